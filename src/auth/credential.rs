//! What a caller presents to the store server: a bearer token in the `authorization` metadata
//! of every call. In a pod it is the pod's projected ServiceAccount token (a file the kubelet
//! rewrites as it rotates, so it is read again, not kept); with `kt up` or without Kubernetes
//! the shared token (`KT_TOKEN`, `--token-file`); from a laptop a short-lived token the
//! Kubernetes API issued for a ServiceAccount (`crate::k8s::tokens`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::metadata::{Ascii, MetadataValue};

use crate::locks;

/// The metadata key of the credential.
pub const AUTHORIZATION: &str = "authorization";
/// The metadata key under which a node agent presents, beside its own credential, the one the
/// process it acts for gave it (on its unix socket): the store then checks the namespace
/// against the caller's, the node against the agent's. [`NO_CREDENTIAL`]: the caller gave none.
pub const ON_BEHALF: &str = "x-kt-on-behalf";
/// What [`ON_BEHALF`] says of a caller that presented nothing (no token is this).
pub const NO_CREDENTIAL: &str = "none";
/// Where a pod's token for ktfs is projected (audience `ktfs`, deploy/examples).
pub const PROJECTED_TOKEN: &str = "/var/run/secrets/ktfs/token";
/// A pod's default ServiceAccount token, used when no ktfs token is projected.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// How long a token read from a file is used before the file is read again: the kubelet
/// rotates projected tokens well before they expire.
const REREAD: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {0} is empty")]
    Empty(String),
    #[error("the token{0} holds characters that cannot travel in a header")]
    NotAscii(String),
}

/// A caller's credential; cloning shares it. `None` sends nothing (a server without
/// authentication).
#[derive(Clone, Default)]
pub struct Credential(Option<Arc<Source>>, Option<MetadataValue<Ascii>>);

enum Source {
    Token(MetadataValue<Ascii>),
    File {
        path: PathBuf,
        cached: Mutex<Option<(Instant, MetadataValue<Ascii>)>>,
    },
}

impl std::fmt::Debug for Credential {
    // Never the token itself: configs that hold a credential are logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_deref() {
            None => f.write_str("Credential(none)"),
            Some(Source::Token(_)) => f.write_str("Credential(token)"),
            Some(Source::File { path, .. }) => write!(f, "Credential(file {})", path.display()),
        }
    }
}

fn header(token: &str, origin: &str) -> Result<MetadataValue<Ascii>, CredentialError> {
    format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| CredentialError::NotAscii(origin.to_string()))
}

/// The token a file holds, without surrounding whitespace; an empty file is an error. The one
/// way every reader of a token file (clients, the server's shared token, `kt node-token`)
/// reads it, so all of them agree on the token.
pub fn read_token_file(path: &Path) -> Result<String, CredentialError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialError::Read {
        path: path.display().to_string(),
        source,
    })?;
    match text.trim() {
        "" => Err(CredentialError::Empty(path.display().to_string())),
        t => Ok(t.to_string()),
    }
}

fn read_file(path: &Path) -> Result<MetadataValue<Ascii>, CredentialError> {
    let text = read_token_file(path)?;
    header(&text, &format!(" in {}", path.display()))
}

impl Credential {
    pub fn none() -> Self {
        Credential(None, None)
    }

    pub fn token(token: &str) -> Result<Self, CredentialError> {
        Ok(Credential(
            Some(Arc::new(Source::Token(header(token, "")?))),
            None,
        ))
    }

    /// This credential (a node agent's) acting for a process that presented `caller` (its
    /// `authorization` value; `None`: nothing) on the agent's socket: see [`ON_BEHALF`].
    pub fn acting_for(&self, caller: Option<MetadataValue<Ascii>>) -> Credential {
        let caller = caller.unwrap_or_else(|| MetadataValue::from_static(NO_CREDENTIAL));
        Credential(self.0.clone(), Some(caller))
    }

    /// A token kept in a file, read now (so a bad path fails at start) and again every minute.
    pub fn file(path: &Path) -> Result<Self, CredentialError> {
        let value = read_file(path)?;
        Ok(Credential(
            Some(Arc::new(Source::File {
                path: path.to_path_buf(),
                cached: Mutex::new(Some((Instant::now(), value))),
            })),
            None,
        ))
    }

    /// What a command line or a library call presents when it names nothing itself: `KT_TOKEN`,
    /// else `token_file` (`--token-file`, `KT_TOKEN_FILE`), else the pod's projected ktfs token
    /// or ServiceAccount token when there is one, else nothing.
    pub fn from_environment(token_file: Option<&Path>) -> Result<Self, CredentialError> {
        if let Some(t) = std::env::var("KT_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            return Credential::token(&t);
        }
        if let Some(path) = token_file {
            return Credential::file(path);
        }
        for path in [PROJECTED_TOKEN, SERVICE_ACCOUNT_TOKEN] {
            if Path::new(path).is_file() {
                return Credential::file(Path::new(path));
            }
        }
        Ok(Credential::none())
    }

    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The `authorization` value to send now.
    pub fn value(&self) -> Option<MetadataValue<Ascii>> {
        match self.0.as_deref()? {
            Source::Token(v) => Some(v.clone()),
            Source::File { path, cached } => {
                let mut cached = locks::lock(cached);
                match cached.as_ref() {
                    Some((at, v)) if at.elapsed() < REREAD => Some(v.clone()),
                    _ => match read_file(path) {
                        Ok(v) => {
                            *cached = Some((Instant::now(), v.clone()));
                            Some(v)
                        }
                        // A file being rewritten by the kubelet: the last token read is still
                        // the best there is, and the server says if it no longer holds.
                        Err(e) => {
                            tracing::warn!(error = %e, "keeping the last token read");
                            cached.as_ref().map(|(_, v)| v.clone())
                        }
                    },
                }
            }
        }
    }
}

impl tonic::service::Interceptor for Credential {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = self.value() {
            req.metadata_mut().insert(AUTHORIZATION, v);
        }
        if let Some(caller) = &self.1 {
            req.metadata_mut().insert(ON_BEHALF, caller.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_trimmed_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        let c = Credential::file(&path).unwrap();
        assert_eq!(c.value().unwrap(), "Bearer s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(Credential::none().value().is_none());
        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(
            Credential::file(&path),
            Err(CredentialError::Empty(_))
        ));
        assert!(matches!(
            Credential::file(&dir.path().join("missing")),
            Err(CredentialError::Read { .. })
        ));
        assert!(Credential::token("bad\u{7}").is_err());
    }
}
