//! mount.kt, the mount(8) helper of ktfs: `mount -t kt SERVER DIR -o OPTIONS` and `/etc/fstab`
//! lines of type `kt` start `kt mount DIR --server SERVER ...` in the background and return once
//! the filesystem is mounted. `umount DIR` ends that `kt mount` (it exits when its filesystem is
//! unmounted).

pub mod invocation;
pub mod options;
pub mod spawn;

pub use invocation::{parse_args, Invocation, UsageError};
pub use options::{parse_options, KtOptions, OptionError};
