#!/usr/bin/env python3
"""vigil lb beside HAProxy, nginx and Caddy on HTTP/2 (h2c, TLS), HTTP/1.1 over TLS, new
TLS connections, gRPC unary and WebSocket echo (issue 35), in the same run, rounds
alternating with the order rotated.

Same backends for all (bench.py's four nginx, a grpcio echo server with the standard
health service, a raw WebSocket echo server), one worker each, active checks every 1 s
(timeout 1 s, fall 3, rise 2 where the proxy has the knobs). Every process started here
is stopped in `finally`; every run is bounded by --duration (or h2load's -n).

  bench/lb/protocols.py --install       # Debian caddy, nghttp2-client; PyPI grpcio, websockets
  bench/lb/protocols.py --rounds 3 --duration 5
"""
import argparse
import asyncio
import base64
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
from common import vigil_binary  # noqa: E402

bench.BACKEND_PORTS = [19201, 19202, 19203, 19204]
GRPC_PORT, WS_PORT = 19211, 19212
# name -> (plain: HTTP/1.1, WebSocket, gRPC and h2c; tls: h2 and http/1.1 by ALPN; h2c)
PORTS = {"vigil": (18280, 18282, 18280), "haproxy": (18283, 18284, 18283),
         "nginx": (18285, 18286, 18287), "caddy": (18288, 18289, 18288)}
VIGIL_ADMIN = 18281
PROXIES = list(PORTS)
NA = {}  # (proxy, test) -> why


def install():
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "caddy", "nghttp2-client", "nginx-light",
                    "haproxy", "wrk", "openssl"], env=env, check=True, stdout=subprocess.DEVNULL)
    for service in ("nginx", "haproxy", "caddy"):
        subprocess.run(["service", service, "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "grpcio",
                    "grpcio-health-checking", "websockets"], check=True)


def check_tools():
    missing = [t for t in ("caddy", "h2load", "nginx", "haproxy", "wrk", "openssl")
               if not shutil.which(t)]
    try:
        import grpc  # noqa: F401
        import grpc_health.v1  # noqa: F401
    except ImportError:
        missing.append("grpcio, grpcio-health-checking (PyPI)")
    if missing:
        sys.exit(f"missing: {', '.join(missing)}; run bench/lb/protocols.py --install")


def certificate(tmp):
    """A self-signed localhost certificate that is not a CA (webpki refuses those)."""
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-addext", "basicConstraints=critical,CA:FALSE",
                    "-keyout", key, "-out", cert], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(os.path.join(tmp, "combined.pem"), "w") as f:
        f.write(open(cert).read() + open(key).read())
    return cert, key


# --- backends beside bench.py's nginx: gRPC echo, WebSocket echo ---------------------

GRPC_SERVER = r"""
import sys, grpc
from concurrent import futures
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
s = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
echo = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)
s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.E", {"Echo": echo}),))
h = health.HealthServicer()
h.set("", health_pb2.HealthCheckResponse.SERVING)
health_pb2_grpc.add_HealthServicer_to_server(h, s)
s.add_insecure_port("127.0.0.1:%s" % sys.argv[1])
s.start(); s.wait_for_termination()
"""

# Plain requests get 200 "ok" (health checks); an Upgrade gets 101, then every byte is
# sent back as it came (the proxies only tunnel: the client reads its own frames back).
WS_SERVER = r"""
import asyncio, base64, hashlib, sys
async def serve(r, w):
    head = await r.readuntil(b"\r\n\r\n")
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")]
    if not key:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"); await w.drain(); w.close(); return
    acc = base64.b64encode(hashlib.sha1(key[0] + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    try:
        while True:
            b = await r.read(65536)
            if not b: break
            w.write(b); await w.drain()
    except ConnectionError:
        pass
    w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await s.serve_forever()
asyncio.run(main())
"""


# --- proxy configurations ------------------------------------------------------------

def vigil_config(cert, key):
    plain, tls, _ = PORTS["vigil"]
    targets = ", ".join(f'{{ addr = "127.0.0.1:{p}" }}' for p in bench.BACKEND_PORTS)
    check = 'interval = "1s"\ntimeout = "1s"\nhealthy_threshold = 2\nunhealthy_threshold = 3\n'
    return f"""
listen = "127.0.0.1:{plain}"
admin_listen = "127.0.0.1:{VIGIL_ADMIN}"
workers = 1
[timeouts]
connect = "1s"
[tls_listeners.public]
listen = "127.0.0.1:{tls}"
[[tls_listeners.public.certificates]]
cert = "{cert}"
key = "{key}"
[[routes]]
path_prefix = "/b.E/"
pool = "grpc"
[[routes]]
path_prefix = "/ws"
pool = "ws"
[[routes]]
pool = "app"
[pools.app]
targets = [{targets}]
[pools.app.health_check]
{check}[pools.app.retries]
max_retries = 2
[pools.grpc]
protocol = "h2"
targets = [{{ addr = "127.0.0.1:{GRPC_PORT}" }}]
[pools.grpc.health_check]
type = "grpc"
{check}[pools.ws]
targets = [{{ addr = "127.0.0.1:{WS_PORT}" }}]
[pools.ws.health_check]
path = "/"
{check}"""


def haproxy_config(tmp):
    plain, tls, _ = PORTS["haproxy"]
    servers = "\n".join(f"  server b{i} 127.0.0.1:{p}" for i, p in enumerate(bench.BACKEND_PORTS))
    return f"""
global
  nbthread 1
  maxconn 8000
  tune.ssl.default-dh-param 2048
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 10s
  timeout tunnel 1h
  option http-keep-alive
  retries 2
  option redispatch 1
  default-server check inter 1s fall 3 rise 2
frontend fe
  bind 127.0.0.1:{plain}
  bind 127.0.0.1:{tls} ssl crt {tmp}/combined.pem alpn h2,http/1.1
  use_backend grpc if {{ path_beg /b.E/ }}
  use_backend ws if {{ path_beg /ws }}
  default_backend be
backend be
  balance leastconn
  http-reuse always
  option httpchk GET /readyz
{servers}
backend grpc
  # no gRPC health check in HAProxy 2.6: a TCP connect check
  server g 127.0.0.1:{GRPC_PORT} proto h2
backend ws
  option httpchk GET /
  server w 127.0.0.1:{WS_PORT}
"""


def nginx_config(d, cert, key):
    plain, tls, h2c = PORTS["nginx"]
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;"
                        for p in bench.BACKEND_PORTS)
    proxy = """proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_connect_timeout 1s; proxy_next_upstream error timeout; proxy_next_upstream_tries 3;"""
    return f"""
daemon off; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 8000; }}
http {{
  access_log off; keepalive_timeout 75s; keepalive_requests 1000000;
  http2_max_requests 1000000;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  ssl_session_cache shared:SSL:10m;
  upstream be {{ least_conn;
{servers}
    keepalive 128; }}
  upstream grpcbe {{ server 127.0.0.1:{GRPC_PORT}; keepalive 16; }}
  upstream wsbe {{ server 127.0.0.1:{WS_PORT}; }}
  server {{ listen 127.0.0.1:{plain};
    location / {{ {proxy} }}
    location /ws {{ proxy_pass http://wsbe; proxy_http_version 1.1; proxy_read_timeout 1h;
      proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection "upgrade"; }} }}
  server {{ listen 127.0.0.1:{tls} ssl http2; ssl_certificate {cert}; ssl_certificate_key {key};
    location / {{ {proxy} }} }}
  server {{ listen 127.0.0.1:{h2c} http2;
    location / {{ {proxy} }}
    location /b.E/ {{ grpc_pass grpc://grpcbe; }} }}
}}
"""


def caddy_config(cert, key):
    plain, tls, _ = PORTS["caddy"]
    ups = " ".join(f"127.0.0.1:{p}" for p in bench.BACKEND_PORTS)
    # Caddy 2.6 (Debian 12) has no health_fails/health_passes (2.7): one failed check
    # ejects, one pass restores.
    checks = "health_interval 1s\n    health_timeout 1s"
    app = f"""reverse_proxy {ups} {{
    lb_policy least_conn
    lb_try_duration 1s
    health_uri /readyz
    {checks}
  }}"""
    return f"""{{
  admin off
  auto_https disable_redirects
  default_sni localhost
  servers {{
    protocols h1 h2 h2c
  }}
}}
http://:{plain} {{
  bind 127.0.0.1
  handle /b.E/* {{
    reverse_proxy h2c://127.0.0.1:{GRPC_PORT}
  }}
  handle /ws* {{
    reverse_proxy 127.0.0.1:{WS_PORT} {{
      health_uri /
      {checks}
    }}
  }}
  handle {{
    {app}
  }}
}}
https://localhost:{tls} {{
  bind 127.0.0.1
  tls {cert} {key}
  {app}
}}
"""


def wait_listen(port, proc, name, log, timeout=30):
    deadline = time.monotonic() + timeout
    import socket
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = open(log).read()[-2000:] if os.path.exists(log) else ""
                raise RuntimeError(f"{name} did not listen on {port}: {tail}")
            time.sleep(0.1)


def start(name, tmp, cert, key, vigil):
    log = os.path.join(tmp, f"{name}.log")
    out = open(log, "w")
    if name == "vigil":
        conf = os.path.join(tmp, "lb.toml")
        open(conf, "w").write(vigil_config(cert, key))
        cmd = [vigil, "lb", "-c", conf]
        env = dict(os.environ, RUST_LOG="warn")
    elif name == "haproxy":
        conf = os.path.join(tmp, "haproxy.cfg")
        open(conf, "w").write(haproxy_config(tmp))
        cmd, env = ["haproxy", "-db", "-f", conf], None
    elif name == "nginx":
        d = os.path.join(tmp, "nginx-proxy")
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        open(conf, "w").write(nginx_config(d, cert, key))
        cmd, env = ["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"], None
        log = f"{d}/error.log"
    else:
        conf = os.path.join(tmp, "Caddyfile")
        open(conf, "w").write(caddy_config(cert, key))
        cmd = ["caddy", "run", "--adapter", "caddyfile", "--config", conf]
        env = dict(os.environ, GOMAXPROCS="1", HOME=tmp, XDG_DATA_HOME=tmp, XDG_CONFIG_HOME=tmp)
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    for port in set(PORTS[name]):
        wait_listen(port, p, name, log)
    time.sleep(2.5)  # checks pass (rise 2 at 1 s)
    return p


def worker_pid(name, proc):
    """The process that serves (nginx: its one worker)."""
    if name != "nginx":
        return proc.pid
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.split() else proc.pid


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- load generators -----------------------------------------------------------------

def h2load(url, args, timeout):
    out = subprocess.run(["h2load"] + args + [url], capture_output=True, text=True,
                         timeout=timeout).stdout
    r = {"rps": float("nan"), "p99": float("nan"), "errors": 0}
    m = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if m:
        r["rps"] = float(m.group(1))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored", out)
    if m:
        r["errors"] = int(m.group(3)) + int(m.group(4))
        r["done"] = int(m.group(1))
    # h2load prints min/max/mean/sd of "time for request", no percentiles: its max is
    # reported as the tail, labelled so.
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if m:
        r["mean"], r["p99"] = bench.ms(m.group(3)), bench.ms(m.group(2))
    return r, out


def wrk_https(port, duration):
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{duration}s", "--latency",
                          f"https://127.0.0.1:{port}/"], capture_output=True, text=True,
                         timeout=duration + 30).stdout
    return bench.parse_wrk(out)


def s_time(port, reuse, duration):
    """Sequential handshakes per second with `openssl s_time` (-new: full handshakes;
    -reuse: the session resumed)."""
    out = subprocess.run(["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-new" if not reuse
                          else "-reuse", "-time", str(duration)], capture_output=True, text=True,
                         timeout=duration + 30).stdout
    m = re.findall(r"(\d+) connections in ([\d.]+) real seconds", out)
    if not m:
        return float("nan")
    n, secs = m[-1]
    return int(n) / float(secs) if float(secs) else float("nan")


def grpc_load(port, duration, concurrency=32):
    """grpcio asyncio client: `concurrency` calls in flight on one channel for `duration`."""
    import grpc

    async def run():
        lat = []
        errors = 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/b.E/Echo")
            await call(b"warm", timeout=5)
            end = time.monotonic() + duration

            async def one():
                nonlocal errors
                while time.monotonic() < end:
                    t = time.perf_counter()
                    try:
                        await call(b"x" * 32, timeout=5)
                        lat.append(time.perf_counter() - t)
                    except grpc.RpcError:
                        errors += 1
            t0 = time.monotonic()
            await asyncio.gather(*(one() for _ in range(concurrency)))
            return lat, errors, time.monotonic() - t0
    lat, errors, secs = asyncio.run(run())
    lat.sort()
    return {"rps": len(lat) / secs, "p99": lat[int(len(lat) * 0.99)] * 1e3 if lat else float("nan"),
            "errors": errors}


def ws_load(port, duration, pid, tunnels=1000):
    """`tunnels` WebSocket connections opened through the proxy; the proxy's RSS with them
    all open; then each sends a 32-byte masked frame and reads it back, for `duration`."""
    frame = bytes([0x81, 0x80 | 32]) + b"\x01\x02\x03\x04" + bytes(32)

    async def run():
        conns = []
        before = rss_kib(pid)
        sem = asyncio.Semaphore(100)

        async def open_one(i):
            async with sem:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                key = base64.b64encode(os.urandom(16))
                w.write(b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                        b"Sec-WebSocket-Key: " + key + b"\r\n\r\n")
                head = await r.readuntil(b"\r\n\r\n")
                if b" 101 " not in head.split(b"\r\n")[0]:
                    raise RuntimeError(head[:80])
                conns.append((r, w))
        await asyncio.gather(*(open_one(i) for i in range(tunnels)))
        await asyncio.sleep(0.5)
        after = rss_kib(pid)
        count = 0
        end = time.monotonic() + duration

        async def loop(r, w):
            nonlocal count
            while time.monotonic() < end:
                w.write(frame)
                await r.readexactly(len(frame))
                count += 1
        t0 = time.monotonic()
        await asyncio.gather(*(loop(r, w) for r, w in conns))
        secs = time.monotonic() - t0
        for _, w in conns:
            w.close()
        return count / secs, before, after
    rate, before, after = asyncio.run(run())
    return {"rps": rate, "rss_mib": after / 1024, "per_tunnel_kib": (after - before) / tunnels}


# --- the run -------------------------------------------------------------------------

def measure(name, proc, test, args):
    plain, tls, h2c = PORTS[name]
    n = ["-n", str(args.requests), "-c", "32", "-m", "10", "-t", "1"]
    if test == "h2c":
        r, _ = h2load(f"http://127.0.0.1:{h2c}/", n, 120)
    elif test == "h2-tls":
        r, _ = h2load(f"https://127.0.0.1:{tls}/", n, 120)
    elif test == "h1-tls":
        r = wrk_https(tls, args.duration)
    elif test == "tls-new":
        r = {"rps": s_time(tls, False, args.duration)}
    elif test == "tls-resume":
        r = {"rps": s_time(tls, True, args.duration)}
    elif test == "h2-tls-conns":  # 1 request per connection, 16 at a time
        r, _ = h2load(f"https://127.0.0.1:{tls}/", ["-n", "1000", "-c", "1000", "-t", "1"], 120)
    elif test == "grpc":
        r = grpc_load(h2c, args.duration)
    elif test == "ws":
        r = ws_load(plain, args.duration, worker_pid(name, proc))
    return r


TESTS = ["h2c", "h2-tls", "h1-tls", "tls-new", "tls-resume", "h2-tls-conns", "grpc", "ws"]
LABEL = {"h2c": "HTTP/2 h2c req/s (h2load -n N -c 32 -m 10 -t 1)",
         "h2-tls": "HTTP/2 over TLS req/s (h2load https, ALPN h2)",
         "h1-tls": "HTTP/1.1 over TLS req/s (wrk -t1 -c32 https)",
         "tls-new": "new TLS connections/s, full handshake (openssl s_time -new, sequential)",
         "tls-resume": "TLS connections/s, session resumed (openssl s_time -reuse)",
         "h2-tls-conns": "h2 over TLS, 1 request per new connection: req/s (h2load -n 1000 -c 1000)",
         "grpc": "gRPC unary calls/s (grpcio aio client, 32 in flight, h2c)",
         "ws": "WebSocket echo messages/s, 1,000 tunnels (raw client, 32-byte frames)"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--install", action="store_true", help="install what the bench needs, then exit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5, help="seconds per timed run")
    ap.add_argument("--requests", type=int, default=100000, help="h2load -n")
    ap.add_argument("--tests", default=",".join(TESTS))
    ap.add_argument("--proxies", default=",".join(PROXIES))
    args = ap.parse_args()
    if args.install:
        install()
        return
    check_tools()
    tests = args.tests.split(",")
    proxies = args.proxies.split(",")
    vigil = vigil_binary()
    tmp = tempfile.mkdtemp(prefix="vigil-protocols-")
    cert, key = certificate(tmp)
    backends = bench.Backends(tmp)
    extra = []
    results = {}  # (proxy, test) -> [dict]
    try:
        backends.start_all()
        gpy = os.path.join(tmp, "grpc_server.py")
        open(gpy, "w").write(GRPC_SERVER)
        wpy = os.path.join(tmp, "ws_server.py")
        open(wpy, "w").write(WS_SERVER)
        extra.append(subprocess.Popen([sys.executable, gpy, str(GRPC_PORT)]))
        extra.append(subprocess.Popen([sys.executable, wpy, str(WS_PORT)]))
        time.sleep(1.5)
        for rnd in range(args.rounds):
            order = proxies[rnd % len(proxies):] + proxies[:rnd % len(proxies)]
            for name in order:
                proc = None
                try:
                    try:
                        proc = start(name, tmp, cert, key, vigil)
                    except RuntimeError as e:
                        print(e, file=sys.stderr)
                        continue
                    for test in tests:
                        try:
                            r = measure(name, proc, test, args)
                        except Exception as e:  # noqa: BLE001 - one failed run is reported, not fatal
                            r = {"rps": float("nan"), "error": str(e)[:200]}
                        results.setdefault((name, test), []).append(r)
                        print(f"round {rnd + 1} {name:8} {test:13} {fmt_one(r)}", file=sys.stderr,
                              flush=True)
                finally:
                    bench.stop(proc)
    finally:
        for p in extra:
            bench.stop(p)
        backends.stop_all()
    report(results, tests, proxies)
    shutil.rmtree(tmp, ignore_errors=True)


def fmt_one(r):
    return " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())


def rng(vals, f="{:,.0f}"):
    vals = [v for v in vals if v == v]
    if not vals:
        return "N/A"
    return f.format(min(vals)) + "-" + f.format(max(vals)) if len(vals) > 1 else f.format(vals[0])


def report(results, tests, proxies):
    print(f"| measure | {' | '.join(proxies)} | vigil/HAProxy | vigil/best peer |")
    print("|---|" + "---|" * (len(proxies) + 2))
    for test in tests:
        for key, label, fmt in (("rps", LABEL[test], "{:,.0f}"),
                                ("p99", "  p99 ms" if test in ("grpc", "h1-tls") else "  max ms", "{:.1f}"),
                                ("rss_mib", "  RSS MiB, 1,000 tunnels open", "{:.1f}"),
                                ("per_tunnel_kib", "  KiB per tunnel", "{:.1f}")):
            rows = {p: [r.get(key, float("nan")) for r in results.get((p, test), [])] for p in proxies}
            if not any(v == v for vs in rows.values() for v in vs):
                continue
            if key == "p99" and test in ("tls-new", "tls-resume", "ws"):
                continue
            cells = [rng(rows[p], fmt) for p in proxies]
            med = {p: statistics.median([v for v in rows[p] if v == v]) for p in proxies
                   if any(v == v for v in rows[p])}
            ratio_h = ratio_b = "-"
            if "vigil" in med and "haproxy" in med and med["haproxy"]:
                ratio_h = f"{med['vigil'] / med['haproxy']:.2f}x"
            peers = {p: v for p, v in med.items() if p != "vigil"}
            if "vigil" in med and peers:
                lower_better = key != "rps"
                best = min(peers.values()) if lower_better else max(peers.values())
                if best:
                    ratio_b = f"{med['vigil'] / best:.2f}x"
            print(f"| {label} | {' | '.join(cells)} | {ratio_h} | {ratio_b} |")
    for (p, t), rs in sorted(results.items()):
        errs = [r["error"] for r in rs if "error" in r]
        if errs:
            print(f"{p} {t}: {errs[0]}")


if __name__ == "__main__":
    main()
