#!/usr/bin/env python3
"""Cross-file checks of deploy/ that no schema can make.

    consistency.py DEPLOY_DIR RENDERED_YAML

RENDERED_YAML is the rendered kustomization (render.py or `kubectl kustomize`); the examples and
the Dockerfile are read from DEPLOY_DIR. Checks that the names one file uses for something another
file defines agree: the CSI driver name, the CSI socket path, the store server's port and address,
the ktfs image tag, service accounts and their bindings, the binaries the image holds, the health
port, and the $(VAR)s containers expand; and that volumes are what kt-csi takes (its parameters,
pod info on mount, the PVC's namespace from the provisioner). Prints every mismatch and exits 1
on any.
"""

import json
import posixpath
import re
import shlex
import sys
from pathlib import Path

import yaml

KT_IMAGE = "ktfs/kt"
SIDECAR_REGISTRY = "registry.k8s.io/sig-storage/"
KUBELET_PLUGINS = "/var/lib/kubelet/plugins"
# What kt-csi takes from a StorageClass (csi/src/volume.rs); it refuses any other key.
CLASS_PARAMETERS = {"namespace", "prefix", "locale", "shareWithNamespaces"}
# What an inline volume may say: its namespace is its pod's, and it grants nothing.
INLINE_ATTRIBUTES = {"namespace", "prefix", "locale"}

errors = []


def error(check, msg):
    errors.append(f"[{check}] {msg}")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def name_of(doc):
    ns = doc["metadata"].get("namespace")
    return f"{doc['kind']}/{ns + '/' if ns else ''}{doc['metadata']['name']}"


def pod_specs(docs):
    """(owner description, namespace, pod template labels, pod spec) of every workload."""
    for doc in docs:
        kind, spec = doc["kind"], doc.get("spec") or {}
        ns = doc["metadata"].get("namespace", "default")
        if kind == "Pod":
            yield name_of(doc), ns, doc["metadata"].get("labels", {}), spec
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            t = spec["template"]
            yield name_of(doc), ns, t.get("metadata", {}).get("labels", {}), t["spec"]
        elif kind == "CronJob":
            t = spec["jobTemplate"]["spec"]["template"]
            yield name_of(doc), ns, t.get("metadata", {}).get("labels", {}), t["spec"]


def argv(container):
    return list(container.get("command") or []) + list(container.get("args") or [])


def flag(args, name):
    """Every value of --name, given as `--name=value` or `--name value`."""
    values = []
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            values.append(a[len(name) + 1:])
        elif a == name and i + 1 < len(args):
            values.append(args[i + 1])
    return values


def program(container):
    args = argv(container)
    return posixpath.basename(args[0]) if args else None


def image_repo_tag(image):
    digestless = image.split("@", 1)[0]
    last = digestless.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = digestless.rsplit(":", 1)
        return repo, tag
    return digestless, None


def mount_volume(container, path):
    """The name of the volume the container mounts at path, or None."""
    for m in container.get("volumeMounts") or []:
        if m["mountPath"].rstrip("/") == path.rstrip("/"):
            return m["name"]
    return None


def resolve_port(container, port):
    """A probe's or targetPort's port (number or name) as the container's port number."""
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p["containerPort"]
    return None


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
    servers = [(o, ns, labels, spec, k) for o, ns, labels, spec in pods
               for k in spec.get("containers") or []
               if program(k) == "kt" and argv(k)[1:2] == ["server"]]
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
        tcp = (ctr.get(probe) or {}).get("tcpSocket")
        if tcp and resolve_port(ctr, tcp["port"]) != listen_port:
            error(c, f"{owner}: {probe} checks port {tcp['port']!r}, the server listens on "
                     f"{listen_port}")
    sts = [d for d in base if d["kind"] == "StatefulSet" and name_of(d) == owner]
    services = [d for d in base if d["kind"] == "Service"
                and d["metadata"].get("namespace", "default") == ns
                and (d["spec"].get("selector") or {})
                and all(labels.get(k) == v for k, v in d["spec"]["selector"].items())]
    if not services:
        error(c, f"no Service in {ns} selects the pods of {owner}")
        return
    addresses = {}
    for svc in services:
        for p in svc["spec"]["ports"]:
            target = resolve_port(ctr, p.get("targetPort", p["port"]))
            if target != listen_port:
                error(c, f"{name_of(svc)}: port {p['port']} targets {p.get('targetPort')!r} "
                         f"= {target}, the server listens on {listen_port}")
            else:
                addresses[(svc["metadata"]["name"], ns)] = p["port"]
    if sts and sts[0]["spec"].get("serviceName") not in [s["metadata"]["name"] for s in services]:
        error(c, f"{owner}: serviceName {sts[0]['spec'].get('serviceName')!r} is not a Service "
                 f"selecting its pods")
    for o, _, _, spec in pods + list(pod_specs(examples)):
        for k in spec.get("containers") or []:
            for server in flag(argv(k), "--server"):
                host, _, port = server.rpartition(":")
                labels_ = host.split(".")
                svc_port = addresses.get(tuple(labels_[:2])) if len(labels_) >= 2 else None
                if svc_port is None:
                    error(c, f"{o}: {k['name']} --server {server}: {host} is not "
                             f"SERVICE.NAMESPACE of a Service in front of kt server "
                             f"({', '.join(f'{s}.{n}' for s, n in addresses)})")
                elif not port.isdigit() or int(port) != svc_port:
                    error(c, f"{o}: {k['name']} --server {server}: port {port}, the Service "
                             f"listens on {svc_port}")


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


def main(argv_):
    if len(argv_) != 3:
        print("usage: consistency.py DEPLOY_DIR RENDERED_YAML", file=sys.stderr)
        return 2
    deploy, rendered = argv_[1], argv_[2]
    base = load(rendered)
    examples = [d for p in sorted((Path(deploy) / "examples").glob("*.yaml")) for d in load(p)]
    pods = list(pod_specs(base))
    example_pods = list(pod_specs(examples))
    driver = check_driver_name(base, examples, pods + example_pods)
    check_socket(pods, driver)
    check_volumes(base, examples, pods + example_pods, driver)
    check_store_port(base, examples, pods)
    check_images(base, examples)
    check_service_accounts(base, pods)
    check_dockerfile(deploy, base, examples)
    check_health_port(pods)
    check_env_references(pods + example_pods)
    if errors:
        print(f"deploy: {len(errors)} consistency error(s):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
