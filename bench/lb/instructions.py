#!/usr/bin/env python3
"""Instructions per proxied request of `vigil lb`, counted by valgrind's callgrind.

Immune to the machine's load (an instruction count, not a time): the figure to compare
data-path changes with. perf has no hardware counters on these VMs, so this is how.

    cargo build --profile profiling -p vigil-cli
    python3 bench/lb/instructions.py [--vigil target/profiling/vigil]

The `profiling` profile is `release` with symbols and debug info kept (the release
binary has its debug info stripped): the counts are the release build's, and
`--keep`'s profiles name functions and lines for callgrind_annotate.

Starts 4 loopback nginx targets and `vigil lb` (bench.py's settings: 1 worker, hedging on) under callgrind,
sends a fixed number of GETs over 16 keep-alive client connections, twice (2000 and 6000
requests, in separate runs), and prints (I6000 - I2000) / 4000: start-up and shut-down
cancel out. Every run is bounded; every process started here is stopped here.
"""
import argparse
import glob
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench import Backends, stop, vigil_config, wait_port  # noqa: E402

LB_PORT, ADMIN_PORT = 18190, 18191
CONNS = 16


def drive(total):
    """`total` GETs over CONNS keep-alive connections; returns the count of 200s."""
    ok = [0] * CONNS

    def one(i, n):
        s = socket.create_connection(("127.0.0.1", LB_PORT), timeout=30)
        buf = b""
        for _ in range(n):
            s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = buf[:end].decode("latin-1").lower()
                    length = int(head.split("content-length:")[1].split("\r\n")[0])
                    if len(buf) >= end + 4 + length:
                        if head.startswith("http/1.1 200"):
                            ok[i] += 1
                        buf = buf[end + 4 + length:]
                        break
                more = s.recv(65536)
                if not more:
                    raise RuntimeError("lb closed the connection")
                buf += more
        s.close()

    threads = [threading.Thread(target=one, args=(i, total // CONNS)) for i in range(CONNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(ok)


def run(vigil, tmp, total):
    conf = os.path.join(tmp, "lb.toml")
    with open(conf, "w") as f:
        f.write(vigil_config(LB_PORT, ADMIN_PORT))
    out = os.path.join(tmp, f"callgrind.{total}")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                          vigil, "lb", "-c", conf],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, RUST_LOG="warn"))
    try:
        if not wait_port(LB_PORT, timeout=60):
            sys.exit("vigil lb did not start under valgrind")
        time.sleep(3)  # targets checked healthy
        drive(CONNS * 4)  # warm: connections to targets
        ok = drive(total)
        if ok != total:
            sys.exit(f"only {ok}/{total} requests answered 200")
    finally:
        stop(p, signal_int())
    for line in open(out):
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    sys.exit(f"no total in {out}")


def signal_int():
    import signal
    return signal.SIGINT


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", default="target/profiling/vigil")
    ap.add_argument("--keep", help="copy the callgrind profiles here (callgrind_annotate)")
    a = ap.parse_args()
    if not os.path.exists(a.vigil):
        sys.exit(f"{a.vigil} not found: build it with `cargo build --profile profiling -p vigil-cli`")
    with tempfile.TemporaryDirectory() as tmp:
        backends = Backends(tmp)
        backends.start_all()
        try:
            small = run(a.vigil, tmp, 2000)
            large = run(a.vigil, tmp, 6000)
        finally:
            backends.stop_all()
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            for f in glob.glob(os.path.join(tmp, "callgrind.*")):
                os.replace(f, os.path.join(a.keep, os.path.basename(f)))
    print(f"vigil lb: {(large - small) / 4000:.0f} instructions per proxied request "
          f"(callgrind; {small} for 2000 requests, {large} for 6000)")


if __name__ == "__main__":
    main()
