# Helpers shared by the end-to-end harness (bench/e2e.sh, bench/fuse.sh). Source it; not a program.
#
# The caller sets LOG_TAG (shown in log lines) and WORK (its temporary directory, or empty) and
# may set these before sourcing (all optional):
#   KT_BENCH_QUIET_WAIT   seconds to wait, before each measured command, for other work on the
#                         machine to stop (default 60; 0 = don't wait)
#   KT_BENCH_QUIET_TOTAL  seconds of such waiting in the whole run, after which it stops waiting
#                         (default 240), so a busy machine cannot stretch the run without bound
#   KT_BENCH_PRIME_MIB    MiB of memory touched and freed right before each measured command
#                         (default: the caller's PRIME_MIB_DEFAULT; 0 = off)
#
# Every background process is registered in PIDS (and FUSE mounts in MOUNT_PIDS/MOUNT_DIRS); the
# EXIT trap installed by `install_cleanup` stops them all, unmounts what is still mounted, and
# removes WORK (never crossing into a mount), on success, failure and Ctrl-C alike.

export LC_ALL=C
HZ=$(getconf CLK_TCK)
QUIET_WAIT=${KT_BENCH_QUIET_WAIT:-60}
QUIET_TOTAL=${KT_BENCH_QUIET_TOTAL:-240}
QUIET_SPENT=0
PRIME_MIB=${KT_BENCH_PRIME_MIB:-${PRIME_MIB_DEFAULT:-2048}}
LOG_TAG=${LOG_TAG:-bench}

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%T)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# ---- cleanup ------------------------------------------------------------------------------------
PIDS=()
MOUNT_PIDS=()
MOUNT_DIRS=()
WORK=${WORK:-}

# /proc/mounts too: `mountpoint` cannot stat a FUSE mount whose process was killed.
is_mounted() { mountpoint -q -- "$1" 2>/dev/null || grep -qF " $1 fuse" /proc/mounts; }

# Stops one `kt mount` process: SIGTERM (it publishes what is open, unmounts and exits), waits up
# to 30 s, then insists and detaches the mount.
stop_mount_pid() { # PID MOUNTPOINT
    local pid=$1 dir=$2 i
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "mount process $pid did not stop within 30 s; killing it"
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    wait "$pid" 2>/dev/null
    if is_mounted "$dir"; then
        log "$dir still mounted; detaching it"
        umount -l -- "$dir" 2>/dev/null
    fi
}

cleanup() {
    local rc=$?
    set +e
    local i pid
    # Mounts first, while the server they publish to still runs.
    for i in "${!MOUNT_PIDS[@]}"; do
        stop_mount_pid "${MOUNT_PIDS[i]}" "${MOUNT_DIRS[i]}"
    done
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            # Its direct children first (socat under /usr/bin/time, rsync's connection processes).
            pkill -TERM -P "$pid" 2>/dev/null
            kill -TERM "$pid" 2>/dev/null
        fi
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ -n $WORK && -d $WORK ]]; then
        # Never delete through a mount that is somehow still there: that would remove its keys.
        for d in "${MOUNT_DIRS[@]}"; do is_mounted "$d" && umount -l -- "$d" 2>/dev/null; done
        rm -rf --one-file-system -- "$WORK"
    fi
    if ((rc != 0)); then
        log "exit status $rc; processes stopped, temporary files removed"
    fi
    exit "$rc"
}
install_cleanup() {
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

forget_pid() { # drop a PID we have already reaped
    local keep=() p
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# ---- tools --------------------------------------------------------------------------------------
ensure_tools() { # PACKAGE:COMMAND...
    local missing=() spec pkg cmd
    for spec in "$@"; do
        pkg=${spec%%:*} cmd=${spec#*:}
        command -v "$cmd" >/dev/null || [[ -x $cmd ]] || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing ${missing[*]}"
        apt-get install -y "${missing[@]}" >/dev/null 2>&1 \
            || { apt-get update >/dev/null 2>&1 && apt-get install -y "${missing[@]}" >/dev/null 2>&1; } \
            || return 1
    else
        return 1
    fi
}

source_rev() { # ROOT
    if [[ -n ${KT_BENCH_REV:-} ]]; then
        echo "$KT_BENCH_REV"
    elif git -C "$1" rev-parse --git-dir >/dev/null 2>&1; then
        local rev
        rev="$(git -C "$1" rev-parse --short HEAD)"
        if [[ -n $(git -C "$1" status --porcelain -- src Cargo.toml Cargo.lock proto 2>/dev/null) ]]; then
            rev="$rev + uncommitted changes"
        fi
        echo "$rev"
    else
        echo unknown
    fi
}

# ---- network ------------------------------------------------------------------------------------
# A free TCP port on 127.0.0.1 (nothing listening or connected on it right now).
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        if [[ -z $(ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null) ]]; then
            echo "$p"
            return
        fi
    done
}

wait_listening() { # PORT PID
    local i
    for i in $(seq 200); do
        [[ -n $(ss -Hltn "( sport = :$1 )" 2>/dev/null) ]] && return 0
        kill -0 "$2" 2>/dev/null || die "process $2 exited before listening on port $1"
        sleep 0.05
    done
    die "nothing listening on port $1 after 10 s"
}

# ---- CPU accounting -----------------------------------------------------------------------------
# CPU time the whole machine has been busy so far (user, nice, system, irq, softirq, steal), in ticks.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# Seconds of CPU the machine was busy between two busy_ticks readings.
busy_s() { awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN { printf "%.2f", (b - a) / hz }'; }
# OTHER = machine CPU-s during the command minus the CPU-s of the measured processes: what else ran
# (other people's builds, kernel threads, loopback softirqs). Large values mark a disturbed run.
other_s() { awk -v busy="$1" 'BEGIN { s = busy; for (i = 2; i < ARGC; i++) s -= ARGV[i]; if (s < 0) s = 0; printf "%.1f", s }' "$@"; }

# CPU seconds (user+sys) a live process has used so far.
proc_cpu() {
    awk -v hz="$HZ" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat"
}
# User and system CPU seconds of a live process, "U S".
proc_cpu_us() {
    awk -v hz="$HZ" '{ sub(/^.*\) /, ""); printf "%.2f %.2f", $12 / hz, $13 / hz }' "/proc/$1/stat"
}
# CPU seconds of a live process's reaped children (the rsync daemon's per-connection processes).
proc_children_cpu() {
    awk -v hz="$HZ" '{ sub(/^.*\) /, ""); printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}
proc_hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }
# Reset a live process's peak RSS to its current RSS (Linux 4.0+), so the next phase is measured alone.
reset_hwm() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; }
sub_s() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Quiet machine. Others may build on this machine while we measure; two cores leave no headroom.
# Before each measured command, wait (up to QUIET_WAIT s, and QUIET_TOTAL s over the whole run)
# until the machine has been nearly idle (under 15% of one core) for a whole second.
wait_quiet() {
    ((QUIET_WAIT > 0)) || return 0
    local start=$SECONDS a b said=
    while :; do
        a=$(busy_ticks)
        sleep 1
        b=$(busy_ticks)
        (((b - a) * 100 < 15 * HZ)) && break
        if ((QUIET_SPENT + SECONDS - start >= QUIET_TOTAL)); then
            [[ -n $said ]] || log "  machine busy ($(((b - a) * 100 / HZ))% of a core); the run's ${QUIET_TOTAL}s of waiting are spent, measuring anyway"
            said=1
            break
        fi
        if [[ -z $said ]]; then
            log "  machine busy ($(((b - a) * 100 / HZ))% of a core); waiting up to ${QUIET_WAIT}s for it to settle"
            said=1
        fi
        if ((SECONDS - start >= QUIET_WAIT)); then
            log "  still busy after ${QUIET_WAIT}s; measuring anyway (see the 'other' CPU in the results)"
            break
        fi
    done
    QUIET_SPENT=$((QUIET_SPENT + SECONDS - start))
}

# timed TAG CMD...: runs CMD under /usr/bin/time -v (stdout to WORK/TAG.out, stderr WORK/TAG.err);
# sets ELAPSED (s), RSS_KB, CPU_S (user+sys), BUSY_S (CPU-s the whole machine was busy meanwhile).
timed() {
    local tag=$1 t0 t1 b0 b1
    shift
    b0=$(busy_ticks)
    t0=$EPOCHREALTIME
    if ! /usr/bin/time -v -o "$WORK/$tag.time" "$@" >"$WORK/$tag.out" 2>"$WORK/$tag.err"; then
        cat "$WORK/$tag.err" >&2
        die "$tag: $*"
    fi
    t1=$EPOCHREALTIME
    b1=$(busy_ticks)
    BUSY_S=$(busy_s "$b0" "$b1")
    ELAPSED=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    read_time_file "$WORK/$tag.time"
}

read_time_file() { # FILE -> RSS_KB, CPU_S
    RSS_KB=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$1")
    CPU_S=$(awk -F': ' '/User time|System time/ { s += $2 } END { printf "%.2f", s }' "$1")
}

# ---- statistics and formatting ------------------------------------------------------------------
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
maxof() { printf '%s\n' "$@" | sort -g | tail -1; }
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
# Speed relative to a baseline: baseline seconds / these seconds (above 1 = faster than it).
ratio() { awk -v base="$2" -v t="$1" 'BEGIN { printf "%.2f", base / t }'; }
verdict() { awk -v r="$1" -v want="$2" 'BEGIN { if (r >= want) print "**met**"; else print "**NOT met**" }'; }
# runs_of N TIMES... OTHERS...: "t1 (o1), t2 (o2), ..."
runs_of() {
    local n=$1 i out=
    shift
    local -a v=("$@")
    for ((i = 0; i < n; i++)); do
        out+="${out:+, }${v[i]} (${v[i + n]})"
    done
    echo "$out"
}

# ---- kt server ----------------------------------------------------------------------------------
SERVER_PID=
SERVER_ADDR=
start_server() { # DIR [ADDR [MORE SERVER ARGS...]]
    mkdir -p "$1/data"
    "$KT" server --listen "${2:-127.0.0.1:0}" --data-dir "$1/data" "${@:3}" >"$1/server.out" 2>"$1/server.err" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    local i
    for i in $(seq 300); do
        SERVER_ADDR=$(sed -n 's/^kt server listening on //p' "$1/server.out")
        [[ -n $SERVER_ADDR ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$1/server.err" >&2; die "kt server exited"; }
        sleep 0.05
    done
    die "kt server did not say where it listens within 15 s"
}
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
    forget_pid "$SERVER_PID"
}

# ---- mounts (the caller sets WORK, KT and SERVER_ADDR) --------------------------------------------
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

declare -A MPID MDIR
# mount_node NAME IP SERVER NODE-ID [ARGS...]: `kt mount` of SERVER as node NODE-ID on IP, at
# WORK/mnt/NAME with a fresh cache dir; waits until it says it is ready and the mount point is
# mounted.
mount_node() {
    local name=$1 ip=$2 server=$3 node=$4 i pid dir=$WORK/mnt/$1
    shift 4
    mkdir -p "$dir" "$WORK/cache/$name"
    "$KT" mount "$dir" --server "$server" --listen "$ip:0" --cache-dir "$WORK/cache/$name" \
        --socket "$WORK/$name.sock" --node-id "$node" "$@" \
        >"$WORK/mount-$name.out" 2>"$WORK/mount-$name.err" &
    pid=$!
    MOUNT_PIDS+=("$pid")
    MOUNT_DIRS+=("$dir")
    MPID[$name]=$pid
    MDIR[$name]=$dir
    for i in $(seq 300); do
        if grep -qs "^kt agent $node listening on" "$WORK/mount-$name.out" && is_mounted "$dir"; then
            log "mount $name (pid $pid): $(head -1 "$WORK/mount-$name.out")"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { tail -5 "$WORK/mount-$name.err" >&2; die "kt mount $name exited"; }
        sleep 0.1
    done
    die "kt mount $name not ready within 30 s"
}
# start_mount NAME IP [ARGS...]: mount_node of SERVER_ADDR as node NAME.
start_mount() {
    mount_node "$1" "$2" "$SERVER_ADDR" "$1" "${@:3}"
}
stop_mount() { # NAME
    local name=$1 pid=${MPID[$1]} dir=${MDIR[$1]} i keep_p=() keep_d=()
    stop_mount_pid "$pid" "$dir"
    is_mounted "$dir" && die "$dir is still mounted"
    for i in "${!MOUNT_PIDS[@]}"; do
        [[ ${MOUNT_PIDS[i]} == "$pid" ]] && continue
        keep_p+=("${MOUNT_PIDS[i]}")
        keep_d+=("${MOUNT_DIRS[i]}")
    done
    MOUNT_PIDS=("${keep_p[@]}")
    MOUNT_DIRS=("${keep_d[@]}")
    unset "MPID[$name]" "MDIR[$name]"
}

# Per-phase accounting of the long-lived processes (server and mounts): snapshot, then deltas.
declare -A C0
snap() { # NAME... : CPU snapshot and peak-RSS reset of these processes ("server" or a mount name)
    local n pid
    for n in "$@"; do
        pid=$([[ $n == server ]] && echo "$SERVER_PID" || echo "${MPID[$n]}")
        C0[$n]=$(proc_cpu "$pid")
        C0[$n.us]=$(proc_cpu_us "$pid")
        reset_hwm "$pid"
    done
}
cpu_of() { # NAME: CPU-s since snap
    local pid
    pid=$([[ $1 == server ]] && echo "$SERVER_PID" || echo "${MPID[$1]}")
    sub_s "${C0[$1]}" "$(proc_cpu "$pid")"
}
us_of() { # NAME: "user U sys S" since snap
    local pid u0 s0 u1 s1
    pid=$([[ $1 == server ]] && echo "$SERVER_PID" || echo "${MPID[$1]}")
    read -r u0 s0 <<<"${C0[$1.us]}"
    read -r u1 s1 <<<"$(proc_cpu_us "$pid")"
    echo "user $(sub_s "$u0" "$u1"), sys $(sub_s "$s0" "$s1")"
}
hwm_of() { # NAME: VmHWM in KiB
    proc_hwm_kb "${MPID[$1]}"
}

# ---- RESULTS.md sections ------------------------------------------------------------------------
# bench/RESULTS.md is shared: e2e.sh writes the top of it (header, end-to-end table,
# micro-benchmarks); fuse.sh owns the part between these markers, which e2e.sh carries over.
FUSE_BEGIN='<!-- bench/fuse.sh: begin -->'
FUSE_END='<!-- bench/fuse.sh: end -->'
# FILE without its fuse.sh block.
without_fuse_block() {
    [[ -f $1 ]] || return 0
    awk -v b="$FUSE_BEGIN" -v e="$FUSE_END" '$0 == b { on = 1 } !on { print } $0 == e { on = 0 }' "$1"
}

# Puts SECTION_FILE (its own begin and end markers included) in place of the section between
# BEGIN and END in RESULTS, or at its end, keeping every other section as it is.
put_section() { # RESULTS BEGIN END SECTION_FILE
    {
        [[ -f $1 ]] && awk -v b="$2" -v e="$3" '$0 == b { on = 1 } !on { print } $0 == e { on = 0 }' "$1" \
            | awk '{ l[NR] = $0 } NF { last = NR } END { for (i = 1; i <= last; i++) print l[i] }'
        [[ -s $1 ]] && echo
        cat "$4"
    } >"$1.tmp"
    mv "$1.tmp" "$1"
}

# A TCP relay on IP in front of TARGET that counts the bytes of every connection both ways:
# sets RELAY (its address); relay_bytes prints "UP DOWN" once no relayed connection is open.
start_counting_relay() { # IP TARGET
    cat >"$WORK/relay.py" <<'EOF'
import socket, sys, threading
listen, port, target, state = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
th, tp = target.rsplit(":", 1)
lock = threading.Lock()
tot = {"up": 0, "down": 0, "open": 0}
def save():
    with open(state + ".tmp", "w") as f:
        f.write("%d %d %d\n" % (tot["up"], tot["down"], tot["open"]))
    import os; os.replace(state + ".tmp", state)
def pump(a, b, key):
    try:
        while True:
            d = a.recv(1 << 20)
            if not d:
                break
            b.sendall(d)
            with lock:
                tot[key] += len(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(c):
    s = socket.create_connection((th, int(tp)))
    for x in (c, s):
        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = [threading.Thread(target=pump, args=(c, s, "up")), threading.Thread(target=pump, args=(s, c, "down"))]
    for x in t: x.start()
    for x in t: x.join()
    c.close(); s.close()
    with lock:
        tot["open"] -= 1
        save()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((listen, port)); l.listen(64)
save()
while True:
    c, _ = l.accept()
    with lock:
        tot["open"] += 1
    threading.Thread(target=serve, args=(c,), daemon=True).start()
EOF
    local port
    port=$(free_port)
    python3 "$WORK/relay.py" "$1" "$port" "$2" "$WORK/relay.state" &
    PIDS+=($!)
    wait_listening "$port" "$!"
    RELAY=$1:$port
}

relay_bytes() { # -> UP DOWN
    local up down open i
    # A connection the client made just before it exited may still wait in the relay's accept
    # queue, not yet counted as open: give the relay a moment to take it.
    sleep 0.2
    for i in $(seq 200); do
        read -r up down open <"$WORK/relay.state"
        ((open == 0)) && { echo "$up $down"; return; }
        sleep 0.05
    done
    die "relayed connections still open 10 s after the client exited"
}

# An rsync daemon on IP with one writable module over $WORK/rsync-dst: sets DST (its URL).
start_rsync_daemon() { # IP
    local port
    port=$(free_port)
    mkdir -p "$WORK/rsync-dst"
    cat >"$WORK/rsyncd.conf" <<EOF
use chroot = no
uid = $(id -u)
gid = $(id -g)
pid file = $WORK/rsyncd.pid
[m]
path = $WORK/rsync-dst
read only = no
EOF
    rsync --daemon --no-detach --config="$WORK/rsyncd.conf" --address="$1" --port="$port" \
        >"$WORK/rsyncd.log" 2>&1 &
    PIDS+=($!)
    wait_listening "$port" "$!"
    DST=rsync://$1:$port/m/
}

# ---- cluster mode: etcd and an S3 server on loopback ---------------------------------------------
# start_etcd IP DATA_DIR: one etcd member on IP (client port 2379, peer 2380), its data in
# DATA_DIR (put it on /dev/shm), heartbeats slowed so that a starved machine is not taken for a
# dead member; waits until it answers. Sets ETCD_PID.
start_etcd() {
    etcd --name m1 --data-dir "$2" \
        --listen-client-urls "http://$1:2379" --advertise-client-urls "http://$1:2379" \
        --listen-peer-urls "http://$1:2380" --initial-advertise-peer-urls "http://$1:2380" \
        --initial-cluster "m1=http://$1:2380" --heartbeat-interval 250 --election-timeout 2500 \
        >"$WORK/etcd.log" 2>&1 &
    ETCD_PID=$!
    PIDS+=("$ETCD_PID")
    local i
    for i in $(seq 150); do curl -sf "http://$1:2379/health" >/dev/null && return 0; sleep 0.2; done
    die "etcd on $1 did not answer within 30 s"
}
# start_s3 IP: s3s-fs on IP:9000 over WORK/s3 with a bucket `bucket`, the keys
# AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (which the caller exports); waits until it answers.
start_s3() {
    mkdir -p "$WORK/s3/bucket"
    s3s-fs --host "$1" --port 9000 --access-key "$AWS_ACCESS_KEY_ID" \
        --secret-key "$AWS_SECRET_ACCESS_KEY" "$WORK/s3" >"$WORK/s3.log" 2>&1 &
    PIDS+=("$!")
    local i
    for i in $(seq 100); do curl -s "http://$1:9000" >/dev/null && return 0; sleep 0.1; done
    die "s3s-fs on $1 did not answer within 10 s"
}

# serve NAME LISTEN FLAGS...: a `kt server` named NAME listening on LISTEN (HOST:0), its data
# in WORK/NAME, with FLAGS; waits for its ready line. Sets PID_<NAME> and ADDR_<NAME>.
serve() {
    local name=$1 listen=$2 i
    shift 2
    "$KT" server --listen "$listen" --data-dir "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 &
    eval "PID_$name=$!"
    for i in $(seq 300); do grep -q listening "$WORK/$name.log" && break; sleep 0.05; done
    eval "ADDR_$name=$(sed -n 's/.*listening on //p' "$WORK/$name.log" | head -1)"
}

# replace_section SECTION: puts SECTION (markdown whose first line is its `## ` heading) in
# bench/RESULTS.md in place of the section with the same heading, or at its end. The section
# ends at the next heading or marker comment: other scripts' `### ` sections and marked
# sections may follow it, and are kept.
replace_section() {
    python3 - "$1" <<'PY'
import sys
section = sys.argv[1].rstrip() + "\n"
path = "bench/RESULTS.md"
text = open(path).read()
head = section.splitlines()[0]
if head in text:
    start = text.index(head)
    ends = [text.find(m, start + 1) for m in ("\n## ", "\n### ", "\n<!-- ")]
    ends = [e for e in ends if e != -1]
    nxt = min(ends) if ends else -1
    text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt != -1 else "")
else:
    text = text.rstrip() + "\n\n" + section
open(path, "w").write(text)
PY
}
