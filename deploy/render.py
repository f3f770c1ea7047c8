#!/usr/bin/env python3
"""Render deploy/kustomization.yaml without kubectl, and compare two renderings.

    render.py DIR            print the kustomization in DIR as one multi-document YAML stream
    render.py --compare A B  exit 1 unless the two streams hold the same objects

The renderer covers exactly what our kustomizations use and refuses anything else, so it can
never silently disagree with `kubectl kustomize`:

- `resources:` files, and directories holding a kustomization.yaml (an overlay's base, rendered
  first, recursively);
- `components:` directories holding a kustomization.yaml of `kind: Component`: after the
  resources, each adds its own resources and applies its patches to everything so far, as
  kustomize does (deploy/tls, deploy/tls/cert-manager and deploy/cluster are components);
- `patches:` with `path:` and a `target:` of `kind`/`name` (optionally `group`, `version`,
  `namespace`), each file a JSON 6902 patch written as a YAML list of operations (`add`,
  `remove`, `replace`, `test`); a strategic-merge patch or an inline `patch:` is refused, and
  so is an `add` onto a member that exists (RFC 6902 replaces it, which would silently drop
  what the base or another component put there: lists are appended to with `/-`, and a value
  is changed by `test` and `replace`);
- `namespace:`: objects of namespaced kinds get `metadata.namespace`; cluster-scoped kinds are
  left alone.

Kustomize sorts objects by kind, this keeps file order; `--compare` therefore matches objects by
identity.
"""

import difflib
import sys
from pathlib import Path

import yaml

# Kinds that have no namespace (kubectl api-resources --namespaced=false, the ones a deploy
# directory could plausibly hold).
CLUSTER_SCOPED = {
    "APIService",
    "CertificateSigningRequest",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterTrustBundle",
    "CSIDriver",
    "CSINode",
    "CustomResourceDefinition",
    "FlowSchema",
    "IngressClass",
    "MutatingWebhookConfiguration",
    "Namespace",
    "Node",
    "PersistentVolume",
    "PriorityClass",
    "PriorityLevelConfiguration",
    "RuntimeClass",
    "StorageClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
    "VolumeAttachment",
    "VolumeAttributesClass",
}

SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "resources", "components", "patches"}
KUSTOMIZATION = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
COMPONENT = ("kustomize.config.k8s.io/v1alpha1", "Component")
PATCH_FIELDS = {"path", "target"}
TARGET_FIELDS = {"group", "version", "kind", "name", "namespace"}


def fail(msg):
    print(f"render.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load_documents(path):
    """The non-empty documents of a YAML file, each a mapping."""
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            fail(f"{path}: a document is not a Kubernetes object")
    return docs


def load_kustomization(directory, want):
    kfile = Path(directory) / "kustomization.yaml"
    if not kfile.is_file():
        fail(f"{directory} holds no kustomization.yaml")
    with open(kfile) as f:
        kust = yaml.safe_load(f)
    unsupported = sorted(set(kust) - SUPPORTED_FIELDS)
    if unsupported:
        fail(f"{kfile}: fields {unsupported} are not supported by this renderer; "
             "extend render.py or drop them")
    have = (kust.get("apiVersion"), kust.get("kind", "Kustomization"))
    if have != want:
        fail(f"{kfile}: is {have[0]} {have[1]}, expected {want[0]} {want[1]} here")
    return kfile, kust


def render(directory):
    kfile, kust = load_kustomization(directory, KUSTOMIZATION)
    docs = []
    accumulate(kfile, kust, docs)
    return docs


def accumulate(kfile, kust, docs):
    """A kustomization's (or component's) resources, components, patches and namespace, in
    kustomize's order, onto docs."""
    directory = kfile.parent
    for res in kust.get("resources", []):
        path = directory / res
        if path.is_dir():
            docs.extend(render(path))
        elif path.is_file():
            docs.extend(load_documents(path))
        else:
            fail(f"{kfile}: resource {res!r} is neither a file nor a directory in {directory}")
    for comp in kust.get("components", []):
        ckfile, ckust = load_kustomization(directory / comp, COMPONENT)
        accumulate(ckfile, ckust, docs)
    for patch in kust.get("patches", []):
        apply_patch(kfile, directory, patch, docs)
    namespace = kust.get("namespace")
    if namespace:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace


def matches(target, doc):
    group, _, version = doc.get("apiVersion", "").rpartition("/")
    md = doc["metadata"]
    have = {"group": group, "version": version, "kind": doc["kind"], "name": md.get("name"),
            "namespace": md.get("namespace", "")}
    return all(have[k] == v for k, v in target.items())


def apply_patch(kfile, directory, patch, docs):
    """One entry of `patches:`: a JSON 6902 patch file applied to every object it targets."""
    if not isinstance(patch, dict) or set(patch) != PATCH_FIELDS:
        fail(f"{kfile}: a patch must have exactly {sorted(PATCH_FIELDS)} (got {patch!r}); "
             "extend render.py or drop it")
    target = patch["target"]
    if not isinstance(target, dict) or not target or set(target) - TARGET_FIELDS:
        fail(f"{kfile}: patch target {target!r} may only use {sorted(TARGET_FIELDS)}")
    path = directory / patch["path"]
    if not path.is_file():
        fail(f"{kfile}: patch {patch['path']!r} is not a file in {directory}")
    with open(path) as f:
        ops = yaml.safe_load(f)
    if not isinstance(ops, list):
        fail(f"{path}: not a JSON 6902 patch (a list of operations); strategic-merge patches "
             "are not supported by this renderer")
    hits = [d for d in docs if matches(target, d)]
    if not hits:
        fail(f"{kfile}: patch {patch['path']!r} targets {target}, which no object is")
    for doc in hits:
        for op in ops:
            try:
                json_patch_op(doc, op)
            except PatchError as e:
                fail(f"{path}: {op!r} on {doc['kind']}/{doc['metadata']['name']}: {e}")


class PatchError(Exception):
    pass


def pointer(path):
    """The tokens of a JSON pointer (RFC 6901)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise PatchError(f"path {path!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def index(container, token, append_ok=False):
    if token == "-" and append_ok:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"{token!r} is not an array index")
    i = int(token)
    if i > len(container) or (i == len(container) and not append_ok):
        raise PatchError(f"index {i} is out of range (length {len(container)})")
    return i


def json_patch_op(doc, op):
    """One RFC 6902 operation, in place. Only what kustomize's patches need."""
    kind = op.get("op") if isinstance(op, dict) else None
    if kind not in ("add", "remove", "replace", "test"):
        raise PatchError("only add, remove, replace and test are supported by this renderer")
    tokens = pointer(op.get("path"))
    parent = doc
    for t in tokens[:-1]:
        if isinstance(parent, list):
            parent = parent[index(parent, t)]
        elif isinstance(parent, dict) and t in parent:
            parent = parent[t]
        else:
            raise PatchError(f"{op['path']}: {t!r} does not exist")
    last = tokens[-1]
    if kind != "remove" and "value" not in op:
        raise PatchError("no value")
    if isinstance(parent, list):
        i = index(parent, last, append_ok=(kind == "add"))
        if kind == "add":
            parent.insert(i, op["value"])
        elif kind == "remove":
            del parent[i]
        elif kind == "replace":
            parent[i] = op["value"]
        elif parent[i] != op["value"]:
            raise PatchError(f"test failed: {parent[i]!r} is not {op['value']!r}")
    elif isinstance(parent, dict):
        if kind == "add":
            if last in parent:
                raise PatchError(f"{op['path']} exists, and an add would replace it; append "
                                 "to a list with /-, or test and replace a value")
            parent[last] = op["value"]
            return
        if last not in parent:
            raise PatchError(f"{op['path']} does not exist")
        if kind == "remove":
            del parent[last]
        elif kind == "replace":
            parent[last] = op["value"]
        elif parent[last] != op["value"]:
            raise PatchError(f"test failed: {parent[last]!r} is not {op['value']!r}")
    else:
        raise PatchError(f"{op['path']}: the parent is neither an object nor an array")


def identity(doc):
    md = doc["metadata"]
    return (doc.get("apiVersion"), doc["kind"], md.get("namespace", ""), md.get("name"))


def compare(a, b):
    left = {identity(d): d for d in load_documents(a)}
    right = {identity(d): d for d in load_documents(b)}
    problems = []
    for key in sorted(set(left) | set(right), key=str):
        if key not in right:
            problems.append(f"only in {a}: {key}")
        elif key not in left:
            problems.append(f"only in {b}: {key}")
        elif left[key] != right[key]:
            diff = difflib.unified_diff(yaml.safe_dump(left[key]).splitlines(),
                                        yaml.safe_dump(right[key]).splitlines(),
                                        a, b, lineterm="")
            problems.append(f"differs: {key}\n" + "\n".join(diff))
    if problems:
        fail("renderings disagree:\n" + "\n".join(problems))


def main(argv):
    if len(argv) == 4 and argv[1] == "--compare":
        compare(argv[2], argv[3])
    elif len(argv) == 2:
        yaml.safe_dump_all(render(argv[1]), sys.stdout, sort_keys=False)
    else:
        fail("usage: render.py DIR | render.py --compare A B")


if __name__ == "__main__":
    main(sys.argv)
