//! The C header `include/ktfs_gpu.h` and the Rust ABI (`ktfs::gpu::abi`) agree: a C program
//! compiled against the header prints its structs' sizes and field offsets and its command
//! numbers, and they are the ones the control files decode.

use std::mem::{offset_of, size_of};
use std::process::Command;

use ktfs::gpu::abi::*;

const PROBE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "ktfs_gpu.h"
int main(void) {
    printf("buffer %zu %zu %zu %zu\n", sizeof(struct kt_gpu_buffer),
           offsetof(struct kt_gpu_buffer, offset), offsetof(struct kt_gpu_buffer, nbytes),
           offsetof(struct kt_gpu_buffer, handle));
    printf("buffers %zu %zu\n", sizeof(struct kt_gpu_buffers), offsetof(struct kt_gpu_buffers, buffers));
    printf("window %zu %zu %zu\n", sizeof(struct kt_gpu_window),
           offsetof(struct kt_gpu_window, group_id), offsetof(struct kt_gpu_window, ips));
    printf("status %zu %zu\n", sizeof(struct kt_gpu_status), offsetof(struct kt_gpu_status, message));
    printf("cmds %lu %lu %lu %lu\n", (unsigned long)KT_GPU_PUT, (unsigned long)KT_GPU_GET,
           (unsigned long)KT_GPU_JOIN, (unsigned long)KT_GPU_STATUS);
    printf("consts %u %u %u %u\n", KT_GPU_ABI_VERSION, KT_GPU_BATCH, KT_GPU_BUF_HOST_SHM, KT_GPU_DONE);
    return 0;
}
"#;

#[test]
fn the_c_header_and_the_rust_structs_agree() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("probe.c");
    let bin = dir.path().join("probe");
    std::fs::write(&src, PROBE).unwrap();
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I", include, "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let want = format!(
        "buffer {} {} {} {}\nbuffers {} {}\nwindow {} {} {}\nstatus {} {}\ncmds {} {} {} {}\nconsts {} {} {} {}\n",
        size_of::<KtGpuBuffer>(),
        offset_of!(KtGpuBuffer, offset),
        offset_of!(KtGpuBuffer, nbytes),
        offset_of!(KtGpuBuffer, handle),
        size_of::<KtGpuBuffers>(),
        offset_of!(KtGpuBuffers, buffers),
        size_of::<KtGpuWindow>(),
        offset_of!(KtGpuWindow, group_id),
        offset_of!(KtGpuWindow, ips),
        size_of::<KtGpuStatus>(),
        offset_of!(KtGpuStatus, message),
        KT_GPU_PUT,
        KT_GPU_GET,
        KT_GPU_JOIN,
        KT_GPU_STATUS,
        ABI_VERSION,
        BATCH,
        BUF_HOST_SHM,
        DONE,
    );
    assert_eq!(printed, want);
}
