#!/usr/bin/env python3
"""Render deploy/kustomization.yaml without kubectl, and compare two renderings.

    render.py DIR            print the kustomization in DIR as one multi-document YAML stream
    render.py --compare A B  exit 1 unless the two streams hold the same objects

The renderer covers exactly what our kustomization uses, `resources:` (files) and `namespace:`,
and refuses anything else, so it can never silently disagree with `kubectl kustomize`. Objects of
namespaced kinds get `metadata.namespace`; cluster-scoped kinds are left alone. Kustomize sorts
objects by kind, this keeps file order; `--compare` therefore matches objects by identity.
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

SUPPORTED_FIELDS = {"apiVersion", "kind", "namespace", "resources"}


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


def render(directory):
    directory = Path(directory)
    kfile = directory / "kustomization.yaml"
    with open(kfile) as f:
        kust = yaml.safe_load(f)
    unsupported = sorted(set(kust) - SUPPORTED_FIELDS)
    if unsupported:
        fail(f"{kfile}: fields {unsupported} are not supported by this renderer; "
             "extend render.py or drop them")
    namespace = kust.get("namespace")
    docs = []
    for res in kust.get("resources", []):
        path = directory / res
        if not path.is_file():
            fail(f"{kfile}: resource {res!r} is not a file in {directory}")
        for doc in load_documents(path):
            if namespace and doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace
            docs.append(doc)
    return docs


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
