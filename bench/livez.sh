#!/usr/bin/env bash
# /livez under a saturated application runtime: vigil's reserved listener vs a naive
# liveness endpoint on the application's own runtime, measured in the same run.
#
# 1. builds the example service in release and starts it on loopback (2 app workers);
# 2. saturates the application runtime with CPU-bound requests (`/work?ms=WORK_MS`,
#    LOAD_CONNS connections, wrk);
# 3. meanwhile samples `/livez` on the reserved health port and `/naive/livez` on the
#    application port, one request every PACE_MS ms each (wrk --latency, paced.lua);
# 4. prints p50/p99 of both and their ratio, and whether the reserved p99 is under 5 ms.
#
# Usage: bench/livez.sh            (DURATION=20 LOAD_CONNS=64 WORK_MS=10 WORKERS=2)
#
# HEALTH_NICE (default -10 when run as root, else unset): the service process starts at
# this nice value and its application workers are set back to WORKER_NICE (default 0),
# so only the reserved health thread (and the process's other helper threads) run at
# the higher priority: it then wins the CPU from saturated workers and from whatever
# else runs on the host. With the kernel's autogroup scheduling on (a CFS group per
# session), nice only ranks threads within their session, so the script re-runs itself
# in a session of its own whose group gets the same nice value: the measured service
# and its probes then compete with the rest of the host as one prioritised group.
# HEALTH_NICE= (empty) runs everything at the default priority.
# Loopback only; bounded by DURATION; the service is stopped on exit.
set -euo pipefail

DURATION=${DURATION:-20}        # seconds of saturating load
LOAD_CONNS=${LOAD_CONNS:-64}    # concurrent CPU-bound requests
WORK_MS=${WORK_MS:-10}          # CPU per request, ms
WORKERS=${WORKERS:-2}           # application runtime worker threads
PACE_MS=${PACE_MS:-10}          # gap between latency samples, ms
APP_PORT=${APP_PORT:-18480}
HEALTH_PORT=${HEALTH_PORT:-18481}
TARGET_P99_MS=5
if [ "$(id -u)" = 0 ]; then HEALTH_NICE=${HEALTH_NICE--10}; else HEALTH_NICE=${HEALTH_NICE-}; fi
WORKER_NICE=${WORKER_NICE:-0}
if [ -n "$HEALTH_NICE" ] && [ -z "${VIGIL_BENCH_SESSION:-}" ] && [ -w /proc/self/autogroup ] \
   && command -v setsid >/dev/null; then
  VIGIL_BENCH_SESSION=1 exec setsid --wait "$0" "$@"
fi
autogroup_note=""
if [ -n "$HEALTH_NICE" ] && [ -n "${VIGIL_BENCH_SESSION:-}" ] \
   && echo "$HEALTH_NICE" 2>/dev/null >/proc/self/autogroup; then
  autogroup_note=", session group nice $HEALTH_NICE"
fi

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=$(mktemp -d /tmp/vigil-bench-livez.XXXXXX)

if ! command -v wrk >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get install -y wrk >/dev/null
  else
    echo "wrk is missing: apt-get install wrk" >&2
    exit 2
  fi
fi

echo "building the example service (release)..." >&2
(cd "$root" && cargo build --release -q -p vigil-example --example service)
bin="$root/target/release/examples/service"

svc_pid=""
cleanup() {
  if [ -n "$svc_pid" ] && kill -0 "$svc_pid" 2>/dev/null; then
    kill -TERM "$svc_pid" 2>/dev/null || true
    wait "$svc_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# max-in-flight far above LOAD_CONNS: this measures queueing, not shedding.
prio=()
prio_note="all threads at the default priority"
if [ -n "$HEALTH_NICE" ]; then
  prio=(nice -n "$HEALTH_NICE")
  prio_note="health thread nice $HEALTH_NICE, application workers nice $WORKER_NICE$autogroup_note"
fi
RUST_LOG=warn "${prio[@]}" "$bin" ${HEALTH_NICE:+--worker-nice "$WORKER_NICE"} \
  --listen "127.0.0.1:$APP_PORT" --health-listen "127.0.0.1:$HEALTH_PORT" \
  --workers "$WORKERS" --max-in-flight 100000 --drain-delay 100ms \
  --data-dir "$out/data" >"$out/service.out" 2>"$out/service.err" &
svc_pid=$!

for _ in $(seq 1 100); do
  if curl -fs "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -fs "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null || {
  echo "the service did not become ready; see $out/service.err" >&2; exit 1; }

probe_secs=$((DURATION - 4))
echo "load: $LOAD_CONNS connections x /work?ms=$WORK_MS for ${DURATION}s on $WORKERS app workers;" \
     "probes: one request per ${PACE_MS}ms for ${probe_secs}s each; $prio_note" >&2

wrk -t1 -c"$LOAD_CONNS" -d"${DURATION}s" --timeout 60s \
  "http://127.0.0.1:$APP_PORT/work?ms=$WORK_MS" >"$out/load.txt" 2>&1 &
load_pid=$!
sleep 2   # let the queue build up
# Record each service thread's nice value (field 19 of /proc/<pid>/task/<tid>/stat).
for t in /proc/"$svc_pid"/task/*; do
  echo "$(cat "$t/comm") nice=$(awk '{print $19}' "$t/stat")"
done | sort | uniq -c >"$out/threads.txt" 2>/dev/null || true
# Both probes run at the health thread's priority: they stand for a kubelet or a load
# balancer on another host, whose own scheduling delays are not the service's latency.
PACE_MS=$PACE_MS "${prio[@]}" wrk -t1 -c1 -d"${probe_secs}s" --timeout 60s --latency -s "$here/livez/paced.lua" \
  "http://127.0.0.1:$HEALTH_PORT/livez" >"$out/reserved.txt" 2>&1 &
r_pid=$!
PACE_MS=$PACE_MS "${prio[@]}" wrk -t1 -c1 -d"${probe_secs}s" --timeout 60s --latency -s "$here/livez/paced.lua" \
  "http://127.0.0.1:$APP_PORT/naive/livez" >"$out/naive.txt" 2>&1 &
n_pid=$!
wait "$r_pid" "$n_pid" "$load_pid"

# "    99%   12.34ms" -> milliseconds
pct_ms() {
  awk -v p="$2" '
    $1 == p"%" {
      v = $2; unit = v; sub(/^[0-9.]+/, "", unit); sub(/[a-z]+$/, "", v);
      if (unit == "us") v = v / 1000; else if (unit == "s") v = v * 1000; else if (unit == "m") v = v * 60000;
      printf "%.3f", v; found = 1
    }
    END { if (!found) printf "nan" }' "$1"
}
reqs() { awk '/requests in/ { print $1 }' "$1"; }
errs() { awk '/Socket errors|Non-2xx/ { $1 = $1; printf "%s; ", $0 }' "$1"; }

r50=$(pct_ms "$out/reserved.txt" 50); r99=$(pct_ms "$out/reserved.txt" 99)
n50=$(pct_ms "$out/naive.txt" 50);    n99=$(pct_ms "$out/naive.txt" 99)
load_rps=$(awk '/Requests\/sec/ { print $2 }' "$out/load.txt")

printf '\n%-34s %10s %10s %9s  %s\n' "endpoint (under saturation)" "p50 ms" "p99 ms" "samples" "errors"
printf '%-34s %10s %10s %9s  %s\n' "reserved  :$HEALTH_PORT/livez" "$r50" "$r99" "$(reqs "$out/reserved.txt")" "$(errs "$out/reserved.txt")"
printf '%-34s %10s %10s %9s  %s\n' "naive     :$APP_PORT/naive/livez" "$n50" "$n99" "$(reqs "$out/naive.txt")" "$(errs "$out/naive.txt")"
awk -v r50="$r50" -v r99="$r99" -v n50="$n50" -v n99="$n99" -v t="$TARGET_P99_MS" 'BEGIN {
  printf "ratio naive/reserved: p50 %.0fx, p99 %.0fx\n", n50 / r50, n99 / r99;
  printf "target reserved p99 < %d ms: %s\n", t, (r99 < t ? "MET" : "MISSED");
}'
echo "priorities: $prio_note; host load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "saturating load: $load_rps req/s of /work?ms=$WORK_MS ($(errs "$out/load.txt"))"
echo "raw wrk outputs: $out"
