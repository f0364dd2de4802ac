#!/usr/bin/env python3
"""vigil lb beside HAProxy and nginx, same backends, same wrk runs (driven by run.sh).

Every process started here is stopped here; every run is bounded by --duration.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BACKEND_PORTS = [19101, 19102, 19103, 19104]
PORTS = {"vigil": 18180, "haproxy": 18182, "nginx": 18183}
VIGIL_ADMIN = 18181
# Equivalent settings for all three: WORKERS worker threads/processes (1 unless
# --workers), keep-alive to backends, 1 s connect
# timeout, 10 s response timeout (vigil's default), least outstanding requests
# (P2C / leastconn / least_conn), 2 retries; active checks every 1 s, 1 s timeout,
# fall 3, rise 2 (nginx open source has passive checks only: max_fails=1).
# The failure runs are made once per --fail-timeouts value (default 10 and 2 s): the
# time one attempt waits for a response header (vigil `timeouts.per_try`, its overall
# `response_header` staying at 10 s or more; HAProxy `timeout server`, a timeout retried
# with `retry-on response-timeout`; nginx `proxy_read_timeout`, retried by
# `proxy_next_upstream timeout`). Set per run in main().
RESPONSE_TIMEOUT_S = 10
# Connection limits of the peers (HAProxy maxconn, nginx worker_connections), and the
# idle keep-alive time of client connections when set (bench/lb/memory.py keeps 10,000
# idle connections open for a while).
MAXCONN = 8000
CLIENT_IDLE_S = None
# vigil's overall response-header time (its default): bounds the client's wait when a
# per-try timeout is shorter.
VIGIL_OVERALL_S = 10
CONNECTIONS = 64
# --pin: the proxy alone on core 0, wrk and the backends on core 1 (else: wherever the
# scheduler puts them). Set in main().
PIN = False
# Worker threads (vigil, HAProxy) or processes (nginx) of each proxy. Set in main().
WORKERS = 1
# The balancing family all three use in a run: "least" (least outstanding requests:
# vigil's default power of two choices, HAProxy leastconn, nginx least_conn) or "rr"
# (round-robin for all three). Set per run in main().
BALANCE = "least"
HAPROXY_BALANCE = {"least": "leastconn", "rr": "roundrobin"}
NGINX_BALANCE = {"least": "least_conn;", "rr": "# round-robin (the default)"}
VIGIL_BALANCE = {"least": "", "rr": 'balance = "round-robin"\n'}


def ensure_tools(*tools):
    """Installs from Debian what is missing of `tools` (nginx, haproxy, wrk, valgrind), as
    run.sh does, and stops the system services the packages start (we run our own)."""
    package = {"nginx": "nginx-light", "perf": "linux-perf"}
    missing = [t for t in tools if not shutil.which(t)]
    if not missing:
        return
    print(f"installing {' '.join(missing)} from Debian", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq"] + [package.get(t, t) for t in missing],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    for service in ("nginx", "haproxy"):
        subprocess.run(["service", service, "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    still = [t for t in tools if not shutil.which(t)]
    if still:
        sys.exit(f"could not install {' '.join(still)}")


def on(core, cmd):
    """`cmd` pinned to `core` when --pin is given."""
    return ["taskset", "-c", str(core)] + cmd if PIN else cmd


def wait_port(port, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def stop(proc, sig=signal.SIGTERM):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.send_signal(sig)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Backends:
    """4 single-process nginx instances answering 200 "ok" (also on /readyz)."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = [None] * len(BACKEND_PORTS)

    def start(self, i):
        d = os.path.join(self.tmp, f"backend{i}")
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""
master_process off; daemon off; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off; keepalive_requests 1000000; keepalive_timeout 120s;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  server {{ listen 127.0.0.1:{BACKEND_PORTS[i]} reuseport;
    location / {{ default_type text/plain; return 200 "ok b{i}\\n"; }} }}
}}
""")
        self.procs[i] = subprocess.Popen(
            on(1, ["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_port(BACKEND_PORTS[i]):
            sys.exit(f"backend {i} did not start")

    def start_all(self):
        for i in range(len(BACKEND_PORTS)):
            self.start(i)

    def kill(self, i):
        os.kill(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()
        self.procs[i] = None

    def freeze(self, i):
        os.kill(self.procs[i].pid, signal.SIGSTOP)

    def thaw(self, i):
        os.kill(self.procs[i].pid, signal.SIGCONT)

    def restore(self):
        for i, p in enumerate(self.procs):
            if p is None:
                self.start(i)
            else:
                os.kill(p.pid, signal.SIGCONT)

    def stop_all(self):
        for p in self.procs:
            stop(p, signal.SIGKILL)


def vigil_config(port=PORTS["vigil"], admin=VIGIL_ADMIN):
    """vigil lb's settings for these runs (also bench/lb/instructions.py's)."""
    targets = ", ".join(f'{{ addr = "127.0.0.1:{p}" }}' for p in BACKEND_PORTS)
    return f"""
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
workers = {WORKERS}
[timeouts]
{f'client_header = "{CLIENT_IDLE_S}s"' if CLIENT_IDLE_S else ""}
connect = "1s"
response_header = "{max(RESPONSE_TIMEOUT_S, VIGIL_OVERALL_S)}s"
per_try = "{RESPONSE_TIMEOUT_S}s"
[pools.app]
{VIGIL_BALANCE[BALANCE]}targets = [{targets}]
[pools.app.health_check]
interval = "1s"
timeout = "1s"
healthy_threshold = 2
unhealthy_threshold = 3
[pools.app.retries]
max_retries = 2
[pools.app.hedge]
enabled = true
"""


def listening(p, name, log):
    """Waits until proxy `name` (process `p`) accepts connections (a loaded machine starts
    it slowly); exits with its log's path if it died or took over 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", PORTS[name]), timeout=0.5).close()
            return
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                stop(p)
                with open(log) as f:
                    tail = f.read()[-2000:]
                sys.exit(f"{name} did not listen within 30 s; the end of its log ({log}):\n{tail}")
            time.sleep(0.1)


def start_vigil(tmp, vigil):
    conf = os.path.join(tmp, "lb.toml")
    with open(conf, "w") as f:
        f.write(vigil_config())
    log = open(os.path.join(tmp, "vigil.log"), "w")
    p = subprocess.Popen(on(0, [vigil, "lb", "-c", conf]), stdout=subprocess.DEVNULL, stderr=log,
                         env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn")))
    # Listening (a loaded machine starts it slowly), then new targets are unknown until
    # 2 checks pass (about 1 s).
    listening(p, "vigil", log.name)
    time.sleep(2.5)
    return p


def haproxy_config(port=PORTS["haproxy"]):
    """HAProxy's settings for these runs (also bench/lb/instructions.py's)."""
    servers = "\n".join(f"  server b{i} 127.0.0.1:{p}" for i, p in enumerate(BACKEND_PORTS))
    return f"""
global
  nbthread {WORKERS}
  maxconn {MAXCONN}
defaults
  mode http
  timeout connect 1s
  timeout client {CLIENT_IDLE_S or 30}s
  timeout http-keep-alive {CLIENT_IDLE_S or 30}s
  timeout server {RESPONSE_TIMEOUT_S}s
  option http-keep-alive
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response response-timeout
frontend fe
  bind 127.0.0.1:{port}
  default_backend be
backend be
  balance {HAPROXY_BALANCE[BALANCE]}
  http-reuse always
  option httpchk GET /readyz
  default-server check inter 1s fall 3 rise 2
{servers}
"""


def start_haproxy(tmp):
    conf = os.path.join(tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(haproxy_config())
    log = os.path.join(tmp, "haproxy.log")
    p = subprocess.Popen(on(0, ["haproxy", "-db", "-f", conf]), stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"))
    listening(p, "haproxy", log)
    time.sleep(2.5)
    return p


def nginx_config(d, port=PORTS["nginx"], master=True):
    """nginx's settings for these runs, files under `d` (also bench/lb/instructions.py's:
    there without a master process, so that the one process valgrind runs serves)."""
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;"
                        for p in BACKEND_PORTS)
    return f"""
daemon off; worker_processes {WORKERS};{"" if master else " master_process off;"}
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections {MAXCONN}; }}
http {{
  access_log off; keepalive_timeout {CLIENT_IDLE_S or 75}s;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  upstream be {{
    {NGINX_BALANCE[BALANCE]}
{servers}
    keepalive 128;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://be;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_connect_timeout 1s;
      proxy_read_timeout {RESPONSE_TIMEOUT_S}s;
      proxy_next_upstream error timeout;
      proxy_next_upstream_tries 3;
    }}
  }}
}}
"""


def start_nginx(tmp):
    d = os.path.join(tmp, "nginx-proxy")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_config(d))
    p = subprocess.Popen(on(0, ["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listening(p, "nginx", f"{d}/error.log")
    time.sleep(1.5)
    return p


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def ms(text):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    return float(m.group(1)) * UNITS[m.group(2)] if m else float("nan")


def parse_wrk(out):
    r = {"rps": 0.0, "p50": float("nan"), "p99": float("nan"), "max": float("nan"),
         "errors": 0, "requests": 0}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Requests/sec:"):
            r["rps"] = float(line.split()[1])
        elif line.startswith("Latency") and len(line.split()) >= 4:
            r["max"] = ms(line.split()[3])
        elif line.startswith("50%"):
            r["p50"] = ms(line.split()[1])
        elif line.startswith("99%"):
            r["p99"] = ms(line.split()[1])
        elif line.startswith("Socket errors:"):
            r["errors"] += sum(int(x) for x in re.findall(r"\d+", line))
        elif line.startswith("Non-2xx"):
            r["errors"] += int(line.split()[-1])
        elif "requests in" in line:
            r["requests"] = int(line.split()[0])
    return r


def process_tree(pid):
    """`pid` and its children (nginx's and HAProxy's workers)."""
    tree = [pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # After the command name: state, then ppid.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == pid:
            tree.append(int(entry))
    return tree


def tree_cpu_seconds(pid):
    """User + system CPU time of a process and its children (nginx's worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime and stime are fields 14 and 15 of stat (1-based).
        total += int(fields[11]) + int(fields[12])
    return total / tick


def sleeps(pids):
    """Times these processes went to sleep (voluntary context switches), summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += sum(int(line.split()[1]) for line in f
                             if line.startswith("voluntary_ctxt_switches"))
        except OSError:
            pass
    return total


def wrk_cmd(port, duration, *options):
    """The one wrk command line of these benchmarks (1 thread, CONNECTIONS connections),
    pinned to core 1 under --pin."""
    return on(1, ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{duration}s", "--timeout", "30s",
                  *options, f"http://127.0.0.1:{port}/"])


def held_by(port):
    """Requests a backend has been sent and not read: its established connections with
    bytes waiting in their receive queue (a frozen backend reads nothing). wrk only
    counts requests that finish, so those still hung on a frozen backend when it stops
    are counted here, the same way for all three proxies."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.split() and int(line.split()[0]) > 0)


def wrk(port, duration, event=None, at=None, pid=None, backends=(), held_port=None):
    """One bounded wrk run. With `pid`: the proxy's CPU per request; with `backends`
    (their pids): how often per request a backend went to sleep (and so had to be woken
    for the next one); with `held_port`: requests still held by that backend half a
    second before wrk stops ([`held_by`])."""
    cmd = wrk_cmd(port, duration, "--latency")
    cpu0 = tree_cpu_seconds(pid) if pid else 0.0
    sleeps0 = sleeps(backends)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.time()
    if event:
        time.sleep(at)
        event()
    held = None
    if held_port:
        time.sleep(max(0.0, started + duration - 0.5 - time.time()))
        held = held_by(held_port)
    out, _ = p.communicate(timeout=duration + 60)
    r = parse_wrk(out)
    r["held"] = held
    if pid and r["requests"]:
        r["cpu_us"] = (tree_cpu_seconds(pid) - cpu0) / r["requests"] * 1e6
    if backends and r["requests"]:
        r["wakeups"] = (sleeps(backends) - sleeps0) / r["requests"]
    return r, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--fail-duration", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="vigil,haproxy,nginx", help="proxies to run")
    ap.add_argument("--no-failures", action="store_true", help="normal runs only")
    ap.add_argument("--failures-only", action="store_true", help="failure runs only")
    ap.add_argument("--workers", type=int, default=1,
                    help="worker threads/processes of each proxy (default 1)")
    ap.add_argument("--balance", default="least,rr",
                    help="balancing families for the normal runs, comma-separated: least "
                         "(vigil P2C, HAProxy leastconn, nginx least_conn), rr (round-robin "
                         "for all); the failure runs use the first")
    ap.add_argument("--fail-timeouts", default="10,2",
                    help="per-try response timeouts (s) of the failure runs, comma-separated")
    ap.add_argument("--pin", action="store_true",
                    help="proxy alone on core 0; wrk and the backends on core 1")
    args = ap.parse_args()
    global PIN, WORKERS, BALANCE, RESPONSE_TIMEOUT_S
    PIN = args.pin
    WORKERS = args.workers
    families = args.balance.split(",")
    for b in families:
        if b not in HAPROXY_BALANCE:
            sys.exit(f"--balance: unknown family {b!r} (expected least or rr)")
    tmp = tempfile.mkdtemp(prefix="vigil-lb-bench-")
    backends = Backends(tmp)
    starters = {
        "vigil": lambda: start_vigil(tmp, args.vigil),
        "haproxy": lambda: start_haproxy(tmp),
        "nginx": lambda: start_nginx(tmp),
    }
    starters = {k: v for k, v in starters.items() if k in args.only.split(",")}
    fail_at = max(2, args.fail_duration // 5)
    normal = {(b, name): [] for b in families for name in starters}
    fail_timeouts = [int(t) for t in args.fail_timeouts.split(",")]
    failures = {(t, name): {} for t in fail_timeouts for name in starters}
    proc = None
    try:
        backends.start_all()
        # Normal runs interleaved over rounds (the machine is shared: interleaving spreads
        # background noise over all of them); the median round is reported.
        for _ in range(0 if args.failures_only else args.rounds):
            for BALANCE in families:
                for name, start in starters.items():
                    proc = start()
                    if proc.poll() is not None:
                        sys.exit(f"{name} did not start; see {tmp}")
                    wrk(PORTS[name], 2)  # warm-up: connections to backends, caches
                    r, raw = wrk(PORTS[name], args.duration, pid=proc.pid,
                                 backends=[p.pid for p in backends.procs])
                    print(f"--- {name} normal ({BALANCE})\n{raw}", file=sys.stderr)
                    normal[(BALANCE, name)].append(r)
                    stop(proc)
                    proc = None
        BALANCE = families[0]
        for RESPONSE_TIMEOUT_S in fail_timeouts:
            for name, start in starters.items():
                for scenario in [] if args.no_failures else ["kill", "freeze"]:
                    proc = start()
                    # The baseline of "throughput kept": a normal run of this very proxy
                    # just before (the machine's load drifts too much between rounds to
                    # compare with the median round).
                    wrk(PORTS[name], 2)
                    base, _ = wrk(PORTS[name], args.duration)
                    ev = ((lambda: backends.kill(0)) if scenario == "kill"
                          else (lambda: backends.freeze(0)))
                    r, raw = wrk(PORTS[name], args.fail_duration, ev, fail_at,
                                 held_port=BACKEND_PORTS[0] if scenario == "freeze" else None)
                    r["base_rps"] = base["rps"]
                    failures[(RESPONSE_TIMEOUT_S, name)][scenario] = r
                    print(f"--- {name} {scenario} timeout {RESPONSE_TIMEOUT_S}s\n{raw}",
                          file=sys.stderr)
                    stop(proc)
                    proc = None
                    backends.restore()
    finally:
        stop(proc)
        backends.stop_all()

    placement = ("proxy pinned to core 0, wrk and backends to core 1" if PIN
                 else "unpinned")

    def median(runs, key):
        vals = sorted(r.get(key, float("nan")) for r in runs)
        return vals[len(vals) // 2]

    names = {"least": "least outstanding requests (vigil P2C, the default; HAProxy "
                      "leastconn; nginx least_conn)",
             "rr": "round-robin (all three)"}
    for b in [] if args.failures_only else families:
        print(f"\n## Normal run, {names[b]}: wrk -t1 -c{CONNECTIONS} -d{args.duration}s, "
              f"4 backends, {WORKERS} worker(s) each, {placement}, median of {args.rounds} "
              "interleaved rounds\n")
        print("| proxy | requests/s | p50 ms | p99 ms | CPU us/request | backend wake-ups/request "
              "| vigil/peer rps | vigil/peer p99 | all rounds rps | all rounds p99 ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        v = normal.get((b, "vigil"), next(iter(normal.values())))
        for name in starters:
            runs = normal[(b, name)]
            all_rps = "/".join(f"{r['rps']:.0f}" for r in runs)
            all_p99 = "/".join(f"{r['p99']:.1f}" for r in runs)
            print(f"| {name} | {median(runs, 'rps'):.0f} | {median(runs, 'p50'):.2f} | "
                  f"{median(runs, 'p99'):.2f} | {median(runs, 'cpu_us'):.1f} | "
                  f"{median(runs, 'wakeups'):.2f} | "
                  f"{median(v, 'rps') / median(runs, 'rps'):.2f} | "
                  f"{median(v, 'p99') / median(runs, 'p99'):.2f} | {all_rps} | {all_p99} |")
    if not args.failures_only:
        print("\nEach column is the median over the rounds (a round's p99 is a single stall away "
              "from another's on a shared machine). CPU us/request: user+system CPU of the proxy "
              "(and its workers) per request; less sensitive than requests/s to other load. "
              "Backend wake-ups/request: how often a backend went to sleep per request, i.e. had "
              "to be woken (and share a core) for the next one; on one machine that is CPU the "
              "proxy and wrk do not get.")
    if args.no_failures:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    print(f"\n## Failure runs ({names[families[0]]}): {args.fail_duration}s, backend 0 killed "
          f"(SIGKILL) or frozen (SIGSTOP) at t={fail_at}s; per-try response timeout "
          f"{', '.join(f'{t}s' for t in fail_timeouts)} for all three (vigil's overall "
          f"response_header {VIGIL_OVERALL_S}s or the per-try timeout if longer)\n")
    print("throughput kept: requests/s of the failure run over a normal run of the same proxy "
          "started just before it. held at stop: requests the frozen backend had been sent "
          "and not read half a second before wrk stopped (wrk counts only requests that "
          "finish: these are neither errors nor latency in its output); an active health "
          "check in flight (vigil, HAProxy) counts too.\n")
    print("| proxy | timeout | scenario | requests/s | throughput kept | client errors | "
          "slowest ms | held at stop |")
    print("|---|---|---|---|---|---|---|---|")
    for (t, name), res in failures.items():
        for scenario in [x for x in ["kill", "freeze"] if x in res]:
            r = res[scenario]
            kept = r["rps"] / r["base_rps"] if r["base_rps"] else float("nan")
            held = "" if r["held"] is None else r["held"]
            print(f"| {name} | {t}s | {scenario} | {r['rps']:.0f} | {kept:.0%} | {r['errors']} "
                  f"| {r['max']:.0f} | {held} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
