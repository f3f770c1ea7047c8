/*
 * ktfs_gpu.h: the ioctl ABI of ktfs's GPU control files, /kt/.gpu/<key>.
 *
 * A publisher opens /kt/.gpu/<key> (O_RDWR | O_CREAT), writes the table of its tensors (JSON,
 * see doc/gpu-abi.md) to it, then registers its buffers with KT_GPU_PUT in batches of at most
 * KT_GPU_BATCH, the last one with KT_GPU_COMMIT. A getter opens the same path (O_RDWR), may read
 * it (the published table, as JSON), writes the table of its own buffers, and hands them over
 * with KT_GPU_GET the same way. KT_GPU_JOIN before the commit joins a broadcast window.
 *
 * No ioctl waits for a transfer: a commit returns a transfer id (the ioctl's return value) at
 * once, KT_GPU_STATUS answers at once, and poll(2) on the control file reports POLLIN when the
 * open file's latest transfer has finished (done or failed). A registration belongs to the open
 * file description that made it: closing its last reference aborts its transfers and, for a
 * publisher, unpublishes the key.
 *
 * FUSE passes restricted ioctls only: the kernel copies exactly _IOC_SIZE(cmd) bytes (at most
 * 16,383) and follows no pointers, so every struct here is fixed-size, little-endian (the only
 * byte order ktfs runs on) and holds no pointers. A struct of another size is another command:
 * the control file answers it with EINVAL.
 */
#ifndef KTFS_GPU_H
#define KTFS_GPU_H

#include <stdint.h>
#include <sys/ioctl.h>

#define KT_GPU_ABI_VERSION 1u
#define KT_GPU_MAGIC 'k'

/* Entries per KT_GPU_PUT / KT_GPU_GET call. */
#define KT_GPU_BATCH 128u

/* kt_gpu_buffer.kind */
#define KT_GPU_BUF_CUDA_IPC 1u /* handle: a cudaIpcMemHandle_t (cuIpcGetMemHandle of the allocation's base) */
#define KT_GPU_BUF_HOST_SHM 2u /* handle: the name of a file in the caller's /dev/shm, NUL-padded */

/* kt_gpu_buffers.flags */
#define KT_GPU_COMMIT 1u /* the last batch: publish (PUT) or start the transfer (GET) */

/* kt_gpu_window.flags */
#define KT_GPU_PACK 1u      /* mixed dtypes travel as bounded uint8 buckets */
#define KT_GPU_PG_GLOBAL 2u /* nccl_pg_mode "global": one transfer at a time per worker */

/* kt_gpu_status.state */
#define KT_GPU_PENDING 0u /* waiting for its window's quorum */
#define KT_GPU_RUNNING 1u
#define KT_GPU_DONE 2u
#define KT_GPU_FAILED 3u

/* One buffer: where the bytes of one table entry are (PUT), or go (GET). 96 bytes. */
struct kt_gpu_buffer {
    uint32_t kind;       /* KT_GPU_BUF_* */
    int32_t device;      /* CUDA device ordinal; -1 for host memory */
    uint32_t entry;      /* index of the entry in the table written to the control file */
    uint32_t reserved;   /* 0 */
    uint64_t offset;     /* bytes from the start of the allocation or file */
    uint64_t nbytes;     /* must equal the entry's size */
    uint8_t handle[64];
};

/* KT_GPU_PUT and KT_GPU_GET. 16 + 128 * 96 = 12304 bytes. */
struct kt_gpu_buffers {
    uint32_t version;    /* KT_GPU_ABI_VERSION */
    uint32_t flags;      /* KT_GPU_COMMIT on the last batch */
    uint32_t count;      /* buffers[] used, at most KT_GPU_BATCH */
    uint32_t reserved;   /* 0 */
    struct kt_gpu_buffer buffers[KT_GPU_BATCH];
};

/* KT_GPU_JOIN: the broadcast window to join at the commit. The quorum closes when ANY of
 * world_size, timeout_ms or ips is reached. A window may carry several keys, each member's
 * the key of its control file: every key one putter, every getter's key put by a member, each
 * getter's table its key's putter's (else every member fails: EEXIST, ENOENT, EBADMSG).
 * 1176 bytes. */
struct kt_gpu_window {
    uint32_t version;    /* KT_GPU_ABI_VERSION */
    uint32_t world_size; /* participants, putters and getters; 0: not a criterion */
    uint64_t timeout_ms; /* from when the window opened; 0: not a criterion */
    uint32_t fanout;     /* 0: one NCCL broadcast over the window; n: a pipelined tree of degree n */
    uint32_t flags;      /* KT_GPU_PACK, KT_GPU_PG_GLOBAL */
    char group_id[128];  /* NUL-terminated; empty: one window per key */
    char ips[1024];      /* comma-separated, NUL-terminated; empty: not a criterion */
};

/* KT_GPU_STATUS: `transfer` in, the rest out. 288 bytes. */
struct kt_gpu_status {
    uint64_t transfer;   /* a transfer id this open file's commit returned */
    uint32_t state;      /* KT_GPU_PENDING ... KT_GPU_FAILED */
    int32_t error;       /* an errno when failed, else 0 */
    uint64_t bytes_done;
    uint64_t bytes_total;
    char message[256];   /* why it failed, NUL-terminated */
};

#define KT_GPU_PUT _IOW(KT_GPU_MAGIC, 1, struct kt_gpu_buffers)
#define KT_GPU_GET _IOW(KT_GPU_MAGIC, 2, struct kt_gpu_buffers)
#define KT_GPU_JOIN _IOW(KT_GPU_MAGIC, 3, struct kt_gpu_window)
#define KT_GPU_STATUS _IOWR(KT_GPU_MAGIC, 4, struct kt_gpu_status)

#endif /* KTFS_GPU_H */
