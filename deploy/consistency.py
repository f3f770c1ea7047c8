#!/usr/bin/env python3
"""Cross-file checks of deploy/ that no schema can make.

    consistency.py DEPLOY_DIR RENDERED_YAML [--tls none|secret|cert-manager]
                   [--store single|cluster]

RENDERED_YAML is the rendered kustomization (render.py or `kubectl kustomize`); the examples and
the Dockerfile are read from DEPLOY_DIR. Checks that the names one file uses for something another
file defines agree: the CSI driver name, the CSI socket path, the store server's port and address,
the ktfs image tag, service accounts and their bindings, the binaries the image holds, the health
port, and the $(VAR)s containers expand; and that volumes are what kt-csi takes (its parameters,
pod info on mount, the PVC's namespace from the provisioner).

`--tls` says what the rendering must be (default `none`): `none`, plaintext throughout (no TLS
flag, no CA, no cert-manager object); `secret` (the tls component), the store server presents a
certificate from one Secret and the node agents one from another, and every client trusts their
CA and checks the store against one name and the agents against another; `cert-manager` (tls
and tls/cert-manager), that and each Secret is the one a cert-manager Certificate writes, the
store's with the names of the store Service and KT_TLS_SERVER_NAME, the nodes' with
KT_TLS_NODE_NAME and none of the store's, both signed by one CA Issuer whose CA a self-signed
Issuer signs; cert-manager objects, which no Kubernetes schema covers, are checked for their
shape here.

`--store` says what the store must be (default `single`): `single`, one server on its data
directory; `cluster` (the cluster component), replicas over etcd and an object store, which
every client lists by the names they advertise (consistency_cluster.py). Prints every mismatch
and exits 1 on any.
"""

import argparse
import json
import posixpath
import re
import shlex
import sys
from pathlib import Path

from consistency_cluster import STORE_MODES, check_store_mode
from consistency_common import (DNS_NAME, argv, env_value, error, errors, flag, headless,
                                image_repo_tag, is_server, kt_servers, load, mount_volume,
                                name_of, pod_specs, program, resolve_port, secret_file,
                                selects, server_lists)

KT_IMAGE = "ktfs/kt"
SIDECAR_REGISTRY = "registry.k8s.io/sig-storage/"
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
# What kt-csi takes from a StorageClass (csi/src/volume.rs); it refuses any other key.
CLASS_PARAMETERS = {"namespace", "prefix", "locale", "shareWithNamespaces", "staleReads"}
# What an inline volume may say: its namespace is its pod's, and it grants nothing.
INLINE_ATTRIBUTES = {"namespace", "prefix", "locale", "staleReads"}


# --- the checks -----------------------------------------------------------------------------


def check_volumes(base, examples, pods, driver):
    """kt-csi takes a volume's namespace from its pod, so the kubelet must send the pod's
    (podInfoOnMount), and from the PVC's when a class names none, so the provisioner must send
    that (--extra-create-metadata); and it refuses keys it does not know."""
    c = "volumes"
    for d in base:
        if d["kind"] == "CSIDriver" and d["metadata"]["name"] == driver:
            if (d.get("spec") or {}).get("podInfoOnMount") is not True:
                error(c, f"{name_of(d)}: podInfoOnMount must be true (kt-csi refuses a publish "
                         "that does not say which pod's namespace it is for)")
    for owner, _, _, spec in pods:
        for ctr in spec.get("containers") or []:
            provisioner = "csi-provisioner" in ctr.get("image", "")
            if provisioner and "--extra-create-metadata" not in argv(ctr):
                error(c, f"{owner}: {ctr['name']} needs --extra-create-metadata (the PVC's "
                         "namespace is a volume's where its StorageClass names none)")
    for d in base + examples:
        if d["kind"] == "StorageClass" and d.get("provisioner") == driver:
            for k in sorted(set(d.get("parameters") or {}) - CLASS_PARAMETERS):
                if not k.startswith("csi.storage.k8s.io/"):
                    error(c, f"{name_of(d)}: kt-csi knows no parameter {k!r} "
                             f"(known: {sorted(CLASS_PARAMETERS)})")
    for owner, _, _, spec in pods:
        for vol in spec.get("volumes") or []:
            csi = vol.get("csi") or {}
            if csi.get("driver") != driver:
                continue
            for k in sorted(set(csi.get("volumeAttributes") or {}) - INLINE_ATTRIBUTES):
                error(c, f"{owner}: inline volume {vol['name']} has attribute {k!r}, which "
                         f"kt-csi refuses (known: {sorted(INLINE_ATTRIBUTES)})")


def check_driver_name(base, examples, pods):
    c = "driver name"
    drivers = [d["metadata"]["name"] for d in base if d["kind"] == "CSIDriver"]
    if len(drivers) != 1:
        error(c, f"expected one CSIDriver object, found {drivers}")
        return None
    driver = drivers[0]
    classes = {d["metadata"]["name"]: d for d in base + examples if d["kind"] == "StorageClass"}
    for sc_name, sc in classes.items():
        if sc.get("provisioner") != driver:
            error(c, f"StorageClass {sc_name} has provisioner {sc.get('provisioner')!r}, "
                     f"the CSIDriver is {driver!r}")
    for owner, _, _, spec in pods:
        for vol in spec.get("volumes") or []:
            if "csi" in vol and vol["csi"].get("driver") != driver:
                error(c, f"{owner}: inline volume {vol['name']} uses driver "
                         f"{vol['csi'].get('driver')!r}, the CSIDriver is {driver!r}")
    for doc in examples:
        if doc["kind"] == "PersistentVolumeClaim":
            sc = (doc.get("spec") or {}).get("storageClassName")
            if sc not in classes:
                error(c, f"{name_of(doc)}: storageClassName {sc!r} is not a StorageClass of the "
                         f"base or the examples ({sorted(classes)})")
    registrars = 0
    for owner, _, _, spec in pods:
        for ctr in spec.get("containers") or []:
            if "csi-node-driver-registrar" not in ctr.get("image", ""):
                continue
            registrars += 1
            paths = flag(argv(ctr), "--kubelet-registration-path")
            probe = ((ctr.get("livenessProbe") or {}).get("exec") or {}).get("command") or []
            paths += flag(probe, "--kubelet-registration-path")
            for p in paths:
                if posixpath.dirname(p) != f"{KUBELET_PLUGINS}/{driver}":
                    error(c, f"{owner}: registrar's --kubelet-registration-path {p} is not "
                             f"under {KUBELET_PLUGINS}/{driver}/")
            if not paths:
                error(c, f"{owner}: registrar has no --kubelet-registration-path")
    if registrars == 0:
        error(c, "no node-driver-registrar container in any workload")
    return driver


def check_socket(pods, driver):
    c = "csi socket"
    sockets = set()
    for owner, _, _, spec in pods:
        containers = spec.get("containers") or []
        plugins = [k for k in containers if program(k) == "kt-csi"]
        if not plugins:
            continue
        plugin = plugins[0]
        endpoints = flag(argv(plugin), "--endpoint")
        if len(endpoints) != 1 or not endpoints[0].startswith("unix://"):
            error(c, f"{owner}: kt-csi needs one --endpoint unix://PATH, has {endpoints}")
            continue
        sock = endpoints[0][len("unix://"):]
        sockets.add(sock)
        sock_dir = posixpath.dirname(sock)
        plugin_vol = mount_volume(plugin, sock_dir)
        if plugin_vol is None:
            error(c, f"{owner}: kt-csi mounts no volume at {sock_dir}, where its socket is")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        if driver and plugin_vol in volumes and "hostPath" in volumes[plugin_vol]:
            host = volumes[plugin_vol]["hostPath"]["path"].rstrip("/")
            if host != f"{KUBELET_PLUGINS}/{driver}":
                error(c, f"{owner}: socket volume {plugin_vol} is hostPath {host}, the kubelet "
                         f"looks in {KUBELET_PLUGINS}/{driver}")
        for ctr in containers:
            if not ctr.get("image", "").startswith(SIDECAR_REGISTRY):
                continue
            args = argv(ctr)
            for addr in flag(args, "--csi-address"):
                if addr.removeprefix("unix://") != sock:
                    error(c, f"{owner}: {ctr['name']} --csi-address={addr}, kt-csi listens on "
                             f"{sock}")
                elif mount_volume(ctr, sock_dir) != plugin_vol:
                    error(c, f"{owner}: {ctr['name']} does not mount volume {plugin_vol} at "
                             f"{sock_dir}, so it cannot see kt-csi's socket")
            if not flag(args, "--csi-address"):
                error(c, f"{owner}: sidecar {ctr['name']} has no --csi-address")
            for reg in flag(args, "--kubelet-registration-path"):
                if posixpath.basename(reg) != posixpath.basename(sock):
                    error(c, f"{owner}: --kubelet-registration-path {reg} names another socket "
                             f"than kt-csi's {sock}")
    if len(sockets) > 1:
        error(c, f"kt-csi endpoints differ between workloads: {sorted(sockets)}")
    if not sockets:
        error(c, "no workload runs kt-csi")


def check_store_port(base, examples, pods):
    c = "store port"
    servers = kt_servers(pods)
    if len(servers) != 1:
        error(c, f"expected one container running `kt server`, found {len(servers)}")
        return
    owner, ns, labels, _, ctr = servers[0]
    listens = flag(argv(ctr), "--listen")
    if len(listens) != 1:
        error(c, f"{owner}: kt server needs one --listen, has {listens}")
        return
    listen_port = int(listens[0].rsplit(":", 1)[1])
    ports = [p["containerPort"] for p in ctr.get("ports") or []]
    if listen_port not in ports:
        error(c, f"{owner}: kt server listens on {listen_port}, containerPorts are {ports}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        for how in ("tcpSocket", "grpc", "httpGet"):
            checked = (ctr.get(probe) or {}).get(how)
            if checked and resolve_port(ctr, checked["port"]) != listen_port:
                error(c, f"{owner}: {probe} checks port {checked['port']!r}, the server listens "
                         f"on {listen_port}")
        # The kubelet's gRPC probes speak no TLS, and a port with a certificate answers only
        # plain HTTP (/metrics, /ready) in the clear: such a probe would never pass.
        if (ctr.get(probe) or {}).get("grpc") and flag(argv(ctr), "--tls-cert"):
            error(c, f"{owner}: {probe} is a gRPC probe, which cannot reach a port that speaks "
                     f"TLS; an httpGet of /ready can")
        http = (ctr.get(probe) or {}).get("httpGet")
        if http and (http.get("path") != "/ready" or http.get("scheme", "HTTP") != "HTTP"):
            error(c, f"{owner}: {probe} asks {http.get('scheme', 'HTTP')} {http.get('path')!r}; "
                     f"the server answers its readiness at HTTP /ready")
    sts = [d for d in base if d["kind"] == "StatefulSet" and name_of(d) == owner]
    services = [d for d in base if d["kind"] == "Service" and selects(d, ns, labels)]
    if not services:
        error(c, f"no Service in {ns} selects the pods of {owner}")
        return
    # A headless Service has no address of its own: its name, and POD.SERVICE.NAMESPACE of each
    # pod of the StatefulSet it governs, resolve to the pods, which clients then dial on the
    # server's own port whatever the Service's is (consistency_cluster.py has the two agree).
    addresses = {}
    for svc in services:
        for p in svc["spec"]["ports"]:
            target = resolve_port(ctr, p.get("targetPort", p["port"]))
            if target != listen_port:
                error(c, f"{name_of(svc)}: port {p['port']} targets {p.get('targetPort')!r} "
                         f"= {target}, the server listens on {listen_port}")
            else:
                addresses[(svc["metadata"]["name"], ns)] = (listen_port if headless(svc)
                                                            else p["port"])
    governing = sts[0]["spec"].get("serviceName") if sts else None
    if sts and governing not in [s["metadata"]["name"] for s in services]:
        error(c, f"{owner}: serviceName {governing!r} is not a Service selecting its pods")
    replica = None
    if any(headless(s) and s["metadata"]["name"] == governing for s in services):
        replica = re.compile(re.escape(sts[0]["metadata"]["name"]) + r"-\d+")
    for o, _, _, spec in pods + list(pod_specs(examples)):
        for k in spec.get("containers") or []:
            for where, servers_ in server_lists(k):
                for server in servers_:
                    host, _, port = server.rpartition(":")
                    labels_ = host.split(".")
                    key = tuple(labels_[:2])
                    if (replica and len(labels_) >= 3 and replica.fullmatch(labels_[0])
                            and tuple(labels_[1:3]) == (governing, ns)):
                        key = (governing, ns)
                    svc_port = addresses.get(key) if len(labels_) >= 2 else None
                    if svc_port is None:
                        error(c, f"{o}: {k['name']} {where}: {host} is not SERVICE.NAMESPACE "
                                 f"of a Service in front of kt server "
                                 f"({', '.join(f'{s}.{n}' for s, n in addresses)})"
                                 + (f" nor a replica's {governing}.{ns} name" if replica else ""))
                    elif not port.isdigit() or int(port) != svc_port:
                        error(c, f"{o}: {k['name']} {where}: {server} has port {port}, the "
                                 f"store is there on {svc_port}")


def check_images(base, examples):
    c = "images"
    tags = {}
    for owner, _, _, spec in list(pod_specs(base)) + list(pod_specs(examples)):
        for k in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            repo, tag = image_repo_tag(k["image"])
            if repo == KT_IMAGE:
                tags.setdefault(tag, []).append(f"{owner}/{k['name']}")
            elif repo.startswith(SIDECAR_REGISTRY) and tag in (None, "latest"):
                error(c, f"{owner}: sidecar {k['name']} image {k['image']} is not pinned")
    if len(tags) > 1:
        error(c, f"{KT_IMAGE} is used with different tags: "
                 + "; ".join(f"{t}: {', '.join(w)}" for t, w in tags.items()))
    if None in tags:
        error(c, f"{KT_IMAGE} without a tag in {tags[None]}")
    if not tags:
        error(c, f"no container uses {KT_IMAGE}")


def check_service_accounts(base, pods):
    c = "service accounts"
    accounts = {(d["metadata"].get("namespace", "default"), d["metadata"]["name"])
                for d in base if d["kind"] == "ServiceAccount"}
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
             for d in base if d["kind"] in ("Role", "ClusterRole")}
    bound = set()
    for b in base:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        bns = b["metadata"].get("namespace", "")
        ref = b["roleRef"]
        ref_key = (ref["kind"], bns if ref["kind"] == "Role" else "", ref["name"])
        if ref_key not in roles:
            error(c, f"{name_of(b)}: roleRef {ref['kind']}/{ref['name']} does not exist")
        for s in b.get("subjects") or []:
            if s["kind"] != "ServiceAccount":
                continue
            key = (s.get("namespace") or bns, s["name"])
            if key not in accounts:
                error(c, f"{name_of(b)}: subject ServiceAccount {key[0]}/{key[1]} does not exist")
            bound.add(key)
    for owner, ns, _, spec in pods:
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount")
        if sa is None:
            continue
        if (ns, sa) not in accounts:
            error(c, f"{owner}: serviceAccountName {sa} does not exist in {ns}")
        elif (ns, sa) not in bound:
            error(c, f"{owner}: ServiceAccount {ns}/{sa} is not bound to any role")


def dockerfile_final_copies(text):
    """Basename -> destination of what the last stage of the Dockerfile copies in."""
    text = re.sub(r"\\\n", " ", text)
    stages = re.split(r"(?im)^\s*FROM\s", text)
    copied = {}
    for line in stages[-1].splitlines():
        line = line.strip()
        if not re.match(r"(?i)^(COPY|ADD)\s", line):
            continue
        rest = line.split(None, 1)[1].strip()
        if rest.startswith("["):
            parts = json.loads(rest)
        else:
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
        *sources, dest = parts
        for s in sources:
            copied[posixpath.basename(s.rstrip("/"))] = dest
    return copied


def check_dockerfile(deploy, base, examples):
    c = "dockerfile"
    path = Path(deploy) / "Dockerfile"
    if not path.is_file():
        error(c, f"{path} is missing")
        return
    copied = dockerfile_final_copies(path.read_text())
    for owner, _, _, spec in list(pod_specs(base)) + list(pod_specs(examples)):
        for k in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if image_repo_tag(k["image"])[0] != KT_IMAGE:
                continue
            args = argv(k)
            if not k.get("command"):
                error(c, f"{owner}/{k['name']}: a {KT_IMAGE} container must name its program "
                         "in `command` (the image has no entrypoint)")
                continue
            binary = posixpath.basename(args[0])
            if binary not in copied:
                error(c, f"{owner}/{k['name']} runs {binary}, which {path.name}'s final stage "
                         f"does not copy (it copies {sorted(copied)})")
            elif "/" in args[0] and posixpath.dirname(args[0]) != copied[binary].rstrip("/"):
                error(c, f"{owner}/{k['name']} runs {args[0]}, the image has it in "
                         f"{copied[binary]}")


def check_health_port(pods):
    c = "health port"
    for owner, _, _, spec in pods:
        containers = spec.get("containers") or []
        probes = [k for k in containers if "livenessprobe" in k.get("image", "")]
        plugins = [k for k in containers if program(k) == "kt-csi"]
        if not probes or not plugins:
            continue
        ports = flag(argv(probes[0]), "--health-port")
        health = int(ports[0]) if ports else 9808  # the sidecar's default
        http = (plugins[0].get("livenessProbe") or {}).get("httpGet")
        if not http:
            error(c, f"{owner}: kt-csi has no httpGet livenessProbe on the livenessprobe sidecar")
        elif resolve_port(plugins[0], http["port"]) != health:
            error(c, f"{owner}: kt-csi's livenessProbe checks port {http['port']!r}, the "
                     f"livenessprobe sidecar serves /healthz on {health}")


def check_env_references(pods):
    c = "env"
    for owner, _, _, spec in pods:
        for k in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            defined = {e["name"] for e in k.get("env") or []}
            for a in argv(k):
                for var in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                    if var not in defined:
                        error(c, f"{owner}/{k['name']}: argument {a!r} uses $({var}), which its "
                                 "env does not define (Kubernetes would pass it literally)")


# --- TLS ------------------------------------------------------------------------------------

TLS_MODES = ("none", "secret", "cert-manager")
CERT_MANAGER_GROUP = "cert-manager.io"
# The keys of a kubernetes.io/tls Secret as cert-manager writes it (and `kubectl create secret
# tls` plus ca.crt): which file each TLS setting must name.
CERT_KEY, KEY_KEY, CA_KEY = "tls.crt", "tls.key", "ca.crt"


def tls_roles(pods):
    """Every ktfs process of the rendering, as (owner, namespace, spec, container, role): role
    `server` (kt server: presents a certificate, dials no one), `agent` (kt agent, kt mount:
    presents one, dials the store and peers), `node` (kt-csi without --controller: the agents it
    starts do both), `controller` (kt-csi --controller: its `kt rm` dials the store), `client`
    (any other kt: dials only)."""
    for owner, ns, _, spec in pods:
        for k in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            prog, args = program(k), argv(k)
            if is_server(k):
                yield owner, ns, spec, k, "server"
            elif prog == "kt" and args[1:2] in (["agent"], ["mount"]):
                yield owner, ns, spec, k, "agent"
            elif prog == "kt-csi":
                yield owner, ns, spec, k, "controller" if "--controller" in args else "node"
            elif prog == "kt":
                yield owner, ns, spec, k, "client"


# The settings each role needs: lists of alternatives (what, how to read it from a container,
# the Secret key its file must be; None for a name).
def _flags(name):
    return lambda k: flag(argv(k), name)


def _env(name):
    return lambda k: [v for present, v in [env_value(k, name)] if present]


SERVER_CERT = [[("--tls-cert", _flags("--tls-cert"), CERT_KEY)],
               [("--tls-key", _flags("--tls-key"), KEY_KEY)]]
NODE_CERT = [[("--agent-tls-cert", _flags("--agent-tls-cert"), CERT_KEY)],
             [("--agent-tls-key", _flags("--agent-tls-key"), KEY_KEY)]]
# kt takes the CA and the names as flags or from its environment; kt-csi only passes its
# environment on to the kt processes it starts.
TRUST_ENV = [("KT_TLS_CA", _env("KT_TLS_CA"), CA_KEY)]
NAME_ENV = [("KT_TLS_SERVER_NAME", _env("KT_TLS_SERVER_NAME"), None)]
NODE_NAME_ENV = [("KT_TLS_NODE_NAME", _env("KT_TLS_NODE_NAME"), None)]
TRUST = TRUST_ENV + [("--tls-ca", _flags("--tls-ca"), CA_KEY)]
NAME = NAME_ENV + [("--tls-server-name", _flags("--tls-server-name"), None)]
NODE_NAME = NODE_NAME_ENV + [("--tls-node-name", _flags("--tls-node-name"), None)]
# What each role needs, and whose each setting is: the store's certificate ("store"), the nodes'
# ("node"), the CA ("trust"), the name the store is checked against ("store name") or the one
# node agents are ("node name").
NEEDS = {
    "server": [(SERVER_CERT[0], "store"), (SERVER_CERT[1], "store")],
    "agent": [(SERVER_CERT[0], "node"), (SERVER_CERT[1], "node"), (TRUST, "trust"),
              (NAME, "store name"), (NODE_NAME, "node name")],
    "node": [(NODE_CERT[0], "node"), (NODE_CERT[1], "node"), (TRUST_ENV, "trust"),
             (NAME_ENV, "store name"), (NODE_NAME_ENV, "node name")],
    "controller": [(TRUST_ENV, "trust"), (NAME_ENV, "store name")],
    "client": [(TRUST, "trust"), (NAME, "store name"), (NODE_NAME, "node name")],
}
ALL_SETTINGS = [a for alts in SERVER_CERT + NODE_CERT + [TRUST, NAME, NODE_NAME] for a in alts]


def check_tls(base, pods, mode):
    """Two certificates of one CA, all or nothing: the store server presents the store's, every
    node agent the nodes' (of another Secret, so that no node holds a key that passes for the
    store), every process that dials trusts the CA and checks the store against one name and
    the node agents against another, which only the nodes' certificate carries; and
    (cert-manager) a Certificate writes each Secret with those names, both signed by one CA
    Issuer."""
    c = "tls"
    secrets = {"store": set(), "node": set(), "trust": set()}
    names = {"store name": set(), "node name": set()}
    namespaces = set()
    roles = list(tls_roles(pods))
    for owner, ns, spec, k, role in roles:
        who = f"{owner}/{k['name']} ({role})"
        if mode == "none":
            for what, get, _ in ALL_SETTINGS:
                if get(k):
                    error(c, f"{who} sets {what}, but this rendering is meant to be plaintext "
                             "(TLS is the tls component's)")
            continue
        namespaces.add(ns)
        for alternatives, whose in NEEDS[role]:
            found = [(what, vals, key) for what, get, key in alternatives
                     for vals in [get(k)] if vals]
            label = " or ".join(a[0] for a in alternatives)
            if not found:
                error(c, f"{who} has no {label}")
                continue
            what, vals, key = found[0]
            if len(found) > 1 or len(vals) != 1:
                error(c, f"{who} gives {label} more than once")
            value = vals[0]
            if value is None:
                error(c, f"{who}: {what} must be a literal value, not a valueFrom")
            elif key is None:
                names[whose].add(value)
                if not DNS_NAME.match(value):
                    error(c, f"{who}: {what}={value!r} is not a DNS name to check "
                             "certificates against")
            else:
                secret, got = secret_file(spec, k, value)
                if secret is None:
                    error(c, f"{who}: {what}={value}: {got}")
                elif got != key:
                    error(c, f"{who}: {what}={value} is key {got!r} of Secret {secret}, it "
                             f"must be {key!r}")
                else:
                    secrets[whose].add(secret)
    cm = [d for d in base if d.get("apiVersion", "").split("/")[0] == CERT_MANAGER_GROUP]
    if mode == "none":
        for d in cm:
            error(c, f"{name_of(d)}: a cert-manager object in a rendering meant to be plaintext")
        return
    if not roles:
        error(c, "no ktfs process in the rendering")
    if not any(r == "server" for *_, r in roles):
        error(c, "no kt server in the rendering")
    if not any(r in ("agent", "node") for *_, r in roles):
        error(c, "no node agent in the rendering")
    for whose in ("store", "node"):
        if len(secrets[whose]) > 1:
            error(c, f"the {whose}'s certificate and key come from different Secrets "
                     f"{sorted(secrets[whose])}")
    store = next(iter(secrets["store"])) if len(secrets["store"]) == 1 else None
    node = next(iter(secrets["node"])) if len(secrets["node"]) == 1 else None
    if store is not None and store == node:
        error(c, f"the store server and the node agents present the certificate of one Secret "
                 f"{store}: every node would hold a key that passes for the store")
    if not secrets["trust"] <= {store, node}:
        error(c, f"the CA comes from {sorted(secrets['trust'])}, not from the certificates' "
                 f"Secrets {sorted(s for s in (store, node) if s)}")
    for whose, found in names.items():
        if len(found) > 1:
            error(c, f"the {whose} differs between processes: {sorted(found)}")
    store_name = next(iter(names["store name"])) if len(names["store name"]) == 1 else None
    node_name = next(iter(names["node name"])) if len(names["node name"]) == 1 else None
    if store_name is not None and store_name == node_name:
        error(c, f"the store and the node agents are checked against one name {store_name}: "
                 "a node's certificate would pass for the store")
    if len(namespaces) > 1:
        error(c, f"ktfs pods in several namespaces {sorted(namespaces)}, one Secret cannot "
                 "serve them")
    ns = next(iter(namespaces)) if len(namespaces) == 1 else None
    for d in base:
        if d["kind"] == "Secret" and d["metadata"]["name"] in (store, node):
            error(c, f"{name_of(d)}: a TLS Secret is in the manifests; its key must be made "
                     "in the cluster (cert-manager, or kubectl create secret)")
    check_cert_manager_shapes(cm)
    if mode == "secret":
        for d in cm:
            error(c, f"{name_of(d)}: a cert-manager object, but --tls secret means the Secrets "
                     "are made without cert-manager")
        return
    if store is None or node is None or ns is None:
        return

    # The store's names. A client checks the store against its KT_TLS_SERVER_NAME (or
    # --tls-server-name) whatever address it dials, and every process here that dials sets one
    # (above): the certificate must hold that name, and the names of each Service with an
    # address of its own in front of kt server, for clients that dial it without one and check
    # the host they dial (`kt --server kt-store.kt-system:7447`). The hosts a process with a
    # server name dials need not be there: in cluster mode each replica is dialled by a name of
    # its own (POD.SERVICE.NAMESPACE.svc of a headless Service, as are that Service's), all
    # present the one certificate, and the clients check the one name. Only a process without
    # a server name (reported above) checks its --server hosts, which then must be there.
    # The nodes' certificate carries none of these, nor any host a client dials the store at:
    # to a client that checks that host, it would pass for the store.
    store_names = {n: "KT_TLS_SERVER_NAME" for n in names["store name"]}
    dialled = {}
    server_pods = [(pns, labels) for _, pns, labels, _, _ in kt_servers(pods)]
    for svc in base:
        if svc["kind"] == "Service" and any(selects(svc, *p) for p in server_pods):
            n, sns = svc["metadata"]["name"], svc["metadata"].get("namespace", "default")
            for name in (f"{n}.{sns}", f"{n}.{sns}.svc"):
                (dialled if headless(svc) else store_names)[name] = f"Service {sns}/{n}"
    for _, _, _, k, _ in roles:
        by_name = any(get(k) for _, get, _ in NAME)
        for where, servers in server_lists(k):
            for server in servers:
                (dialled if by_name else store_names).setdefault(server.rpartition(":")[0],
                                                                 f"{k['name']} {where}")
    node_names = {n: "KT_TLS_NODE_NAME" for n in names["node name"]}
    issuers = set()
    for secret, wanted, forbidden, whose in ((store, store_names, node_names, "the nodes'"),
                                             (node, node_names, {**dialled, **store_names},
                                              "the store's")):
        issuer = check_certificate(cm, secret, ns, wanted, forbidden, whose)
        if issuer is not None:
            issuers.add(issuer)
    if len(issuers) > 1:
        error(c, f"the store's and the nodes' Certificates have different Issuers "
                 f"{sorted(issuers)}: the processes trust one CA")


def check_certificate(cm, secret, ns, wanted, forbidden, other):
    """The one Certificate that writes `secret` in `ns`: a server's, whose dnsNames hold every
    name of `wanted` and none of `forbidden` (the `other` certificate's), issued by a CA Issuer
    whose CA a self-signed Issuer signs. Returns its Issuer's name."""
    c = "tls"

    def find(kind, name, namespace):
        return [d for d in cm if d["kind"] == kind and d["metadata"]["name"] == name
                and d["metadata"].get("namespace", "") == (namespace if kind != "ClusterIssuer"
                                                           else "")]
    certs = [d for d in cm if d["kind"] == "Certificate"
             and (d.get("spec") or {}).get("secretName") == secret]
    if len(certs) != 1:
        error(c, f"the pods mount Secret {secret}: expected one Certificate writing it, found "
                 f"{[name_of(d) for d in certs]}")
        return None
    cert = certs[0]
    spec = cert.get("spec") or {}
    if cert["metadata"].get("namespace") != ns:
        error(c, f"{name_of(cert)} writes {secret} in namespace "
                 f"{cert['metadata'].get('namespace')!r}, the pods mount it from {ns!r}")
    if spec.get("isCA"):
        error(c, f"{name_of(cert)}: a server's certificate must not be a CA")
    usages = spec.get("usages")
    if usages is not None and "server auth" not in usages:
        error(c, f"{name_of(cert)}: usages {usages} lack 'server auth'")
    # Clients check the subjectAltNames (dnsNames) only; a commonName must not name the other
    # certificate's either.
    dns = set(spec.get("dnsNames") or [])
    for name, why in sorted(wanted.items()):
        if name not in dns:
            error(c, f"{name_of(cert)}: dnsNames {sorted(dns)} lack {name} ({why})")
    for name, why in sorted(forbidden.items()):
        if name in dns | {spec.get("commonName")}:
            error(c, f"{name_of(cert)}: carries {name}, {other} name ({why}): its key would "
                     "pass for the other")
    # The chain: the Certificate's Issuer signs with a CA whose certificate cert-manager makes
    # with a self-signed Issuer, all in the manifests.
    ref = spec.get("issuerRef") or {}
    found = find(ref.get("kind", "Issuer"), ref.get("name"), ns)
    if not found:
        error(c, f"{name_of(cert)}: issuerRef {ref.get('kind', 'Issuer')}/{ref.get('name')} is "
                 "not in the manifests")
        return None
    ca = (found[0].get("spec") or {}).get("ca")
    if not ca:
        error(c, f"{name_of(found[0])}: expected a CA Issuer (spec.ca), signing with the CA "
                 "that the servers' clients trust")
        return None
    ca_certs = [d for d in cm if d["kind"] == "Certificate"
                and d["metadata"].get("namespace") == ns
                and (d.get("spec") or {}).get("secretName") == ca.get("secretName")]
    if len(ca_certs) != 1:
        error(c, f"{name_of(found[0])}: ca.secretName {ca.get('secretName')!r} is written by "
                 f"{len(ca_certs)} Certificates of {ns}, expected one")
        return None
    ca_cert = ca_certs[0]
    if (ca_cert.get("spec") or {}).get("isCA") is not True:
        error(c, f"{name_of(ca_cert)}: the CA's Certificate needs isCA: true")
    if ca.get("secretName") == secret:
        error(c, f"{name_of(ca_cert)}: the CA's Secret must not be the servers' {secret} (the "
                 "pods would hold the CA's key)")
    cref = (ca_cert.get("spec") or {}).get("issuerRef") or {}
    root = find(cref.get("kind", "Issuer"), cref.get("name"), ns)
    if not root:
        error(c, f"{name_of(ca_cert)}: issuerRef {cref.get('kind', 'Issuer')}/{cref.get('name')}"
                 " is not in the manifests")
    elif "selfSigned" not in (root[0].get("spec") or {}):
        error(c, f"{name_of(root[0])}: expected the self-signed Issuer that signs the CA")
    return f"{found[0]['kind']}/{found[0]['metadata']['name']}"


# The fields of cert-manager.io/v1 objects (cert-manager 1.x), for a strict check of their shape:
# spec field -> its check (None: any value).
def _str(v):
    return isinstance(v, str) and v != ""


GO_DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms|us|µs|ns))+$")
DURATION_UNITS = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
USAGES = {"signing", "digital signature", "content commitment", "key encipherment",
          "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
          "decipher only", "any", "server auth", "client auth", "code signing", "email protection",
          "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping",
          "ocsp signing", "microsoft sgc", "netscape sgc"}
ISSUER_REF = {"name": _str, "kind": lambda v: v in ("Issuer", "ClusterIssuer"),
              "group": lambda v: v == CERT_MANAGER_GROUP}
PRIVATE_KEY = {"algorithm": lambda v: v in ("RSA", "ECDSA", "Ed25519"),
               "size": lambda v: isinstance(v, int), "encoding": lambda v: v in ("PKCS1", "PKCS8"),
               "rotationPolicy": lambda v: v in ("Never", "Always")}
CERTIFICATE_SPEC = {
    "secretName": _str, "issuerRef": ISSUER_REF, "commonName": lambda v: _str(v) and len(v) <= 64,
    "dnsNames": lambda v: isinstance(v, list) and all(
        isinstance(n, str) and DNS_NAME.match(n.removeprefix("*.")) for n in v),
    "ipAddresses": list, "uris": list, "emailAddresses": list, "otherNames": list,
    "duration": lambda v: isinstance(v, str) and GO_DURATION.match(v),
    "renewBefore": lambda v: isinstance(v, str) and GO_DURATION.match(v),
    "renewBeforePercentage": int, "isCA": bool,
    "usages": lambda v: isinstance(v, list) and set(v) <= USAGES,
    "privateKey": PRIVATE_KEY, "secretTemplate": {"labels": dict, "annotations": dict},
    "subject": dict, "literalSubject": str, "keystores": dict, "encodeUsagesInRequest": bool,
    "revisionHistoryLimit": int, "additionalOutputFormats": list, "nameConstraints": dict,
}
ISSUER_TYPES = {
    "selfSigned": {"crlDistributionPoints": list},
    "ca": {"secretName": _str, "crlDistributionPoints": list, "ocspServers": list,
           "issuingCertificateURLs": list},
    "acme": None, "vault": None, "venafi": None,
}


def seconds(duration):
    return sum(float(n) * DURATION_UNITS[u]
               for n, _, u in re.findall(r"(\d+(\.\d+)?)(h|ms|m|us|µs|ns|s)", duration))


def check_fields(where, value, shape):
    """value against shape: a dict of field -> shape, a type, a predicate, or None."""
    if shape is None:
        return
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            error("cert-manager", f"{where}: expected an object, got {value!r}")
            return
        for k in sorted(set(value) - set(shape)):
            error("cert-manager", f"{where}: unknown field {k!r} (known: {sorted(shape)})")
        for k, v in value.items():
            if k in shape:
                check_fields(f"{where}.{k}", v, shape[k])
    elif isinstance(shape, type):
        if not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
            error("cert-manager", f"{where}: expected {shape.__name__}, got {value!r}")
    elif not shape(value):
        error("cert-manager", f"{where}: invalid value {value!r}")


def check_cert_manager_shapes(cm):
    c = "cert-manager"
    for d in cm:
        where = name_of(d)
        if d["apiVersion"] != f"{CERT_MANAGER_GROUP}/v1":
            error(c, f"{where}: apiVersion {d['apiVersion']}, cert-manager serves "
                     f"{CERT_MANAGER_GROUP}/v1")
        for k in sorted(set(d) - {"apiVersion", "kind", "metadata", "spec"}):
            error(c, f"{where}: unknown top-level field {k!r}")
        md = d["metadata"]
        if not _str(md.get("name")) or not DNS_NAME.match(md["name"]):
            error(c, f"{where}: metadata.name must be a DNS name")
        for k in sorted(set(md) - {"name", "namespace", "labels", "annotations"}):
            error(c, f"{where}: unexpected metadata field {k!r}")
        spec = d.get("spec")
        if d["kind"] == "Certificate":
            check_fields(f"{where} spec", spec, CERTIFICATE_SPEC)
            spec = spec if isinstance(spec, dict) else {}
            for req in ("secretName", "issuerRef"):
                if req not in spec:
                    error(c, f"{where}: spec.{req} is required")
            if "name" not in (spec.get("issuerRef") or {}):
                error(c, f"{where}: spec.issuerRef.name is required")
            if not any(spec.get(k) for k in ("commonName", "dnsNames", "ipAddresses", "uris",
                                             "emailAddresses", "otherNames", "literalSubject")):
                error(c, f"{where}: names nothing (commonName, dnsNames, ...)")
            pk = spec.get("privateKey") or {}
            sizes = {"RSA": lambda s: 2048 <= s <= 8192, "ECDSA": lambda s: s in (256, 384, 521),
                     "Ed25519": lambda s: True}
            alg = pk.get("algorithm", "RSA")
            if "size" in pk and alg in sizes and not sizes[alg](pk["size"]):
                error(c, f"{where}: privateKey size {pk['size']} is not one {alg} takes")
            dur, renew = spec.get("duration"), spec.get("renewBefore")
            if isinstance(dur, str) and GO_DURATION.match(dur) and seconds(dur) < 3600:
                error(c, f"{where}: duration {dur} is under cert-manager's minimum of 1h")
            if (isinstance(dur, str) and isinstance(renew, str) and GO_DURATION.match(dur)
                    and GO_DURATION.match(renew) and seconds(renew) >= seconds(dur)):
                error(c, f"{where}: renewBefore {renew} is not shorter than duration {dur}")
        elif d["kind"] in ("Issuer", "ClusterIssuer"):
            check_fields(f"{where} spec", spec, ISSUER_TYPES)
            kinds = [k for k in (spec or {}) if k in ISSUER_TYPES] if isinstance(spec, dict) else []
            if len(kinds) != 1:
                error(c, f"{where}: spec needs exactly one issuer type of "
                         f"{sorted(ISSUER_TYPES)}, has {kinds}")
            if d["kind"] == "ClusterIssuer" and md.get("namespace"):
                error(c, f"{where}: a ClusterIssuer has no namespace")
        else:
            error(c, f"{where}: kind {d['kind']} is not one this check knows "
                     "(Certificate, Issuer, ClusterIssuer)")



def main(argv_):
    parser = argparse.ArgumentParser(prog="consistency.py",
                                     description="Cross-file checks of deploy/.")
    parser.add_argument("deploy", metavar="DEPLOY_DIR")
    parser.add_argument("rendered", metavar="RENDERED_YAML")
    parser.add_argument("--tls", choices=TLS_MODES, default="none")
    parser.add_argument("--store", choices=STORE_MODES, default="single")
    opts = parser.parse_args(argv_[1:])
    deploy, rendered, mode = opts.deploy, opts.rendered, opts.tls
    base = load(rendered)
    examples = [d for p in sorted((Path(deploy) / "examples").glob("*.yaml")) for d in load(p)]
    pods = list(pod_specs(base))
    example_pods = list(pod_specs(examples))
    driver = check_driver_name(base, examples, pods + example_pods)
    check_socket(pods, driver)
    check_volumes(base, examples, pods + example_pods, driver)
    check_store_port(base, examples, pods)
    check_store_mode(base, pods, example_pods, opts.store)
    check_images(base, examples)
    check_service_accounts(base, pods)
    check_dockerfile(deploy, base, examples)
    check_health_port(pods)
    check_env_references(pods + example_pods)
    check_tls(base, pods, mode)
    if errors:
        print(f"deploy: {len(errors)} consistency error(s) ({rendered}, --tls {mode}, "
              f"--store {opts.store}):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
