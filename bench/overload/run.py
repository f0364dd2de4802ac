#!/usr/bin/env python3
"""A database slowed past the clients' timeout for 60 s: vigil's fleet beside a naive one.

Issue 31, "Real processes". On the machine's PostgreSQL (127.0.0.1:5432, trust, database
`test`), one setup after the other, in one run, the same workload:

- vigil: 4 `vigil example-service`s with their admission layer (the default) behind
  `vigil lb` (P2C; `timeouts.response_header` = the clients' 1 s patience,
  `timeouts.per_try` 600 ms, `retries.max_retries` 1 within the default retry budget:
  the balancer of the issue's scenario);
- naive: the same 4 services started with `--admission off` behind nginx (Debian's,
  installed if missing; round-robin, keep-alive, `proxy_next_upstream error timeout`,
  `proxy_next_upstream_tries 2`, `proxy_read_timeout` = the clients' patience, 1 s, and
  nginx's passive defaults `max_fails=1 fail_timeout=10s`). When the binary has no
  `--admission` flag yet (`vigil example-service --help`), the naive services run
  without it and the output says so: the two setups then differ by their balancer only.

Every service reaches PostgreSQL through a delay proxy (bench/overload/delay_proxy.py,
started here in front of 127.0.0.1:5432, one per setup), which, for FAULT seconds after
WARMUP seconds of load, makes every database call take CALL_MS (1500: "database calls
slowed to 1.5 s", past the clients' 1 s timeout, under the issue's 2 s check timeout;
the example's own check gives up after 1 s); AFTER seconds of load follow. The proxy
holds every chunk PostgreSQL sends for CALL_MS / 2: tokio-postgres makes two round trips
per call (prepare, then execute; measured: a 300 ms hold makes a read take 604 ms and
the check's `SELECT 1` 603 ms).

The clients (bench/overload/loadgen.py, this process): open-loop arrivals at RATE per
second (fixed rate, or `--arrivals poisson`), DB_SHARE of them `GET /items/{id}` (a read
that needs the database) and the rest `GET /work?ms=CPU_MS` (CPU only, no database);
each attempt waits at most 1 s, a failed one (timeout, 5xx, connection error) is retried
once after a jittered 50-250 ms. Goodput is the requests answered 2xx within an
attempt's timeout, counted by the second they were issued. RATE defaults to LOAD (0.5)
x the fleet's capacity, measured first by a closed-loop probe through vigil lb (64
clients, 6 s, the same mix, no retries), at most --max-rate (400: what this Python
client sustains beside the fleet on 2 cores).

Printed, side by side, with ratios:
- goodput during the slowdown, as a share of the requests that did not need the
  database (the issue's target: at least 90% of that servable goodput), each kind's own
  share (reads answered from the cache count: a degraded answer is an answer), the
  worst 5 s and the seconds below 50% (an outage the 60 s average hides);
- seconds to recover after the slowdown ends: the first second after which every
  second's goodput (share of its requests answered) stays at >= 95% of the pre-fault
  level (seconds 5..WARMUP) until the end (the issue's target: within 5 s);
- peak load amplification, over 5 s windows: attempts reaching the services per client
  request issued. vigil lb: every attempt of a client goes to a service, plus the
  balancer's own retries (`vigil_lb_retries_total`), less the 503s it answers itself with
  no service to try (`vigil_lb_requests_total{target="none",code="503"}`), scraped each
  second; nginx: the tries its access log names for each request (`$upstream_addr`; a
  "no live upstreams" 502 names none). Also the clients' attempts per request, what
  reaches the balancer.
Also: retries by the clients and the balancers, targets taken out (vigil lb's outlier
ejections from the slowdown's start to 10 s after its end; nginx's "upstream server
temporarily disabled", max_fails reached, over the run), the services' requests in
flight; then a timeline in 5 s steps and the seconds around the slowdown's start and end
for each setup. Figures of runs: bench/overload/RESULTS.md.

Usage: bench/overload/run.py [--rate N | --load 0.5] [--warmup 20] [--fault 60]
       [--after 30] [--call-ms 1500] [--db-share 0.4] [--cpu-ms 5] [--arrivals fixed|poisson]
       [--only vigil,vigil-off,naive] [--nginx-read-timeout 1s]
The binary is $VIGIL, or target/release/vigil (built if missing). About 4-5 minutes with
the defaults. Every process started here is stopped here, on Ctrl-C or an error too; logs
in a temporary directory named in the output.
"""

import argparse
import asyncio
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from common import vigil_binary  # noqa: E402
import loadgen  # noqa: E402

SERVICES = 4
PG = "127.0.0.1:5432"
TIMEOUT_S = 1.0
WINDOW_S = 5
BASELINE_FROM = 5
RECOVERED = 0.95
# Round trips to PostgreSQL per database call of the example service (tokio-postgres
# prepares, then executes): the delay proxy holds each answer CALL_MS / ROUND_TRIPS.
ROUND_TRIPS = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """Every child process, stopped in reverse order whatever happens."""

    def __init__(self):
        self.procs = []

    def start(self, name, cmd, logdir, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        log = open(os.path.join(logdir, f"{name}.log"), "w")
        # A session of its own: Ctrl-C reaches this script only, which stops them all.
        p = subprocess.Popen(cmd, stderr=log, start_new_session=True, **kw)
        self.procs.append((name, p))
        return p

    def stop_all(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    p.terminate()
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def has_admission_flag(vigil):
    out = subprocess.run([vigil, "example-service", "--help"], capture_output=True, text=True).stdout
    return "--admission" in out


def wait_http(port, path="/readyz", timeout=15.0, proc=None, what="process", log=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} did not answer 200 on 127.0.0.1:{port}{path}; see {log}")


def ensure_nginx():
    if shutil.which("nginx"):
        return
    print("installing nginx-light from Debian", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx-light"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["service", "nginx", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not shutil.which("nginx"):
        sys.exit("could not install nginx")


class Fleet:
    """A delay proxy, 4 example services reading through it, and a balancer in front."""

    def __init__(self, name, vigil, procs, logdir, balancer, admission_off, args):
        self.name, self.balancer = name, balancer
        self.dir = os.path.join(logdir, name)
        os.makedirs(self.dir)
        self.proxy = procs.start(f"{name}-delay-proxy", [sys.executable, os.path.join(HERE, "delay_proxy.py"),
                                                         "--upstream", PG],
                                 self.dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.proxy.stdout.readline()
        if not line.startswith("LISTENING"):
            sys.exit(f"{name}: the delay proxy did not start ({line!r}); see {self.dir}")
        db = f"postgres://postgres@127.0.0.1:{line.split()[1]}/test"
        self.services = []
        for i in range(SERVICES):
            cmd = [vigil, "--log-format", "json", "example-service", "--listen", "127.0.0.1:0",
                   "--health-listen", "127.0.0.1:0", "--db", db, "--name", f"{name}-s{i}",
                   "--data-dir", os.path.join(self.dir, "data"), "--drain-delay", "0s"]
            if admission_off:
                cmd += ["--admission", "off"]
            p = procs.start(f"{name}-s{i}", cmd, self.dir, stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline().strip()
            if not line.startswith("LISTENING app=") or "store=postgres" not in line:
                sys.exit(f"{name} s{i} did not start on PostgreSQL ({line!r}); see {self.dir}")
            app = line.split()[1].split("=", 1)[1]
            self.services.append(app.rsplit(":", 1)[1])
        self.port = free_port()
        self.admin = None
        targets = [f"127.0.0.1:{p}" for p in self.services]
        if balancer == "vigil lb":
            self.admin = free_port()
            conf = os.path.join(self.dir, "lb.toml")
            with open(conf, "w") as f:
                f.write(f'listen = "127.0.0.1:{self.port}"\nadmin_listen = "127.0.0.1:{self.admin}"\n'
                        'workers = 1\ndrain_timeout = "1s"\n'
                        f'[timeouts]\nresponse_header = "{int(TIMEOUT_S * 1000)}ms"\nper_try = "600ms"\n'
                        '[pools.app]\ntargets = [' + ", ".join(f'{{ addr = "{t}" }}' for t in targets) + ']\n'
                        '[pools.app.retries]\nmax_retries = 1\n')
            p = procs.start(f"{name}-lb", [vigil, "--log-format", "json", "lb", "-c", conf], self.dir)
            wait_http(self.port, "/work?ms=0", proc=p, what=f"{name}: vigil lb", log=self.dir)
        else:
            ensure_nginx()
            conf = os.path.join(self.dir, "nginx.conf")
            d = self.dir
            self.access_log = os.path.join(d, "access.log")
            servers = "\n".join(f"    server {t};" for t in targets)
            with open(conf, "w") as f:
                f.write(f"""
daemon off; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  log_format bench '$msec $status "$upstream_addr" "$upstream_status"';
  access_log {self.access_log} bench buffer=64k flush=1s;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  upstream be {{
{servers}
    keepalive 128;
  }}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      proxy_pass http://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_connect_timeout 1s;
      proxy_read_timeout {args.nginx_read_timeout};
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 2;
    }}
  }}
}}
""")
            p = procs.start(f"{name}-nginx", ["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"], self.dir)
            wait_http(self.port, "/work?ms=0", proc=p, what=f"{name}: nginx", log=self.dir)

    def delay(self, ms):
        self.proxy.stdin.write(f"delay {ms}\n")
        self.proxy.stdin.flush()

    def proxy_stats(self):
        self.proxy.stdin.write("stats\n")
        self.proxy.stdin.flush()
        for _ in range(10):
            line = self.proxy.stdout.readline()
            if line.startswith("STATS"):
                return line.split(None, 1)[1].strip()
        return "?"


def metric_sum(text, name, match=""):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and match in line:
            total += float(line.rsplit(None, 1)[1])
    return total


class Scraper:
    """Once a second: the balancer's retries (vigil lb), the services' in-flight requests,
    shed counts and database check status."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.lb = loadgen.Client("127.0.0.1", fleet.admin, 4) if fleet.admin else None
        self.svcs = [loadgen.Client("127.0.0.1", int(p), 2) for p in fleet.services]
        self.retries = {}       # second -> cumulative lb retries
        self.denied = {}
        self.per_try = {}
        self.ejections = {}     # second -> cumulative outlier ejections
        self.no_target = {}     # second -> cumulative answers vigil lb made with no target tried (503)
        self.in_flight = {}     # second -> sum over services
        self.db_failing = {}    # second -> services whose database check fails

    async def _get(self, client, path):
        # The client reads the body but does not return it: fetch through a tiny raw read.
        reader, writer = await asyncio.wait_for(asyncio.open_connection(client.host, client.port), 0.5)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return (await asyncio.wait_for(reader.read(), 0.8)).decode("utf-8", "replace")
        finally:
            writer.close()

    async def run(self, t0, duration):
        while (now := time.monotonic() - t0) < duration:
            sec = int(now)
            if self.lb:
                try:
                    text = await self._get(self.lb, "/metrics")
                    self.retries[sec] = metric_sum(text, "vigil_lb_retries_total")
                    self.denied[sec] = metric_sum(text, "vigil_lb_retries_denied_total")
                    self.per_try[sec] = metric_sum(text, "vigil_lb_timeouts_total", 'kind="per_try"')
                    self.ejections[sec] = metric_sum(text, "vigil_lb_target_ejections_total")
                    self.no_target[sec] = metric_sum(text, "vigil_lb_requests_total", 'target="none",code="503"')
                except (OSError, asyncio.TimeoutError):
                    pass
            flight, failing = 0, 0
            for c in self.svcs:
                try:
                    text = await self._get(c, "/metrics")
                    # The shed layer's gauge (--admission off) or the admission layer's.
                    flight += (metric_sum(text, "vigil_requests_in_flight")
                               + metric_sum(text, "vigil_admission_in_flight"))
                    failing += metric_sum(text, "vigil_check_status", 'check="postgres:query"') >= 2
                except (OSError, asyncio.TimeoutError):
                    pass
            self.in_flight[sec] = flight
            self.db_failing[sec] = failing
            await asyncio.sleep(max(0.0, sec + 1 - (time.monotonic() - t0)))


def per_second_from_cumulative(cum, seconds):
    out, last = [0.0] * seconds, 0.0
    for s in range(seconds):
        if s in cum:
            out[s] = max(0.0, cum[s] - last)
            last = cum[s]
    return out


def nginx_retries(path, t0_wall, seconds):
    """Per second: tries beyond the first (an address in $upstream_addr past the first)."""
    out = [0] * seconds
    tries = [0] * seconds
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out, tries
    for line in lines:
        m = re.match(r'([\d.]+) (\d+) "([^"]*)"', line)
        if not m:
            continue
        s = int(float(m.group(1)) - t0_wall)
        if not 0 <= s < seconds:
            continue
        n = len(re.findall(r"\d+\.\d+\.\d+\.\d+:\d+", m.group(3)))
        tries[s] += n
        out[s] += max(0, n - 1)
    return out, tries


async def drive(fleet, rate, args):
    client = loadgen.Client("127.0.0.1", fleet.port)
    gen = loadgen.Generator(client, rate, db_share=args.db_share, cpu_ms=args.cpu_ms, timeout=TIMEOUT_S,
                            arrivals=args.arrivals, seed=args.seed)
    total = args.warmup + args.fault + args.after
    scraper = Scraper(fleet)
    t0 = time.monotonic()
    t0_wall = time.time()

    async def fault():
        await asyncio.sleep(max(0.0, t0 + args.warmup - time.monotonic()))
        fleet.delay(args.call_ms / ROUND_TRIPS)
        await asyncio.sleep(max(0.0, t0 + args.warmup + args.fault - time.monotonic()))
        fleet.delay(0)

    tasks = [asyncio.create_task(fault()), asyncio.create_task(scraper.run(t0, total + 3))]
    try:
        await gen.run(total, t0)
        await asyncio.wait(tasks, timeout=5)
    finally:
        for t in tasks:
            t.cancel()
        client.close()
    gen.counts.stale_resends = client.stale_resends
    return gen.counts, scraper, t0_wall


def taken_out(scraper, fleet, lo, hi):
    """Targets taken out of service from `lo` to `hi` s: vigil lb's outlier ejections, or
    nginx's "upstream server temporarily disabled" (max_fails reached)."""
    if fleet.admin:
        return scraper.ejections.get(hi, max(scraper.ejections.values(), default=0)) - scraper.ejections.get(lo, 0)
    try:
        return sum("temporarily disabled" in line for line in open(os.path.join(fleet.dir, "error.log")))
    except OSError:
        return None


def analyse(counts, scraper, fleet, t0_wall, args):
    n = args.warmup + args.fault + args.after
    fs, fe = args.warmup, args.warmup + args.fault
    off = {k: [counts.offered[k].get(s, 0) for s in range(n)] for k in loadgen.KINDS}
    ok = {k: [counts.ok[k].get(s, 0) for s in range(n)] for k in loadgen.KINDS}
    offered = [off["db"][s] + off["cpu"][s] for s in range(n)]
    good = [ok["db"][s] + ok["cpu"][s] for s in range(n)]
    share = [good[s] / offered[s] if offered[s] else 1.0 for s in range(n)]
    base = sum(good[BASELINE_FROM:fs]) / max(1, sum(offered[BASELINE_FROM:fs]))
    client_attempts = [counts.attempts.get(s, 0) for s in range(n)]
    if fleet.admin:
        # vigil lb: every client attempt goes to a target, plus the balancer's retries,
        # less the answers it made itself without trying a target (503: none usable).
        lb_retries = per_second_from_cumulative(scraper.retries, n)
        no_target = per_second_from_cumulative(scraper.no_target, n)
        attempts = [client_attempts[s] + lb_retries[s] - no_target[s] for s in range(n)]
    else:
        # nginx: the tries of each request, as its access log names them ($upstream_addr;
        # "no live upstreams" names none).
        lb_retries, attempts = nginx_retries(fleet.access_log, t0_wall, n)

    def peak_of(series):
        amp = []
        for s in range(0, n - WINDOW_S + 1):
            req = sum(offered[s:s + WINDOW_S])
            amp.append((sum(series[s:s + WINDOW_S]) / req if req else 0.0, s))
        return max(amp) if amp else (0.0, 0)

    peak, peak_at = peak_of(attempts)
    peak_client, peak_client_at = peak_of(client_attempts)
    recovered = None
    for t in range(fe, n):
        if all(share[s] >= RECOVERED * base for s in range(t, n)):
            recovered = t - fe
            break
    d = lambda k: sum(ok[k][fs:fe]) / max(1, sum(off[k][fs:fe]))  # noqa: E731
    failures = {}
    for s in range(fs, fe):
        for cause, m in counts.failures.get(s, {}).items():
            failures[cause] = failures.get(cause, 0) + m
    lat = sorted(x for k in loadgen.KINDS for s in range(BASELINE_FROM, fs) for x in counts.latency[k].get(s, []))
    return {
        "n": n, "offered": offered, "good": good, "share": share, "base": base, "off": off, "ok": ok,
        "attempts": attempts, "lb_retries": lb_retries,
        "servable": sum(good[fs:fe]) / max(1, sum(off["cpu"][fs:fe])),
        "cpu_share": d("cpu"), "db_share": d("db"),
        "cache": sum(counts.ok_cache.get(s, 0) for s in range(fs, fe)) / max(1, sum(ok["db"][fs:fe])),
        "recovered": recovered, "peak": peak, "peak_at": peak_at - fs,
        "peak_client": peak_client, "peak_client_at": peak_client_at - fs,
        "amp_pre": sum(attempts[BASELINE_FROM:fs]) / max(1, sum(offered[BASELINE_FROM:fs])),
        "failures": failures,
        "lb_retries_fault": sum(lb_retries[fs:fe]),
        "client_retries_fault": sum(counts.retries.get(s, 0) for s in range(fs, fe)),
        "p50": lat[len(lat) // 2] if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
        "max_in_flight": max((scraper.in_flight.get(s, 0) for s in range(n)), default=0),
        "db_failing": [scraper.db_failing.get(s) for s in range(n)],
        "in_flight": [scraper.in_flight.get(s) for s in range(n)],
        "denied": (scraper.denied.get(fe, 0) - scraper.denied.get(fs, 0)) if scraper.denied else None,
        "taken_out": taken_out(scraper, fleet, fs, fe + 10),
        "worst5": min((sum(good[s:s + WINDOW_S]) / max(1, sum(offered[s:s + WINDOW_S])), s - fs)
                      for s in range(fs, fe - WINDOW_S + 1)),
        "below_half": sum(1 for s in range(fs, fe) if share[s] < 0.5),
        "failures_by_second": [dict(counts.failures.get(s, {})) for s in range(n)],
        "client_retries": [counts.retries.get(s, 0) for s in range(n)],
        "stale_resends": getattr(counts, "stale_resends", 0),
    }


def pct(x):
    return f"{100 * x:.1f}%"


def ratio(a, b):
    return f"{a / b:.2f}x" if b else ("=" if a == b else "inf")


def report(results, args, rate):
    names = list(results)
    print()
    print(f"figures: every database call slowed to {args.call_ms} ms (each answer chunk held "
          f"{args.call_ms / ROUND_TRIPS:g} ms), seconds {args.warmup}.."
          f"{args.warmup + args.fault} of {args.warmup + args.fault + args.after}; {rate:g} requests/s "
          f"({pct(args.db_share)} need the database)")
    rows = [
        ("goodput during slowdown / non-db requests", lambda r: pct(r["servable"]), lambda r: r["servable"]),
        ("  non-db requests answered", lambda r: pct(r["cpu_share"]), lambda r: r["cpu_share"]),
        ("  db requests answered", lambda r: pct(r["db_share"]), lambda r: r["db_share"]),
        ("  of those, from the cache", lambda r: pct(r["cache"]), None),
        ("  worst 5 s of goodput in the slowdown", lambda r: f"{pct(r['worst5'][0])} at {r['worst5'][1]:+d}s",
         lambda r: r["worst5"][0]),
        ("  seconds of it below 50% goodput", lambda r: str(r["below_half"]), None),
        ("recovery after slowdown (s)",
         lambda r: str(r["recovered"]) if r["recovered"] is not None else f">{args.after}",
         lambda r: r["recovered"] if r["recovered"] is not None else None),
        ("peak amplification at the targets", lambda r: f"{r['peak']:.2f}x at {r['peak_at']:+d}s", lambda r: r["peak"]),
        ("  at the balancer (clients' attempts)", lambda r: f"{r['peak_client']:.2f}x at {r['peak_client_at']:+d}s",
         lambda r: r["peak_client"]),
        ("amplification before the fault", lambda r: f"{r['amp_pre']:.2f}x", lambda r: r["amp_pre"]),
        ("pre-fault goodput", lambda r: pct(r["base"]), lambda r: r["base"]),
        ("pre-fault latency p50 / p99 (ms)", lambda r: f"{1000 * r['p50']:.1f} / {1000 * r['p99']:.1f}", None),
        ("client retries during slowdown", lambda r: str(r["client_retries_fault"]), lambda r: r["client_retries_fault"]),
        ("balancer retries during slowdown", lambda r: f"{r['lb_retries_fault']:.0f}", lambda r: r["lb_retries_fault"]),
        ("targets taken out (ejected / disabled)", lambda r: str(r["taken_out"]), None),
        ("most requests in flight (4 services)", lambda r: f"{r['max_in_flight']:.0f}", None),
    ]
    w = 40
    head = f"{'':{w}}" + "".join(f"{n:>22}" for n in names)
    if len(names) == 2:
        head += f"{names[1] + '/' + names[0]:>16}"
    print(head)
    for label, fmt, val in rows:
        line = f"{label:{w}}" + "".join(f"{fmt(results[n]):>22}" for n in names)
        if len(names) == 2 and val is not None:
            a, b = val(results[names[0]]), val(results[names[1]])
            line += f"{ratio(b, a) if a is not None and b is not None else '-':>16}"
        print(line)
    yes = lambda ok: "yes" if ok else "no"  # noqa: E731
    print("issue 31's targets (goodput during the slowdown >= 90% of the non-db requests / the non-db requests "
          "themselves >= 90% answered / recovery <= 5 s / peak amplification at the targets <= 1.3) met: "
          + "; ".join(f"{n} {yes(r['servable'] >= 0.9)}/{yes(r['cpu_share'] >= 0.9)}/"
                      f"{yes(r['recovered'] is not None and r['recovered'] <= 5)}/{yes(r['peak'] <= 1.3)}"
                      for n, r in results.items()))
    for n in names:
        f = results[n]["failures"]
        print(f"{n}: failed attempts during the slowdown: "
              + (", ".join(f"{k} {v}" for k, v in sorted(f.items(), key=lambda kv: -kv[1])) or "none")
              + (f"; retries the budget refused: {results[n]['denied']:.0f}" if results[n]["denied"] is not None else ""))
    for n in names:
        r = results[n]
        print(f"\ntimeline {n} (5 s steps, from the fault's start; goodput = answered / issued, "
              f"amp = attempts at the targets / requests, in flight = sum of the 4 services' at the step's start, "
              f"db check failing = services):")
        print(f"{'t':>5} {'issued':>7} {'goodput':>8} {'db ok':>7} {'cpu ok':>7} {'amp':>6} {'in flight':>10} {'db check failing':>17}")
        fs = args.warmup
        for s in range(0, r["n"], WINDOW_S):
            e = min(r["n"], s + WINDOW_S)
            iss = sum(r["offered"][s:e])
            g = sum(r["good"][s:e])
            dbo, dbk = sum(r["off"]["db"][s:e]), sum(r["ok"]["db"][s:e])
            cpo, cpk = sum(r["off"]["cpu"][s:e]), sum(r["ok"]["cpu"][s:e])
            mark = " <- slowdown" if fs <= s < fs + args.fault else ""
            print(f"{s - fs:>+5} {iss:>7} {pct(g / iss) if iss else '-':>8} {pct(dbk / dbo) if dbo else '-':>7} "
                  f"{pct(cpk / cpo) if cpo else '-':>7} {sum(r['attempts'][s:e]) / iss if iss else 0:>6.2f} "
                  f"{r['in_flight'][s] if r['in_flight'][s] is not None else '-':>10} "
                  f"{r['db_failing'][s] if r['db_failing'][s] is not None else '-':>17}{mark}")
        print(f"\nper second around the slowdown's start and end, {n}:")
        edges(r, args)


def edges(r, args):
    """Per second around the slowdown's start and end: where the interesting things are."""
    fs, fe = args.warmup, args.warmup + args.fault
    print(f"{'t':>5} {'goodput':>8} {'db ok':>7} {'cpu ok':>7} {'amp':>6} {'client retries':>15} "
          f"{'balancer retries':>17}  failed attempts")
    for lo, hi in ((fs - 1, fs + 6), (fe - 1, fe + 6)):
        for s in range(max(0, lo), min(r["n"], hi)):
            iss, g = r["offered"][s], r["good"][s]
            dbo, dbk = r["off"]["db"][s], r["ok"]["db"][s]
            cpo, cpk = r["off"]["cpu"][s], r["ok"]["cpu"][s]
            f = r["failures_by_second"][s]
            print(f"{s - fs:>+5} {pct(g / iss) if iss else '-':>8} {pct(dbk / dbo) if dbo else '-':>7} "
                  f"{pct(cpk / cpo) if cpo else '-':>7} {r['attempts'][s] / iss if iss else 0:>6.2f} "
                  f"{r['client_retries'][s]:>15} {r['lb_retries'][s]:>17.0f}  "
                  + (", ".join(f"{k} {v}" for k, v in sorted(f.items(), key=lambda kv: -kv[1])) or "-"))
        print(f"{'':>5} ...")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, help="requests/s (default: --load x the measured capacity)")
    ap.add_argument("--load", type=float, default=0.5, help="share of the measured capacity offered (default 0.5)")
    ap.add_argument("--max-rate", type=float, default=400.0,
                    help="upper bound of the chosen rate: the Python clients' own limit on 2 cores (default 400)")
    ap.add_argument("--warmup", type=int, default=20, help="seconds of load before the slowdown (default 20)")
    ap.add_argument("--fault", type=int, default=60, help="seconds of slowdown (default 60)")
    ap.add_argument("--after", type=int, default=30, help="seconds of load after it (default 30)")
    ap.add_argument("--call-ms", type=int, default=1500,
                    help="time of every database call during the slowdown (default 1500)")
    ap.add_argument("--db-share", type=float, default=0.4, help="share of requests that need the database (0.4)")
    ap.add_argument("--cpu-ms", type=int, default=5,
                    help="CPU time of a request that does not (GET /work?ms=, default 5)")
    ap.add_argument("--arrivals", choices=["fixed", "poisson"], default="fixed")
    ap.add_argument("--only", default="vigil,naive",
                    help="setups to run, in this order (default vigil,naive; also vigil-off: vigil lb in front "
                         "of services started with --admission off)")
    ap.add_argument("--nginx-read-timeout", default="1s",
                    help="nginx proxy_read_timeout: one try's wait, retried on another server (default 1s, the "
                         "clients' patience)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.warmup <= BASELINE_FROM + 2:
        sys.exit(f"--warmup must be more than {BASELINE_FROM + 2} s (the baseline starts at {BASELINE_FROM} s)")
    vigil = vigil_binary()
    logdir = tempfile.mkdtemp(prefix="vigil-bench-overload-")
    procs = Procs()

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Also when started in the background of a script (which ignores SIGINT for it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    admission = has_admission_flag(vigil)
    setups = [s.strip() for s in args.only.split(",") if s.strip()]
    for s in setups:
        if s not in ("vigil", "vigil-off", "naive"):
            sys.exit(f"unknown setup {s!r} (vigil, vigil-off, naive)")
        if s == "vigil-off" and not admission:
            sys.exit("vigil-off needs an example service with --admission (a later binary)")
    try:
        print(f"machine: {os.cpu_count()} cores, load {' '.join(open('/proc/loadavg').read().split()[:3])}; "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}; logs {logdir}")
        print(f"binary {vigil}; " + ("naive services: --admission off" if admission else
                                     "NOTE: this binary's example service has no --admission flag: the naive "
                                     "services run as the vigil ones do (the setups differ by balancer only)"))
        rate = args.rate
        if rate is None:
            fleet = Fleet("probe", vigil, procs, logdir, "vigil lb", False, args)
            client = loadgen.Client("127.0.0.1", fleet.port)
            asyncio.run(loadgen.closed_loop(client, 16, 2.0, args.db_share, args.cpu_ms))  # warm
            client = loadgen.Client("127.0.0.1", fleet.port)
            cap, p50, p99, errs = asyncio.run(loadgen.closed_loop(client, 64, 6.0, args.db_share, args.cpu_ms))
            procs.stop_all()
            rate = max(10.0, min(args.max_rate, round(args.load * cap)))
            print(f"capacity (closed loop, 64 clients, 6 s, through vigil lb): {cap:.0f} answers/s, p50 "
                  f"{1000 * p50:.1f} ms, p99 {1000 * p99:.1f} ms, {errs} errors -> rate {rate:g}/s "
                  f"({args.load:g} x capacity{', capped by --max-rate' if rate == args.max_rate else ''})")
        print(f"command: bench/overload/run.py --rate {rate:g} --warmup {args.warmup} --fault {args.fault} "
              f"--after {args.after} --call-ms {args.call_ms} --db-share {args.db_share:g} --cpu-ms {args.cpu_ms} "
              f"--arrivals {args.arrivals} --only {','.join(setups)} --nginx-read-timeout {args.nginx_read_timeout}")
        results = {}
        for setup in setups:
            if setup == "vigil":
                fleet = Fleet("vigil", vigil, procs, logdir, "vigil lb", False, args)
            elif setup == "vigil-off":
                fleet = Fleet("vigil-off", vigil, procs, logdir, "vigil lb", True, args)
            else:
                fleet = Fleet("naive", vigil, procs, logdir, "nginx", admission, args)
            time.sleep(2)  # the balancers' first health checks
            print(f"running {setup} ({fleet.balancer}) for {args.warmup + args.fault + args.after} s ...",
                  file=sys.stderr, flush=True)
            counts, scraper, t0_wall = asyncio.run(drive(fleet, rate, args))
            if fleet.balancer == "nginx":
                time.sleep(1.2)  # the access log's flush
            results[setup] = analyse(counts, scraper, fleet, t0_wall, args)
            results[setup]["proxy"] = fleet.proxy_stats()
            procs.stop_all()
        report(results, args, rate)
        with open(os.path.join(logdir, "results.json"), "w") as f:
            json.dump({"rate": rate, "args": vars(args), "admission_flag": admission, "results": results}, f)
        for n, r in results.items():
            print(f"{n}: delay proxy {r['proxy']}; requests sent again on a new connection after an idle "
                  f"keep-alive one turned out closed: {r['stale_resends']}")
        print(f"load at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    except KeyboardInterrupt:
        print("interrupted: stopping every process", file=sys.stderr)
        sys.exit(130)
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
