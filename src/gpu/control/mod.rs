//! The agent's side of the GPU control files: what each open control file holds (its table,
//! its buffers, its window, its transfers) and what its ioctls do.
//!
//! Nothing here blocks a FUSE thread on a transfer: a commit checks what it can at once (the
//! table, the buffers), starts the transfer on the runtime and returns its id; STATUS reads
//! the transfer's state; poll(2) readiness comes from wakers the FUSE adapter hands over, called
//! when a transfer finishes. A registration belongs to its open file: [`GpuControl::release`]
//! lets the worker go of it and unpublishes a publisher's key.
//!
//! - `gpu_control`: the control files of a mount, what the filesystem core calls;
//! - `file`: one open control file; `transfer`: one of its transfers, as STATUS reports it;
//! - `commit`: a commit's work on the runtime, PUT or GET, in a window or not;
//! - `workers`: the agent's transfer workers, and letting go of a registration;
//! - `error`: what all of it fails with.

mod commit;
mod error;
mod file;
mod gpu_control;
mod transfer;
mod workers;

pub use error::GpuError;
pub use file::ControlFile;
pub use gpu_control::GpuControl;
pub use transfer::Waker;
