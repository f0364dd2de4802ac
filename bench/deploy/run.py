#!/usr/bin/env python3
"""A rolling deploy of 6 example services behind `vigil lb` under load: `vigil deploy`
beside a naive restart loop, in one run, on this machine (not a timed test).

Each arm gets a fresh fleet: 6 `vigil example-service`s at revision v1 in 3 zones (two
each), one `vigil lb` in front (active checks on /health every 250 ms), and `wrk`
through the balancer (16 connections, GET /items/N: well over 1,000 requests/s). After
WARMUP seconds each arm deploys, first a good revision (v2), then a bad one (bad-v3:
its disk check fails, so its hosts report back failing, as a release missing a file
would):

- vigil: `vigil deploy run` (min_healthy 66%: waves of 2, one zone at a time; bake
  2 s; drain through the balancer's admin API, `drain.kind = "http"`); the install
  hook asks this script's supervisor to restart the host on the revision (SIGTERM,
  then start it again on the same ports), as a package manager's post-install would;
- naive: the same restart, host after host, each as soon as the previous one answers
  its /livez again: no drain, no waiting for report-back, no verdict, no rollback.

Printed per arm and revision: client errors (wrk's non-2xx answers and socket errors)
and requests, the deploy's duration, for the bad revision the time until it was rolled
back (vigil: `run` exits 2) and the hosts that ever ran it, and the hosts on each
revision at the end.

Usage: bench/deploy/run.py [--warmup 5] [--settle 5] [--connections 16]
The binary is $VIGIL, or target/release/vigil (built if missing). Needs wrk (installed
from Debian when missing). Bounded: every wait has a deadline; each arm at most a few
minutes.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import stop, vigil_binary  # noqa: E402

HOSTS = 6
ZONES = ["a", "a", "b", "b", "c", "c"]
DEPLOY_LIMIT = 180.0


def ensure_wrk():
    if shutil.which("wrk"):
        return
    print("installing wrk from Debian", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def free_port():
    # Below the ephemeral range: a host restarts on the same port, and a port from the
    # ephemeral range may meanwhile be taken as some connection's local port.
    while True:
        p = 20000 + int.from_bytes(os.urandom(2), "big") % 10000
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue


def get(url, timeout=1.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def answers(url):
    try:
        return get(url)[0] == 200
    except Exception:
        return False


def wait(what, cond, limit=30.0):
    deadline = time.time() + limit
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"timed out after {limit} s waiting for {what}")
        time.sleep(0.05)


class Fleet:
    """Six example services, restarted by a supervisor thread onto the revision their
    want-file asks for (written by the install hook or the naive loop)."""

    def __init__(self, vigil, dir):
        self.vigil, self.dir = vigil, dir
        self.hosts = []
        for i in range(HOSTS):
            app, health = free_port(), free_port()
            self.hosts.append({"id": f"127.0.0.1:{app}", "app": app, "health": health, "zone": ZONES[i],
                               "revision": "v1", "proc": None, "name": f"h{i}"})
        self.ever = {}  # revision -> hosts that ever ran it
        self.lock = threading.Lock()
        for h in self.hosts:
            self.start(h, "v1")
        self.stop_flag = False
        self.thread = threading.Thread(target=self.supervise, daemon=True)
        self.thread.start()

    def start(self, h, revision):
        data = os.path.join(self.dir, f"data-{h['name']}")
        os.makedirs(data, exist_ok=True)
        log = open(os.path.join(self.dir, f"{h['name']}.log"), "ab")
        h["proc"] = subprocess.Popen(
            [self.vigil, "example-service", "--name", h["name"], "--revision", revision,
             "--listen", f"127.0.0.1:{h['app']}", "--health-listen", f"127.0.0.1:{h['health']}",
             "--data-dir", data, "--db", "postgres://nobody@127.0.0.1:1/none", "--workers", "1",
             "--check-interval", "250ms", "--drain-delay", "500ms",
             "--disk-fail-below", "100%" if revision.startswith("bad") else "0%", "--disk-warn-below", "off"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        h["revision"] = revision
        with self.lock:
            self.ever.setdefault(revision, set()).add(h["name"])

    def restart(self, h, revision):
        """SIGTERM (the service drains), then start it again on the same ports."""
        stop(h["proc"])
        self.start(h, revision)

    def want_file(self, h):
        return os.path.join(self.dir, f"want-{h['id']}")

    def supervise(self):
        while not self.stop_flag:
            for h in self.hosts:
                try:
                    want = open(self.want_file(h)).read().strip()
                except OSError:
                    continue
                if want and want != h["revision"]:
                    self.restart(h, want)
            time.sleep(0.02)

    def wait_up(self):
        for h in self.hosts:
            wait(f"{h['name']} up", lambda: answers(f"http://127.0.0.1:{h['health']}/livez"))

    def revisions(self):
        out = {}
        for h in self.hosts:
            out[h["revision"]] = out.get(h["revision"], 0) + 1
        return out

    def close(self):
        self.stop_flag = True
        self.thread.join()
        for h in self.hosts:
            h["proc"].terminate()
        for h in self.hosts:
            stop(h["proc"])


class Lb:
    def __init__(self, vigil, dir, fleet):
        self.port, self.admin = free_port(), free_port()
        targets = ", ".join(f'{{ addr = "{h["id"]}", zone = "{h["zone"]}" }}' for h in fleet.hosts)
        cfg = os.path.join(dir, "lb.toml")
        with open(cfg, "w") as f:
            f.write(f'''listen = "127.0.0.1:{self.port}"
admin_listen = "127.0.0.1:{self.admin}"

[timeouts]
connect = "300ms"
response_header = "2s"

[pools.web]
targets = [{targets}]
slow_start_window = "0s"

[pools.web.health_check]
path = "/health"
interval = "250ms"
timeout = "500ms"
healthy_threshold = 2
unhealthy_threshold = 2
new_targets = "healthy"
''')
        log = open(os.path.join(dir, "lb.log"), "ab")
        self.proc = subprocess.Popen([vigil, "lb", "-c", cfg], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait("the balancer", lambda: answers(f"http://127.0.0.1:{self.admin}/livez"))
        wait("every target in service", self.all_healthy)

    def states(self):
        try:
            v = json.loads(get(f"http://127.0.0.1:{self.admin}/admin/targets")[1])
            return [t["state"] for t in v["pools"]["web"]["targets"]]
        except Exception:
            return []

    def all_healthy(self):
        s = self.states()
        return len(s) == HOSTS and all(x == "healthy" for x in s)

    def close(self):
        stop(self.proc)


class Wrk:
    """wrk through the balancer for `seconds`; `result()` parses its summary."""

    def __init__(self, port, connections, seconds, dir):
        script = os.path.join(dir, "items.lua")
        with open(script, "w") as f:
            f.write('local n = 0\nrequest = function()\n  n = n + 1\n'
                    '  return wrk.format("GET", "/items/" .. (n % 10 + 1))\nend\n')
        self.proc = subprocess.Popen(
            ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--timeout", "5s", "-s", script,
             f"http://127.0.0.1:{port}/"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self):
        out, _ = self.proc.communicate(timeout=DEPLOY_LIMIT + 60)
        reqs = int(re.search(r"(\d+) requests in", out).group(1))
        non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
        sock = sum(int(x) for x in m.groups()) if (m := re.search(
            r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)) else 0
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        return {"requests": reqs, "errors": non2xx + sock, "rps": rps}


def vigil_deploy(vigil, dir, fleet, lb, revision):
    """`vigil deploy run`; (exit code, seconds)."""
    hook = os.path.join(dir, "install.sh")
    with open(hook, "w") as f:
        f.write(f'''set -e
if grep -qxF "$VIGIL_IDEMPOTENCY_KEY" {dir}/installed-keys 2>/dev/null; then exit 0; fi
echo "$VIGIL_REVISION" > "{dir}/want-$VIGIL_HOST_ID.tmp"
mv "{dir}/want-$VIGIL_HOST_ID.tmp" "{dir}/want-$VIGIL_HOST_ID"
echo "$VIGIL_IDEMPOTENCY_KEY" >> {dir}/installed-keys
''')
    cfg = os.path.join(dir, "deploy.toml")
    hosts = "".join(f'[[hosts]]\nid = "{h["id"]}"\nurl = "http://127.0.0.1:{h["health"]}"\nzone = "{h["zone"]}"\n'
                    for h in fleet.hosts)
    with open(cfg, "w") as f:
        f.write(f'''name = "bench"
store = "deploy.db"
[rollout]
min_healthy = "66%"
progress_deadline = "20s"
bake = "2s"
min_samples = 3
[probe]
interval = "250ms"
timeout = "1s"
[install.exec]
command = ["sh", "{hook}"]
timeout = "20s"
[drain]
kind = "http"
url = "http://127.0.0.1:{lb.admin}/admin/targets/{{host}}/drain?wait=5s"
{hosts}''')
    log = open(os.path.join(dir, "deploy.log"), "ab")
    t0 = time.time()
    p = subprocess.run([vigil, "deploy", "run", "-c", cfg, "--revision", revision], stdout=log, stderr=log,
                       timeout=DEPLOY_LIMIT)
    return p.returncode, time.time() - t0


def naive_deploy(fleet, revision):
    """Restart host after host onto `revision`, each once the previous answers /livez."""
    t0 = time.time()
    for h in fleet.hosts:
        fleet.restart(h, revision)
        wait(f"{h['name']} up", lambda: answers(f"http://127.0.0.1:{h['health']}/livez"))
    return None, time.time() - t0


def arm(name, vigil, args):
    dir = tempfile.mkdtemp(prefix=f"vigil-bench-deploy-{name}-")
    fleet = Fleet(vigil, dir)
    rows = []
    try:
        fleet.wait_up()
        lb = Lb(vigil, dir, fleet)
        try:
            for revision in ["v2", "bad-v3"]:
                before = {r: set(hs) for r, hs in fleet.ever.items()}
                load = Wrk(lb.port, args.connections, args.warmup + DEPLOY_LIMIT / 3 + args.settle, dir)
                time.sleep(args.warmup)
                if name == "vigil":
                    code, took = vigil_deploy(vigil, dir, fleet, lb, revision)
                else:
                    code, took = naive_deploy(fleet, revision)
                # Let the load run out (its duration covers warmup + deploy + settle).
                r = load.result()
                ever = sorted(fleet.ever.get(revision, set()) - before.get(revision, set()))
                rows.append((revision, code, took, r, ever, fleet.revisions(), lb.states()))
        finally:
            lb.close()
    finally:
        fleet.close()
    return rows, dir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--connections", type=int, default=16)
    args = ap.parse_args()
    ensure_wrk()
    vigil = vigil_binary()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"machine: {os.cpu_count()} cores, load {load}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
    print(f"build: {vigil}; {HOSTS} example services in zones {ZONES} behind vigil lb; wrk -c{args.connections}")
    results = {}
    for name in ["vigil", "naive"]:
        rows, dir = arm(name, vigil, args)
        results[name] = rows
        print(f"{name}: logs in {dir}", file=sys.stderr)
    print()
    print(f"{'arm':<6} {'revision':<8} {'outcome':<26} {'deploy s':>8} {'requests':>9} {'req/s':>7} "
          f"{'errors':>6} {'hosts ever on it':<18} end revisions / lb states")
    for name, rows in results.items():
        for revision, code, took, r, ever, revs, states in rows:
            outcome = {None: "restarted all (no verdict)", 0: "completed (exit 0)",
                       2: "rolled back (exit 2)"}.get(code, f"exit {code}")
            print(f"{name:<6} {revision:<8} {outcome:<26} {took:>8.1f} {r['requests']:>9} {r['rps']:>7.0f} "
                  f"{r['errors']:>6} {len(ever)} {','.join(ever):<16} {revs} {sorted(set(states))}")
    v_bad = results["vigil"][1]
    n_bad = results["naive"][1]
    print()
    print(f"bad revision: vigil ran it on {len(v_bad[4])} of {HOSTS} hosts and rolled it back in {v_bad[2]:.1f} s; "
          f"the naive loop ran it on {len(n_bad[4])} of {HOSTS} and left it there")
    print(f"client errors over both rollouts: vigil {results['vigil'][0][3]['errors'] + v_bad[3]['errors']}, "
          f"naive {results['naive'][0][3]['errors'] + n_bad[3]['errors']}")


if __name__ == "__main__":
    main()
