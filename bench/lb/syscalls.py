#!/usr/bin/env python3
"""System calls and context switches per proxied request, for vigil, HAProxy and nginx
side by side under the same wrk load (not a timed test; every run is bounded).

    python3 bench/lb/syscalls.py --vigil target/release/vigil [--workers 2] [--rounds 2]
                                 [--only vigil,haproxy,nginx] [--duration 6]

Counts come from the kernel's tracepoints (`perf stat -e raw_syscalls:sys_enter,
syscalls:sys_enter_<name>`, which need no hardware counters) and the `context-switches`
software event, over all threads of the proxy, divided by the requests wrk finished in
the same window. Counts per request move far less with the machine's noise than
latencies do: they tell whether a proxy makes more system calls (a `write` to an
eventfd is a runtime waking itself or another thread; `sched_yield` is vigil's 1 ms
CPU sharing, `worker.rs`) or is switched out more often. Same backends and proxy
settings as bench.py (run.sh).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import bench  # noqa: E402
from bench import Backends, PORTS, stop  # noqa: E402

CALLS = ["sendto", "recvfrom", "writev", "readv", "write", "read", "epoll_wait", "epoll_ctl",
         "sched_yield", "futex"]
EVENTS = ["raw_syscalls:sys_enter", "context-switches"] + [f"syscalls:sys_enter_{c}" for c in CALLS]


def count(pids, seconds):
    """{event: count} over `seconds` for the threads of `pids`."""
    pr = subprocess.run(["perf", "stat", "-x", ",", "-e", ",".join(EVENTS), "-p",
                         ",".join(map(str, pids)), "--", "sleep", str(seconds)],
                        capture_output=True, text=True)
    out = {}
    for line in pr.stderr.splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].replace(".", "").isdigit():
            name = f[2].split(":")[-1].replace("sys_enter_", "")
            out["syscalls" if name == "sys_enter" else name] = float(f[0])
    if not out:
        sys.exit(f"perf stat counted nothing (is linux-perf installed?):\n{pr.stderr}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=6, help="seconds counted per run")
    ap.add_argument("--only", default="vigil,haproxy,nginx")
    args = ap.parse_args()
    bench.WORKERS = args.workers
    bench.ensure_tools("nginx", "haproxy", "wrk", "perf")
    starters = {"vigil": lambda tmp: bench.start_vigil(tmp, args.vigil),
                "haproxy": bench.start_haproxy, "nginx": bench.start_nginx}
    names = args.only.split(",")
    cols = ["syscalls", "context-switches"] + CALLS
    print(f"per request, wrk -c{bench.CONNECTIONS}, {args.workers} worker(s) each:")
    print("| proxy | round | requests/s | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    with tempfile.TemporaryDirectory() as tmp:
        backends = Backends(tmp)
        backends.start_all()
        try:
            for r in range(args.rounds):
                for name in names:
                    p = starters[name](tmp)
                    try:
                        bench.wrk(PORTS[name], 2)  # warm-up
                        pids = bench.process_tree(p.pid)
                        w = subprocess.Popen(bench.wrk_cmd(PORTS[name], args.duration + 2),
                                             stdout=subprocess.PIPE, text=True)
                        time.sleep(1)
                        c = count(pids, args.duration)
                        out, _ = w.communicate(timeout=args.duration + 60)
                        res = bench.parse_wrk(out)
                        n = res["rps"] * args.duration
                        cells = " | ".join(f"{c.get(k, 0.0) / n:.3f}" for k in cols)
                        print(f"| {name} | {r + 1} | {res['rps']:.0f} | {cells} |", flush=True)
                    finally:
                        stop(p)
        finally:
            backends.stop_all()


if __name__ == "__main__":
    main()
