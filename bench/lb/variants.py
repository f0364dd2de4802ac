#!/usr/bin/env python3
"""A/B runs of vigil lb variants on the same 4 backends, alternating, to tell a real
difference from the machine's drift (not a timed test; every run is bounded).

    python3 bench/lb/variants.py [--rounds 3] [--duration 8] VARIANT ...

A VARIANT is `name` (bench.py's configuration as is), `name:KEY=VALUE` (an environment
variable for that run, e.g. `slow:RUST_LOG=debug`), or `name@TOML` where TOML is text
appended to the configuration's `[pools.app]` table (e.g.
`least@balance = "least-request"`; `\\n` for new lines), or `name^TOML` where TOML is
text added to the top-level keys (e.g. `kernel^worker_slice = "0s"`). With --vigil
PATH for another binary (a variant of the code): `name=PATH` uses that binary; they
combine as `name=PATH:KEY=VALUE^TOP@TOML`. Prints one line per run
and, per variant, the median requests/s, p50 and p99 over the rounds.
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
from bench import Backends, PORTS, stop, vigil_config  # noqa: E402


def parse_variant(spec, default_vigil):
    """`name[=PATH][:KEY=VALUE][^TOP][@TOML]` -> (name, binary, env, top, toml)."""
    name, vigil, env, toml, top = spec, default_vigil, {}, "", ""
    if "@" in name:
        name, toml = name.split("@", 1)
        toml = toml.replace("\\n", "\n")
    if "^" in name:
        name, top = name.split("^", 1)
        top = top.replace("\\n", "\n")
    if ":" in name:
        name, kv = name.split(":", 1)
        k, v = kv.split("=", 1)
        env[k] = v
    if "=" in name:
        name, vigil = name.split("=", 1)
    return name, vigil, env, top, toml


def run(tmp, name, vigil, env, top, toml, duration):
    cfg = vigil_config().replace("[pools.app]\n", "[pools.app]\n" + (toml + "\n" if toml else ""))
    assert "[timeouts]\n" in cfg, "top-level keys go before [timeouts]"
    cfg = cfg.replace("[timeouts]\n", (top + "\n" if top else "") + "[timeouts]\n", 1)
    conf = os.path.join(tmp, f"{name}.toml")
    with open(conf, "w") as f:
        f.write(cfg)
    p = subprocess.Popen([vigil, "lb", "-c", conf], stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(tmp, f"{name}.log"), "w"),
                         env=dict(os.environ, RUST_LOG="warn", **env))
    try:
        time.sleep(2.5)  # new targets are checked before traffic
        res, _ = bench.wrk(PORTS["vigil"], duration)
    finally:
        stop(p, signal.SIGINT)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--vigil", default="target/release/vigil")
    ap.add_argument("--workers", type=int, default=1,
                    help="worker threads of every variant (bench.py's WORKERS; default 1)")
    ap.add_argument("--connections", type=int, default=bench.CONNECTIONS,
                    help=f"wrk's connections (default {bench.CONNECTIONS})")
    a = ap.parse_args()
    bench.WORKERS, bench.CONNECTIONS = a.workers, a.connections
    variants = [parse_variant(v, a.vigil) for v in a.variants]
    results = {v[0]: [] for v in variants}
    tmp = tempfile.mkdtemp(prefix="vigil-variants-")
    backends = Backends(tmp)
    backends.start_all()
    try:
        for r in range(a.rounds):
            for name, vigil, env, top, toml in variants:
                res = run(tmp, name, vigil, env, top, toml, a.duration)
                results[name].append(res)
                print(f"round {r + 1} {name}: {res['rps']:.0f} req/s, p50 {res['p50']:.2f} ms, "
                      f"p99 {res['p99']:.2f} ms, errors {res['errors']}", flush=True)
    finally:
        backends.stop_all()
    print("\n| variant | requests/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for name, rs in results.items():
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        print(f"| {name} | {med('rps'):.0f} | {med('p50'):.2f} | {med('p99'):.2f} |")


if __name__ == "__main__":
    main()
