"""What consistency.py and consistency_cluster.py read manifests with, and where they report.

Pure functions of rendered objects (dicts as PyYAML loads them); every check reports through
error(), and consistency.py prints `errors` at the end.
"""

import posixpath
import re

import yaml

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


# A DNS name (RFC 1123), as Kubernetes and certificates take them.
LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){LABEL}(\.{LABEL})*$")


def env_value(container, name):
    """(present, literal value) of an env var; a valueFrom is present with value None."""
    for e in container.get("env") or []:
        if e["name"] == name:
            return True, e.get("value")
    return False, None


def secret_file(spec, container, path):
    """(Secret name, key) of the file at path in the container, or (None, reason)."""
    m, vol = mounted_volume(spec, container, path)
    if m is None:
        return None, f"no volume is mounted where {path} is"
    if vol is None:
        return None, f"{path} is on volume {m['name']!r}, which the pod does not define"
    if "secret" not in vol:
        return None, f"{path} is on volume {m['name']!r}, which is not a secret volume"
    sec = vol["secret"]
    if sec.get("optional"):
        return None, (f"volume {m['name']!r} is optional: the pod would start without "
                      f"{path}")
    rel = path[len(m["mountPath"].rstrip("/")) + 1:]
    if m.get("subPath"):
        if rel:
            return None, f"{path} is below a subPath mount of one file"
        rel = m["subPath"]
    items = sec.get("items")
    if items is None:
        if not rel or "/" in rel:
            return None, f"{path} is no key of Secret {sec.get('secretName')!r}"
        return sec.get("secretName"), rel
    keys = [i["key"] for i in items if i["path"] == rel]
    if not keys:
        return None, (f"{path}: volume {m['name']!r} projects only "
                      f"{sorted(i['path'] for i in items)} of Secret {sec.get('secretName')!r}")
    return sec.get("secretName"), keys[0]


def mounted_volume(spec, container, path):
    """(mount, volume) of the volume the container has path on (the deepest mount holding it):
    (None, None) where none holds it, (mount, None) where the pod does not define its volume."""
    mounts = [m for m in container.get("volumeMounts") or []
              if path == m["mountPath"].rstrip("/")
              or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        return None, None
    m = max(mounts, key=lambda m: len(m["mountPath"]))
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    return m, vols.get(m["name"])


def is_server(container):
    return program(container) == "kt" and argv(container)[1:2] == ["server"]


def kt_servers(pods):
    """(owner, namespace, labels, spec, container) of every container running `kt server`."""
    return [(o, ns, labels, spec, k) for o, ns, labels, spec in pods
            for k in spec.get("containers") or [] if is_server(k)]


def selects(service, namespace, labels):
    """Whether the Service sends its traffic to pods of these labels in this namespace."""
    sel = (service.get("spec") or {}).get("selector") or {}
    return (service["metadata"].get("namespace", "default") == namespace and bool(sel)
            and all(labels.get(k) == v for k, v in sel.items()))


def headless(service):
    return (service.get("spec") or {}).get("clusterIP") == "None"


def server_lists(container):
    """The store addresses a ktfs client dials, as (where, [HOST:PORT, ...]): each --server and
    a literal KT_SERVER, a comma-separated list of the store's replicas."""
    lists = [(f"--server {v}", v) for v in flag(argv(container), "--server")]
    present, value = env_value(container, "KT_SERVER")
    if present and value is not None:
        lists.append((f"KT_SERVER={value}", value))
    return [(where, [a.strip() for a in value.split(",")]) for where, value in lists]
