//! The store server's gRPC handlers, called over a real connection to a real server (its auth
//! layer, its handler, RocksDB in a temporary directory), started once for the whole process:
//! state carries over between runs, as it does between a server's callers.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use prost::Message;
use tonic::transport::Channel;
use tonic::{Code, Status};

use ktfs::proto::store_client::StoreClient;
use ktfs::proto::*;
use ktfs::server::StoreServerProcess;

use crate::rt::runtime;

/// Longer than any call takes on loopback: reaching it means a handler hangs.
const HANG: Duration = Duration::from_secs(10);
/// Calls in one input at most: enough to publish, then resolve, rename, link and remove.
const MAX_CALLS: usize = 16;
/// The RPCs of `service Store`, in the order a call's first byte picks them.
pub const RPCS: usize = 23;
/// The pick of `Watch`: the stream stays open for the calls after it in the input.
const WATCH: usize = 22;

struct Server {
    client: StoreClient<Channel>,
    dir: PathBuf,
}

static SERVER: OnceLock<Server> = OnceLock::new();

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("ktfs-fuzz-grpc-")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        runtime().block_on(async {
            let srv = StoreServerProcess::bind("127.0.0.242:0", &dir, Duration::from_secs(15))
                .await
                .expect("a store server")
                .with_gc(None);
            let addr = srv.local_addr().expect("its address");
            tokio::spawn(async move {
                srv.run(std::future::pending())
                    .await
                    .expect("the server runs");
            });
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("an endpoint")
                .connect_lazy();
            Server {
                client: StoreClient::new(channel),
                dir,
            }
        })
    })
}

/// Removes the server's data directory; for the end of a process that ran [`grpc_handlers`].
pub fn remove_grpc_store() {
    if let Some(s) = SERVER.get() {
        let _ = std::fs::remove_dir_all(&s.dir);
    }
}

/// A sequence of calls: `[rpc][len u16 LE][len bytes of its request, protobuf]`, up to
/// [`MAX_CALLS`]. A request that does not decode is skipped (the server's decoder is prost's,
/// fuzzed by others). Every answer is a value or a fault the caller caused; a fault of the
/// server (internal, unknown, a dropped connection) or a hang is a finding, and so is a call
/// that succeeds without doing what it said (a key published, renamed or removed and then not
/// resolving so).
pub fn grpc_handlers(input: &[u8]) {
    let s = server();
    let mut client = s.client.clone();
    let mut rest = input;
    let mut calls = 0;
    runtime().block_on(async {
        let mut watch = None;
        while rest.len() >= 3 && calls < MAX_CALLS {
            let pick = rest[0] as usize % RPCS;
            let len = u16::from_le_bytes([rest[1], rest[2]]) as usize;
            let len = len.min(rest.len() - 3);
            let body = &rest[3..3 + len];
            rest = &rest[3 + len..];
            calls += 1;
            match pick {
                WATCH => watch_call(&mut client, &mut watch, body).await,
                _ => call(&mut client, pick, body).await,
            }
        }
        if let Some(w) = watch {
            w.end().await;
        }
    });
}

/// Fails on a fault that is the server's, not the caller's.
fn judged<T>(what: &str, r: Result<tonic::Response<T>, Status>) -> Option<T> {
    match r {
        Ok(r) => Some(r.into_inner()),
        Err(s) => {
            assert!(
                !matches!(
                    s.code(),
                    Code::Internal
                        | Code::Unknown
                        | Code::Unavailable
                        | Code::Cancelled
                        | Code::DataLoss
                        | Code::Unimplemented
                ),
                "{what}: the server failed: {s:?}"
            );
            None
        }
    }
}

macro_rules! rpc {
    ($client:ident . $method:ident ($req:expr)) => {{
        let r = tokio::time::timeout(HANG, $client.$method($req))
            .await
            .unwrap_or_else(|_| panic!("{} hung for 10 s", stringify!($method)));
        judged(stringify!($method), r)
    }};
}

macro_rules! decoded {
    ($t:ty, $body:expr) => {
        match <$t>::decode($body) {
            Ok(r) => r,
            Err(_) => return,
        }
    };
}

/// An item of a batch answered with an error: one the caller caused, not the server.
fn refused_by_caller(what: &str, code: i32, message: &str) {
    let code = Code::from(code);
    assert!(
        !matches!(
            code,
            Code::Internal | Code::Unknown | Code::DataLoss | Code::Ok
        ),
        "{what:?}: the server failed: {code:?} {message}"
    );
}

async fn resolve(c: &mut StoreClient<Channel>, namespace: &str, key: &str) -> ResolveResponse {
    let req = ResolveRequest {
        namespace: namespace.to_string(),
        key: key.to_string(),
        ..Default::default()
    };
    rpc!(c.resolve(req)).unwrap_or_else(|| panic!("{key:?} does not resolve"))
}

/// A watch an input opened: a mount's lease, held while the input's later calls run, so that
/// every change they make waits on it. One that acknowledges answers every change as a mount
/// does; one that does not makes each change wait for its lease to run out (3 s), and never
/// longer (the calls' hang check).
struct Watch {
    up: tokio::sync::mpsc::Sender<WatchUp>,
    /// Renewals sent, which the server's `renewed` answers must name.
    renews: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Ends the stream and takes the reader's verdict (its panic is this input's finding).
    async fn end(self) {
        drop(self.up);
        match tokio::time::timeout(HANG, self.reader).await {
            Err(_) => panic!("a watch's stream did not end once its watcher left"),
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(_) => {}
        }
    }
}

/// `Watch`: the first pick opens the stream with the request as its first message, later picks
/// send theirs up the open stream (any `acked` and `renew`, in any order).
async fn watch_call(c: &mut StoreClient<Channel>, open: &mut Option<Watch>, body: &[u8]) {
    let up = decoded!(WatchUp, body);
    if let Some(w) = open {
        if up.renew != 0 {
            ktfs::locks::lock(&w.renews).push(up.renew);
        }
        // The server may have dropped this watcher already (a lease it let run out).
        let _ = w.up.send(up).await;
        return;
    }
    let acks = (up.acked ^ up.renew) & 1 == 0;
    let renews = std::sync::Arc::new(std::sync::Mutex::new(vec![up.renew]));
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tx.send(up).await.expect("the stream's first message");
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let Some(mut down) = rpc!(c.watch(stream)) else {
        return;
    };
    // Weak: the stream ends when the input drops its sender, not when this task does.
    let (answer, sent) = (tx.downgrade(), renews.clone());
    let reader = tokio::spawn(async move {
        let (mut first, mut seq) = (true, 0);
        // Until the server drops the watcher or the input ends it.
        while let Ok(Some(d)) = down.message().await {
            if first {
                assert_ne!(d.watcher, 0, "a watch's first answer names no watcher");
                first = false;
            }
            if d.renewed != 0 {
                assert!(
                    ktfs::locks::lock(&sent).contains(&d.renewed),
                    "a renewal of {} that was not asked for",
                    d.renewed
                );
                assert!(d.lease_ms > 0, "a lease renewed for no time");
            }
            if d.seq != 0 {
                assert!(d.seq > seq, "change {} told after {seq}", d.seq);
                assert!(
                    (1..=256).contains(&d.paths.len()),
                    "change {} names {} paths",
                    d.seq,
                    d.paths.len()
                );
                seq = d.seq;
                if let (true, Some(answer)) = (acks, answer.upgrade()) {
                    let _ = answer
                        .send(WatchUp {
                            acked: seq,
                            ..Default::default()
                        })
                        .await;
                }
            }
        }
    });
    *open = Some(Watch {
        up: tx,
        renews,
        reader,
    });
}

async fn call(c: &mut StoreClient<Channel>, pick: usize, body: &[u8]) {
    match pick {
        0 => {
            let _ = rpc!(c.register_node(decoded!(RegisterNodeRequest, body)));
        }
        1 => {
            let _ = rpc!(c.heartbeat(decoded!(HeartbeatRequest, body)));
        }
        2 => {
            let _ = rpc!(c.missing_blocks(decoded!(MissingBlocksRequest, body)));
        }
        3 => publish_then_resolve(c, body).await,
        4 => publish_gpu_then_resolve(c, body).await,
        5 => {
            let _ = rpc!(c.resolve(decoded!(ResolveRequest, body)));
        }
        6 => list_then_each_ahead(c, body).await,
        7 => remove_then_resolve(c, body).await,
        8 => {
            let _ = rpc!(c.add_location(decoded!(AddLocationRequest, body)));
        }
        9 => rename_then_find(c, body).await,
        10 => {
            let req = decoded!(LinkRequest, body);
            let (ns, to) = (req.namespace.clone(), req.to.clone());
            if rpc!(c.link(req)).is_some() {
                resolve(c, &ns, &to).await;
            }
        }
        11 => {
            let _ = rpc!(c.set_attr(decoded!(SetAttrRequest, body)));
        }
        12 => {
            let mut req = decoded!(JoinRequest, body);
            // Waiting for a quorum that no other caller completes is waiting by design.
            req.wait_quorum = false;
            let _ = rpc!(c.join_broadcast(req));
        }
        13 => {
            let _ = rpc!(c.new_parent(decoded!(NewParentRequest, body)));
        }
        14 => {
            let _ = rpc!(c.leave_broadcast(decoded!(LeaveRequest, body)));
        }
        15 => {
            let _ = rpc!(c.get_window(decoded!(GetWindowRequest, body)));
        }
        16 => {
            let _ = rpc!(c.join_gpu_window(decoded!(GpuJoinRequest, body)));
        }
        17 => {
            let mut req = decoded!(GpuAwaitRequest, body);
            // The server holds the call as long as asked (up to 5 s): a slow run, no finding.
            req.wait_ms = req.wait_ms.min(20);
            let _ = rpc!(c.await_gpu_window(req));
        }
        18 => {
            let _ = rpc!(c.finish_gpu_window(decoded!(GpuFinishRequest, body)));
        }
        19 => publish_batch_then_resolve(c, body).await,
        20 => {
            let _ = rpc!(c.swarm_sync(decoded!(SwarmSyncRequest, body)));
        }
        _ => resolve_many_then_each(c, body).await,
    }
}

/// `Publish`: a key published resolves to the version published, as a key of its own, with a
/// valid manifest.
async fn publish_then_resolve(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(PublishRequest, body);
    let (ns, key) = (req.namespace.clone(), req.key.clone());
    if let Some(done) = rpc!(c.publish(req)) {
        let found = resolve(c, &ns, &key).await;
        assert_eq!(
            found.version, done.version,
            "{key:?} resolves to another version"
        );
        assert!(
            found.subpath.is_empty(),
            "{key:?} resolves inside another key"
        );
        let m = found.manifest.expect("a resolved key's manifest");
        assert!(
            ktfs::manifest::validate(&m).is_ok(),
            "a stored manifest is invalid"
        );
    }
}

/// `PublishGpu`: a GPU key published resolves to the version published.
async fn publish_gpu_then_resolve(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(PublishGpuRequest, body);
    let (ns, key) = (req.namespace.clone(), req.key.clone());
    if let Some(done) = rpc!(c.publish_gpu(req)) {
        let found = resolve(c, &ns, &key).await;
        assert_eq!(
            found.version, done.version,
            "{key:?} resolves to another version"
        );
    }
}

/// `List`: what a listing brings ahead is bounded, and each listing brought ahead is the one
/// its own request gives.
async fn list_then_each_ahead(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(ListRequest, body);
    let ns = req.namespace.clone();
    if let Some(l) = rpc!(c.list(req)) {
        let n: usize = l.ahead.iter().map(|a| a.entries.len()).sum();
        assert!(n <= 8192, "{n} entries listed ahead");
        // Each listing brought ahead is the one its own request gives (nothing
        // changes between the two: this harness is the only caller).
        for a in l.ahead.iter().take(4) {
            let own = rpc!(c.list(ListRequest {
                namespace: ns.clone(),
                prefix: a.path.clone(),
                ..Default::default()
            }));
            assert!(
                own.is_some_and(|o| o.exists && o.entries == a.entries && o.dir == a.dir),
                "{:?} listed ahead is not its own listing",
                a.path
            );
        }
    }
}

/// `Remove`: no name it says it removed resolves as itself any more.
async fn remove_then_resolve(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(RemoveRequest, body);
    let ns = req.namespace.clone();
    if let Some(done) = rpc!(c.remove(req)) {
        for name in &done.removed {
            let req = ResolveRequest {
                namespace: ns.clone(),
                key: name.clone(),
                ..Default::default()
            };
            let r = tokio::time::timeout(HANG, c.resolve(req))
                .await
                .expect("hung");
            if let Ok(r) = r {
                let r = r.into_inner();
                assert!(
                    r.key != *name || !r.subpath.is_empty(),
                    "{name:?} removed and still resolves"
                );
            }
        }
    }
}

/// `Rename`: the name renamed to resolves, or lists as a directory.
async fn rename_then_find(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(RenameRequest, body);
    let (ns, to) = (req.namespace.clone(), req.to.clone());
    if rpc!(c.rename(req)).is_some() {
        // A prefix that is no key (a directory of keys) moves as one: then `to` lists.
        let key = tokio::time::timeout(
            HANG,
            c.resolve(ResolveRequest {
                namespace: ns.clone(),
                key: to.clone(),
                ..Default::default()
            }),
        )
        .await
        .expect("resolve hung");
        if key.is_err() {
            let dir = rpc!(c.list(ListRequest {
                namespace: ns,
                prefix: to.clone(),
                dir_only: true,
                ..Default::default()
            }));
            assert!(
                dir.is_some_and(|d| d.exists),
                "{to:?} renamed to and neither resolves nor lists"
            );
        }
    }
}

/// `PublishBatch`: one answer per item, each key resolving to its last item's version, and
/// each refused item refused for a fault of the caller's.
async fn publish_batch_then_resolve(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(PublishBatchRequest, body);
    let (ns, keys) = (
        req.namespace.clone(),
        req.items.iter().map(|i| i.key.clone()).collect::<Vec<_>>(),
    );
    if let Some(done) = rpc!(c.publish_batch(req)) {
        assert_eq!(
            done.results.len(),
            keys.len(),
            "a batch answered another count"
        );
        for (i, (key, r)) in keys.iter().zip(&done.results).enumerate() {
            match &r.published {
                // The key's last item in the batch is what it resolves to.
                Some(p) if !keys[i + 1..].contains(key) => {
                    let found = resolve(c, &ns, key).await;
                    assert_eq!(
                        found.version, p.version,
                        "{key:?} resolves to another version"
                    );
                }
                Some(_) => {}
                None => refused_by_caller("a batch item", r.code, &r.message),
            }
        }
    }
}

/// `ResolveMany`: one answer per key, each the one a resolve of its own gives, and no more
/// than 1 MiB of blocks inline in all.
async fn resolve_many_then_each(c: &mut StoreClient<Channel>, body: &[u8]) {
    let req = decoded!(ResolveManyRequest, body);
    let (ns, keys) = (req.namespace.clone(), req.keys.clone());
    let Some(done) = rpc!(c.resolve_many(req)) else {
        return;
    };
    assert_eq!(done.results.len(), keys.len(), "answers to another count");
    let mut inline = 0;
    for (key, r) in keys.iter().zip(&done.results) {
        match &r.resolved {
            // Each answer is what a resolve of its own answers.
            Some(found) => {
                let alone = resolve(c, &ns, key).await;
                assert_eq!(found.version, alone.version, "{key:?}: another version");
                assert_eq!(found.subpath, alone.subpath, "{key:?}: another subpath");
                inline += found
                    .inline_blocks
                    .iter()
                    .map(|b| b.data.len())
                    .sum::<usize>();
            }
            None => refused_by_caller(key, r.code, &r.message),
        }
    }
    assert!(inline <= 1 << 20, "{inline} bytes inline in one answer");
}
