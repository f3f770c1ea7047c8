#!/usr/bin/env bash
# The test command: sets up a fresh Debian machine (the apt and pip packages the build and the
# tests need), then runs every test of the workspace. Run it as root: the mount and CSI tests
# mount FUSE for real, and the package install needs root (as a user, install the packages
# yourself; the install step is skipped, not the tests).
#
#   bash scripts/test.sh          # as root; from a user account: sudo bash scripts/test.sh
#
# It also checks formatting, clippy's lints and the client-only build (`--no-default-features`:
# no RocksDB, no FUSE), which a laptop's `kt` and the Python package link, and builds, installs
# and tests the Python package (python/). `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# librocksdb-dev: linked instead of compiling RocksDB (see .cargo/config.toml); clang and
# libclang-dev: bindgen for its bindings; protobuf-compiler: the control-plane proto, and
# libprotobuf-dev: the google/protobuf/*.proto that the CSI spec's csi.proto imports (kt-csi);
# fuse3, attr (setfattr), git and python3: the mount tests drive the filesystem with them;
# iproute2: the GPU test makes a pod of its own (a network namespace and a veth pair); rdiff:
# tests/delta.rs applies ktfs's deltas with librsync's tool; rsync: bench/delta.sh's baseline;
# etcd-server: cluster mode's metadata engine, which the engine's tests start and the second
# pass below runs the metadata-heavy tests on (curl asks it whether it is up); etcd-client:
# etcdctl, which backs etcd up and restores it in tests/cluster.rs.
APT_PACKAGES=(librocksdb-dev clang libclang-dev protobuf-compiler libprotobuf-dev fuse3 attr iproute2 git rdiff rsync
    python3 python3-pip etcd-server etcd-client curl)
# kubernetes-validate: the offline Kubernetes schemas deploy/check.sh validates the manifests
# against (tests/deploy.rs runs it); maturin builds the Python package, whose tests use pytest,
# fsspec, numpy, pandas and pyarrow.
PIP_PACKAGES=(kubernetes-validate==1.37.0 maturin pytest fsspec numpy pandas pyarrow)

pip_install() {
    # A Debian-managed python3 needs --break-system-packages.
    python3 -m pip install -q "$@" 2>/dev/null \
        || python3 -m pip install -q --break-system-packages "$@"
}

if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
    pip_install "${PIP_PACKAGES[@]}"
else
    echo "test.sh: not root: not installing ${APT_PACKAGES[*]} ${PIP_PACKAGES[*]}" >&2
fi
# s3s-fs: a real S3 server over a directory (the s3s project's), which tests/cluster.rs runs
# cluster mode's object store against; built from crates.io at a pinned version with its own
# lock file (0.14.1: newer ones need a newer rustc than the toolchain's).
if ! command -v s3s-fs >/dev/null; then
    cargo install --quiet --locked s3s-fs@0.14.1 --features binary
fi

cargo fmt --all -- --check
# Every crate and target of the workspace, lints as errors (`clippy.toml` holds the thresholds).
cargo clippy --workspace --all-targets -- -D warnings

# The client-only build holds nothing of RocksDB or FUSE, and compiles (checked, not built:
# a build would put its `kt` where the tests expect the full one).
if cargo tree --no-default-features -p ktfs -e normal -i rocksdb >/dev/null 2>&1 \
    || cargo tree --no-default-features -p ktfs -e normal -i fuser >/dev/null 2>&1 \
    || cargo tree --no-default-features -p ktfs -e normal -i etcd-client >/dev/null 2>&1 \
    || cargo tree --no-default-features -p ktfs -e normal -i object_store >/dev/null 2>&1 \
    || cargo tree --no-default-features -p ktfs -e normal -i tonic-health >/dev/null 2>&1; then
    echo "test.sh: the client-only build depends on a store server's crate (rocksdb, fuser, etcd-client, object_store, tonic-health)" >&2
    exit 1
fi
cargo check --no-default-features -p ktfs --lib --bins

# What `kt put` remembers of its puts goes to a directory of this run, not the user's cache,
# where indexes of earlier runs name servers long gone (whose addresses the tests reuse).
KT_INDEX_DIR="$(mktemp -d)"
export KT_INDEX_DIR
ETCD_PID=
cleanup() {
    # The run's own status, whatever stopping etcd answers (its SIGTERM would be 143).
    local status=$?
    set +e
    if [ -n "$ETCD_PID" ]; then
        kill "$ETCD_PID" 2>/dev/null
        wait "$ETCD_PID" 2>/dev/null
    fi
    rm -rf "$KT_INDEX_DIR" "${ETCD_DIR:-}"
    exit "$status"
}
trap cleanup EXIT

cargo test --workspace

# The Python package: its extension built in the profile the Rust tests used (so only it and
# the client-only library compile), installed, and its tests run against the `kt` just built.
rm -rf target/wheels
maturin build --profile dev -m python/Cargo.toml --out target/wheels --quiet
pip_install --force-reinstall --no-deps target/wheels/ktfs-*.whl
python3 -m pytest -q python/tests

# The second pass: the metadata-heavy tests again, each store server's metadata on a real etcd
# (one member on loopback, its data in memory, slow heartbeats for a starved machine) rather
# than RocksDB: the two engines must answer alike (doc/cluster.md).
ETCD_DIR="$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)"
ETCD_AT=127.0.0.108
etcd --name kt --data-dir "$ETCD_DIR/data" \
    --listen-client-urls "http://$ETCD_AT:2379" --advertise-client-urls "http://$ETCD_AT:2379" \
    --listen-peer-urls "http://$ETCD_AT:2380" --initial-advertise-peer-urls "http://$ETCD_AT:2380" \
    --initial-cluster "kt=http://$ETCD_AT:2380" --heartbeat-interval 250 --election-timeout 2500 \
    >"$ETCD_DIR/log" 2>&1 &
ETCD_PID=$!
# Up once it answers its health check: at most 30 s, asked every 0.2 s.
for _ in $(seq 150); do
    curl -sf "http://$ETCD_AT:2379/health" >/dev/null && break
    sleep 0.2
done
curl -sf "http://$ETCD_AT:2379/health" >/dev/null || { cat "$ETCD_DIR/log" >&2; exit 1; }
export KT_TEST_META="etcd://$ETCD_AT:2379"
cargo test --workspace --test semantics --test watch --test gc --test durability --test model \
    --test posix --test cli --test auth --test tls
python3 -m pytest -q python/tests
