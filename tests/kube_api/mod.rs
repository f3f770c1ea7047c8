//! A fake Kubernetes API server for tests: plain HTTP on 127.0.0.x, just the calls ktfs makes
//! (get a node, get a service, list pods by label, and the pod port-forward WebSocket in the
//! `v4.channel.k8s.io` protocol, which it serves by connecting to a real address, as a kubelet
//! connects to the pod; get a pod; TokenReview, and TokenRequest for the ServiceAccounts it
//! holds). It records every port a port-forward asked for, every review and every pod got.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

/// What the fake cluster holds.
#[derive(Clone, Default)]
pub struct World {
    /// Node name -> labels.
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// Services as JSON objects, by "namespace/name".
    pub services: BTreeMap<String, serde_json::Value>,
    /// Pods as JSON objects (with metadata.namespace and metadata.labels).
    pub pods: Vec<serde_json::Value>,
    /// Where a port-forward to any pod connects.
    pub pod_target: Option<SocketAddr>,
    /// Tokens TokenReview knows: token -> (user name, the audiences it was issued for).
    pub tokens: BTreeMap<String, (String, Vec<String>)>,
    /// Tokens bound to a pod: token -> the node the pod runs on (TokenReview says so in the
    /// user's extra, as Kubernetes 1.30 and later do).
    pub token_nodes: BTreeMap<String, String>,
    /// Tokens bound to a pod: token -> the pod's name, which TokenReview names alone (as
    /// Kubernetes 1.21 to 1.29 do) where `token_nodes` has no entry; the pod is in `pods`.
    pub token_pods: BTreeMap<String, String>,
    /// ServiceAccounts ("namespace/name") whose tokens the kubeconfig's user may request.
    pub service_accounts: Vec<String>,
}

impl World {
    /// A cluster whose kt-system/kt-store Service selects one pod, shaped as deploy/ defines
    /// them: Service port 7447 with the named target port `kt`. The container's port `kt` is
    /// 7448 here (7447 in deploy/), so that a forward to the right port shows the name was
    /// looked up.
    pub fn with_store(pod_target: SocketAddr, phase: &str) -> World {
        let mut w = World {
            pod_target: Some(pod_target),
            ..Default::default()
        };
        w.services.insert(
            "kt-system/kt-store".into(),
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kt-store", "namespace": "kt-system"},
                "spec": {
                    "selector": {"app.kubernetes.io/name": "kt-store"},
                    "ports": [{"name": "kt", "port": 7447, "targetPort": "kt"}]
                }
            }),
        );
        w.pods.push(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "kt-store-0", "namespace": "kt-system",
                "labels": {"app.kubernetes.io/name": "kt-store"}
            },
            "spec": {"containers": [{
                "name": "store", "image": "ktfs",
                "ports": [{"name": "kt", "containerPort": 7448}]
            }]},
            "status": {"phase": phase}
        }));
        w
    }
}

/// What the fake has seen and issued.
#[derive(Default)]
pub struct Seen {
    /// Tokens issued by TokenRequest, as `World::tokens`.
    pub issued: BTreeMap<String, (String, Vec<String>)>,
    /// The specs of every TokenReview asked.
    pub reviews: Vec<serde_json::Value>,
    /// Every pod got by name ("namespace/name").
    pub pods_got: Vec<String>,
}

pub struct FakeApi {
    pub addr: SocketAddr,
    /// Ports that port-forward requests asked for, in order.
    pub forwarded_ports: Arc<Mutex<Vec<u16>>>,
    pub seen: Arc<Mutex<Seen>>,
    /// Serves until the fake is dropped.
    _runtime: tokio::runtime::Runtime,
}

impl FakeApi {
    pub fn start(ip: &str, world: World) -> FakeApi {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(TcpListener::bind(format!("{ip}:0")))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarded_ports = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (world, ports, seen2) = (Arc::new(world), forwarded_ports.clone(), seen.clone());
        runtime.spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let (world, ports, seen) = (world.clone(), ports.clone(), seen2.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &world, &ports, &seen).await;
                });
            }
        });
        FakeApi {
            addr,
            forwarded_ports,
            seen,
            _runtime: runtime,
        }
    }

    /// A kubeconfig file for this server, written into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\nusers:\n- name: fake\n  user:\n    token: not-a-secret\n",
                self.addr
            ),
        )
        .unwrap();
        path
    }
}

/// The head of an HTTP request, read without consuming it (a WebSocket handshake reads it
/// again).
async fn peek_head(conn: &TcpStream) -> std::io::Result<String> {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = conn.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(end) = buf[..n].windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(String::from_utf8_lossy(&buf[..end + 4]).into_owned());
        }
        if n == buf.len() {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        conn.readable().await?;
    }
}

async fn serve(
    mut conn: TcpStream,
    world: &World,
    ports: &Mutex<Vec<u16>>,
    seen: &Mutex<Seen>,
) -> std::io::Result<()> {
    let head = peek_head(&conn).await?;
    let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    if head.to_ascii_lowercase().contains("upgrade: websocket") {
        let port = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("ports="))
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or(0);
        ports.lock().unwrap().push(port);
        return port_forward(conn, port, world.pod_target).await;
    }
    let mut consumed = vec![0u8; head.len()];
    conn.read_exact(&mut consumed).await?;
    let (status, body) = if head.starts_with("POST ") {
        let length = header(&head, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length.min(1 << 20)];
        conn.read_exact(&mut body).await?;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        post(world, seen, path, &body)
    } else {
        route(world, seen, path, query)
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The strings of a JSON array (none for anything else).
fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// TokenReview and TokenRequest.
fn post(
    world: &World,
    seen: &Mutex<Seen>,
    path: &str,
    body: &serde_json::Value,
) -> (&'static str, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut seen = seen.lock().unwrap();
    match parts.as_slice() {
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => {
            let spec = body["spec"].clone();
            seen.reviews.push(spec.clone());
            let token = spec["token"].as_str().unwrap_or_default();
            let asked = strings(&spec["audiences"]);
            let known = world.tokens.get(token).or_else(|| seen.issued.get(token));
            // A token is good for the audiences it was issued for; none asked means the API
            // server's own, which the fake calls "api".
            let status = match known {
                Some((user, auds))
                    if (asked.is_empty() && auds.iter().any(|a| a == "api"))
                        || asked.iter().any(|a| auds.contains(a)) =>
                {
                    let mut user = serde_json::json!({"username": user});
                    if let Some(node) = world.token_nodes.get(token) {
                        user["extra"] = serde_json::json!({
                            "authentication.kubernetes.io/node-name": [node]
                        });
                    } else if let Some(pod) = world.token_pods.get(token) {
                        user["extra"] = serde_json::json!({
                            "authentication.kubernetes.io/pod-name": [pod]
                        });
                    }
                    serde_json::json!({"authenticated": true, "user": user, "audiences": asked})
                }
                Some(_) => serde_json::json!({"authenticated": false,
                                              "error": "token audiences do not match"}),
                None => {
                    serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
                }
            };
            (
                "201 Created",
                serde_json::json!({
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "metadata": {}, "spec": spec, "status": status
                })
                .to_string(),
            )
        }
        ["api", "v1", "namespaces", ns, "serviceaccounts", name, "token"] => {
            if !world.service_accounts.contains(&format!("{ns}/{name}")) {
                return (
                    "403 Forbidden",
                    serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("cannot create serviceaccounts/token {ns}/{name}"),
                        "reason": "Forbidden", "code": 403
                    })
                    .to_string(),
                );
            }
            let auds = strings(&body["spec"]["audiences"]);
            let token = format!("issued-{ns}-{name}-{}", seen.issued.len());
            seen.issued.insert(
                token.clone(),
                (format!("system:serviceaccount:{ns}:{name}"), auds),
            );
            (
                "201 Created",
                serde_json::json!({
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "metadata": {"name": name, "namespace": ns}, "spec": body["spec"],
                    "status": {"token": token, "expirationTimestamp": "2100-01-01T00:00:00Z"}
                })
                .to_string(),
            )
        }
        _ => not_found(path),
    }
}

fn not_found(what: &str) -> (&'static str, String) {
    (
        "404 Not Found",
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{what} not found"), "reason": "NotFound", "code": 404
        })
        .to_string(),
    )
}

fn route(world: &World, seen: &Mutex<Seen>, path: &str, query: &str) -> (&'static str, String) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "nodes", name] => match world.nodes.get(*name) {
            Some(labels) => (
                "200 OK",
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": labels}
                })
                .to_string(),
            ),
            None => not_found(&format!("node {name}")),
        },
        ["api", "v1", "namespaces", ns, "services", name] => {
            match world.services.get(&format!("{ns}/{name}")) {
                Some(s) => ("200 OK", s.to_string()),
                None => not_found(&format!("service {ns}/{name}")),
            }
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            seen.lock().unwrap().pods_got.push(format!("{ns}/{name}"));
            match world
                .pods
                .iter()
                .find(|p| p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name)
            {
                Some(p) => ("200 OK", p.to_string()),
                None => not_found(&format!("pod {ns}/{name}")),
            }
        }
        ["api", "v1", "namespaces", ns, "pods"] => {
            let selector = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("labelSelector="))
                .map(percent_decode)
                .unwrap_or_default();
            let items: Vec<&serde_json::Value> = world
                .pods
                .iter()
                .filter(|p| p["metadata"]["namespace"] == *ns)
                .filter(|p| {
                    selector.split(',').filter(|s| !s.is_empty()).all(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        p["metadata"]["labels"][k] == v
                    })
                })
                .collect();
            (
                "200 OK",
                serde_json::json!({
                    "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items
                })
                .to_string(),
            )
        }
        _ => not_found(path),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One port-forward: channel 0 carries the data, channel 1 errors; each starts with the port.
#[allow(clippy::result_large_err)] // the handshake callback's type is tungstenite's
async fn port_forward(
    conn: TcpStream,
    port: u16,
    target: Option<SocketAddr>,
) -> std::io::Result<()> {
    let ws = tokio_tungstenite::accept_hdr_async(conn, |_req: &Request, mut resp: Response| {
        resp.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        Ok(resp)
    })
    .await
    .map_err(std::io::Error::other)?;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let [lo, hi] = port.to_le_bytes();
    for ch in [0u8, 1] {
        ws_tx
            .send(Message::Binary(vec![ch, lo, hi].into()))
            .await
            .map_err(std::io::Error::other)?;
    }
    let Some(target) = target else {
        let mut msg = vec![1u8];
        msg.extend_from_slice(b"no pod to forward to");
        let _ = ws_tx.send(Message::Binary(msg.into())).await;
        return Ok(());
    };
    let pod = TcpStream::connect(target).await?;
    let (mut pod_rx, mut pod_tx) = pod.into_split();
    let up = async {
        while let Some(Ok(msg)) = ws_rx.next().await {
            match msg {
                Message::Binary(b) if b.len() > 1 && b[0] == 0 => {
                    let written = pod_tx.write_all(&b[1..]).await;
                    if written.is_err() {
                        break;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = pod_tx.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match pod_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut msg = Vec::with_capacity(n + 1);
                    msg.push(0u8);
                    msg.extend_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(msg.into())).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.close().await;
    };
    tokio::join!(up, down);
    Ok(())
}
