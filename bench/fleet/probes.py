#!/usr/bin/env python3
"""Probe load on the targets of a fleet of balancers, and how fast a dead target leaves
all of them (issue 33: `[share]` in `vigil lb`).

For N = 1, 2, 4, 8, 16 balancers in front of 20 loopback targets (one asyncio thread
serving 20 ports, counting the health checks each gets on /readyz), checks every 1 s:

- vigil lb with `[share]` (peers = all the others, probes_per_interval = 1),
- vigil lb without `[share]` (each balancer probes every target),
- HAProxy (`option httpchk GET /readyz`, `check inter 1s fall 3 rise 1`),
- nginx: OSS nginx has no active health checks (passive `max_fails` only): N/A.

It prints, per N, the probes per second each target got (mean and max over targets,
over a window once every balancer has every target in service and, shared, sees all its
peers), and the time from killing one target (listener closed, its connections reset)
to its removal at EVERY balancer (the median of --kills targets killed one
after another) (vigil: /admin/targets; HAProxy: `show stat` on its
stats socket), shared vs unshared as a ratio. A markdown table.

    python3 bench/fleet/probes.py                 # N = 1,2,4,8,16, a 10 s window
    python3 bench/fleet/probes.py --ns 1,4 --window 5 --only shared,unshared

Every process it starts is stopped at the end (try/finally); each run ends by itself.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import stop, vigil_binary  # noqa: E402

TARGETS = 20
INTERVAL_S = 1.0
TIMEOUT_MS = 500
FALL = 3
BUDGET = 1
LOCAL_EVERY = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Targets:
    """`n` HTTP servers on loopback in one asyncio thread; each counts GET /readyz."""

    def __init__(self, n):
        self.counts = [0] * n
        self.ports = []
        self.servers = []
        self.conns = [set() for _ in range(n)]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(n, ready), daemon=True)
        self.thread.start()
        ready.wait()

    def _run(self, n, ready):
        asyncio.set_event_loop(self.loop)

        async def start():
            for i in range(n):
                server = await asyncio.start_server(lambda r, w, i=i: self._serve(i, r, w), "127.0.0.1", 0)
                self.servers.append(server)
                self.ports.append(server.sockets[0].getsockname()[1])
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _serve(self, i, reader, writer):
        self.conns[i].add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].split()
                if len(line) > 1 and line[1].startswith(b"/readyz"):
                    self.counts[i] += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.conns[i].discard(writer)
            writer.close()

    def kill(self, i):
        """Closes target `i`'s listener and resets its connections (a dead process)."""
        done = threading.Event()

        def do():
            self.servers[i].close()
            for w in list(self.conns[i]):
                w.transport.abort()
            done.set()

        self.loop.call_soon_threadsafe(do)
        done.wait()

    def snapshot(self):
        return list(self.counts)

    def close(self):
        def do():
            for s in self.servers:
                s.close()
            for cs in self.conns:
                for w in list(cs):
                    w.transport.abort()
            self.loop.stop()

        self.loop.call_soon_threadsafe(do)
        self.thread.join(5)


def get(url, timeout=1.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except OSError:
        return None


class VigilLb:
    def __init__(self, tmp, vigil, i, admins, ports, share):
        self.id = f"lb-{i + 1}"
        self.admin = admins[i]
        peers = ", ".join(f'"http://127.0.0.1:{a}"' for j, a in enumerate(admins) if j != i)
        section = (f'[share]\nid = "{self.id}"\npeers = [{peers}]\nprobes_per_interval = {BUDGET}\n'
                   f"local_every = {LOCAL_EVERY}\n\n") if share else ""
        targets = ", ".join(f'{{ addr = "127.0.0.1:{p}" }}' for p in ports)
        conf = os.path.join(tmp, f"{self.id}.toml")
        with open(conf, "w") as f:
            f.write(f'listen = "127.0.0.1:{free_port()}"\nadmin_listen = "127.0.0.1:{self.admin}"\nworkers = 1\n\n'
                    f"{section}[pools.web]\ntargets = [{targets}]\n\n[pools.web.health_check]\n"
                    f'interval = "{int(INTERVAL_S * 1000)}ms"\ntimeout = "{TIMEOUT_MS}ms"\n'
                    f"healthy_threshold = 1\nunhealthy_threshold = {FALL}\n")
        self.log = os.path.join(tmp, f"{self.id}.log")
        self.proc = subprocess.Popen([vigil, "lb", "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"), env=dict(os.environ, RUST_LOG="warn"))

    def in_service(self):
        """{addr: in service} of pool web, None while the admin does not answer."""
        text = get(f"http://127.0.0.1:{self.admin}/admin/targets")
        if text is None:
            return None
        try:
            ts = json.loads(text)["pools"]["web"]["targets"]
        except (ValueError, KeyError, TypeError):
            return None
        return {t["addr"]: t.get("state") in ("healthy", "slow-start") for t in ts}

    def metric(self, name):
        text = get(f"http://127.0.0.1:{self.admin}/metrics") or ""
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def settled(self, n_targets, n_peers, share):
        s = self.in_service()
        if not s or len(s) != n_targets or not all(s.values()):
            return False
        return not share or (self.metric("vigil_lb_share_peers_live ") == n_peers
                             and self.metric("vigil_lb_share_fallback_targets") == 0)

    def removed(self, addr):
        s = self.in_service()
        return s is not None and s.get(addr) is False

    def stop(self):
        stop(self.proc)


class Haproxy:
    def __init__(self, tmp, i, ports):
        self.id = f"haproxy-{i + 1}"
        self.sock = os.path.join(tmp, f"{self.id}.sock")
        servers = "\n".join(f"  server t{j} 127.0.0.1:{p}" for j, p in enumerate(ports))
        conf = os.path.join(tmp, f"{self.id}.cfg")
        with open(conf, "w") as f:
            f.write(f"""
global
  nbthread 1
  stats socket {self.sock} mode 600 level admin
defaults
  mode http
  timeout connect {TIMEOUT_MS}ms
  timeout check {TIMEOUT_MS}ms
  timeout client 30s
  timeout server 30s
frontend fe
  bind 127.0.0.1:{free_port()}
  default_backend be
backend be
  option httpchk GET /readyz
  default-server check inter {int(INTERVAL_S * 1000)}ms fall {FALL} rise 1
{servers}
""")
        self.log = os.path.join(tmp, f"{self.id}.log")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", conf], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))
        self.names = {f"127.0.0.1:{p}": f"t{j}" for j, p in enumerate(ports)}

    def status(self):
        """{server name: status} from `show stat`, None while the socket does not answer."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(self.sock)
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return None
        lines = data.decode().splitlines()
        if not lines:
            return None
        head = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(head, line.split(",")))
            if row.get("pxname") == "be" and row.get("svname", "").startswith("t"):
                out[row["svname"]] = row.get("status", "")
        return out

    def settled(self, n_targets, n_peers, share):
        s = self.status()
        return bool(s) and len(s) == n_targets and all(v.startswith("UP") and "/" not in v for v in s.values())

    def removed(self, addr):
        s = self.status()
        return s is not None and s.get(self.names[addr], "").startswith("DOWN")

    def stop(self):
        stop(self.proc)


def run(kind, n, vigil, window, kills):
    """One fleet of `n` balancers of `kind`: (mean probes/s, max probes/s, median removal
    s over `kills` targets killed one after another)."""
    tmp = tempfile.mkdtemp(prefix=f"vigil-fleet-{kind}-{n}-")
    targets = Targets(TARGETS)
    lbs = []
    try:
        admins = [free_port() for _ in range(n)]
        for i in range(n):
            if kind == "haproxy":
                lbs.append(Haproxy(tmp, i, targets.ports))
            else:
                lbs.append(VigilLb(tmp, vigil, i, admins, targets.ports, kind == "shared"))
        deadline = time.monotonic() + 60
        while not all(lb.settled(TARGETS, n - 1, kind == "shared") for lb in lbs):
            for lb in lbs:
                if lb.proc.poll() is not None:
                    sys.exit(f"{lb.id} exited; its log: {lb.log}")
            if time.monotonic() > deadline:
                sys.exit(f"{kind} x{n}: not settled within 60 s (logs in {tmp})")
            time.sleep(0.2)
        time.sleep(2 * INTERVAL_S)  # past the first turns
        before, t0 = targets.snapshot(), time.monotonic()
        time.sleep(window)
        after, took = targets.snapshot(), time.monotonic() - t0
        rates = [(a - b) / took for a, b in zip(after, before)]
        removals = []
        for k in range(kills):
            # A random phase against the checks' schedule, then one more target dies.
            time.sleep(random.uniform(0, INTERVAL_S))
            dead = f"127.0.0.1:{targets.ports[k]}"
            killed = time.monotonic()
            targets.kill(k)
            pending = set(range(n))
            while pending:
                pending = {i for i in pending if not lbs[i].removed(dead)}
                if time.monotonic() - killed > 30:
                    sys.exit(f"{kind} x{n}: {dead} still in service at {len(pending)} balancers after 30 s "
                             f"(logs in {tmp})")
                time.sleep(0.02)
            removals.append(time.monotonic() - killed)
        return statistics.mean(rates), max(rates), statistics.median(removals)
    finally:
        for lb in lbs:
            lb.stop()
        targets.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", default="1,2,4,8,16", help="fleet sizes")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of probe counting per run")
    ap.add_argument("--kills", type=int, default=3, help="targets killed one after another per run (median)")
    ap.add_argument("--only", default="shared,unshared,haproxy", help="kinds to run")
    args = ap.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    kinds = args.only.split(",")
    if "haproxy" in kinds and not shutil.which("haproxy"):
        print("haproxy not found: left out", file=sys.stderr)
        kinds.remove("haproxy")
    vigil = vigil_binary() if {"shared", "unshared"} & set(kinds) else None
    rows = {}
    for n in ns:
        for kind in kinds:
            rows[(kind, n)] = run(kind, n, vigil, args.window, args.kills)
            mean, top, removal = rows[(kind, n)]
            print(f"{kind} x{n}: {mean:.2f} probes/s/target mean, {top:.2f} max; removed everywhere in {removal:.2f} s (median)",
                  file=sys.stderr)

    def cell(kind, n, what):
        r = rows.get((kind, n))
        if r is None:
            return "-"
        return f"{r[0]:.2f} / {r[1]:.2f}" if what == "rate" else f"{r[2]:.2f}"

    print(f"\n{TARGETS} targets, checks every {INTERVAL_S:g} s, fall {FALL}; `[share]` probes_per_interval = {BUDGET}, "
          f"local_every = {LOCAL_EVERY}; removal: the median of {args.kills} targets killed one after another; "
          f"{os.cpu_count()} cores.\n")
    print("| balancers | probes/s per target, mean / max: vigil shared | shared budget | vigil unshared | HAProxy | nginx OSS "
          "| removal at every balancer (s): shared | unshared | shared / unshared | HAProxy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        s, u = rows.get(("shared", n)), rows.get(("unshared", n))
        ratio = f"{s[2] / u[2]:.2f}" if s and u else "-"
        budget = (min(BUDGET, n) + max(n - BUDGET, 0) / LOCAL_EVERY) / INTERVAL_S
        print(f"| {n} | {cell('shared', n, 'rate')} | {budget:.2f} | {cell('unshared', n, 'rate')} | {cell('haproxy', n, 'rate')} "
              f"| N/A (no active checks; passive max_fails only) | {cell('shared', n, 'rm')} | {cell('unshared', n, 'rm')} "
              f"| {ratio} | {cell('haproxy', n, 'rm')} |")


if __name__ == "__main__":
    main()
