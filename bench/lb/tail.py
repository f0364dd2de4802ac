#!/usr/bin/env python3
"""Where the latency tail comes from: the full latency distribution of each proxy (wrk's
own histogram, through a Lua `done` hook) beside what the kernel's scheduler did to the
processes involved during the run (not a timed test; every run is bounded).

    python3 bench/lb/tail.py --vigil target/release/vigil [--rounds 2] [--connections 64]
                             [--only vigil,haproxy,nginx] [--duration 8] [--workers 1]

Per proxy and round: requests/s, p50 .. p99.9, then for the proxy, the 4 backends and
wrk: CPU time per request, run-queue wait per request (runnable but not running, from
/proc/<pid>/task/*/schedstat) and preemptions per request (nonvoluntary context
switches). A tail that is a bump at p98-p99 with one process's run-queue wait high is
the scheduler's doing, not the proxy's code: docs/lb.md ("The p99 tail") tells how one
was found this way. Same backends and proxy settings as bench.py (run.sh).
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import bench  # noqa: E402
from bench import Backends, PORTS, stop  # noqa: E402

PERCENTILES = [50, 90, 95, 98, 99, 99.9]
LUA = """
done = function(summary, latency, requests)
  local out = {}
  for _, p in ipairs({%s}) do
    out[#out + 1] = string.format("%%.3f", latency:percentile(p) / 1000)
  end
  io.write("TAIL " .. table.concat(out, " ") .. "\\n")
end
""" % ", ".join(str(p) for p in PERCENTILES)


def threads(pids):
    """{tid: (cpu ns, run-queue wait ns, nonvoluntary switches)} of these processes."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run, wait, _ = map(int, f.read().split())
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    nonvol = next(int(line.split()[1]) for line in f
                                  if line.startswith("nonvoluntary_ctxt_switches"))
            except (OSError, StopIteration, ValueError):
                continue
            out[tid] = (run, wait, nonvol)
    return out


def per_request(before, after, requests):
    """(cpu us, run-queue wait us, preemptions) per request, over threads in both."""
    sums = [0, 0, 0]
    for tid, now in after.items():
        if tid in before:
            for i in range(3):
                sums[i] += now[i] - before[tid][i]
    return sums[0] / requests / 1e3, sums[1] / requests / 1e3, sums[2] / requests


def run_one(name, port, proxy_pids, backend_pids, duration, lua):
    w = subprocess.Popen(bench.wrk_cmd(port, duration, "-s", lua), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    groups = {"proxy": proxy_pids, "backends": backend_pids, "wrk": [w.pid]}
    # The scheduler's counters are read over a window inside the run (wrk's worker
    # thread exists only once it has started, and is gone when it ends).
    time.sleep(0.5)
    t0, before = time.monotonic(), {g: threads(p) for g, p in groups.items()}
    time.sleep(max(duration - 1.0, 0.5))
    t1, after = time.monotonic(), {g: threads(p) for g, p in groups.items()}
    out, _ = w.communicate(timeout=duration + 30)
    r = bench.parse_wrk(out)
    tail = next((line.split()[1:] for line in out.splitlines() if line.startswith("TAIL")), None)
    if not r["requests"] or not tail:
        print(f"{name}: wrk gave no result:\n{out}", file=sys.stderr)
        return None
    r["tail"] = [float(x) for x in tail]
    in_window = r["rps"] * (t1 - t0)
    r["sched"] = {g: per_request(before[g], after[g], in_window) for g in groups}
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--connections", type=int, default=bench.CONNECTIONS)
    ap.add_argument("--only", default="vigil,haproxy,nginx")
    ap.add_argument("--workers", type=int, default=1,
                    help="worker threads/processes of each proxy (as run.sh's WORKERS)")
    args = ap.parse_args()
    bench.WORKERS, bench.CONNECTIONS = args.workers, args.connections
    names = args.only.split(",")
    starters = {"vigil": lambda tmp: bench.start_vigil(tmp, args.vigil),
                "haproxy": bench.start_haproxy, "nginx": bench.start_nginx}
    results = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        lua = os.path.join(tmp, "tail.lua")
        with open(lua, "w") as f:
            f.write(LUA)
        backends = Backends(tmp)
        backends.start_all()
        try:
            backend_pids = [p.pid for p in backends.procs]
            for rnd in range(args.rounds):
                for name in names:
                    proc = starters[name](tmp)
                    try:
                        r = run_one(name, PORTS[name], bench.process_tree(proc.pid),
                                    backend_pids, args.duration, lua)
                    finally:
                        stop(proc, signal.SIGINT)
                    if r is None:
                        continue
                    results[name].append(r)
                    cells = " ".join(f"p{p}={v:.2f}" for p, v in zip(PERCENTILES, r["tail"]))
                    sched = "  ".join(f"{g} {c:.1f}/{w:.1f}/{n:.3f}"
                                      for g, (c, w, n) in r["sched"].items())
                    print(f"round {rnd + 1} {name:8s} {r['rps']:8.0f} req/s  {cells} ms  "
                          f"[cpu us/wait us/preemptions per request: {sched}]", flush=True)
        finally:
            backends.stop_all()
    print(f"\nmedians over {args.rounds} rounds, wrk -c{args.connections}, "
          f"{args.workers} worker(s) each, ms:")
    print("| proxy | requests/s | " + " | ".join(f"p{p}" for p in PERCENTILES)
          + " | run-queue wait us/request (proxy, backends, wrk) | vigil/peer p99 |")
    print("|---" * (len(PERCENTILES) + 4) + "|")
    med = {}
    for name, rs in results.items():
        if not rs:
            continue
        med[name] = [statistics.median(r["tail"][i] for r in rs) for i in range(len(PERCENTILES))]
        waits = ", ".join(f"{statistics.median(r['sched'][g][1] for r in rs):.1f}"
                          for g in ("proxy", "backends", "wrk"))
        ratio = ""
        if "vigil" in med and name != "vigil":
            ratio = f"{med['vigil'][PERCENTILES.index(99)] / med[name][PERCENTILES.index(99)]:.2f}"
        print(f"| {name} | {statistics.median(r['rps'] for r in rs):.0f} | "
              + " | ".join(f"{v:.2f}" for v in med[name]) + f" | {waits} | {ratio} |")


if __name__ == "__main__":
    main()
