#!/usr/bin/env bash
# The cost of TLS: `kt put` and `kt get` of one pseudo-random file, and `kt ls` (a process start,
# one connection, one call), against two `kt server`s on loopback in the same run: one in the
# clear (the baseline) and one with a certificate (`--tls-cert/--tls-key`, the client with
# `--tls-ca`). The two ways alternate, A B A B; every copy is checked with cmp; medians are
# reported with the peak RSS of the client and the CPU seconds of client and server. Writes its
# section of bench/RESULTS.md.
#
#   bash bench/tls.sh
#
# Environment (all optional):
#   KT_BENCH_MIB      size of the file in MiB (default 512)
#   KT_BENCH_RUNS     runs of each way (default 3; `kt ls` runs 10 times as many)
#   KT_BENCH_PROFILE  cargo profile of the `kt` measured: release (default) or dev
#   KT_BENCH_RESULTS  where to write the results (default bench/RESULTS.md)
#   KT_BENCH_QUIET_WAIT, KT_BENCH_QUIET_TOTAL, KT_BENCH_PRIME_MIB: see bench/lib.sh
#
# Listens on 127.0.0.246 and 127.0.0.247 only; needs openssl for the certificate.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SIZE_MIB=${KT_BENCH_MIB:-512}
RUNS=${KT_BENCH_RUNS:-3}
PROFILE=${KT_BENCH_PROFILE:-release}
RESULTS=${KT_BENCH_RESULTS:-$ROOT/bench/RESULTS.md}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $PROFILE in
    dev) KT=$TARGET/debug/kt ;;
    *) KT=$TARGET/$PROFILE/kt ;;
esac
# Read by bench/lib.sh.
export LOG_TAG=tls PRIME_MIB_DEFAULT=0
WORK=
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
install_cleanup
ensure_tools openssl:openssl time:/usr/bin/time diffutils:cmp || die "missing tools: openssl time diffutils"

log "cargo build --profile $PROFILE --bin kt"
cargo build -q --profile "$PROFILE" --bin kt
REV=$(source_rev "$ROOT")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kt-tls.XXXXXX")
PLAIN_IP=127.0.0.246
TLS_IP=127.0.0.247

# A self-signed server certificate (not a CA: a trust anchor used as the leaf itself).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj /CN=ktfs \
    -addext "subjectAltName=IP:$TLS_IP" -addext "basicConstraints=critical,CA:FALSE" 2>/dev/null

declare -A ADDR PID
serve() { # WAY FLAGS...
    local way=$1 ip
    shift
    [[ $way == tls ]] && ip=$TLS_IP || ip=$PLAIN_IP
    mkdir -p "$WORK/$way"
    "$KT" server --listen "$ip:0" --data-dir "$WORK/$way/data" --gc-interval-secs 0 "$@" \
        >"$WORK/$way/server.out" 2>"$WORK/$way/server.err" &
    PID[$way]=$!
    PIDS+=("${PID[$way]}")
    local _
    for _ in $(seq 300); do
        ADDR[$way]=$(sed -n 's/^kt server listening on //p' "$WORK/$way/server.out")
        [[ -n ${ADDR[$way]} ]] && return 0
        sleep 0.05
    done
    cat "$WORK/$way/server.err" >&2
    die "kt server ($way) did not start"
}
serve plain
serve tls --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem"

# The command line of `kt` for a way (run under /usr/bin/time, so no shell function).
kt_way() { # WAY -> KT_CMD
    if [[ $1 == tls ]]; then
        KT_CMD=(env "KT_SERVER=${ADDR[tls]}" "$KT" --tls-ca "$WORK/cert.pem")
    else
        KT_CMD=(env "KT_SERVER=${ADDR[plain]}" "$KT")
    fi
}

log "writing a $SIZE_MIB MiB source"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$WORK/src.bin"
cat "$WORK/src.bin" >/dev/null

declare -A T RSS CPU SRV
for op in put get ls; do
    for way in plain tls; do T[$op,$way]=; RSS[$op,$way]=0; CPU[$op,$way]=; SRV[$op,$way]=; done
done
measure() { # OP WAY TAG CMD...
    local op=$1 way=$2 tag=$3 s0 s1
    shift 3
    wait_quiet
    s0=$(proc_cpu "${PID[$way]}")
    timed "$tag" "$@"
    s1=$(proc_cpu "${PID[$way]}")
    T[$op,$way]+="$ELAPSED "
    CPU[$op,$way]+="$CPU_S "
    SRV[$op,$way]+="$(sub_s "$s0" "$s1") "
    ((RSS_KB > RSS[$op,$way])) && RSS[$op,$way]=$RSS_KB
    return 0
}
for r in $(seq "$RUNS"); do
    for way in plain tls; do
        log "run $r: $way put"
        kt_way "$way"
        measure put "$way" "put-$way-$r" "${KT_CMD[@]}" put "f$r" --src "$WORK/src.bin"
    done
    for way in plain tls; do
        log "run $r: $way get"
        rm -f "$WORK/got.bin"
        kt_way "$way"
        measure get "$way" "get-$way-$r" "${KT_CMD[@]}" get "f$r" --dest "$WORK/got.bin"
        cmp -s "$WORK/src.bin" "$WORK/got.bin" || die "$way get $r: the copy differs"
    done
done
for r in $(seq $((RUNS * 10))); do
    for way in plain tls; do
        kt_way "$way"
        measure ls "$way" "ls-$way-$r" "${KT_CMD[@]}" ls
    done
done

# shellcheck disable=SC2086 # the lists are meant to split
med() { median ${1}; }
BEGIN_MARK="<!-- bench/tls.sh: begin -->"
END_MARK="<!-- bench/tls.sh: end -->"
{
    echo "$BEGIN_MARK"
    echo "## TLS on both planes: its cost over 127.0.0.1"
    echo
    echo "Produced by \`KT_BENCH_MIB=$SIZE_MIB KT_BENCH_RUNS=$RUNS KT_BENCH_PROFILE=$PROFILE bash bench/tls.sh\` on $(date -u '+%Y-%m-%d %H:%M') UTC,"
    echo "source revision $REV, $(nproc) cores. Two \`kt server\`s on loopback, one in the clear (the baseline) and"
    echo "one with a certificate (ECDSA P-256; rustls on ring, TLS 1.3, AES-GCM); the client trusts it with"
    echo "\`--tls-ca\`. The ways alternate, every copy is checked with cmp; medians of $RUNS runs (\`kt ls\`: $((RUNS * 10)))."
    echo "put and get move one $SIZE_MIB MiB pseudo-random file (blocks on the data plane, the manifest over gRPC); \`kt ls\`"
    echo "is a process start, one connection (one handshake) and one call. A plain \`kt get\` sends blocks with"
    echo "sendfile(2); over TLS they are read and encrypted. Client CPU: user+sys of \`kt\`; server CPU: what the"
    echo "server used meanwhile."
    echo
    echo "| operation | plain s | TLS s | TLS / plain | plain client CPU s | TLS client CPU s | plain server CPU s | TLS server CPU s | plain peak RSS MiB | TLS peak RSS MiB |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for op in put get ls; do
        p=$(med "${T[$op,plain]}") t=$(med "${T[$op,tls]}")
        echo "| $op | $p | $t | $(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.2f", a / b }') | $(med "${CPU[$op,plain]}") | $(med "${CPU[$op,tls]}") | $(med "${SRV[$op,plain]}") | $(med "${SRV[$op,tls]}") | $(mib "${RSS[$op,plain]}") | $(mib "${RSS[$op,tls]}") |"
    done
    echo
    echo "All runs (seconds): $(for op in put get; do for way in plain tls; do printf '%s %s: %s; ' "$op" "$way" "${T[$op,$way]% }"; done; done)"
    echo "$END_MARK"
} >"$WORK/section.md"
put_section "$RESULTS" "$BEGIN_MARK" "$END_MARK" "$WORK/section.md"
log "wrote $RESULTS"
cat "$WORK/section.md"
