//! How a call to the store server or this node's agent fails, as its caller sees it.

use super::status::{Fault, RemoteError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the store server at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("cannot reach the agent at {path}: {reason}")]
    AgentUnreachable { path: String, reason: String },
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Remote(s.into())
    }
}

impl ClientError {
    pub fn fault(&self) -> Fault {
        match self {
            ClientError::Unreachable { .. } | ClientError::AgentUnreachable { .. } => {
                Fault::Unreachable
            }
            ClientError::Remote(r) => r.fault,
        }
    }

    /// The gRPC code the failure travels as (a transport failure as `Unavailable`).
    pub fn code(&self) -> tonic::Code {
        self.fault().code()
    }

    /// Whether the peer answered that the thing asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        self.fault() == Fault::NotFound
    }
}
