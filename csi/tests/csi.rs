//! kt-csi over its unix socket, driven as the kubelet and the external provisioner drive it:
//! a real store server, real `kt mount` processes, real FUSE and bind mounts.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kt_csi::proto::controller_service_capability;
use kt_csi::proto::plugin_capability;
use kt_csi::proto::volume_capability::access_mode::Mode;
use kt_csi::proto::*;
use tonic::Code;

fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// A CreateVolume for a PVC of namespace `default` whose StorageClass has `params`, as the
/// external provisioner sends it (`--extra-create-metadata`).
fn create_req(name: &str, params: &[(&str, &str)]) -> CreateVolumeRequest {
    let mut parameters = map(&[
        ("csi.storage.k8s.io/pvc/name", "data"),
        (PVC_NAMESPACE, "default"),
        ("csi.storage.k8s.io/pv/name", name),
    ]);
    parameters.extend(map(params));
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter)],
        parameters,
        ..Default::default()
    }
}

/// A NodePublishVolume of a persistent volume for a pod in the volume's own namespace, as the
/// kubelet sends it (the CSIDriver has `podInfoOnMount`).
fn publish_req(volume: &Volume, target: &Path, readonly: bool) -> NodePublishVolumeRequest {
    publish_req_for(
        &volume.volume_context["namespace"],
        volume,
        target,
        readonly,
    )
}

/// The same for a pod in namespace `pod_ns`.
fn publish_req_for(
    pod_ns: &str,
    volume: &Volume,
    target: &Path,
    readonly: bool,
) -> NodePublishVolumeRequest {
    let mut volume_context = volume.volume_context.clone();
    volume_context.extend(pod_info(pod_ns, false));
    NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap(if readonly {
            Mode::MultiNodeReaderOnly
        } else {
            Mode::MultiNodeMultiWriter
        })),
        readonly,
        volume_context,
        ..Default::default()
    }
}

/// What the kubelet adds to a volume context for a pod in namespace `ns`, over what the pod's
/// author wrote.
fn pod_info(ns: &str, ephemeral: bool) -> HashMap<String, String> {
    map(&[
        (POD_NAMESPACE, ns),
        ("csi.storage.k8s.io/pod.name", "pod"),
        (
            "csi.storage.k8s.io/pod.uid",
            "0f6d1a3e-55aa-4a1b-9c1e-2b7d8e9f0a11",
        ),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        (EPHEMERAL, if ephemeral { "true" } else { "false" }),
    ])
}

/// An inline volume of a pod in namespace `pod_ns` whose author wrote `attrs`.
fn inline_req(
    pod_ns: &str,
    attrs: &[(&str, &str)],
    target: &Path,
    readonly: bool,
) -> NodePublishVolumeRequest {
    let mut volume_context = map(attrs);
    volume_context.extend(pod_info(pod_ns, true));
    NodePublishVolumeRequest {
        volume_id: format!("csi-{}", target.file_name().unwrap().to_string_lossy()),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap(if readonly {
            Mode::SingleNodeReaderOnly
        } else {
            Mode::SingleNodeWriter
        })),
        readonly,
        volume_context,
        ..Default::default()
    }
}

fn unpublish_req(volume_id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    }
}

/// The `kt agent` processes whose command line names a socket in kt-csi's `agents/` state
/// directory (not their keeper, whose command line names it too).
fn agent_processes(dirs: &CsiDirs) -> Vec<u32> {
    let agents = dirs.state().join("agents").display().to_string();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            (args.get(1) == Some(&&b"agent"[..])
                && String::from_utf8_lossy(&cmdline).contains(&agents))
            .then_some(pid)
        })
        .collect();
    pids.sort();
    pids
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces; the state and ppid follow it.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs a gRPC call with a bound, so that a hang fails the test instead of stalling it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("the call took longer than 120 s")
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_capabilities_and_node_info() {
    let store = Store::start("127.0.0.90");
    let dirs = CsiDirs::new();
    let _csi = start_csi(&dirs, &store, "127.0.0.90", true);
    let mut c = connect(&dirs.socket()).await;

    let info = c
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "kt.ktfs.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let caps = c
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(caps.iter().any(|cap| matches!(
        &cap.r#type,
        Some(plugin_capability::Type::Service(s))
            if s.r#type == plugin_capability::service::Type::ControllerService as i32
    )));

    let probe = c
        .identity
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    let ccaps = c
        .controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(ccaps.iter().any(|cap| matches!(
        &cap.r#type,
        Some(controller_service_capability::Type::Rpc(r))
            if r.r#type == controller_service_capability::rpc::Type::CreateDeleteVolume as i32
    )));

    let ncaps = c
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(ncaps.capabilities.is_empty());

    let ninfo = c
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ninfo.node_id, "test-node");
    assert_eq!(
        ninfo.accessible_topology.unwrap().segments,
        map(&[("topology.kt.ktfs.io/node", "test-node")])
    );

    // Calls outside what kt-csi implements.
    assert_eq!(
        code(
            c.controller
                .list_volumes(ListVolumesRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.node
                .node_stage_volume(NodeStageVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );

    // A node-only plugin has no Controller service at all.
    let node_dirs = CsiDirs::new();
    let _node_csi = start_csi(&node_dirs, &store, "127.0.0.90", false);
    let mut n = connect(&node_dirs.socket()).await;
    assert_eq!(
        code(n.controller.create_volume(create_req("pvc-x", &[])).await),
        Code::Unimplemented
    );
    assert!(n.identity.probe(ProbeRequest {}).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_volume_is_idempotent_and_validates() {
    let store = Store::start("127.0.0.91");
    let dirs = CsiDirs::new();
    let csi = start_csi(&dirs, &store, "127.0.0.91", true);
    let mut c = connect(&dirs.socket()).await;

    let v = the_same_name_is_the_same_volume(&mut c).await;
    the_class_or_the_pvc_names_the_namespace(&mut c).await;
    the_longest_odd_names_are_volumes_of_their_own(&mut c).await;
    bad_create_requests_are_invalid(&mut c).await;
    capabilities_are_validated(&mut c, &v).await;

    // A restarted controller remembers what it created.
    csi.kill();
    let _csi = start_csi(&dirs, &store, "127.0.0.91", true);
    let mut c = connect(&dirs.socket()).await;
    assert_eq!(
        c.controller
            .create_volume(create_req("pvc-a", &[("locale", "local")]))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap(),
        v
    );
    assert_eq!(
        code(
            c.controller
                .create_volume(create_req("pvc-a", &[("namespace", "other")]))
                .await
        ),
        Code::AlreadyExists
    );
}

/// A volume for a PVC `pvc-a`; the same request again gives the same volume, and the same name
/// with other parameters, or another capacity, is ALREADY_EXISTS. Returns the volume.
async fn the_same_name_is_the_same_volume(c: &mut Clients) -> Volume {
    let v = c
        .controller
        .create_volume(create_req("pvc-a", &[("locale", "local")]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.volume_id, "default/pvc-a");
    assert_eq!(
        v.volume_context,
        map(&[
            ("namespace", "default"),
            ("prefix", "pvc-a"),
            ("locale", "local")
        ])
    );
    assert_eq!(v.capacity_bytes, 1 << 30);

    // The same request again: the same volume.
    let again = c
        .controller
        .create_volume(create_req("pvc-a", &[("locale", "local")]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, v);

    // The same name with other parameters, or another capacity: ALREADY_EXISTS.
    assert_eq!(
        code(
            c.controller
                .create_volume(create_req("pvc-a", &[("locale", "store")]))
                .await
        ),
        Code::AlreadyExists
    );
    let mut bigger = create_req("pvc-a", &[("locale", "local")]);
    bigger.capacity_range = Some(CapacityRange {
        required_bytes: 2 << 30,
        limit_bytes: 0,
    });
    assert_eq!(
        code(c.controller.create_volume(bigger).await),
        Code::AlreadyExists
    );
    v
}

/// An explicit namespace and prefix; a class that names no namespace takes the PVC's (and
/// without the PVC's either, there is none); a class that shares its volumes puts the grant in
/// the volume context.
async fn the_class_or_the_pvc_names_the_namespace(c: &mut Clients) {
    let w = c
        .controller
        .create_volume(create_req(
            "pvc-b",
            &[
                ("namespace", "team-b"),
                ("prefix", "svc/data"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ],
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(w.volume_id, "team-b/svc/data");

    // A class that names no namespace: the PVC's. Without the PVC's either, none.
    let mut own = create_req("pvc-own", &[(PVC_NAMESPACE, "team-c")]);
    let v_own = within(c.controller.create_volume(own.clone()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v_own.volume_id, "team-c/pvc-own");
    own.parameters.remove(PVC_NAMESPACE);
    let e = c.controller.create_volume(own).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("--extra-create-metadata"), "{e:?}");

    // A class that shares its volumes: the grant is in the volume context.
    let shared = within(c.controller.create_volume(create_req(
        "pvc-shared",
        &[
            ("namespace", "shared"),
            ("shareWithNamespaces", "team-b, default"),
        ],
    )))
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    assert_eq!(shared.volume_id, "shared/pvc-shared");
    assert_eq!(
        shared
            .volume_context
            .get("shareWithNamespaces")
            .map(String::as_str),
        Some("default,team-b")
    );
}

/// The spec's longest name, of characters it allows that a key or a file name does not take
/// as they are: a volume, the same one again, and another for a name one byte shorter.
async fn the_longest_odd_names_are_volumes_of_their_own(c: &mut Clients) {
    let odd = format!("../ a/b\t\u{e9}/{}xy", "\u{2603}/.".repeat(23));
    assert_eq!(odd.len(), 128);
    let v_odd = within(c.controller.create_volume(create_req(&odd, &[])))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        v_odd.volume_id.starts_with("default/~"),
        "{}",
        v_odd.volume_id
    );
    assert_eq!(
        within(c.controller.create_volume(create_req(&odd, &[])))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap(),
        v_odd
    );
    let shorter = within(c.controller.create_volume(create_req(&odd[..127], &[])))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_ne!(shorter.volume_id, v_odd.volume_id);
}

/// No name, no capabilities, a block volume, or a parameter that is not one kt-csi knows (or
/// not a value it takes).
async fn bad_create_requests_are_invalid(c: &mut Clients) {
    let mut no_name = create_req("", &[]);
    no_name.name.clear();
    assert_eq!(
        code(c.controller.create_volume(no_name).await),
        Code::InvalidArgument
    );
    let mut no_caps = create_req("pvc-c", &[]);
    no_caps.volume_capabilities.clear();
    assert_eq!(
        code(c.controller.create_volume(no_caps).await),
        Code::InvalidArgument
    );
    let mut block = create_req("pvc-c", &[]);
    block.volume_capabilities = vec![block_cap()];
    assert_eq!(
        code(c.controller.create_volume(block).await),
        Code::InvalidArgument
    );
    for params in [
        &[("namespace", "Not_A_Namespace")][..],
        &[("prefix", "a/../b")][..],
        &[("locale", "somewhere")][..],
        &[("colour", "red")][..],
        &[("shareWithNamespaces", "Team")][..],
    ] {
        assert_eq!(
            code(
                c.controller
                    .create_volume(create_req("pvc-c", params))
                    .await
            ),
            Code::InvalidArgument,
            "{params:?}"
        );
    }
}

/// ValidateVolumeCapabilities of volume `v`: mount capabilities are confirmed, a block one is
/// not; an unknown volume is NOT_FOUND and no capabilities INVALID_ARGUMENT.
async fn capabilities_are_validated(c: &mut Clients, v: &Volume) {
    let ok = c
        .controller
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_context: v.volume_context.clone(),
            volume_capabilities: vec![
                mount_cap(Mode::MultiNodeMultiWriter),
                mount_cap(Mode::SingleNodeWriter),
                mount_cap(Mode::MultiNodeReaderOnly),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let confirmed = ok.confirmed.expect("confirmed");
    assert_eq!(confirmed.volume_capabilities.len(), 3);
    let refused = c
        .controller
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(refused.confirmed.is_none() && refused.message.contains("block"));
    assert_eq!(
        code(
            c.controller
                .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id: "no-slash-here".into(),
                    volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
                    ..Default::default()
                })
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller
                .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id: v.volume_id.clone(),
                    ..Default::default()
                })
                .await
        ),
        Code::InvalidArgument
    );
}

/// What the steps of the publish test share: kt-csi (with its controller) on a store, the
/// namespace its volumes are in, and where pods' volumes go. Dropped in this order: kt-csi,
/// its directories, the store.
struct Plugin {
    _csi: Proc,
    dirs: CsiDirs,
    store: Store,
    ns: &'static str,
    pods: PathBuf,
}

impl Plugin {
    fn start(ip: &str, ns: &'static str) -> Self {
        let store = Store::start(ip);
        let dirs = CsiDirs::new();
        let csi = start_csi(&dirs, &store, ip, true);
        let pods = dirs.pods();
        Plugin {
            _csi: csi,
            dirs,
            store,
            ns,
            pods,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_read_write_read_only_unpublish_and_delete() {
    require_fuse();
    let w = Plugin::start("127.0.0.92", "csi-pub");
    let mut c = connect(&w.dirs.socket()).await;
    let c = &mut c;

    let (vol_a, vol_b) = two_volumes(c, &w).await;
    let (t1, pid) = a_read_write_publish_writes_keys(c, &w, &vol_a).await;
    let t2 = a_second_volume_shares_the_mount(c, &w, &vol_b, &t1, pid).await;
    let t3 = a_read_only_publish_refuses_writes(c, &w, &vol_a, &t1).await;
    let t4 = an_inline_volume_mounts_a_prefix(c, &w, pid).await;
    pods_of_other_namespaces_are_refused(c, &w, &vol_a).await;
    let t6 = a_shared_volume_is_read_where_it_is_shared(c, &w).await;
    let t7 = an_odd_name_maps_to_a_prefix(c, &w).await;
    another_namespace_is_served_by_the_same_agent(c, &w, &t1, pid).await;
    bad_publish_requests_are_invalid(c, &w, &vol_a, &t1).await;
    let targets = [&t1, &t2, &t3, &t4, &t6, &t7];
    unpublish_removes_binds_and_targets(c, &w, &vol_a, targets, pid).await;
    delete_volume_removes_its_prefix_alone(c, &w, &vol_a).await;
}

/// Two volumes of namespace `ns`, one of its own prefix.
async fn two_volumes(c: &mut Clients, w: &Plugin) -> (Volume, Volume) {
    let ns = w.ns;
    let vol_a = within(c.controller.create_volume(create_req(
        "pvc-a",
        &[("namespace", ns), ("prefix", "team/a")],
    )))
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    let vol_b = within(
        c.controller
            .create_volume(create_req("pvc-b", &[("namespace", ns)])),
    )
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    (vol_a, vol_b)
}

/// A read-write publish of `vol_a`: kt-csi creates the target, starts the node agent, and the
/// files written there are keys under the prefix, in the namespace. The same publish again is
/// fine, another mode on the same target is not. The target and the agent's pid.
async fn a_read_write_publish_writes_keys(
    c: &mut Clients,
    w: &Plugin,
    vol_a: &Volume,
) -> (PathBuf, u32) {
    let (store, dirs, pods, ns) = (&w.store, &w.dirs, &w.pods, w.ns);
    let t1 = pods.join("pod1-vol");
    within(c.node.node_publish_volume(publish_req(vol_a, &t1, false)))
        .await
        .unwrap();
    let pid = dirs.agent_pid().expect("the node agent");
    assert!(alive(pid));
    std::fs::write(t1.join("hello.txt"), b"hello from a pod\n").unwrap();
    std::fs::create_dir(t1.join("sub")).unwrap();
    std::fs::write(t1.join("sub/data.bin"), pattern(300_000, 1)).unwrap();
    // The files are keys under the prefix, in the namespace.
    assert!(
        eventually(Duration::from_secs(10), || {
            store
                .ls(ns, Some("team/a"))
                .contains(&"hello.txt".to_string())
        }),
        "kt ls -n {ns} team/a: {:?}",
        store.ls(ns, Some("team/a"))
    );
    let got = dirs.dir.path().join("got.txt");
    store.ok(&[
        "get",
        "-n",
        ns,
        "team/a/hello.txt",
        "--dest",
        got.to_str().unwrap(),
        "--no-seed-data",
    ]);
    assert_eq!(std::fs::read(&got).unwrap(), b"hello from a pod\n");

    // Publishing the same volume on the same target again is fine.
    within(c.node.node_publish_volume(publish_req(vol_a, &t1, false)))
        .await
        .unwrap();
    // The same target with another mode is not.
    assert_eq!(
        code(within(c.node.node_publish_volume(publish_req(vol_a, &t1, true))).await),
        Code::AlreadyExists
    );
    (t1, pid)
}

/// A second volume of the namespace shares the same kt mount, and sees its own prefix.
async fn a_second_volume_shares_the_mount(
    c: &mut Clients,
    w: &Plugin,
    vol_b: &Volume,
    t1: &Path,
    pid: u32,
) -> PathBuf {
    let (store, dirs, pods, ns) = (&w.store, &w.dirs, &w.pods, w.ns);
    let t2 = pods.join("pod2-vol");
    within(c.node.node_publish_volume(publish_req(vol_b, &t2, false)))
        .await
        .unwrap();
    assert_eq!(dirs.agent_pid(), Some(pid));
    let ns_mounts = mount_points()
        .into_iter()
        .filter(|m| *m == dirs.ns_mount(ns))
        .count();
    assert_eq!(ns_mounts, 1);
    std::fs::write(t2.join("b.txt"), b"volume b").unwrap();
    assert!(!t1.join("b.txt").exists(), "volumes see their own prefix");
    assert!(eventually(Duration::from_secs(10), || store
        .ls(ns, Some("pvc-b"))
        .contains(&"b.txt".to_string())));
    t2
}

/// A read-only publish of volume a: reads work, writes get EROFS, and the read-write publish
/// of the same volume still writes.
async fn a_read_only_publish_refuses_writes(
    c: &mut Clients,
    w: &Plugin,
    vol_a: &Volume,
    t1: &Path,
) -> PathBuf {
    let pods = &w.pods;
    let t3 = pods.join("pod3-vol");
    within(c.node.node_publish_volume(publish_req(vol_a, &t3, true)))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(t3.join("hello.txt")).unwrap(),
        b"hello from a pod\n"
    );
    assert_eq!(
        std::fs::read(t3.join("sub/data.bin")).unwrap(),
        pattern(300_000, 1)
    );
    let err = std::fs::write(t3.join("nope.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // The read-write publish of the same volume still writes.
    std::fs::write(t1.join("still-rw.txt"), b"ok").unwrap();
    t3
}

/// An ephemeral inline volume (no CreateVolume): attributes name the prefix it mounts, of its
/// pod's namespace.
async fn an_inline_volume_mounts_a_prefix(c: &mut Clients, w: &Plugin, pid: u32) -> PathBuf {
    let (dirs, pods, ns) = (&w.dirs, &w.pods, w.ns);
    let t4 = pods.join("pod4-inline");
    within(c.node.node_publish_volume(inline_req(
        ns,
        &[("namespace", ns), ("prefix", "team/a/sub")],
        &t4,
        true,
    )))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(t4.join("data.bin")).unwrap(),
        pattern(300_000, 1)
    );
    assert_eq!(dirs.agent_pid(), Some(pid));
    t4
}

/// A pod of another namespace may not name this one's keys in an inline volume, nor the pod
/// of this one another's; nor mount a PV of this namespace its class does not share; and a
/// kubelet that does not say which pod it publishes for is refused.
async fn pods_of_other_namespaces_are_refused(c: &mut Clients, w: &Plugin, vol_a: &Volume) {
    let (pods, ns) = (&w.pods, w.ns);
    let t_no = pods.join("pod-denied");
    for r in [
        inline_req(
            "csi-other",
            &[("namespace", ns), ("prefix", "team/a")],
            &t_no,
            true,
        ),
        inline_req(
            ns,
            &[("namespace", "csi-other"), ("prefix", "x")],
            &t_no,
            true,
        ),
        inline_req(
            "csi-other",
            &[("prefix", "x"), ("shareWithNamespaces", "*")],
            &t_no,
            true,
        ),
        publish_req_for("csi-other", vol_a, &t_no, true),
    ] {
        let e = within(c.node.node_publish_volume(r)).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    }
    // A kubelet that does not say which pod it publishes for (no podInfoOnMount).
    let mut r = inline_req(ns, &[("prefix", "team/a")], &t_no, true);
    r.volume_context.remove(POD_NAMESPACE);
    let e = within(c.node.node_publish_volume(r)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("podInfoOnMount"), "{e:?}");
    assert!(!t_no.exists());
}

/// A PV its class shares with namespace csi-reader: a pod there reads volume a's files, a pod
/// of another namespace is refused.
async fn a_shared_volume_is_read_where_it_is_shared(c: &mut Clients, w: &Plugin) -> PathBuf {
    let (pods, ns) = (&w.pods, w.ns);
    let t_no = pods.join("pod-denied");
    let shared = within(c.controller.create_volume(create_req(
        "pvc-shared",
        &[
            ("namespace", ns),
            ("prefix", "team/a"),
            ("shareWithNamespaces", "csi-reader"),
        ],
    )))
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    let t6 = pods.join("pod6-shared");
    within(
        c.node
            .node_publish_volume(publish_req_for("csi-reader", &shared, &t6, true)),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(t6.join("hello.txt")).unwrap(),
        b"hello from a pod\n"
    );
    let e = within(
        c.node
            .node_publish_volume(publish_req_for("csi-else", &shared, &t_no, true)),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    t6
}

/// A volume of the spec's longest name, of unusual characters: its files are keys under the
/// prefix its name maps to.
async fn an_odd_name_maps_to_a_prefix(c: &mut Clients, w: &Plugin) -> PathBuf {
    let (store, pods, ns) = (&w.store, &w.pods, w.ns);
    let odd = format!("../ a/b\t\u{e9}/{}xy", "\u{2603}/.".repeat(23));
    let vol_odd = within(
        c.controller
            .create_volume(create_req(&odd, &[("namespace", ns)])),
    )
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    let t7 = pods.join("pod7-odd-name");
    within(
        c.node
            .node_publish_volume(publish_req(&vol_odd, &t7, false)),
    )
    .await
    .unwrap();
    std::fs::write(t7.join("odd.txt"), b"odd").unwrap();
    let odd_prefix = vol_odd.volume_id.split_once('/').unwrap().1.to_string();
    assert!(eventually(Duration::from_secs(10), || store
        .ls(ns, Some(&odd_prefix))
        .contains(&"odd.txt".to_string())));
    t7
}

/// A volume of another namespace: mounted by the same node agent, one cache for both; one
/// agent process serves both namespaces (none was started per namespace), under the keeper
/// kt-csi started.
async fn another_namespace_is_served_by_the_same_agent(
    c: &mut Clients,
    w: &Plugin,
    t1: &Path,
    pid: u32,
) {
    let (store, dirs, pods) = (&w.store, &w.dirs, &w.pods);
    let t5 = pods.join("pod5-other-ns");
    within(
        c.node
            .node_publish_volume(inline_req("csi-other", &[("prefix", "x")], &t5, false)),
    )
    .await
    .unwrap();
    std::fs::write(t5.join("o.txt"), b"other namespace").unwrap();
    assert!(eventually(Duration::from_secs(10), || store
        .ls("csi-other", Some("x"))
        .contains(&"o.txt".to_string())));
    assert!(mount_points().contains(&dirs.ns_mount("csi-other")));
    assert!(!t1.join("o.txt").exists());
    assert_eq!(dirs.agent_pid(), Some(pid));
    // One agent process serves both namespaces (none was started per namespace), under the
    // keeper kt-csi started.
    let agents = agent_processes(dirs);
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert_eq!(parent_of(agents[0]), Some(pid));
}

/// Publish requests without a volume id, a target or a capability, or of a block volume.
async fn bad_publish_requests_are_invalid(c: &mut Clients, w: &Plugin, vol_a: &Volume, t1: &Path) {
    let pods = &w.pods;
    let mut r = publish_req(vol_a, &pods.join("x"), false);
    r.volume_id.clear();
    assert_eq!(
        code(c.node.node_publish_volume(r).await),
        Code::InvalidArgument
    );
    let mut r = publish_req(vol_a, &pods.join("x"), false);
    r.target_path.clear();
    assert_eq!(
        code(c.node.node_publish_volume(r).await),
        Code::InvalidArgument
    );
    let mut r = publish_req(vol_a, &pods.join("x"), false);
    r.volume_capability = None;
    assert_eq!(
        code(c.node.node_publish_volume(r).await),
        Code::InvalidArgument
    );
    let mut r = publish_req(vol_a, &pods.join("x"), false);
    r.volume_capability = Some(block_cap());
    assert_eq!(
        code(c.node.node_publish_volume(r).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.node.node_unpublish_volume(unpublish_req("", t1)).await),
        Code::InvalidArgument
    );
}

/// Unpublish, twice each: the binds go, the targets go, the namespace mount stays; a target
/// that never existed is fine.
async fn unpublish_removes_binds_and_targets(
    c: &mut Clients,
    w: &Plugin,
    vol_a: &Volume,
    targets: [&PathBuf; 6],
    pid: u32,
) {
    let pods = &w.pods;
    for t in targets {
        for _ in 0..2 {
            within(
                c.node
                    .node_unpublish_volume(unpublish_req(&vol_a.volume_id, t)),
            )
            .await
            .unwrap();
        }
        assert!(!t.exists(), "{} still exists", t.display());
        assert!(!mount_points().contains(t));
    }
    assert!(alive(pid));
    // A target that never existed.
    within(
        c.node
            .node_unpublish_volume(unpublish_req(&vol_a.volume_id, &pods.join("never"))),
    )
    .await
    .unwrap();
}

/// DeleteVolume removes the keys under the prefix, and only those; again, and for ids that
/// never were, it is still fine; and the name is free again after it.
async fn delete_volume_removes_its_prefix_alone(c: &mut Clients, w: &Plugin, vol_a: &Volume) {
    let (store, ns) = (&w.store, w.ns);
    within(c.controller.delete_volume(DeleteVolumeRequest {
        volume_id: vol_a.volume_id.clone(),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert!(store.ls(ns, Some("team/a")).is_empty());
    // The parent directory that publishing made stays; the prefix itself is gone.
    assert!(!store.ls(ns, Some("team")).contains(&"a/".to_string()));
    assert!(store.ls(ns, Some("pvc-b")).contains(&"b.txt".to_string()));
    // Again, and for ids that never were: still fine.
    for id in [vol_a.volume_id.as_str(), "default/never-was", "malformed"] {
        within(c.controller.delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        }))
        .await
        .unwrap_or_else(|e| panic!("delete {id}: {e}"));
    }
    assert_eq!(
        code(
            c.controller
                .delete_volume(DeleteVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    // The name is free again after the delete.
    within(c.controller.create_volume(create_req(
        "pvc-a",
        &[("namespace", ns), ("prefix", "elsewhere")],
    )))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_plugin_keeps_mounts_serving() {
    require_fuse();
    let store = Store::start("127.0.0.93");
    let dirs = CsiDirs::new();
    let csi = start_csi(&dirs, &store, "127.0.0.93", true);
    let mut c = connect(&dirs.socket()).await;
    let ns = "csi-restart";
    let pods = dirs.pods();
    let vol = within(
        c.controller
            .create_volume(create_req("pvc-r", &[("namespace", ns)])),
    )
    .await
    .unwrap()
    .into_inner()
    .volume
    .unwrap();
    let t1 = pods.join("reader-pod");
    within(c.node.node_publish_volume(publish_req(&vol, &t1, false)))
        .await
        .unwrap();
    let data = pattern(2 << 20, 7);
    std::fs::write(t1.join("model.bin"), &data).unwrap();
    let pid = dirs.agent_pid().expect("the node agent's pid");

    // A pod reads the file over and over while the plugin is killed and restarted.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads, file, data) = (
            stop.clone(),
            reads.clone(),
            t1.join("model.bin"),
            data.clone(),
        );
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read(&file) {
                    Ok(b) if b == data => {
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(b) => {
                        let first = b.iter().zip(data.iter()).position(|(x, y)| x != y);
                        let size = std::fs::metadata(&file).map(|m| m.len()).ok();
                        return Err(format!(
                            "read {} bytes that differ (first difference at {first:?}; the file's size now {size:?}; after {} good reads)",
                            b.len(),
                            reads.load(Ordering::Relaxed)
                        ));
                    }
                    Err(e) => return Err(format!("read failed: {e}")),
                }
            }
            Ok(())
        })
    };
    let mut reader = Some(reader);
    let log_path = dirs.state().join("logs").join("node.log");
    // Waits for `n` more good reads; a reader that stopped fails the test with its error.
    let mut more_reads = |n: u64, when: &str| {
        let start = reads.load(Ordering::Relaxed);
        let ok = eventually(Duration::from_secs(30), || {
            reads.load(Ordering::Relaxed) >= start + n
                || reader.as_ref().is_some_and(|r| r.is_finished())
        });
        if reader.as_ref().is_some_and(|r| r.is_finished()) {
            let result = reader.take().map(|r| r.join());
            let log = std::fs::read_to_string(log_path.clone()).unwrap_or_default();
            let listed =
                String::from_utf8_lossy(&store.kt(&["ls", "-r", "-n", ns, "--json"]).stdout)
                    .into_owned();
            let staged = std::fs::read_dir(dirs.cache().join("staging"))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| (e.file_name(), e.metadata().map(|m| m.len()).ok()))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            panic!("the reader stopped {when}: {result:?}\nstore lists: {listed}\nstaging: {staged:?}\nthe node agent's log:\n{log}");
        }
        assert!(ok, "fewer than {n} reads {when}");
    };
    more_reads(3, "before the restart");
    drop(c);
    csi.kill();
    more_reads(3, "while kt-csi was down");
    assert!(alive(pid), "the node agent must outlive kt-csi");

    let _csi = start_csi(&dirs, &store, "127.0.0.93", true);
    let mut c = connect(&dirs.socket()).await;
    // The restarted plugin reuses the running kt mount for the next publish.
    let t2 = pods.join("second-pod");
    within(c.node.node_publish_volume(publish_req(&vol, &t2, true)))
        .await
        .unwrap();
    assert_eq!(dirs.agent_pid(), Some(pid));
    assert_eq!(std::fs::read(t2.join("model.bin")).unwrap(), data);
    // Republishing the first target (the kubelet does this after a restart) is a no-op.
    within(c.node.node_publish_volume(publish_req(&vol, &t1, false)))
        .await
        .unwrap();
    more_reads(3, "after the restart");

    // The node agent itself dies: its keeper starts another on the same mounts, and the reader
    // only waits.
    let agents = agent_processes(&dirs);
    assert_eq!(agents.len(), 1, "one node agent: {agents:?}");
    // SAFETY: killing the agent process this test's kt-csi started.
    unsafe { libc::kill(agents[0] as i32, libc::SIGKILL) };
    more_reads(3, "after the node agent was killed");
    let restarted = agent_processes(&dirs);
    assert!(
        restarted.len() == 1 && restarted != agents,
        "a new node agent: {agents:?} -> {restarted:?}"
    );

    stop.store(true, Ordering::Relaxed);
    let result = reader
        .take()
        .expect("the reader runs")
        .join()
        .expect("reader thread");
    assert_eq!(result, Ok(()), "the reader saw an error");
    assert!(reads.load(Ordering::Relaxed) >= 12);

    for t in [&t1, &t2] {
        within(
            c.node
                .node_unpublish_volume(unpublish_req(&vol.volume_id, t)),
        )
        .await
        .unwrap();
        assert!(!t.exists());
    }
    assert!(alive(pid));
}

/// A volume of a StorageClass with `staleReads: "true"` is served by a mount of its own of
/// the namespace (`kt mount --stale-reads`), which goes on reading what the node holds while no
/// store server answers and refuses writes with EROFS; a volume of the same namespace without
/// it, on the namespace's other mount, fails its reads instead (close-to-open holds there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_with_stale_reads_reads_what_its_node_holds_while_no_server_answers() {
    require_fuse();
    let Plugin {
        _csi,
        dirs,
        store,
        ns,
        pods,
    } = Plugin::start("127.0.0.146", "csi-stale");
    let mut c = connect(&dirs.socket()).await;
    let mut volumes = Vec::new();
    for (name, params) in [
        ("pvc-stale", &[("staleReads", "true")][..]),
        ("pvc-plain", &[]),
    ] {
        let mut all = vec![("namespace", ns)];
        all.extend_from_slice(params);
        let created = within(c.controller.create_volume(create_req(name, &all)))
            .await
            .unwrap();
        volumes.push(created.into_inner().volume.unwrap());
    }
    let (stale, plain) = (&volumes[0], &volumes[1]);
    assert_eq!(stale.volume_context["staleReads"], "true");
    let (ts, tp) = (pods.join("stale-vol"), pods.join("plain-vol"));
    for (v, t) in [(stale, &ts), (plain, &tp)] {
        within(c.node.node_publish_volume(publish_req(v, t, false)))
            .await
            .unwrap();
    }
    let mounted = mount_points();
    let stale_mount = dirs
        .state()
        .join("mounts")
        .join(format!("{ns}@stale-reads"));
    assert!(mounted.contains(&dirs.ns_mount(ns)), "{mounted:?}");
    assert!(mounted.contains(&stale_mount), "{mounted:?}");
    let data = pattern(3 << 20, 7);
    for t in [&ts, &tp] {
        std::fs::write(t.join("f"), &data).unwrap();
    }
    // Read through the node (not from the page cache the writes filled): its blocks are then
    // what the node holds.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    for t in [&ts, &tp] {
        assert!(std::fs::read(t.join("f")).unwrap() == data);
    }

    let names = || -> Vec<_> {
        std::fs::read_dir(&ts)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    assert_eq!(names(), ["f"]);

    store.proc.kill();
    // A directory as the probe: a failed one leaves nothing behind.
    let refused = || {
        std::fs::create_dir(ts.join("probe"))
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::EROFS)
    };
    assert!(
        eventually(Duration::from_secs(10), refused),
        "writes to the stale-reads volume were not refused with the server gone"
    );
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read(tp.join("f"))
            .is_err()),
        "the plain volume went on reading with the server gone"
    );
    // Past every lease and listing lifetime: what its node holds, as it last saw it.
    std::thread::sleep(Duration::from_secs(2));
    assert!(std::fs::read(ts.join("f")).unwrap() == data);
    let write = std::fs::write(ts.join("new"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EROFS), "{write}");
    assert_eq!(names(), ["f"]);
}
