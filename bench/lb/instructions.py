#!/usr/bin/env python3
"""Instructions per proxied request of `vigil lb`, HAProxy and nginx, counted by
valgrind's callgrind, side by side in one run with vigil's ratio to each peer.

Immune to the machine's load (an instruction count, not a time): the figure to compare
data-path changes with. perf has no hardware counters on these VMs, so this is how.

    cargo build --profile profiling -p vigil-cli
    python3 bench/lb/instructions.py [--vigil target/profiling/vigil] [--only vigil]

The `profiling` profile is `release` with symbols and debug info kept (the release
binary has its debug info stripped): the counts are the release build's, and
`--keep`'s profiles name functions and lines for callgrind_annotate.

Starts 4 loopback nginx targets and each proxy in turn under callgrind with bench.py's
settings (1 worker/thread/process: nginx without its master process, HAProxy with -db;
vigil with hedging on; active checks for vigil and HAProxy), sends a fixed number of GETs over 16 keep-alive client connections, twice (2000 and 6000
requests, in separate runs), and prints (I6000 - I2000) / 4000: start-up and shut-down
cancel out, and so do the proxies' timers and active checks as far as both runs last
as long. The peers are Debian's builds (-O2, no symbols); vigil is the `profiling`
build. Every run is bounded; every process started here is stopped here.
"""
import argparse
import glob
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import bench  # noqa: E402
from bench import (Backends, haproxy_config, nginx_config, stop,  # noqa: E402
                   vigil_config, wait_port)

LB_PORT, ADMIN_PORT = 18190, 18191
PROXIES = ("vigil", "haproxy", "nginx")
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


def command(proxy, vigil, tmp):
    """The proxy's command line, its config written under `tmp`."""
    if proxy == "vigil":
        conf = os.path.join(tmp, "lb.toml")
        with open(conf, "w") as f:
            f.write(vigil_config(LB_PORT, ADMIN_PORT))
        return [vigil, "lb", "-c", conf]
    if proxy == "haproxy":
        conf = os.path.join(tmp, "haproxy.cfg")
        with open(conf, "w") as f:
            f.write(haproxy_config(LB_PORT))
        return ["haproxy", "-db", "-f", conf]
    d = os.path.join(tmp, "nginx-proxy")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_config(d, LB_PORT, master=False))
    return ["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"]


def run(proxy, vigil, tmp, total):
    out = os.path.join(tmp, f"callgrind.{proxy}.{total}")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                          *command(proxy, vigil, tmp)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, RUST_LOG="warn"))
    try:
        if not wait_port(LB_PORT, timeout=60):
            sys.exit(f"{proxy} did not start under valgrind")
        time.sleep(3)  # targets checked healthy
        drive(CONNS * 4)  # warm: connections to targets
        ok = drive(total)
        if ok != total:
            sys.exit(f"{proxy}: only {ok}/{total} requests answered 200")
    finally:
        # nginx stops on SIGQUIT (graceful) and writes its profile; the others on SIGINT.
        stop(p, signal.SIGQUIT if proxy == "nginx" else signal.SIGINT)
    for line in open(out):
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    sys.exit(f"no total in {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", default="target/profiling/vigil")
    ap.add_argument("--only", choices=PROXIES, action="append",
                    help="measure only this proxy (repeatable; default: all three)")
    ap.add_argument("--keep", help="copy the callgrind profiles here (callgrind_annotate)")
    a = ap.parse_args()
    proxies = a.only or list(PROXIES)
    if "vigil" in proxies and not os.path.exists(a.vigil):
        sys.exit(f"{a.vigil} not found: build it with `cargo build --profile profiling -p vigil-cli`")
    bench.ensure_tools("valgrind", *({"haproxy", "nginx"} & set(proxies)))
    per = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends = Backends(tmp)
        backends.start_all()
        try:
            for proxy in proxies:
                small = run(proxy, a.vigil, tmp, 2000)
                large = run(proxy, a.vigil, tmp, 6000)
                per[proxy] = (large - small) / 4000
                print(f"{proxy:8} {per[proxy]:9.0f} instructions per proxied request "
                      f"(callgrind; {small} for 2000 requests, {large} for 6000)", flush=True)
        finally:
            backends.stop_all()
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            for f in glob.glob(os.path.join(tmp, "callgrind.*")):
                os.replace(f, os.path.join(a.keep, os.path.basename(f)))
    if "vigil" in per:
        for peer in ("haproxy", "nginx"):
            if peer in per:
                print(f"vigil / {peer}: {per['vigil'] / per[peer]:.2f}x instructions per request")


if __name__ == "__main__":
    main()
