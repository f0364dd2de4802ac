#!/usr/bin/env bash
# Benchmark of `vigil sim`: 1,000 servers over 24 simulated hours with the default client
# load (50% of capacity, 400,000 requests/s), a shared dependency, and a few faults so
# every policy has work to do. Prints wall time and simulated events (and requests) per
# second. Target (docs/DESIGN.md): under 10 s on one core, release build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p vigil-cli
scenario=$(mktemp --suffix=.toml)
trap 'rm -f "$scenario"' EXIT
cat >"$scenario" <<'TOML'
name = "bench-fleet-day"
description = "1,000 servers, 24 h, default load, a few faults."
duration = "24h"

[fleet]
servers = 1000
zones = 3

[[dependencies]]
name = "db"
request_fraction = 0.5

[[faults]]
at = "1h"
kind = "kill"
target = "servers:10-14"

[[faults]]
at = "3h"
kind = "gray"
target = "server:100"
error_rate = 0.5
duration = "1h"

[[faults]]
at = "6h"
kind = "dependency"
dependency = "db"
error_rate = 0.05
duration = "30m"

[[faults]]
at = "12h"
kind = "disk_fill"
target = "servers:200-203"
fill_in = "20m"

[[faults]]
at = "18h"
kind = "zone_down"
zone = 2
duration = "10m"
TOML
# One core: taskset when available. CPU time is reported beside wall time because this
# machine is shared: wall time includes waiting for the core.
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
summary=$(mktemp)
timing=$(mktemp)
trap 'rm -f "$scenario" "$summary" "$timing"' EXIT
vigil="${CARGO_TARGET_DIR:-target}/release/vigil"
/usr/bin/time -f '%U %S %e' -o "$timing" "${pin[@]}" "$vigil" sim run "$scenario" >"$summary"
read -r user sys wall <"$timing"
events=$(sed -n 's/^ *events simulated *//p' "$summary" | tr -d ,)
requests=$(sed -n 's/^ *client errors *[0-9,]* of //p' "$summary" | tr -d ,)
cpu=$(echo "$user + $sys" | bc -l)
cat "$summary"
printf '\nbench: 1000 servers, 24h simulated, default load (50%% of capacity)\n'
printf 'cpu time: %.2f s   wall time: %.2f s   (target: under 10 s on one core)\n' "$cpu" "$wall"
printf 'simulated events: %s (%.0f events/s of CPU time)\n' "$events" "$(echo "$events / $cpu" | bc -l)"
printf 'client requests:  %s (%.3g requests/s of CPU time)\n' "$requests" "$(echo "$requests / $cpu" | bc -l)"
