#!/usr/bin/env bash
# Offline checks of deploy/ (CI runs this): render the kustomization, validate every object and
# the examples against the Kubernetes schemas (strict: unknown fields fail), then the cross-file
# consistency checks. Needs python3 with PyYAML and kubernetes-validate
# (`pip install kubernetes-validate`); kubectl is optional (when present, its rendering must agree
# with render.py's). Run from anywhere: bash deploy/check.sh
set -euo pipefail

K8S_VERSION=1.30.0
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "deploy/check.sh: $*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is missing (apt-get install python3 python3-pip)"
python3 -c 'import yaml' 2>/dev/null \
  || die "the Python module yaml is missing (pip install pyyaml, or apt-get install python3-yaml)"
python3 -c 'import kubernetes_validate' 2>/dev/null \
  || die "the Python module kubernetes_validate is missing (pip install kubernetes-validate)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# a. Render. render.py always runs; kubectl, where installed, must give the same objects.
python3 "$dir/render.py" "$dir" >"$tmp/rendered.yaml"
renderer="render.py (no kubectl here)"
if command -v kubectl >/dev/null; then
  kubectl kustomize "$dir" >"$tmp/kubectl.yaml" || die "kubectl kustomize $dir failed"
  python3 "$dir/render.py" --compare "$tmp/rendered.yaml" "$tmp/kubectl.yaml"
  renderer="kubectl kustomize and render.py agree"
fi

# b. Schemas. One file per document (NNN-SOURCE-KIND-NAME.yaml) so that an error names its object.
examples=("$dir"/examples/*.yaml)
[[ -e "${examples[0]}" ]] || die "no examples in $dir/examples"
count="$(python3 - "$tmp/docs" "$tmp/rendered.yaml" "${examples[@]}" <<'EOF'
import os, sys, yaml
out, n = sys.argv[1], 0
os.makedirs(out)
for i, path in enumerate(sys.argv[2:]):
    source = "base" if i == 0 else os.path.basename(path).removesuffix(".yaml")
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            n += 1
            name = f"{n:03d}-{source}-{doc['kind']}-{doc['metadata']['name']}.yaml".lower()
            with open(os.path.join(out, name), "w") as g:
                yaml.safe_dump(doc, g, sort_keys=False)
print(n)
EOF
)"
python3 -m kubernetes_validate --strict --quiet -k "$K8S_VERSION" "$tmp"/docs/*.yaml \
  || die "schema validation against Kubernetes $K8S_VERSION failed (see above)"

# c. Cross-file consistency.
python3 "$dir/consistency.py" "$dir" "$tmp/rendered.yaml" || die "consistency checks failed"

# d.
echo "deploy: $count documents valid (Kubernetes $K8S_VERSION schemas, strict; consistency checks passed; $renderer)"
