#!/usr/bin/env python3
"""Memory per idle keep-alive client connection: vigil lb beside nginx and HAProxy.

    python3 bench/lb/memory.py --vigil target/release/vigil
    python3 bench/lb/memory.py --vigil target/release/vigil --connections 10000 --waves 6
    python3 bench/lb/memory.py --vigil target/release/vigil --connections 4000 --burst

For each proxy (bench.py's settings: 4 nginx backends, 1 worker each): opens
`--connections` client connections, sends one request on each and reads its answer,
and keeps them all open and idle; the resident memory (RSS of the proxy and its
worker processes) before and with them open, divided by their number, is the cost of
an idle keep-alive connection. Then all are closed and the RSS measured again, for
`--waves` waves: memory that does not come back after the connections close shows as
the RSS growing wave after wave.

Not a timed measurement: RSS is read after the connections settle.
"""
import argparse
import os
import resource
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import bench  # noqa: E402
from bench import Backends, PORTS, process_tree, stop  # noqa: E402

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def rss_kib(pid):
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        except OSError:
            pass
    return total


def open_idle(port, n):
    """`n` connections, each with one request answered, left open."""
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(REQUEST)
        read_answer(s, f"port {port}: connection closed after {len(conns)}")
        conns.append(s)
    return conns


def read_answer(s, closed):
    """Reads one small answer on `s`; exits saying `closed` if the proxy closes first."""
    got = b""
    while b"\r\n\r\n" not in got or not got.endswith(b"\n"):
        b = s.recv(4096)
        if not b:
            raise SystemExit(closed)
        got += b


def open_burst(port, n):
    """Like `open_idle`, but every connection is opened, then every request sent, then
    every answer read: all `n` are busy in the proxy at once, whatever this machine's
    speed (the worst case for memory kept after the burst; `open_idle`'s one-by-one
    pace depends on how fast the client runs)."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    for s in conns:
        s.sendall(REQUEST)
    for i, s in enumerate(conns):
        read_answer(s, f"port {port}: connection {i} closed before its answer")
    return conns


SETTLE_S = 3.0


def settle():
    """Past vigil's idle-buffer release (1 s) and the closes' processing."""
    time.sleep(SETTLE_S)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--only", default="vigil,haproxy,nginx")
    ap.add_argument("--burst", action="store_true",
                    help="open all connections, then send all requests, then read all "
                         "answers (every connection busy at once), instead of one by one")
    ap.add_argument("--later", type=float, default=0.0, metavar="SECONDS",
                    help="also read the RSS this long after closing (memory an allocator "
                         "returns on a timer, such as jemalloc's decay), besides at 3 s")
    a = ap.parse_args()
    later = a.later > SETTLE_S  # a third reading, after the one at SETTLE_S
    bench.ensure_tools(*({"haproxy", "nginx"} & set(a.only.split(","))))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # HAProxy wants about twice maxconn in file descriptors.
    want = min(6 * a.connections + 10000, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    # nginx: a client and a target connection each; HAProxy: its own accounting.
    # A burst has every request in flight at once: a target connection each as well
    # (nginx's worker_connections counts both; HAProxy wants two descriptors per maxconn).
    bench.MAXCONN = min((2 if a.burst else 1) * a.connections + 2000, (want - 1000) // 2)
    bench.CLIENT_IDLE_S = 300
    tmp = tempfile.mkdtemp(prefix="vigil-lb-memory-")
    backends = Backends(tmp)
    # Idle client connections must outlive the measurement: long client timeouts.
    starters = {"vigil": lambda: bench.start_vigil(tmp, a.vigil),
                "haproxy": lambda: bench.start_haproxy(tmp),
                "nginx": lambda: bench.start_nginx(tmp)}
    results = {}
    proc = None
    try:
        backends.start_all()
        for name in a.only.split(","):
            proc = starters[name]()
            open_idle(PORTS[name], 50)  # warm: target connections, first allocations
            settle()
            base = rss_kib(proc.pid)
            waves = []
            for _ in range(a.waves):
                t0 = time.monotonic()
                conns = (open_burst if a.burst else open_idle)(PORTS[name], a.connections)
                opened_s = time.monotonic() - t0
                settle()
                loaded = rss_kib(proc.pid)
                for s in conns:
                    s.close()
                settle()
                after = rss_kib(proc.pid)
                then = None
                if later:
                    time.sleep(a.later - SETTLE_S)
                    then = rss_kib(proc.pid)
                waves.append((loaded, after, then))
                print(f"{name}: base {base} KiB, {a.connections} idle: {loaded} KiB "
                      f"({(loaded - base) * 1024 / a.connections / 1000:.1f} KB each), "
                      f"after close: {after} KiB"
                      + (f", {a.later:g} s after: {then} KiB" if later else "")
                      + f" (opened in {opened_s:.2f} s)", file=sys.stderr)
            results[name] = (base, waves)
            stop(proc)
            proc = None
    finally:
        stop(proc)
        backends.stop_all()
    print(f"\n| proxy | RSS before KiB | per idle connection KB (wave 1) | RSS with {a.connections} "
          f"open, each wave, KiB | RSS after closing, each wave, KiB |"
          + (f" RSS {a.later:g} s after closing, each wave, KiB |" if later else ""))
    print("|---|---|---|---|---|" + ("---|" if later else ""))
    for name, (base, waves) in results.items():
        per = (waves[0][0] - base) * 1024 / a.connections / 1000
        print(f"| {name} | {base} | {per:.1f} | {'/'.join(str(w[0]) for w in waves)} | "
              f"{'/'.join(str(w[1]) for w in waves)} |"
              + (f" {'/'.join(str(w[2]) for w in waves)} |" if later else ""))


if __name__ == "__main__":
    main()
