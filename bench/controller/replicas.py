#!/usr/bin/env python3
"""Several `vigil controller` replicas on the machine's PostgreSQL: failover times and
what sharded probing costs and moves.

Measures, in one run, on a schema of its own (dropped after):
  1. failover after SIGKILL and after SIGTERM: three replicas on 20 targets, the
     leader signalled,
     the time until another replica says it leads (GET /api/leader, polled every
     20 ms), ROUNDS times each;
  2. targets moved when a replica joins (3 -> 4) and leaves (4 -> 3, SIGKILL): the
     fraction of targets whose set of probers changed (GET /api/probing), beside the
     rendezvous expectation r/N (on TARGETS targets);
  3. probes/s and CPU per probe of 3 replicas sharing TARGETS targets against 1
     replica probing them all: probes counted per replica at the script's own target
     server (the User-Agent names the replica), CPU from /proc/<pid>/stat over the
     window.

The targets are asyncio HTTP/1.1 servers in child processes of this script (4,000 per
process), one port each (keep-alive, a passing health+json answer), so the probe rate
they can serve bounds what is measured: keep TARGETS / INTERVAL x probers under a few thousand
per second. Say which build: the debug build (default) is much slower per probe than
release; label figures accordingly.

Usage: bench/controller/replicas.py [--vigil target/debug/vigil] [--targets 500]
         [--interval 1s] [--ttl 2s] [--rounds 1] [--window 10]
"""
import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PG = os.environ.get("VIGIL_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test")
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


class Fleet:
    """TARGETS health endpoints, one port each, probes counted per replica.

    Served by child processes of PER_CHILD targets each: every target is a listener
    plus up to two kept-alive probe connections (three with a fourth replica
    probing), so 10,000 targets in one process would pass the 20,000 descriptors a
    process may hold here (the hard limit cannot be raised on this machine)."""

    PER_CHILD = 4000

    def __init__(self, n):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        self.ports = []
        self.children = []
        for k in range(0, n, self.PER_CHILD):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve_slice, args=(min(self.PER_CHILD, n - k), child),
                               daemon=True)
            proc.start()
            ports = parent.recv()
            if isinstance(ports, str):
                sys.exit(f"target server: {ports}")
            self.ports.extend(ports)
            self.children.append((proc, parent))

    def take(self):
        """Probes counted since the last take, by replica id."""
        total = {}
        for _, pipe in self.children:
            pipe.send("take")
            for replica, n in pipe.recv().items():
                total[replica] = total.get(replica, 0) + n
        return total


def _serve_slice(n, pipe):
    """A child process: n target servers; answers "take" on the pipe with its counts."""
    hits = {}
    lock = threading.Lock()
    body = b'{"status":"pass"}'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/health+json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def serve(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                replica = ""
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"user-agent:") and b"(replica " in line:
                        replica = line.split(b"(replica ", 1)[1].rstrip(b")").decode()
                with lock:
                    hits[replica] = hits.get(replica, 0) + 1
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        writer.close()

    def commands():
        while True:
            try:
                pipe.recv()
            except EOFError:
                os._exit(0)
            with lock:
                counts = dict(hits)
                hits.clear()
            pipe.send(counts)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    ports = []
    try:
        # A port per target, as real targets have: the prober keeps one idle
        # connection per host:port, so targets sharing one would open a connection
        # per probe.
        for _ in range(n):
            server = loop.run_until_complete(
                asyncio.start_server(serve, "127.0.0.1", 0, backlog=512))
            ports.append(server.sockets[0].getsockname()[1])
    except OSError as e:
        pipe.send(f"cannot listen on target {len(ports) + 1} of {n}: {e}")
        return
    pipe.send(ports)
    threading.Thread(target=commands, daemon=True).start()
    loop.run_forever()


class Replica:
    def __init__(self, vigil, schema, rid, targets_toml, args, sqlite=False):
        self.id = rid
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"vigil-bench-{rid}-")
        store = "" if sqlite else (
            f'[store]\nurl = "{PG}?options=-csearch_path%3D{schema}"\n'
            f'[replicas]\nid = "{rid}"\nlease_ttl = "{args.ttl}"\n')
        config = (f'listen = "127.0.0.1:{self.port}"\ndata_dir = "{self.dir}/data"\n'
                  f'api_token = "bench"\n[probe]\ninterval = "{args.interval}"\n'
                  f'timeout = "2s"\njitter = 0.1\nconcurrency = 4096\n{store}{targets_toml}')
        path = os.path.join(self.dir, "fleet.toml")
        with open(path, "w") as f:
            f.write(config)
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen([vigil, "--log-format", "json", "controller", "-c", path],
                                     stdout=subprocess.DEVNULL, stderr=self.log,
                                     env={**os.environ, "RUST_LOG": "warn"})
        deadline = time.time() + 60
        while True:
            try:
                get(self.port, "/api/leader")
                break
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit(f"replica {rid} did not start; see {self.dir}/log")
                time.sleep(0.05)

    def leading(self):
        try:
            return get(self.port, "/api/leader")["leading"] is True
        except Exception:
            return False

    def cpu_s(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def schema_sql(sql):
    subprocess.run(["psql", "-q", PG, "-c", "SET client_min_messages = warning; " + sql], check=True, stdout=subprocess.DEVNULL)


def wait(what, cond, limit=60):
    deadline = time.time() + limit
    while not cond():
        if time.time() > deadline:
            sys.exit(f"timed out: {what}")
        time.sleep(0.02)


def leader_of(rs):
    wait("one replica leads", lambda: sum(r.leading() for r in rs) == 1)
    return next(r for r in rs if r.leading())


def assignments(r, n):
    wait(f"{r.id} sees {n} live replicas", lambda: len(get(r.port, "/api/probing")["live"]) == n)
    return {t["id"]: frozenset(t["probers"]) for t in get(r.port, "/api/probing")["targets"]}


def moved(a, b):
    return sum(1 for t in a if a[t] != b[t]) / len(a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", default="target/debug/vigil")
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--interval", default="1s")
    ap.add_argument("--ttl", default="2s")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--window", type=float, default=10)
    args = ap.parse_args()
    # Every probe in flight is a connection on both sides (the default 1,024 wedges
    # the target servers under three replicas): raise the limit as far as allowed
    # (as root up to fs.nr_open where the hard limit permits); the target servers
    # are split over child processes so that each stays well under it.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = max(hard, 8 * args.targets + 4096)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            want = min(want, int(f.read()))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)}")
    def toml(fleet):
        return "".join(
            f'[[targets]]\nid = "t{i}"\nurl = "http://127.0.0.1:{p}"\nzone = "z{i % 3}"\n'
            for i, p in enumerate(fleet.ports))
    # The failovers run on a small fleet of their own.
    small = toml(Fleet(20))
    fleet = Fleet(args.targets)
    targets = toml(fleet)
    schema = f"vigil_bench_{os.getpid()}"
    print(f"machine: {os.cpu_count()} cores, load {open('/proc/loadavg').read().split()[:3]}; "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    print(f"build: {args.vigil}; targets {args.targets} every {args.interval}; lease_ttl {args.ttl}; "
          f"probers 2 (default)")
    running = []
    try:
        # 1. failover
        for how, sig in (("SIGKILL", signal.SIGKILL), ("SIGTERM", signal.SIGTERM)):
            times = []
            for rnd in range(args.rounds):
                schema_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
                rs = [Replica(args.vigil, schema, f"r{i}", small, args) for i in range(3)]
                running.extend(rs)
                lead = leader_of(rs)
                time.sleep(1)  # a settled term: renewals going
                t0 = time.monotonic()
                if sig == signal.SIGTERM:
                    lead.stop(sig)  # drains: the last commit, then the resignation
                else:
                    lead.proc.send_signal(sig)
                    lead.proc.wait()
                rest = [r for r in rs if r is not lead]
                wait("another replica leads", lambda: any(r.leading() for r in rest))
                times.append(time.monotonic() - t0)
                for r in rs:
                    r.stop()
            print(f"failover after {how}: " + ", ".join(f"{t:.2f} s" for t in times)
                  + f" (max {max(times):.2f} s)")
        # 2. targets moved on join and leave
        schema_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
        rs = [Replica(args.vigil, schema, f"r{i}", targets, args) for i in range(3)]
        running.extend(rs)
        leader_of(rs)
        a3 = assignments(rs[0], 3)
        fourth = Replica(args.vigil, schema, "r3", targets, args)
        running.append(fourth)
        a4 = assignments(rs[0], 4)
        print(f"replica joins (3 -> 4): {moved(a3, a4):.1%} of targets changed a prober "
              f"(rendezvous expectation r/N = 2/4 = 50.0%; hash-mod would move about 75%)")
        fourth.proc.send_signal(signal.SIGKILL)
        fourth.proc.wait()
        a3b = assignments(rs[0], 3)
        print(f"replica leaves (4 -> 3): {moved(a4, a3b):.1%} of targets changed a prober "
              f"(expectation r/N = 2/4 = 50.0%); back to the 3-replica sets: {a3b == a3}")
        # 3. probes/s and CPU per probe: 3 sharing vs 1 alone
        time.sleep(2)
        fleet.take()
        cpu0 = {r.id: r.cpu_s() for r in rs}
        time.sleep(args.window)
        hits = fleet.take()
        cpu = {r.id: r.cpu_s() - cpu0[r.id] for r in rs}
        total = sum(hits.get(r.id, 0) for r in rs)
        for r in rs:
            n = hits.get(r.id, 0)
            print(f"  3 replicas: {r.id} {n / args.window:.0f} probes/s, "
                  f"{cpu[r.id] / args.window:.2f} cores, "
                  f"{cpu[r.id] / max(n, 1) * 1e6:.0f} us CPU per probe")
        print(f"3 replicas sharing {args.targets} targets: {total / args.window:.0f} probes/s in all "
              f"(2 per target), {sum(cpu.values()) / max(total, 1) * 1e6:.0f} us CPU per probe, "
              f"{sum(cpu.values()) / args.window:.2f} cores")
        for r in rs:
            r.stop()
        alone = Replica(args.vigil, schema, "alone", targets, args, sqlite=True)
        running.append(alone)
        time.sleep(2)
        fleet.take()
        c0 = alone.cpu_s()
        time.sleep(args.window)
        n = sum(fleet.take().values())
        c = alone.cpu_s() - c0
        print(f"1 replica alone (SQLite) on the same targets: {n / args.window:.0f} probes/s, "
              f"{c / max(n, 1) * 1e6:.0f} us CPU per probe, {c / args.window:.2f} cores")
    finally:
        for r in running:
            r.stop(signal.SIGKILL)
        schema_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
