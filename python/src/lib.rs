//! `ktfs._native`: the ktfs library called in-process from Python, for files (no subprocess per
//! call). Every call runs on one tokio runtime with the GIL released, and is abandoned cleanly
//! when the caller is interrupted (Ctrl-C): the transfer's future is dropped, which removes its
//! temporary files, and `KeyboardInterrupt` is raised. Failures become the exceptions of the
//! one fault table (`ktfs::rpc::Fault`), with the message the CLI prints.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ktfs::auth::Credential;
use ktfs::dataplane::Peers;
use ktfs::k8s::outside::Outside;
use ktfs::k8s::{api, env};
use ktfs::key::{KeyPath, Namespace};
use ktfs::manifest::DEFAULT_BLOCK_SIZE;
use ktfs::proto::{ListRequest, Locale, RemoveRequest, WindowSpec};
use ktfs::rpc::client::{self, ClientError};
use ktfs::rpc::Fault;
use ktfs::transfer::get::{self as getting, GetOptions};
use ktfs::transfer::put::scan::ScanOptions;
use ktfs::transfer::put::{self as putting, PutOptions};
use ktfs::transfer::read::{self, Stat};
use ktfs::transfer::Remotes;

/// The kinds of failure: each a class of `ktfs.errors`, where the classes also take the
/// builtin bases code written against the reference data store catches (`KeyError`,
/// `ValueError`, `TimeoutError`...), which classes made here could not.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Kt,
    KeyNotFound,
    InvalidKey,
    Unreachable,
    Conflict,
    BroadcastTimeout,
    Unavailable,
    PermissionDenied,
}

impl Kind {
    fn class(self) -> &'static str {
        match self {
            Kind::Kt => "KtError",
            Kind::KeyNotFound => "KeyNotFoundError",
            Kind::InvalidKey => "InvalidKeyError",
            Kind::Unreachable => "UnreachableError",
            Kind::Conflict => "ConflictError",
            Kind::BroadcastTimeout => "BroadcastTimeoutError",
            Kind::Unavailable => "UnavailableError",
            Kind::PermissionDenied => "PermissionDeniedError",
        }
    }

    /// The exception of this kind saying `message`.
    fn err(self, message: impl Into<String>) -> PyErr {
        let message = message.into();
        Python::attach(|py| {
            let made = py
                .import("ktfs.errors")
                .and_then(|m| m.getattr(self.class()))
                .and_then(|class| class.call1((message.clone(),)));
            match made {
                Ok(e) => PyErr::from_value(e),
                // ktfs.errors itself failed to load: say so, with the message.
                Err(e) => PyException::new_err(format!("{message} (and ktfs.errors: {e})")),
            }
        })
    }
}

/// A failure, ready to become an exception once the GIL is back.
struct Failure {
    fault: Option<Fault>,
    message: String,
}

impl Failure {
    fn of(fault: Option<Fault>, e: impl std::fmt::Display) -> Self {
        Failure {
            fault,
            message: e.to_string(),
        }
    }

    fn into_err(self) -> PyErr {
        let m = self.message;
        match self.fault {
            Some(Fault::NotFound) => Kind::KeyNotFound.err(m),
            Some(Fault::Invalid) => Kind::InvalidKey.err(m),
            Some(Fault::Unreachable) => Kind::Unreachable.err(m),
            Some(
                Fault::Exists | Fault::Conflict | Fault::NotEmpty | Fault::NotDir | Fault::IsDir,
            ) => Kind::Conflict.err(m),
            Some(Fault::Timeout) => Kind::BroadcastTimeout.err(m),
            Some(Fault::Unavailable) => Kind::Unavailable.err(m),
            Some(Fault::Denied | Fault::Unauthenticated) => Kind::PermissionDenied.err(m),
            Some(Fault::NoSpace | Fault::TooLarge | Fault::Unimplemented | Fault::Internal)
            | None => Kind::Kt.err(m),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::of(Some(e.fault()), e)
    }
}

impl From<ktfs::key::KeyError> for Failure {
    fn from(e: ktfs::key::KeyError) -> Self {
        Failure::of(Some(Fault::Invalid), e)
    }
}

/// The peers this client fetches from: its pool of data-plane connections, which range reads of
/// one file share, kept as long as the interpreter.
fn peers() -> &'static Peers {
    static PEERS: OnceLock<Peers> = OnceLock::new();
    PEERS.get_or_init(Peers::default)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("ktfs")
            .build()
            .expect("a tokio runtime for ktfs")
    })
}

/// Runs `fut` to its end with the GIL released, checking for signals every 100 ms; an
/// interrupt abandons the call (dropping its future) and raises.
fn run<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = Result<T, Failure>> + Send + 'static,
) -> PyResult<T> {
    let rt = runtime();
    let mut task = rt.spawn(fut);
    loop {
        let polled = py.detach(|| {
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(100), &mut task).await })
        });
        match polled {
            Ok(Ok(result)) => return result.map_err(Failure::into_err),
            Ok(Err(e)) => return Err(Kind::Kt.err(format!("the call failed: {e}"))),
            Err(_) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
            }
        }
    }
}

/// Where to reach the store server, and whom to ask: the arguments, else the environment
/// (`KT_SERVER`, `KT_NAMESPACE`, the pod's namespace, `KT_AGENT`, `KT_KUBECONFIG`), else the
/// defaults `kt` has.
struct Target {
    server: String,
    /// `KT_TOKEN`, `KT_TOKEN_FILE`, the pod's token, or with a kubeconfig one the API issued.
    credential: Credential,
    namespace: Namespace,
    agent: PathBuf,
    kubeconfig: Option<PathBuf>,
}

fn target(
    server: Option<String>,
    namespace: Option<String>,
    kubeconfig: Option<String>,
) -> Result<Target, Failure> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let namespace = namespace
        .or_else(|| var("KT_NAMESPACE"))
        .unwrap_or_else(env::default_namespace);
    let token_file = var("KT_TOKEN_FILE").map(PathBuf::from);
    let credential = Credential::from_environment(token_file.as_deref())
        .map_err(|e| Failure::of(Some(Fault::Invalid), e))?;
    Ok(Target {
        server: server
            .or_else(|| var("KT_SERVER"))
            .unwrap_or_else(env::default_server),
        credential,
        namespace: Namespace::parse(&namespace)?,
        agent: var("KT_AGENT")
            .map(PathBuf::from)
            .unwrap_or_else(client::default_agent_socket),
        kubeconfig: kubeconfig
            .or_else(|| var("KT_KUBECONFIG"))
            .map(PathBuf::from),
    })
}

impl Target {
    /// With a kubeconfig, a port-forward to the store server (kept by the caller for the call's
    /// length) and the server is its local end. The context, the store's Service and the
    /// ServiceAccount come from the environment, as for `kt` (`KT_CONTEXT`, `KT_STORE_SERVICE`,
    /// `KT_SERVICE_ACCOUNT`): the reference API has no parameters for them.
    async fn reach(&mut self) -> Result<Option<api::Forward>, Failure> {
        let Some(path) = &self.kubeconfig else {
            return Ok(None);
        };
        let outside = Outside::from_env(path.clone());
        let fwd = outside
            .forward()
            .await
            .map_err(|e| Failure::of(Some(Fault::Unreachable), e))?;
        self.server = fwd.addr.to_string();
        let given = ["KT_TOKEN", "KT_TOKEN_FILE"]
            .iter()
            .any(|k| std::env::var_os(k).is_some());
        if !given {
            let denied = |e: String| Failure::of(Some(Fault::Denied), e);
            self.credential = match outside.token(self.namespace.as_str()).await {
                Ok(Some(token)) => Credential::token(&token).map_err(|e| denied(e.to_string()))?,
                Ok(None) => Credential::none(),
                Err(e) => return Err(denied(e.to_string())),
            };
        }
        Ok(Some(fwd))
    }
}

fn window(
    timeout: Option<f64>,
    world_size: Option<u32>,
    ips: Vec<String>,
    group_id: Option<String>,
    fanout: Option<u32>,
) -> WindowSpec {
    WindowSpec {
        group_id: group_id.unwrap_or_default(),
        timeout_ms: timeout.map_or(0, |s| (s.max(0.0) * 1000.0) as u64),
        world_size: world_size.unwrap_or(0),
        ips,
        fanout: fanout.unwrap_or(0),
    }
}

fn json(v: &impl serde::Serialize) -> Result<String, Failure> {
    serde_json::to_string(v).map_err(|e| Failure::of(None, e))
}

/// Publishes `src` under `key`; returns the report `kt put --json` prints.
#[pyfunction]
#[pyo3(signature = (key, src, locale="store", force=false, contents=false, excludes=Vec::new(),
    includes=Vec::new(), window_timeout=None, world_size=None, ips=Vec::new(), group_id=None,
    fanout=None, verbose=false, namespace=None, server=None, kubeconfig=None, block_size=None,
    ttl=0))]
#[allow(clippy::too_many_arguments)]
fn put(
    py: Python<'_>,
    key: String,
    src: Vec<String>,
    locale: &str,
    force: bool,
    contents: bool,
    excludes: Vec<String>,
    includes: Vec<String>,
    window_timeout: Option<f64>,
    world_size: Option<u32>,
    ips: Vec<String>,
    group_id: Option<String>,
    fanout: Option<u32>,
    verbose: bool,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
    block_size: Option<u32>,
    ttl: u64,
) -> PyResult<String> {
    let locale = match locale {
        "store" => Locale::Store,
        "local" => Locale::Local,
        other => {
            return Err(
                Kind::InvalidKey.err(format!("locale must be store or local, not {other:?}"))
            )
        }
    };
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let key = KeyPath::parse(&key).map_err(|e| Failure::from(e).into_err())?;
    let spec = window(window_timeout, world_size, ips, group_id, fanout);
    let any_window = window_timeout.is_some()
        || world_size.is_some()
        || !spec.ips.is_empty()
        || !spec.group_id.is_empty();
    run(py, async move {
        let _forward = t.reach().await?;
        let pb = ktfs::transfer::progress_bar(verbose);
        let report = putting::put(
            PutOptions {
                server: t.server,
                credential: t.credential,
                namespace: t.namespace,
                key,
                srcs: src,
                scan: ScanOptions {
                    block_size: block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
                    contents,
                    excludes,
                    includes,
                },
                locale,
                force,
                ttl_secs: ttl,
                agent_socket: t.agent,
                window: any_window.then_some(spec),
                remotes: Remotes {
                    store: None,
                    peers: peers().clone(),
                },
            },
            &pb,
        )
        .await
        .map_err(|e| Failure::of(Some(e.fault()), e))?;
        pb.finish_and_clear();
        json(&report)
    })
}

/// Copies `key` to `dest`; returns the report `kt get --json` prints.
#[pyfunction]
#[pyo3(signature = (key, dest, force=false, contents=false, excludes=Vec::new(),
    includes=Vec::new(), window_timeout=None, world_size=None, ips=Vec::new(), group_id=None,
    fanout=None, verbose=false, namespace=None, server=None, kubeconfig=None, seed=true))]
#[allow(clippy::too_many_arguments)]
fn get(
    py: Python<'_>,
    key: String,
    dest: String,
    force: bool,
    contents: bool,
    excludes: Vec<String>,
    includes: Vec<String>,
    window_timeout: Option<f64>,
    world_size: Option<u32>,
    ips: Vec<String>,
    group_id: Option<String>,
    fanout: Option<u32>,
    verbose: bool,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
    seed: bool,
) -> PyResult<String> {
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let key = KeyPath::parse(&key).map_err(|e| Failure::from(e).into_err())?;
    let spec = window(window_timeout, world_size, ips, group_id, fanout);
    run(py, async move {
        let forward = t.reach().await?;
        let pb = ktfs::transfer::progress_bar(verbose);
        let report = getting::get(
            GetOptions {
                server: t.server,
                credential: t.credential,
                namespace: t.namespace,
                key,
                dest,
                contents,
                force,
                excludes,
                includes,
                seed,
                agent_socket: t.agent,
                window: spec,
                bwlimit: None,
                store_only: forward.is_some(),
                preserve: Default::default(),
                remotes: Remotes {
                    store: None,
                    peers: peers().clone(),
                },
            },
            &pb,
        )
        .await
        .map_err(|e| Failure::of(Some(e.fault()), e))?;
        pb.finish_and_clear();
        json(&report)
    })
}

/// The entries below `key` (or the namespace's root), as JSON: name (`/` after a directory),
/// is_directory, locale (`store`, or the publishing node of a local key), size.
#[pyfunction]
#[pyo3(signature = (key="", recursive=false, namespace=None, server=None, kubeconfig=None))]
fn ls(
    py: Python<'_>,
    key: &str,
    recursive: bool,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
) -> PyResult<String> {
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let prefix = KeyPath::parse_prefix(key).map_err(|e| Failure::from(e).into_err())?;
    let shown = key.to_string();
    run(py, async move {
        let _forward = t.reach().await?;
        let store = client::connect_store(&t.server, &t.credential).await?;
        let resp = store
            .list_all(ListRequest {
                namespace: t.namespace.to_string(),
                prefix: prefix.map(|p| p.to_string()).unwrap_or_default(),
                recursive,
                ..Default::default()
            })
            .await?;
        if !resp.exists {
            return Err(Failure::of(
                Some(Fault::NotFound),
                format!("key {shown} not found"),
            ));
        }
        let entries: Vec<serde_json::Value> = resp
            .entries
            .into_iter()
            .map(|e| {
                let locale = if e.locale() == Locale::Local && !e.origin_node.is_empty() {
                    e.origin_node.clone()
                } else {
                    "store".into()
                };
                serde_json::json!({
                    "name": e.name,
                    "is_directory": e.is_directory,
                    "locale": locale,
                    "size": e.size,
                })
            })
            .collect();
        json(&entries)
    })
}

/// Removes keys; returns the keys removed.
#[pyfunction]
#[pyo3(signature = (key, recursive=false, prefix=false, namespace=None, server=None,
    kubeconfig=None))]
fn rm(
    py: Python<'_>,
    key: &str,
    recursive: bool,
    prefix: bool,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
) -> PyResult<Vec<String>> {
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let key = KeyPath::parse(key).map_err(|e| Failure::from(e).into_err())?;
    run(py, async move {
        let _forward = t.reach().await?;
        let store = client::connect_store(&t.server, &t.credential).await?;
        Ok(store
            .remove(RemoveRequest {
                namespace: t.namespace.to_string(),
                key: key.to_string(),
                recursive,
                prefix,
                gpu_registration: 0,
                watcher: 0,
            })
            .await?
            .removed)
    })
}

/// Blocks fetched by [`read_range`] in this process, for tests and tools.
static BLOCKS_FETCHED: AtomicU64 = AtomicU64::new(0);

/// `length` bytes of the file at `key` from `offset`: only the blocks that cover the range are
/// fetched.
#[pyfunction]
#[pyo3(signature = (key, offset, length, namespace=None, server=None, kubeconfig=None))]
fn read_range<'py>(
    py: Python<'py>,
    key: &str,
    offset: u64,
    length: u64,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let key = KeyPath::parse(key).map_err(|e| Failure::from(e).into_err())?;
    let got = run(py, async move {
        let _forward = t.reach().await?;
        let store = client::connect_store(&t.server, &t.credential).await?;
        read::read_range(
            peers(),
            &store,
            &t.server,
            t.namespace.as_str(),
            &key,
            offset,
            length,
        )
        .await
        .map_err(|e| Failure::of(Some(e.fault()), e))
    })?;
    BLOCKS_FETCHED.fetch_add(got.blocks_fetched as u64, Ordering::Relaxed);
    Ok(PyBytes::new(py, &got.data))
}

/// How many blocks [`read_range`] has fetched in this process.
#[pyfunction]
fn blocks_fetched() -> u64 {
    BLOCKS_FETCHED.load(Ordering::Relaxed)
}

/// What is at `key`, as JSON: `{"type": "file", "size", "mtime"}`, `{"type": "directory"}` or
/// `{"type": "symlink", "target"}`.
#[pyfunction]
#[pyo3(signature = (key, namespace=None, server=None, kubeconfig=None))]
fn stat(
    py: Python<'_>,
    key: &str,
    namespace: Option<String>,
    server: Option<String>,
    kubeconfig: Option<String>,
) -> PyResult<String> {
    let mut t = target(server, namespace, kubeconfig).map_err(Failure::into_err)?;
    let key = KeyPath::parse(key).map_err(|e| Failure::from(e).into_err())?;
    run(py, async move {
        let _forward = t.reach().await?;
        let store = client::connect_store(&t.server, &t.credential).await?;
        let st = read::stat(&store, t.namespace.as_str(), &key)
            .await
            .map_err(|e| Failure::of(Some(e.fault()), e))?;
        json(&match st {
            Stat::File { size, mtime_sec } => {
                serde_json::json!({ "type": "file", "size": size, "mtime": mtime_sec })
            }
            Stat::Directory => serde_json::json!({ "type": "directory", "size": 0 }),
            Stat::Symlink { target } => {
                serde_json::json!({ "type": "symlink", "size": 0, "target": target })
            }
        })
    })
}

/// The GPU control files' ABI as the mount decodes it (sizes and command numbers), for the
/// package's ctypes structures to be checked against.
#[pyfunction]
fn gpu_abi() -> std::collections::HashMap<&'static str, u64> {
    use ktfs::gpu::abi::*;
    use std::mem::size_of;
    [
        ("version", u64::from(ABI_VERSION)),
        ("batch", BATCH as u64),
        ("buffer", size_of::<KtGpuBuffer>() as u64),
        ("buffers", size_of::<KtGpuBuffers>() as u64),
        ("window", size_of::<KtGpuWindow>() as u64),
        ("status", size_of::<KtGpuStatus>() as u64),
        ("put", u64::from(KT_GPU_PUT)),
        ("get", u64::from(KT_GPU_GET)),
        ("join", u64::from(KT_GPU_JOIN)),
        ("status_cmd", u64::from(KT_GPU_STATUS)),
    ]
    .into_iter()
    .collect()
}

#[pymodule]
mod _native {
    #[pymodule_export]
    use super::{blocks_fetched, get, gpu_abi, ls, put, read_range, rm, stat};
}
