//! What a GPU window's state says, read the same way by the store server that keeps it and the
//! agents that wait on it.

use crate::proto::{GpuMemberState, GpuWindow, Role};

/// The key a kept NCCL communicator goes by (`HeldComm.key`, `GpuWindow.comm`): BLAKE3 of the
/// unique id it was formed from, which every member of it was given.
pub fn comm_key(unique_id: &[u8]) -> Vec<u8> {
    blake3::hash(unique_id).as_bytes().to_vec()
}

/// Whether the quorum has closed and every getter of `w` has finished, one way or the other:
/// what the putter waits for.
pub fn getters_finished(w: &GpuWindow) -> bool {
    w.closed
        && w.members
            .iter()
            .all(|m| m.role() == Role::Putter || m.state() != GpuMemberState::GpuWaiting)
}

/// What the putter's transfer comes to once every getter has finished: `Err` names each getter
/// that failed, and why.
pub fn outcome(w: &GpuWindow) -> Result<(), String> {
    let failed: Vec<String> = w
        .members
        .iter()
        .filter(|m| m.role() == Role::Getter && m.state() == GpuMemberState::GpuFailed)
        .map(|m| format!("member {} on node {}: {}", m.id, m.node_id, m.error))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} getters failed: {}",
            failed.len(),
            w.members.len().saturating_sub(1),
            failed.join("; ")
        ))
    }
}
