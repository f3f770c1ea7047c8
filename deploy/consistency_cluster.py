"""The store's two modes, for consistency.py's `--store single|cluster`.

`single`: one `kt server` whose data directory holds the whole store: on a claim, one replica
(two would be two stores), no flag of cluster mode. `cluster` (deploy/cluster): replicas of
one store over etcd (`--meta`) and an object store (`--blocks`), so that none holds anything
another needs: each on an emptyDir, all signing tickets with one secret, a StatefulSet whose
governing Service is headless, each replica advertising its own name under it. A standby
redirects a client to the owner by that name, and a client follows only to an address of its
own list: so every client lists exactly the N replicas by those names.
"""

import re
from urllib.parse import parse_qsl

from consistency_common import (argv, env_value, error, flag, headless, is_server, kt_servers,
                                mounted_volume, name_of, program, resolve_port, secret_file,
                                selects, server_lists)

STORE_MODES = ("single", "cluster")
# What `kt server --blocks` takes; file:// only where every replica mounts the directory.
BLOCK_SCHEMES = ("s3", "gs", "az", "file")
ETCD_URL = re.compile(r"^etcd://(?:(?P<user>[^@/]*)@)?(?P<hosts>[^/?@]+)/(?P<prefix>[^?]+)"
                      r"(?:\?(?P<query>.*))?$")
ETCD_QUERY = {"ca", "cert", "key", "server_name"}
ETCD_FILES = ("ca", "cert", "key")
VAR = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# The object store's key, which the server takes from its environment only.
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
C = "store mode"


def literal_env(container, name):
    present, value = env_value(container, name)
    return [value] if present and value is not None else []


def check_store_mode(base, pods, example_pods, mode):
    servers = kt_servers(pods)
    if len(servers) != 1:
        return  # check_store_port reports it
    owner, ns, labels, spec, ctr = servers[0]
    who = f"{owner}/{ctr['name']}"
    workload = next((d for d in base if name_of(d) == owner), None)
    wspec = (workload or {}).get("spec") or {}
    replicas = wspec.get("replicas", 1) if workload and workload["kind"] != "Pod" else 1
    args = argv(ctr)
    meta, blocks = flag(args, "--meta"), flag(args, "--blocks")
    advertise = flag(args, "--advertise") + literal_env(ctr, "KT_ADVERTISE")
    tickets = flag(args, "--ticket-secret") + literal_env(ctr, "KT_TICKET_SECRET")
    check_credentials(base, who, ctr)
    data_dirs = flag(args, "--data-dir")
    if len(data_dirs) != 1:
        error(C, f"{who} needs one --data-dir, has {data_dirs}")
        return
    mount, vol = mounted_volume(spec, ctr, data_dirs[0])
    claims = [t["metadata"]["name"] for t in wspec.get("volumeClaimTemplates") or []]
    on_claim = mount is not None and (mount["name"] in claims
                                      or "persistentVolumeClaim" in (vol or {}))
    if mode == "single":
        single_only = (("--meta", meta), ("--blocks", blocks), ("--advertise", advertise),
                       ("--shards", flag(args, "--shards")))
        for what, values in single_only:
            if values:
                error(C, f"{who} has {what}, but this rendering is meant to be one server on "
                         "its data directory (cluster mode is the cluster component's)")
        if replicas != 1:
            error(C, f"{owner}: {replicas} replicas, each on a data directory of its own, would "
                     f"be {replicas} stores")
        if not on_claim:
            error(C, f"{who}: --data-dir={data_dirs[0]} holds the whole store, but is on no "
                     "PersistentVolumeClaim: it would go with the pod")
        return

    for what, values in (("--meta", meta), ("--blocks", blocks)):
        if len(values) != 1:
            error(C, f"{who} needs one {what} in cluster mode, has {values}")
    configmaps = {(d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d
                  for d in base if d["kind"] == "ConfigMap"}
    if len(meta) == 1:
        check_meta(who, spec, ctr, ns, meta[0], configmaps)
    shards = flag(args, "--shards")
    if len(shards) > 1:
        error(C, f"{who} has --shards {shards}: one count, or none to follow the store's")
    elif shards:
        count = expand(who, ctr, ns, "--shards", shards[0], configmaps)
        if count is not None and not (count.isdigit() and 1 <= int(count) <= 1024):
            error(C, f"{who}: --shards is {count!r}, not a count from 1 to 1024")
    if len(blocks) == 1:
        check_blocks(who, spec, ctr, ns, blocks[0], configmaps, replicas)
    # A ticket one replica gave must hold at the next owner.
    if len(tickets) != 1:
        error(C, f"{who} needs one --ticket-secret (or KT_TICKET_SECRET), has {tickets}: "
                 "without it each replica signs with keys of its own, and a new owner refuses "
                 "every ticket the last one gave")
    else:
        secret, got = secret_file(spec, ctr, tickets[0])
        if secret is None:
            error(C, f"{who}: --ticket-secret={tickets[0]}: {got}")
        elif any(d["kind"] == "Secret" and d["metadata"]["name"] == secret for d in base):
            error(C, f"Secret {secret} is in the manifests: whoever reads them could mint the "
                     "store's tickets (make it in the cluster)")
    if vol is None or "emptyDir" not in vol:
        error(C, f"{who}: --data-dir={data_dirs[0]} should be on an emptyDir: a replica keeps "
                 "nothing another needs there, and a claim would tie it to one node's disk")
    if workload is None or workload["kind"] != "StatefulSet":
        error(C, f"{owner}: replicas need names of their own to advertise and to be listed "
                 "by: run them in a StatefulSet")
        return
    if claims:
        error(C, f"{owner}: volumeClaimTemplates {claims}: nothing of a replica outlives it")
    # In order, one replica that cannot start (its node gone) would hold back the others.
    if wspec.get("podManagementPolicy") != "Parallel":
        error(C, f"{owner}: podManagementPolicy {wspec.get('podManagementPolicy')!r}, expected "
                 "Parallel: replicas start and are replaced independently")
    listens = flag(args, "--listen")
    if len(listens) != 1:
        return  # check_store_port reports it
    port = int(listens[0].rsplit(":", 1)[1])
    suffix = check_governing(base, owner, ns, labels, ctr, wspec.get("serviceName"), port)
    if suffix is None:
        return
    check_advertise(who, ctr, advertise, suffix)
    expected = [f"{workload['metadata']['name']}-{i}.{suffix}" for i in range(replicas)]
    check_clients(pods, example_pods, expected)


def check_governing(base, owner, ns, labels, ctr, name, port):
    """The governing Service gives each replica its name, POD.SERVICE.NAMESPACE.svc; returns
    the part after POD. (with the port), or None where there is none."""
    found = [d for d in base if d["kind"] == "Service" and d["metadata"]["name"] == name
             and d["metadata"].get("namespace", "default") == ns]
    if not found:
        error(C, f"{owner}: serviceName {name!r} is no Service of {ns}")
        return None
    svc = found[0]
    sspec = svc.get("spec") or {}
    if not headless(svc):
        error(C, f"{name_of(svc)} governs {owner} but is not headless (clusterIP: None): the "
                 "replicas get no names of their own")
    if not selects(svc, ns, labels):
        error(C, f"{name_of(svc)} governs {owner} but does not select its pods")
    # The owner is elected through etcd whether or not its probe passed yet, and clients must
    # reach it by its name as soon as it is.
    if sspec.get("publishNotReadyAddresses") is not True:
        error(C, f"{name_of(svc)}: publishNotReadyAddresses must be true: a replica's name must "
                 "resolve from its start, not from its first passed probe")
    # Its names are the pods' addresses, dialled on the pod's port.
    for p in sspec.get("ports") or []:
        target = resolve_port(ctr, p.get("targetPort", p["port"]))
        if p["port"] != target:
            error(C, f"{name_of(svc)}: port {p['port']} targets {target}: a headless Service's "
                     "names are the pods', dialled on the port a client names")
    if not any(p["port"] == port for p in sspec.get("ports") or []):
        error(C, f"{name_of(svc)} has no port {port}, where kt server listens")
    return f"{name}.{ns}.svc:{port}"


def check_advertise(who, ctr, advertise, suffix):
    """Each replica advertises its own name, which a standby names when it redirects."""
    want = f"$(POD_NAME).{suffix}"
    if len(advertise) != 1:
        error(C, f"{who} needs one --advertise (or KT_ADVERTISE), {want}, has {advertise}")
        return
    m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)\.(.*)", advertise[0])
    if not m or m.group(2) != suffix:
        error(C, f"{who}: --advertise={advertise[0]}, expected {want}: the replica's name "
                 "under the StatefulSet's governing Service, which the clients list")
        return
    env = {e["name"]: e for e in ctr.get("env") or []}
    field = ((env.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef") or {}
    if field.get("fieldPath") != "metadata.name":
        error(C, f"{who}: --advertise takes $({m.group(1)}), which is not the pod's "
                 "metadata.name")


def check_clients(pods, example_pods, expected):
    """Every client lists the replicas, all of them and nothing else: a call moves on to the
    next replica of its list, and follows a standby's redirect only to an address of it. Each
    process of the rendering that dials the store must name them; an example that names the
    store at all must name them the same way (one address works with a single server only)."""
    rendered = {id(spec) for *_, spec in pods}
    for owner, _, _, spec in pods + example_pods:
        for k in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if is_server(k) or program(k) not in ("kt", "kt-csi"):
                continue
            lists = server_lists(k)
            if not lists and id(spec) in rendered:
                error(C, f"{owner}: {k['name']} names no replica (--server or KT_SERVER): "
                         f"expected {','.join(expected)}")
            for where, addresses in lists:
                wrong = [f"{what} {found}" for what, found in (
                    ("lacks", [a for a in expected if a not in addresses]),
                    ("names what is no replica:", sorted({a for a in addresses
                                                          if a not in expected})),
                    ("names twice", sorted({a for a in addresses if addresses.count(a) > 1})))
                    if found]
                if wrong:
                    error(C, f"{owner}: {k['name']} {where} {'; '.join(wrong)} (the "
                             f"{len(expected)} replicas are {','.join(expected)})")


def expand(who, ctr, ns, what, text, configmaps):
    """text with its $(VAR)s as Kubernetes expands them from the container's env: a literal
    value, or a key of a ConfigMap of the manifests. None where a Secret holds one (its value
    is not in the manifests), or where a reference is reported."""
    env = {e["name"]: e for e in ctr.get("env") or []}
    known = True

    def value(m):
        nonlocal known
        var = m.group(1)
        e = env.get(var)
        if e is None:
            known = False  # check_env_references reports it
            return m.group(0)
        if "value" in e:
            return e["value"]
        ref = e.get("valueFrom") or {}
        src = ref.get("configMapKeyRef") or ref.get("secretKeyRef")
        known = False
        if src is None:
            error(C, f"{who}: {what} takes $({var}) from a field of the pod, not a URL")
            return m.group(0)
        if src.get("optional"):
            error(C, f"{who}: {what} takes $({var}) from an optional key: where it is missing "
                     f"the server gets the text $({var})")
        if "secretKeyRef" in ref:
            return m.group(0)
        cm = configmaps.get((ns, src.get("name")))
        if cm is None:
            error(C, f"{who}: {what} takes $({var}) from ConfigMap {src.get('name')}, which is "
                     f"not in the manifests in {ns}: the pod would not start")
        elif src.get("key") not in (cm.get("data") or {}):
            error(C, f"{who}: {what} takes $({var}) from key {src.get('key')!r} of "
                     f"{name_of(cm)}, which has {sorted(cm.get('data') or {})}")
        else:
            known = True
            return cm["data"][src["key"]]
        return m.group(0)

    out = VAR.sub(value, text)
    return out if known else None


def check_meta(who, spec, ctr, ns, value, configmaps):
    url = expand(who, ctr, ns, "--meta", value, configmaps)
    if url is None:
        return
    m = ETCD_URL.match(url)
    if not m:
        error(C, f"{who}: --meta is {url!r}, not etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?...]")
        return
    if m["user"] is not None and ":" in m["user"]:
        error(C, f"{who}: --meta {url!r} holds a password, which would be in the manifests for "
                 "whoever reads them: take the URL from a Secret")
    for hostport in m["hosts"].split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            error(C, f"{who}: --meta {url!r}: {hostport!r} is not HOST:PORT")
    query = dict(parse_qsl(m["query"] or "", keep_blank_values=True))
    for k in sorted(set(query) - ETCD_QUERY):
        error(C, f"{who}: --meta {url!r}: kt server knows no {k!r} (known: {sorted(ETCD_QUERY)})")
    for k in ETCD_FILES:
        if k in query:
            secret, got = secret_file(spec, ctr, query[k])
            if secret is None and not (k == "ca" and mounted_volume(spec, ctr, query[k])[1]):
                error(C, f"{who}: --meta {k}={query[k]}: {got}")


def check_blocks(who, spec, ctr, ns, value, configmaps, replicas):
    url = expand(who, ctr, ns, "--blocks", value, configmaps)
    if url is None:
        return
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in BLOCK_SCHEMES:
        error(C, f"{who}: --blocks is {url!r}, not one of "
                 f"{', '.join(s + '://' for s in BLOCK_SCHEMES)}")
    elif scheme == "file":
        path = rest.split("?", 1)[0]
        _, vol = mounted_volume(spec, ctr, path)
        if replicas > 1 and (vol is None or "emptyDir" in vol or "hostPath" in vol):
            error(C, f"{who}: --blocks {url!r} is on no volume the {replicas} replicas share: "
                     "each would hold blocks the others lack")
    elif not rest.split("?", 1)[0].split("/", 1)[0]:
        error(C, f"{who}: --blocks {url!r} names no bucket")


def check_credentials(base, who, ctr):
    """The object store's key comes from a Secret made in the cluster, both halves of it from
    one, or from neither (a cloud's workload identity)."""
    env = {e["name"]: e for e in ctr.get("env") or [] if e["name"] in CREDENTIALS}
    if env and len(env) != len(CREDENTIALS):
        error(C, f"{who} sets {sorted(env)} without {sorted(set(CREDENTIALS) - set(env))}")
    secrets = set()
    for name, e in sorted(env.items()):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            error(C, f"{who}: {name} is not from a Secret: the key would be in the manifests "
                     "for whoever reads them")
        else:
            secrets.add(ref.get("name"))
    if len(secrets) > 1:
        error(C, f"{who}: the object store's key comes from several Secrets {sorted(secrets)}")
    for d in base:
        if d["kind"] == "Secret" and d["metadata"]["name"] in secrets:
            error(C, f"{name_of(d)}: the object store's key is in the manifests (make the "
                     "Secret in the cluster)")
