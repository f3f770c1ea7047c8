//! What `kt` prints: text for people, one JSON object with `--json`, progress on a terminal,
//! and an exit code per kind of failure that scripts, kt-csi and the Python package rely on.

use anyhow::Result;

use ktfs::key::KeyError;
use ktfs::manifest::ManifestError;
use ktfs::rpc::{ClientError, Fault, RemoteError};
use ktfs::transfer::get::GetError;
pub use ktfs::transfer::progress_bar;
use ktfs::transfer::publish::PublishError;
use ktfs::transfer::put::scan::ScanError;
use ktfs::transfer::put::PutError;
use ktfs::transfer::TransferError;

/// The exit codes, as `kt --help` shows them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes: 0 success; 1 other failure; 2 usage; 3 not found (the key or prefix does not exist);
4 invalid (a bad key, namespace or argument); 5 unreachable (the store server or the agent);
6 conflict (the key exists, a destination differs, it changed meanwhile); 7 timeout;
8 data unavailable (no source could give every block); 9 permission denied (or no
credential the store server accepts).
With --json a failure prints {\"error\": {\"kind\", \"exit_code\", \"message\"}} on stdout.";

/// Failures the command line finds itself.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Denied(String),
}

/// The exit code of a failure of this kind.
pub fn exit_code(f: Fault) -> i32 {
    match f {
        Fault::NotFound => 3,
        Fault::Invalid => 4,
        Fault::Unreachable => 5,
        Fault::Exists | Fault::Conflict | Fault::NotEmpty | Fault::NotDir | Fault::IsDir => 6,
        Fault::Timeout => 7,
        Fault::Unavailable => 8,
        Fault::Denied | Fault::Unauthenticated => 9,
        Fault::NoSpace | Fault::TooLarge | Fault::Unimplemented | Fault::Internal => 1,
    }
}

/// The kind of a failure: the first error in its chain that knows what it is.
pub fn fault_of(e: &anyhow::Error) -> Option<Fault> {
    e.chain().find_map(|c| {
        if let Some(x) = c.downcast_ref::<CliError>() {
            return Some(match x {
                CliError::NotFound(_) => Fault::NotFound,
                CliError::Invalid(_) => Fault::Invalid,
                CliError::Denied(_) => Fault::Denied,
            });
        }
        if let Some(x) = c.downcast_ref::<GetError>() {
            return Some(x.fault());
        }
        if let Some(x) = c.downcast_ref::<PutError>() {
            return Some(x.fault());
        }
        if let Some(x) = c.downcast_ref::<PublishError>() {
            return Some(x.fault());
        }
        if let Some(x) = c.downcast_ref::<TransferError>() {
            return Some(x.fault());
        }
        if let Some(x) = c.downcast_ref::<ClientError>() {
            return Some(x.fault());
        }
        if let Some(x) = c.downcast_ref::<RemoteError>() {
            return Some(x.fault);
        }
        if let Some(x) = c.downcast_ref::<ScanError>() {
            return Some(x.fault());
        }
        if c.downcast_ref::<KeyError>().is_some() {
            return Some(Fault::Invalid);
        }
        if c.downcast_ref::<ManifestError>().is_some() {
            return Some(Fault::Internal);
        }
        if c.downcast_ref::<ktfs::k8s::api::ClusterError>().is_some() {
            return Some(Fault::Unreachable);
        }
        None
    })
}

/// Reports a failure on stderr (and with `--json` on stdout too); returns the exit code.
pub fn report_failure(e: &anyhow::Error, json: bool) -> i32 {
    let msg = format!("{e:#}").replace('\n', " ");
    let fault = fault_of(e);
    let code = fault.map_or(1, exit_code);
    if json {
        let kind = fault.map_or("other", Fault::name);
        println!(
            "{}",
            serde_json::json!({ "error": { "kind": kind, "exit_code": code, "message": msg } })
        );
    }
    eprintln!("kt: error: {msg}");
    code
}

pub fn print_json(v: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(v)?);
    Ok(())
}

pub fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_failure_has_its_exit_code() {
        let missing: anyhow::Error = GetError::NotFound("k".into()).into();
        assert_eq!(fault_of(&missing).map(exit_code), Some(3));
        let bad_key: anyhow::Error = ktfs::key::KeyPath::parse("a//b").unwrap_err().into();
        assert_eq!(fault_of(&bad_key).map(exit_code), Some(4));
        let down: anyhow::Error = ClientError::Unreachable {
            addr: "127.0.0.1:1".into(),
            reason: "connection refused".into(),
        }
        .into();
        assert_eq!(fault_of(&down).map(exit_code), Some(5));
        let exists: anyhow::Error = ClientError::from(ktfs::rpc::status::to_status(
            Fault::Exists,
            "key k already exists",
        ))
        .into();
        assert_eq!(fault_of(&exists).map(exit_code), Some(6));
        let late: anyhow::Error =
            ClientError::from(tonic::Status::deadline_exceeded("too slow")).into();
        assert_eq!(fault_of(&late).map(exit_code), Some(7));
        let context = anyhow::Error::from(GetError::NotFound("k".into())).context("fetching");
        assert_eq!(fault_of(&context).map(exit_code), Some(3));
        assert_eq!(fault_of(&anyhow::anyhow!("anything else")), None);
    }
}
