//! Whether CUDA and NCCL are usable in this process, found once and never by panicking.
//!
//! `cudarc` loads libcuda and libnccl at their first call and panics (for good: it retries
//! every time) when a library or one of its symbols is missing. So the probe first asks
//! whether each library loads at all (`is_culib_present`), then whether it has every symbol
//! this module calls, and only then calls anything: `cuInit` (where `CUDA_ERROR_NO_DEVICE`
//! means a machine without a GPU, not a fault), the device count and the versions. Any panic
//! that escapes all this anyway (a library that vanished between two looks) is caught and
//! reported as a reason.
//!
//! `KT_GPU_TRANSPORT=host` makes the probe answer "no" without touching either library: the
//! worker then offers host buffers only.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::sys as cu;
use cudarc::nccl::sys as nc;

use super::error::CudaError;

/// The environment variable that forces the host transport when it is `host`.
pub const TRANSPORT_ENV: &str = "KT_GPU_TRANSPORT";

/// What [`probe`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    pub cuda: Result<CudaInfo, Unavailable>,
    pub nccl: Result<NcclInfo, Unavailable>,
}

impl Availability {
    /// Whether CUDA buffers can move over NCCL here.
    pub fn nccl_transfers(&self) -> bool {
        self.cuda.is_ok() && self.nccl.is_ok()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaInfo {
    pub devices: u32,
    /// As `cuDriverGetVersion` gives it: 12080 is CUDA 12.8.
    pub driver_version: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    /// As `ncclGetVersion` gives it: 22703 is 2.27.3.
    pub version: i32,
}

impl NcclInfo {
    /// `major.minor.patch`.
    pub fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
        } else {
            // NCCL before 2.9 coded versions as major*1000 + minor*100 + patch.
            format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
        }
    }
}

/// Why CUDA or NCCL is not usable, in words for a person.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The driver functions this module calls: each must be in libcuda before any is called.
const CUDA_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventDestroy_v2",
];

/// The NCCL functions this module calls.
const NCCL_SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommInitRankConfig",
    "ncclCommGetAsyncError",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclBroadcast",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
];

/// Fails unless the probe found a usable CUDA driver and device.
pub(crate) fn require_cuda() -> Result<&'static CudaInfo, CudaError> {
    probe()
        .cuda
        .as_ref()
        .map_err(|e| CudaError::Unavailable(e.to_string()))
}

/// What this process can use, probed at the first call.
pub fn probe() -> &'static Availability {
    static FOUND: OnceLock<Availability> = OnceLock::new();
    FOUND.get_or_init(|| {
        let transport = std::env::var(TRANSPORT_ENV).ok();
        let found = detect(transport.as_deref());
        match (&found.cuda, &found.nccl) {
            (Ok(c), Ok(n)) => tracing::info!(
                devices = c.devices,
                driver = c.driver_version,
                nccl = %n.version_string(),
                "CUDA and NCCL found"
            ),
            (cuda, nccl) => tracing::info!(
                cuda = %describe(cuda),
                nccl = %describe(nccl),
                "GPU transfers over NCCL unavailable"
            ),
        }
        found
    })
}

fn describe<T: std::fmt::Debug>(r: &Result<T, Unavailable>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => e.0.clone(),
    }
}

/// The probe itself, for a given value of [`TRANSPORT_ENV`].
fn detect(transport: Option<&str>) -> Availability {
    if transport == Some("host") {
        let off = || Unavailable(format!("{TRANSPORT_ENV}=host forces the host transport"));
        return Availability {
            cuda: Err(off()),
            nccl: Err(off()),
        };
    }
    if let Some(other) = transport.filter(|t| !t.is_empty() && *t != "nccl" && *t != "auto") {
        tracing::warn!("{TRANSPORT_ENV}={other:?} is not host, nccl or auto; probing");
    }
    Availability {
        cuda: guarded("CUDA", probe_cuda),
        nccl: guarded("NCCL", probe_nccl),
    }
}

/// `f`, with a panic turned into a reason.
fn guarded<T>(what: &str, f: fn() -> Result<T, Unavailable>) -> Result<T, Unavailable> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        Err(Unavailable(format!("loading {what} failed: {msg}")))
    })
}

fn probe_cuda() -> Result<CudaInfo, Unavailable> {
    // SAFETY: only tries to dlopen the library under its candidate names and closes it again;
    // it calls nothing in it.
    if !unsafe { cu::is_culib_present() } {
        return Err(Unavailable(
            "libcuda.so not found (no NVIDIA driver here)".into(),
        ));
    }
    // SAFETY: the library loads (just checked); `culib` opens it once for the process and
    // looking a symbol up calls nothing.
    let lib = unsafe { cu::culib() };
    // SAFETY: as above; the symbol is looked up, never called.
    if let Some(missing) = CUDA_SYMBOLS
        .iter()
        .find(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err())
    {
        return Err(Unavailable(format!(
            "libcuda lacks {missing} (a driver older than CUDA 12)"
        )));
    }
    // SAFETY: every symbol called below is present (checked above); the arguments are plain
    // values and pointers to locals that live through each call.
    unsafe {
        match cu::cuInit(0) {
            cu::CUresult::CUDA_SUCCESS => {}
            cu::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(Unavailable("no CUDA device".into()));
            }
            other => return Err(Unavailable(format!("cuInit: {other:?}"))),
        }
        let mut count = 0;
        let r = cu::cuDeviceGetCount(&mut count);
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(Unavailable(format!("cuDeviceGetCount: {r:?}")));
        }
        if count <= 0 {
            return Err(Unavailable("no CUDA device".into()));
        }
        let mut driver_version = 0;
        let r = cu::cuDriverGetVersion(&mut driver_version);
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(Unavailable(format!("cuDriverGetVersion: {r:?}")));
        }
        Ok(CudaInfo {
            devices: count as u32,
            driver_version,
        })
    }
}

fn probe_nccl() -> Result<NcclInfo, Unavailable> {
    // SAFETY: only tries to dlopen the library under its candidate names and closes it again.
    if !unsafe { nc::is_culib_present() } {
        return Err(Unavailable(
            "libnccl.so not found (pip's NCCL installs only libnccl.so.2: start the process \
             with the LD_LIBRARY_PATH that nccl_lib::loader_path_for_nccl gives)"
                .into(),
        ));
    }
    // SAFETY: the library loads (just checked); symbols are looked up, not called.
    let lib = unsafe { nc::culib() };
    if let Some(missing) = NCCL_SYMBOLS
        .iter()
        // SAFETY: as above.
        .find(|s| unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err())
    {
        return Err(Unavailable(format!(
            "libnccl lacks {missing} (older than NCCL 2.14)"
        )));
    }
    let mut version = 0;
    // SAFETY: the symbol is present; `version` outlives the call.
    let r = unsafe { nc::ncclGetVersion(&mut version) };
    if r != nc::ncclResult_t::ncclSuccess {
        return Err(Unavailable(format!("ncclGetVersion: {r:?}")));
    }
    Ok(NcclInfo { version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_transport_forces_no_cuda_without_loading_anything() {
        let a = detect(Some("host"));
        assert!(!a.nccl_transfers());
        for reason in [a.cuda.unwrap_err(), a.nccl.unwrap_err()] {
            assert!(reason.0.contains("KT_GPU_TRANSPORT=host"), "{reason}");
        }
    }

    #[test]
    fn a_machine_without_libcuda_answers_no_cuda_without_panicking() {
        let a = detect(None);
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cu::is_culib_present() } {
            let reason = a.cuda.unwrap_err();
            assert!(reason.0.contains("libcuda.so not found"), "{reason}");
        }
        // SAFETY: as above.
        if !unsafe { nc::is_culib_present() } {
            let reason = a.nccl.unwrap_err();
            assert!(reason.0.contains("libnccl.so not found"), "{reason}");
        }
        // Once and for the process: the same answer again.
        assert_eq!(probe(), probe());
    }

    #[test]
    fn nccl_versions_read_as_people_write_them() {
        assert_eq!(NcclInfo { version: 22703 }.version_string(), "2.27.3");
        assert_eq!(NcclInfo { version: 23000 }.version_string(), "2.30.0");
        assert_eq!(NcclInfo { version: 2804 }.version_string(), "2.8.4");
    }

    #[test]
    fn a_panic_becomes_a_reason() {
        fn boom() -> Result<(), Unavailable> {
            panic!("Unable to dynamically load");
        }
        let r = guarded("CUDA", boom).unwrap_err();
        assert!(r.0.contains("Unable to dynamically load"), "{r}");
    }
}
