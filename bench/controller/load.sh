#!/usr/bin/env bash
# Reading the API never starves probing: `vigil controller` probing N targets, idle and
# then with READERS clients looping on its API, side by side.
#
# Budget (issue 12): with 10,000 targets and 4 clients looping on the API, probes/s at
# least 90% of the idle figure, no false probe failure (the fake fleet never fails),
# RSS under 2x idle.
#
# Builds release, then runs crates/vigil-controller/examples/controller_bench with
# --readers: the controller pinned to CORE, the fake fleet and the readers on the other
# core(s); after the warm-up an idle window, a loaded window (READERS clients looping:
# MIX = list | walk | mixed, see the example's docs), a 10 s cool-down without readers;
# each window's probes/s, false failures, schedule lag, CPU and RSS, and the ratios.
#
# Usage: bench/controller/load.sh [TARGETS] [INTERVAL] [SECONDS] [CORE] [READERS] [MIX]
#   VIGILS="a b": the vigil binaries to measure, one after the other (default: the one
#   just built), e.g. VIGILS="/tmp/vigil-71b901b target/release/vigil" for before/after.
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGETS=${1:-10000}
INTERVAL=${2:-500ms}
SECONDS_=${3:-20}
CORE=${4:-1}
READERS=${5:-4}
MIX=${6:-list}
WARMUP=${WARMUP:-10}

ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -le "$((TARGETS + 1000))" ]; then
    echo "ulimit -n $(ulimit -n) is too small for $TARGETS targets" >&2
    exit 2
fi

cargo build --release -p vigil-cli --bin vigil >&2
cargo build --release -p vigil-controller --example controller_bench >&2

for VIGIL in ${VIGILS:-target/release/vigil}; do
    echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
    echo "command: target/release/examples/controller_bench --targets $TARGETS --interval $INTERVAL --seconds $SECONDS_ --warmup $WARMUP --core $CORE --no-baseline --readers $READERS --read-mix $MIX --vigil $VIGIL"
    target/release/examples/controller_bench --targets "$TARGETS" --interval "$INTERVAL" \
        --seconds "$SECONDS_" --warmup "$WARMUP" --core "$CORE" --no-baseline \
        --readers "$READERS" --read-mix "$MIX" --vigil "$VIGIL"
    echo
done
