//! The ioctl ABI of the GPU control files, as `include/ktfs_gpu.h` declares it for C callers
//! (and `python/ktfs/gpu_abi.py` for Python): fixed-layout, little-endian `#[repr(C)]` structs
//! whose sizes are asserted here at compile time and checked against the C header by
//! `tests/gpu_abi.rs`. FUSE passes restricted ioctls only (the kernel copies exactly
//! `_IOC_SIZE(cmd)` bytes, at most 16,383, and follows no pointers), so nothing here points
//! anywhere. Untrusted bytes are decoded field by field, never cast.

use std::mem::size_of;

pub const ABI_VERSION: u32 = 1;
pub const MAGIC: u8 = b'k';
/// Entries per PUT or GET call.
pub const BATCH: usize = 128;
/// Largest ioctl payload FUSE carries.
pub const MAX_IOCTL: usize = 16_383;

pub const BUF_CUDA_IPC: u32 = 1;
pub const BUF_HOST_SHM: u32 = 2;

pub const COMMIT: u32 = 1;

pub const PACK: u32 = 1;
pub const PG_GLOBAL: u32 = 2;

pub const PENDING: u32 = 0;
pub const RUNNING: u32 = 1;
pub const DONE: u32 = 2;
pub const FAILED: u32 = 3;

/// One buffer: where the bytes of one table entry are (PUT), or go (GET).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KtGpuBuffer {
    pub kind: u32,
    pub device: i32,
    pub entry: u32,
    pub reserved: u32,
    pub offset: u64,
    pub nbytes: u64,
    pub handle: [u8; 64],
}

/// PUT and GET.
#[repr(C)]
#[derive(Clone, Debug)]
pub struct KtGpuBuffers {
    pub version: u32,
    pub flags: u32,
    pub count: u32,
    pub reserved: u32,
    pub buffers: [KtGpuBuffer; BATCH],
}

/// JOIN.
#[repr(C)]
#[derive(Clone, Debug)]
pub struct KtGpuWindow {
    pub version: u32,
    pub world_size: u32,
    pub timeout_ms: u64,
    pub fanout: u32,
    pub flags: u32,
    pub group_id: [u8; 128],
    pub ips: [u8; 1024],
}

/// STATUS.
#[repr(C)]
#[derive(Clone, Debug)]
pub struct KtGpuStatus {
    pub transfer: u64,
    pub state: u32,
    pub error: i32,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub message: [u8; 256],
}

const _: () = assert!(size_of::<KtGpuBuffer>() == 96);
const _: () = assert!(size_of::<KtGpuBuffers>() == 16 + BATCH * 96);
const _: () = assert!(size_of::<KtGpuWindow>() == 1176);
const _: () = assert!(size_of::<KtGpuStatus>() == 288);
const _: () = assert!(size_of::<KtGpuBuffers>() <= MAX_IOCTL);

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((MAGIC as u32) << 8) | nr
}

pub const KT_GPU_PUT: u32 = ioc(IOC_WRITE, 1, size_of::<KtGpuBuffers>());
pub const KT_GPU_GET: u32 = ioc(IOC_WRITE, 2, size_of::<KtGpuBuffers>());
pub const KT_GPU_JOIN: u32 = ioc(IOC_WRITE, 3, size_of::<KtGpuWindow>());
pub const KT_GPU_STATUS: u32 = ioc(IOC_READ | IOC_WRITE, 4, size_of::<KtGpuStatus>());

/// A command of the control files, decoded.
#[derive(Clone, Debug)]
pub enum Command {
    Put(KtGpuBuffers),
    Get(KtGpuBuffers),
    Join(KtGpuWindow),
    Status(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    /// Our magic with another number or size: a caller built against another layout.
    #[error("ioctl {0:#x} is not a command of this ABI (version {ABI_VERSION}): a struct of another size?")]
    BadCommand(u32),
    /// Another driver's ioctl (a terminal's, say).
    #[error("ioctl {0:#x} is not a ktfs command")]
    Foreign(u32),
    #[error("ioctl {cmd:#x} carries {got} bytes, its struct has {want}")]
    Size { cmd: u32, got: usize, want: usize },
    #[error("ABI version {0} is not {ABI_VERSION}")]
    Version(u32),
    #[error("{0} buffers in one batch, at most {BATCH}")]
    Count(u32),
    #[error("a reserved field is not zero")]
    Reserved,
    #[error("{0} is not valid UTF-8")]
    Text(&'static str),
}

/// Reads little-endian fields off a byte slice the caller checked the length of.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4));
        u32::from_le_bytes(b)
    }

    fn i32(&mut self) -> i32 {
        self.u32() as i32
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8));
        u64::from_le_bytes(b)
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N));
        b
    }
}

fn buffers(data: &[u8]) -> Result<KtGpuBuffers, AbiError> {
    let mut f = Fields(data);
    let (version, flags, count, reserved) = (f.u32(), f.u32(), f.u32(), f.u32());
    if version != ABI_VERSION {
        return Err(AbiError::Version(version));
    }
    if count as usize > BATCH {
        return Err(AbiError::Count(count));
    }
    if reserved != 0 {
        return Err(AbiError::Reserved);
    }
    let empty = KtGpuBuffer {
        kind: 0,
        device: 0,
        entry: 0,
        reserved: 0,
        offset: 0,
        nbytes: 0,
        handle: [0; 64],
    };
    let mut out = KtGpuBuffers {
        version,
        flags,
        count,
        reserved,
        buffers: [empty; BATCH],
    };
    for b in out.buffers.iter_mut() {
        *b = KtGpuBuffer {
            kind: f.u32(),
            device: f.i32(),
            entry: f.u32(),
            reserved: f.u32(),
            offset: f.u64(),
            nbytes: f.u64(),
            handle: f.bytes::<64>(),
        };
    }
    Ok(out)
}

fn window(data: &[u8]) -> Result<KtGpuWindow, AbiError> {
    let mut f = Fields(data);
    let w = KtGpuWindow {
        version: f.u32(),
        world_size: f.u32(),
        timeout_ms: f.u64(),
        fanout: f.u32(),
        flags: f.u32(),
        group_id: f.bytes::<128>(),
        ips: f.bytes::<1024>(),
    };
    if w.version != ABI_VERSION {
        return Err(AbiError::Version(w.version));
    }
    Ok(w)
}

/// Decodes a control file's ioctl: its command number and the bytes the kernel copied in.
pub fn decode(cmd: u32, data: &[u8]) -> Result<Command, AbiError> {
    let want = match cmd {
        KT_GPU_PUT | KT_GPU_GET => size_of::<KtGpuBuffers>(),
        KT_GPU_JOIN => size_of::<KtGpuWindow>(),
        KT_GPU_STATUS => size_of::<KtGpuStatus>(),
        _ if (cmd >> 8) & 0xff == u32::from(MAGIC) => return Err(AbiError::BadCommand(cmd)),
        _ => return Err(AbiError::Foreign(cmd)),
    };
    if data.len() != want {
        return Err(AbiError::Size {
            cmd,
            got: data.len(),
            want,
        });
    }
    Ok(match cmd {
        KT_GPU_PUT => Command::Put(buffers(data)?),
        KT_GPU_GET => Command::Get(buffers(data)?),
        KT_GPU_JOIN => Command::Join(window(data)?),
        _ => Command::Status(Fields(data).u64()),
    })
}

/// The NUL-terminated text of a fixed field.
pub fn text<'a>(field: &'a [u8], what: &'static str) -> Result<&'a str, AbiError> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end]).map_err(|_| AbiError::Text(what))
}

impl KtGpuStatus {
    /// The bytes the kernel copies back to the caller.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_of::<KtGpuStatus>());
        out.extend_from_slice(&self.transfer.to_le_bytes());
        out.extend_from_slice(&self.state.to_le_bytes());
        out.extend_from_slice(&self.error.to_le_bytes());
        out.extend_from_slice(&self.bytes_done.to_le_bytes());
        out.extend_from_slice(&self.bytes_total.to_le_bytes());
        out.extend_from_slice(&self.message);
        out
    }

    /// A status with `message` cut to fit its field (on a character boundary), NUL-terminated.
    pub fn with_message(mut self, message: &str) -> Self {
        let mut end = message.len().min(self.message.len() - 1);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        self.message = [0; 256];
        self.message[..end].copy_from_slice(&message.as_bytes()[..end]);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_follow_linux_ioc_encoding() {
        // _IOW('k', 1, 12304): direction 1, size 12304, type 'k', number 1.
        assert_eq!(KT_GPU_PUT, (1 << 30) | (12304 << 16) | (0x6b << 8) | 1);
        assert_eq!(KT_GPU_STATUS >> 30, 3);
        assert_eq!((KT_GPU_JOIN >> 16) & 0x3fff, 1176);
    }

    #[test]
    fn bad_sizes_versions_and_counts_are_refused() {
        let mut put = vec![0u8; size_of::<KtGpuBuffers>()];
        put[..4].copy_from_slice(&ABI_VERSION.to_le_bytes());
        put[8..12].copy_from_slice(&3u32.to_le_bytes());
        put[16..20].copy_from_slice(&BUF_HOST_SHM.to_le_bytes());
        put[20..24].copy_from_slice(&(-1i32).to_le_bytes());
        put[48..53].copy_from_slice(b"x.shm");
        let Ok(Command::Put(b)) = decode(KT_GPU_PUT, &put) else {
            panic!("a good PUT")
        };
        assert_eq!(
            (b.count, b.buffers[0].kind, b.buffers[0].device),
            (3, 2, -1)
        );
        assert_eq!(text(&b.buffers[0].handle, "handle"), Ok("x.shm"));
        assert!(matches!(
            decode(KT_GPU_PUT, &put[1..]),
            Err(AbiError::Size { .. })
        ));
        // The same command number with another size is another command.
        let other = ioc(IOC_WRITE, 1, 100);
        assert_eq!(
            decode(other, &put[..100]).unwrap_err(),
            AbiError::BadCommand(other)
        );
        assert_eq!(decode(0x5401, &[]).unwrap_err(), AbiError::Foreign(0x5401));
        put[8..12].copy_from_slice(&129u32.to_le_bytes());
        assert_eq!(decode(KT_GPU_PUT, &put).unwrap_err(), AbiError::Count(129));
        put[..4].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode(KT_GPU_PUT, &put).unwrap_err(), AbiError::Version(2));
    }

    #[test]
    fn a_status_encodes_to_its_struct_and_cuts_long_messages() {
        let st = KtGpuStatus {
            transfer: 7,
            state: FAILED,
            error: libc::EIO,
            bytes_done: 1,
            bytes_total: 2,
            message: [0; 256],
        }
        .with_message(&"é".repeat(200));
        let b = st.encode();
        assert_eq!(b.len(), size_of::<KtGpuStatus>());
        assert_eq!(&b[..8], &7u64.to_le_bytes());
        assert_eq!(b[287], 0);
        assert!(text(&st.message, "message")
            .unwrap()
            .chars()
            .all(|c| c == 'é'));
    }
}
