#!/usr/bin/env bash
# vigil lb beside HAProxy and nginx, in one run, on this machine (not a timed test).
#
#   bench/lb/run.sh                 # default: 10 s normal runs, 20 s failure runs
#   DURATION=5 FAIL_DURATION=12 ROUNDS=1 bench/lb/run.sh
#   PIN=1 bench/lb/run.sh          # proxy alone on core 0, wrk and backends on core 1
#   WORKERS=2 bench/lb/run.sh      # 2 worker threads/processes per proxy (the peers'
#                                  # defaults on this 2-core machine: one per core)
#   BALANCE=least bench/lb/run.sh  # normal runs for one balancing family only (default
#                                  # least,rr: least outstanding requests for all three,
#                                  # then round-robin for all three)
#   FAILURES_ONLY=1 bench/lb/run.sh  # the failure runs alone
#   FAIL_TIMEOUTS=2 bench/lb/run.sh  # per-try response timeouts of the failure runs
#                                  # (default 10,2: each failure run at 10 s, then at 2 s)
#
# Installs nginx, haproxy and wrk from Debian if missing, builds vigil (release), starts
# 4 tiny loopback backends (single-process nginx answering "ok"), then for each proxy
# (vigil lb, HAProxy, nginx; WORKERS (default 1) worker threads/processes each, keep-alive to backends,
# equivalent timeouts and active checks where the proxy has them):
#   1. a normal wrk run per balancing family: requests/s, p50, p99, CPU and backend
#      wake-ups per request;
#   2. 1 of 4 backends SIGKILLed mid-run: client errors, slowest request, throughput kept;
#   3. 1 of 4 backends SIGSTOPped mid-run (frozen: accepts, never answers): same, and
#      the requests still hung on it when wrk stops (wrk does not count those);
#   2 and 3 once per per-try response timeout (10 s, then a realistic 2 s).
# Prints a table with vigil's ratios to each peer. Every run is bounded in time.
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
if ((${#need[@]})); then
  echo "installing ${need[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null || apt-get install -y -qq nginx haproxy wrk >/dev/null
fi
# The Debian packages start system services on install: we run our own instances.
systemctl stop nginx haproxy >/dev/null 2>&1 || service nginx stop >/dev/null 2>&1 || true
service haproxy stop >/dev/null 2>&1 || true

VIGIL=${VIGIL:-}
if [[ -z "$VIGIL" ]]; then
  cargo build --release -q -p vigil-cli
  VIGIL=$PWD/target/release/vigil
fi
exec python3 bench/lb/bench.py --vigil "$VIGIL" --rounds "${ROUNDS:-3}" \
  --duration "${DURATION:-10}" --fail-duration "${FAIL_DURATION:-20}" --workers "${WORKERS:-1}" --balance "${BALANCE:-least,rr}" \
  --fail-timeouts "${FAIL_TIMEOUTS:-10,2}" ${FAILURES_ONLY:+--failures-only} ${PIN:+--pin}
