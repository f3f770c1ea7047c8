#!/usr/bin/env bash
# Offline checks of deploy/ (CI runs this): render the kustomization and its TLS and cluster
# variants, validate every object and the examples against the Kubernetes schemas (strict:
# unknown fields fail), then the cross-file consistency checks. Needs python3 with PyYAML and
# kubernetes-validate (`pip install kubernetes-validate`); kubectl is optional (when present, its
# rendering must agree with render.py's). Run from anywhere: bash deploy/check.sh
set -euo pipefail

K8S_VERSION=1.30.0
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"

die() { echo "deploy/check.sh: $*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is missing (apt-get install python3 python3-pip)"
python3 -c 'import yaml' 2>/dev/null \
  || die "the Python module yaml is missing (pip install pyyaml, or apt-get install python3-yaml)"
python3 -c 'import kubernetes_validate' 2>/dev/null \
  || die "the Python module kubernetes_validate is missing (pip install kubernetes-validate)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tmp="$(cd "$tmp" && pwd -P)"

# The variants, NAME|COMPONENTS|TLS|STORE: the components of deploy/ it turns on, and what
# consistency.py's --tls and --store expect of it. Each but the base is rendered from an overlay
# in $tmp, as a user's own overlay turns them on (kustomize refuses an overlay inside its base's
# directory). cluster comes before tls in one and after it in another: the components append to
# the same lists, and either order must keep both.
variants=(
  "base||none|single"
  "tls|tls|secret|single"
  "tls+cert-manager|tls tls/cert-manager|cert-manager|single"
  "cluster|cluster|none|cluster"
  "cluster+tls+cert-manager|cluster tls tls/cert-manager|cert-manager|cluster"
  "tls+cluster|tls cluster|secret|cluster"
)

# a. Render. render.py always runs; kubectl, where installed, must give the same objects.
renderer="render.py (no kubectl here)"
if command -v kubectl >/dev/null; then
  renderer="kubectl kustomize and render.py agree"
fi
rendered=()
names=()
for v in "${variants[@]}"; do
  IFS='|' read -r name components _ <<<"$v"
  src="$dir"
  if [[ -n "$components" ]]; then
    src="$tmp/overlays/$name"
    mkdir -p "$src"
    rel="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
      "$dir" "$src")"
    {
      echo "apiVersion: kustomize.config.k8s.io/v1beta1"
      echo "kind: Kustomization"
      echo "resources:"
      echo "  - $rel"
      echo "components:"
      for comp in $components; do echo "  - $rel/$comp"; done
    } >"$src/kustomization.yaml"
  fi
  out="$tmp/rendered-$name.yaml"
  python3 "$dir/render.py" "$src" >"$out" || die "render.py failed on the $name variant"
  if command -v kubectl >/dev/null; then
    kubectl kustomize "$src" >"$tmp/kubectl-$name.yaml" \
      || die "kubectl kustomize failed on the $name variant ($src)"
    python3 "$dir/render.py" --compare "$out" "$tmp/kubectl-$name.yaml" \
      || die "render.py and kubectl kustomize disagree on the $name variant"
  fi
  rendered+=("$out")
  names+=("$name")
done

# b. Schemas. One file per distinct document (NNN-SOURCE-KIND-NAME.yaml) so that an error names
# its object; a document a variant shares with the base is validated once. cert-manager's
# objects (cert-manager.io) are custom resources, which the Kubernetes schemas do not cover:
# they are left out here, and consistency.py checks their shape field by field.
examples=("$dir"/examples/*.yaml)
[[ -e "${examples[0]}" ]] || die "no examples in $dir/examples"
counts="$(python3 - "$tmp/docs" "${#variants[@]}" "${rendered[@]}" "${examples[@]}" <<'PY'
import os, sys, yaml
out, nvariants, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
os.makedirs(out)
seen, n, custom = set(), 0, 0
for i, path in enumerate(paths):
    source = os.path.basename(path).removesuffix(".yaml")
    if i < nvariants:
        source = source.removeprefix("rendered-")
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            text = yaml.safe_dump(doc, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            if doc.get("apiVersion", "").split("/")[0] == "cert-manager.io":
                custom += 1
                continue
            n += 1
            name = f"{n:03d}-{source}-{doc['kind']}-{doc['metadata']['name']}.yaml".lower()
            with open(os.path.join(out, name), "w") as g:
                yaml.safe_dump(doc, g, sort_keys=False)
print(n, custom)
PY
)"
read -r count custom <<<"$counts"
python3 -m kubernetes_validate --strict --quiet -k "$K8S_VERSION" "$tmp"/docs/*.yaml \
  || die "schema validation against Kubernetes $K8S_VERSION failed (see above)"
[[ "$custom" -gt 0 ]] || die "the tls/cert-manager variant rendered no cert-manager object"

# c. Cross-file consistency of each variant, TLS included: all or nothing, one Secret, the
# mounted paths the flags and KT_TLS_CA name, the certificate's names (see consistency.py); and
# the store's mode: one server on a claim, or replicas that every client lists by the names they
# advertise (see consistency_cluster.py).
for i in "${!variants[@]}"; do
  IFS='|' read -r name _ tls store <<<"${variants[$i]}"
  python3 "$dir/consistency.py" "$dir" "${rendered[$i]}" --tls "$tls" --store "$store" \
    || die "consistency checks of the $name variant failed"
done

# d.
echo "deploy: $count documents valid (Kubernetes $K8S_VERSION schemas, strict) and $custom" \
  "cert-manager objects shape-checked, in ${#variants[@]} variants (${names[*]});" \
  "consistency checks passed; $renderer"
