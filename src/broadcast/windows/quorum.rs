//! What file windows and GPU windows share of their lives: which criterion closes a quorum, and
//! how long an idle window is kept.

use std::time::Duration;

use crate::proto::WindowSpec;

/// A window no one has touched for this long is forgotten.
pub const WINDOW_IDLE: Duration = Duration::from_secs(600);

/// Which criterion of `spec`, if any, closes a quorum of members at `ips` (one per member, in
/// join order) `elapsed` after the window opened. File and GPU windows close alike.
pub(super) fn quorum(spec: &WindowSpec, ips: &[&str], elapsed: Duration) -> Option<&'static str> {
    if spec.world_size > 0 && ips.len() >= spec.world_size as usize {
        Some("world_size")
    } else if !spec.ips.is_empty() && spec.ips.iter().all(|ip| ips.contains(&ip.as_str())) {
        Some("ips")
    } else if spec.timeout_ms > 0 && elapsed >= Duration::from_millis(spec.timeout_ms) {
        Some("timeout")
    } else {
        None
    }
}
