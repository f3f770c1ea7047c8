# The multi-node harness on one machine: a store server and N node agents, each in its own network
# namespace on one bridge, each namespace's uplink limited by tc, so that what a tree saves over a
# single source shows on a single machine. Source it after bench/lib.sh; not a program.
#
# Addresses live only inside namespaces this harness creates (NET_PREFIX.0.1 the store,
# NET_PREFIX.1.i node i); the bridge has no address, so nothing outside them is reachable from
# them, nor they from the host's own namespace. Every namespace, link and process is removed by
# `netns_cleanup`, which the caller runs from its EXIT trap.
#
# The caller sets KT (the binary) and WORK, and may set:
#   NET_PREFIX   first two octets of the private addresses inside the namespaces (default 10.201)
#   LINK_MBIT    each namespace's uplink in Mbit/s (default 400, i.e. 50 MB/s)

NET_PREFIX=${NET_PREFIX:-10.201}
LINK_MBIT=${LINK_MBIT:-400}
NS_PREFIX=ktb$$
BRIDGE=ktbr$$
NETNS_LIST=()
AGENT_PIDS=()
STORE_NS=
STORE_ADDR=

netns_cleanup() {
    set +e
    local ns pid
    for pid in "${AGENT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${AGENT_PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    for ns in "${NETNS_LIST[@]}"; do
        # Whatever still runs in it (a get left by a failed scenario).
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    ip link del "$BRIDGE" 2>/dev/null
    true
}

netns_bridge() {
    ip link add "$BRIDGE" type bridge || die "cannot create a bridge (root and CAP_NET_ADMIN needed)"
    ip link set "$BRIDGE" up
}

# A namespace named NS_PREFIX-NAME with ADDR/16 on eth0, attached to the bridge, uplink limited.
netns_add() { # NAME ADDR
    local ns=$NS_PREFIX-$1 addr=$2 host=${NS_PREFIX}h$RANDOM
    ip netns add "$ns" || die "ip netns add $ns"
    NETNS_LIST+=("$ns")
    ip link add "$host" type veth peer name eth0 netns "$ns" || die "veth for $ns"
    ip link set "$host" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$addr/16" dev eth0
    ip -n "$ns" link set eth0 up
    # Egress of the namespace: what it sends to everyone else together (its uplink).
    # The bucket holds a couple of TSO segments; latency bounds the queue.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${LINK_MBIT}mbit" burst 1mb latency 100ms \
        || die "tc on $ns"
}

in_ns() { # NAME CMD...
    local ns=$NS_PREFIX-$1
    shift
    ip netns exec "$ns" "$@"
}

# The store server in its own namespace.
netns_store() { # DIR
    netns_add store "$NET_PREFIX.0.1"
    STORE_NS=store
    STORE_ADDR=$NET_PREFIX.0.1:7447
    mkdir -p "$1/data"
    # A simple command, not the in_ns function, so that $! is the server itself.
    ip netns exec "$NS_PREFIX-store" "$KT" server --listen "$STORE_ADDR" --data-dir "$1/data" >"$1/server.out" 2>"$1/server.err" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    local i
    for i in $(seq 300); do
        grep -q 'listening on' "$1/server.out" 2>/dev/null && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$1/server.err" >&2; die "kt server exited"; }
        sleep 0.05
    done
    die "kt server did not start within 15 s"
}

# Node agent I (1-based) in namespace nI at NET_PREFIX.1.I; its socket is DIR/nI/agent.sock.
netns_agent() { # I DIR
    local i=$1 d=$2/n$1
    mkdir -p "$d"
    netns_add "n$i" "$NET_PREFIX.1.$i"
    ip netns exec "$NS_PREFIX-n$i" "$KT" agent --server "$STORE_ADDR" --listen "$NET_PREFIX.1.$i:7448" \
        --cache-dir "$d/cache" --cache-size 1G --socket "$d/agent.sock" --node-id "n$i" \
        --heartbeat-secs 2 >"$d/agent.out" 2>"$d/agent.err" &
    AGENT_PIDS+=($!)
}

netns_wait_agents() { # DIR N
    local i j
    for i in $(seq "$2"); do
        for j in $(seq 300); do
            grep -q 'listening on' "$1/n$i/agent.out" 2>/dev/null && break
            ((j == 300)) && { cat "$1/n$i/agent.err" >&2; die "agent n$i did not start"; }
            sleep 0.05
        done
    done
}
