#!/usr/bin/env bash
# vigil controller probing beside the Prometheus blackbox exporter, in one run.
#
# Budget (shared/DESIGN.md): 20,000 probes/s on one core; under 2 KiB memory per target.
#
# Builds release, then runs crates/vigil-controller/examples/controller_bench: a fake
# fleet of N health+json targets on loopback (127.0.x.y on 100 ports, in the bench
# process, pinned to every core but CORE), `vigil controller` pinned to CORE probing
# every target at the interval (default 10,000 targets every 500 ms = 20,000 probes/s
# scheduled), then the blackbox exporter pinned to the same core probing the same
# targets as fast as a closed-loop driver can make it. CPU is each prober's own
# (/proc/<pid>/stat), memory its RSS at the end of the window. Prints achieved
# probes/s, schedule lag p50/p99/p99.9, CPU per probe, probes/s per core, RSS per
# target (RSS / N: includes the ~11 MB mapped binary) and the marginal memory per
# target ((RSS at N - RSS of the same controller with 1 target) / (N - 1)), and the
# ratios. Run at least 40 s (warm-up + window) so a guard snapshot (every 30 s) falls
# inside; the peak RSS since start is printed too.
#
# Usage: bench/controller/run.sh [TARGETS] [INTERVAL] [SECONDS] [CORE]
#   extra flags for the bench binary via BENCH_FLAGS (e.g. BENCH_FLAGS=--no-keep-alive)
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGETS=${1:-10000}
INTERVAL=${2:-500ms}
SECONDS_=${3:-60}
CORE=${4:-1}
WARMUP=${WARMUP:-10}

BLACKBOX=$(command -v prometheus-blackbox-exporter || true)
if [ -z "$BLACKBOX" ]; then
    echo "installing prometheus-blackbox-exporter (Debian package)" >&2
    apt-get install -y prometheus-blackbox-exporter >&2
    BLACKBOX=$(command -v prometheus-blackbox-exporter)
fi
# Each target is a connection on both sides.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -le "$((TARGETS + 1000))" ]; then
    echo "ulimit -n $(ulimit -n) is too small for $TARGETS targets" >&2
    exit 2
fi

# Two builds: with --example, cargo would build the example only, not the vigil binary.
cargo build --release -p vigil-cli --bin vigil >&2
cargo build --release -p vigil-controller --example controller_bench >&2

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
echo "command: target/release/examples/controller_bench --targets $TARGETS --interval $INTERVAL --seconds $SECONDS_ --warmup $WARMUP --core $CORE --blackbox $BLACKBOX ${BENCH_FLAGS:-}"
# shellcheck disable=SC2086
exec target/release/examples/controller_bench --targets "$TARGETS" --interval "$INTERVAL" \
    --seconds "$SECONDS_" --warmup "$WARMUP" --core "$CORE" --vigil target/release/vigil \
    --blackbox "$BLACKBOX" ${BENCH_FLAGS:-}
