#!/usr/bin/env python3
"""One black hole among four queue workers: vigil (gate + controller) beside a naive pool.

On the machine's real RabbitMQ (127.0.0.1:5672, guest/guest) or, with `--broker
nats://127.0.0.1:4222`, its NATS JetStream, in one run, side by side:

- vigil: 4 `vigil example-worker`s through the library's gate, sending signed
  heartbeats (`--controller`, `--heartbeat-key`) to a real `vigil controller` that
  compares them with their peers (`[anomaly]` defaults: 60 s window in 5 s buckets) and
  acts through its guard (log actuator: the action is recorded, nothing is killed);
- naive: 4 `vigil example-worker --naive` (no local checks, no kill switch, no
  controller), the pool most queue workers are.

Each pool has its own queue and a steady producer (`vigil example-producer`, publisher
confirms) at RATE messages/s (10 per worker). After WARMUP seconds worker w2 of both
pools turns into a black hole (`POST /fault/black-hole?on=true`: every message fails in
2 ms while every check passes). The producers stop after RUN more seconds; the queues are
then drained (bounded) and counted. Printed per pool:

- failed: deliveries that failed, as a share of all deliveries handled, and per 100
  messages published (a failed message goes back to the queue and is redone);
- detection: black hole switched on -> the controller's first action (and on whom), and
  -> the worker paused by its own kill switch (never, for the naive pool);
- conservation: published (confirmed by the broker) = acknowledged (the workers'
  `processed`) + dead-lettered (messages in `<queue>.dead`) + left in the queue, the
  queues counted by the broker (`vigil example-producer --depths`: RabbitMQ's ready
  count, JetStream's pending and unacknowledged count of the workers' consumer).

Usage: bench/workers/run.py [--warmup 20] [--run 60] [--rate 40] [--work-time 50ms]
                            [--broker amqp://guest:guest@127.0.0.1:5672/%2f | nats://127.0.0.1:4222]
The binary is $VIGIL, or target/release/vigil (built if missing). Bounded: warmup + run
+ at most 60 s of drain.
"""

import argparse
import datetime
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import vigil_binary  # noqa: E402

SECRET = "bench-heartbeat-secret"
WORKERS = 4
HOLE = 2
DRAIN_LIMIT = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heartbeat_key(target):
    # docs/controller.md: hex(HMAC-SHA256(secret, "heartbeat:" + id)).
    return hmac.new(SECRET.encode(), f"heartbeat:{target}".encode(), hashlib.sha256).hexdigest()


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def post(url):
    req = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=2.0) as r:
        return r.status


def queue_depths(vigil, broker, queue):
    """(queued, dead) by the broker's own count."""
    out = subprocess.run([vigil, "example-producer", "--broker", broker, "--queue", queue, "--depths"],
                         check=True, capture_output=True, text=True).stdout.split()
    # QUEUED <n> DEAD <m>
    return int(out[1]), int(out[3])


class Pool:
    def __init__(self, name, vigil, queue, naive, controller, args, logdir):
        self.name, self.queue, self.naive = name, queue, naive
        self.procs, self.addrs = [], []
        self.logdir = logdir
        self.producer = subprocess.Popen(
            [vigil, "example-producer", "--broker", args.broker, "--queue", queue, "--rate", str(args.rate), "--purge",
             "--for", f"{args.run + args.warmup}s"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(logdir, f"{name}-producer.log"), "w"), text=True)
        line = self.producer.stdout.readline()
        if not line.startswith("PRODUCING"):
            sys.exit(f"{name} producer did not start ({line!r}): is {args.broker} reachable? see {logdir}")
        for i in range(WORKERS):
            wid = f"w{i}"
            cmd = [vigil, "--log-format", "json", "example-worker", "--broker", args.broker, "--queue", queue, "--id", wid,
                   "--listen", "127.0.0.1:0", "--work-time", args.work_time]
            if naive:
                cmd.append("--naive")
            else:
                cmd += ["--controller", controller, "--heartbeat-key", heartbeat_key(wid), "--heartbeat-every", "1s"]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                 stderr=open(os.path.join(logdir, f"{name}-{wid}.log"), "w"), text=True)
            line = p.stdout.readline().strip()
            if not line.startswith("LISTENING worker="):
                sys.exit(f"{name} {wid} did not start ({line!r}); see {logdir}")
            self.procs.append(p)
            self.addrs.append(line.split("=", 1)[1])

    def reports(self):
        return [get(f"{a}/worker") for a in self.addrs]

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before the black hole (default 20)")
    ap.add_argument("--run", type=float, default=60.0, help="seconds of black hole under load (default 60)")
    ap.add_argument("--rate", type=float, default=40.0, help="messages/s per pool (default 40: 10 per worker)")
    ap.add_argument("--work-time", default="50ms", help="time a worker takes per message (default 50ms)")
    ap.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/%2f",
                    help="amqp://... (RabbitMQ, the default) or nats://host:port (NATS JetStream)")
    args = ap.parse_args()
    vigil = vigil_binary()
    logdir = tempfile.mkdtemp(prefix="vigil-bench-workers-")
    port = free_port()
    controller = f"http://127.0.0.1:{port}"
    with open(os.path.join(logdir, "fleet.toml"), "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\ndata_dir = "data"\napi_token = "bench"\n'
                f'[heartbeat]\nsecret = "{SECRET}"\nttl = "10s"\n'
                # Judge at once (the workers are new), and act after 5 s of failing rather
                # than the production 30 s: the figure is the comparison's, not the wait.
                '[guard]\ngrace = "0s"\nmin_failing = "5s"\n'
                # A heartbeat target is judged once per probe interval (10 s by default),
                # and the guard wants 3 failed judgements in a row.
                '[probe]\ninterval = "2s"\n')
        for i in range(WORKERS):
            f.write(f'[[targets]]\nid = "w{i}"\nheartbeat = true\ngroup = "bench"\n')
    ctl = subprocess.Popen([vigil, "--log-format", "json", "controller", "-c", os.path.join(logdir, "fleet.toml")],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(logdir, "controller.log"), "w"))
    pools = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get(f"{controller}/api/targets")
                break
            except OSError:
                if time.monotonic() > deadline or ctl.poll() is not None:
                    sys.exit(f"the controller did not start; see {logdir}/controller.log")
                time.sleep(0.2)
        tag = os.getpid()
        pools = [Pool("vigil", vigil, f"bench-workers-vigil-{tag}", False, controller, args, logdir),
                 Pool("naive", vigil, f"bench-workers-naive-{tag}", True, None, args, logdir)]
        print(f"machine: {os.cpu_count()} cores, load {' '.join(open('/proc/loadavg').read().split()[:3])}; "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
        print(f"command: bench/workers/run.py --warmup {args.warmup:g} --run {args.run:g} --rate {args.rate:g} "
              f"--work-time {args.work_time} --broker {args.broker}  (binary {vigil})")
        time.sleep(args.warmup)
        before = [p.reports() for p in pools]
        for p in pools:
            post(f"{p.addrs[HOLE]}/fault/black-hole?on=true")
        t0 = time.monotonic()
        t0_wall = time.time()
        decided = paused = None
        action = None
        end = t0 + args.run
        while time.monotonic() < end:
            now = time.monotonic() - t0
            if decided is None:
                acts = get(f"{controller}/api/actions?limit=10")["actions"]
                if acts:
                    decided, action = now, acts[0]
            if paused is None and not get(f"{pools[0].addrs[HOLE]}/worker")["pulling"]:
                paused = now
            time.sleep(0.25)
        # Drain: the producers have stopped; wait until every queue is empty and nothing
        # is in flight (the naive black hole keeps bouncing what it gets: bounded).
        for p in pools:
            out, _ = p.producer.communicate(timeout=30)
            p.published = int(out.split("PUBLISHED")[1].split()[0]) if "PUBLISHED" in out else None
        drain_deadline = time.monotonic() + DRAIN_LIMIT
        while True:
            idle = all(queue_depths(vigil, args.broker, p.queue)[0] == 0
                       and all(r["in_flight"] == 0 for r in p.reports()) for p in pools)
            if idle or time.monotonic() > drain_deadline:
                break
            time.sleep(0.5)
        reports = [p.reports() for p in pools]
        depths = {p.queue: queue_depths(vigil, args.broker, p.queue) for p in pools}
        naive_paused = any(not r["pulling"] for r in reports[1])
    finally:
        for p in pools:
            p.stop()
        ctl.terminate()
        ctl.wait(timeout=30)

    print(f"4 workers per pool, {args.rate:g} msg/s per pool, work {args.work_time}/message, w{HOLE} a black hole "
          f"(fails in 2 ms) after {args.warmup:g} s for {args.run:g} s, then drained")
    print(f"{'pool':<6} {'published':>9} {'acked':>7} {'dead':>5} {'left':>5} {'conserved':>9} "
          f"{'failed':>7} {'of deliveries':>13} {'per 100 msgs':>12} {'during hole':>11}")
    rows = []
    for p, rs, bs in zip(pools, reports, before):
        acked = sum(r["processed"] for r in rs)
        failed = sum(r["failed"] for r in rs)
        failed_hole = failed - sum(r["failed"] for r in bs)
        handled_hole = acked + failed - sum(r["processed"] + r["failed"] for r in bs)
        left, dead = depths[p.queue]
        ok = p.published is not None and p.published == acked + dead + left
        rows.append((p.name, failed, acked))
        print(f"{p.name:<6} {p.published!s:>9} {acked:>7} {dead:>5} {left:>5} {'yes' if ok else 'NO':>9} "
              f"{failed:>7} {100.0 * failed / max(1, acked + failed):>12.1f}% "
              f"{100.0 * failed / max(1, p.published or 1):>12.1f} "
              f"{100.0 * failed_hole / max(1, handled_hole):>10.1f}%")
    for p, rs in zip(pools, reports):
        print(f"  {p.name} per worker (processed/failed): "
              + ", ".join(f"w{i} {r['processed']}/{r['failed']}" for i, r in enumerate(rs))
              + f"; w{HOLE}: {rs[HOLE]['state']}")
    fmt = lambda t: "never" if t is None else f"{t:.1f} s"
    found = None
    for line in open(os.path.join(logdir, "controller.log")):
        if '"worker fails far more than its peers"' in line:
            ts = json.loads(line)["timestamp"]
            found = datetime.datetime.fromisoformat(ts.rstrip("Z")[:26] + "+00:00").timestamp() - t0_wall
            break
    who = action["target"] if action else "-"
    print(f"detection (black hole on ->): vigil comparison finds it {fmt(found)}, controller action {fmt(decided)} (on {who}), "
          f"vigil worker paused itself {fmt(paused)}; naive: {'paused' if naive_paused else 'never'}")
    if action:
        print(f"  decision: {action['event'].get('summary', '')}")
    for q in (p.queue for p in pools):
        subprocess.run([vigil, "example-producer", "--broker", args.broker, "--queue", q, "--delete"],
                       capture_output=True)
    print(f"logs: {logdir}")


if __name__ == "__main__":
    main()
