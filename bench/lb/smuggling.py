#!/usr/bin/env python3
"""Request-smuggling probes: what vigil lb, nginx and HAProxy do with each ambiguous input.

    python3 bench/lb/smuggling.py --vigil target/release/vigil     # all three
    python3 bench/lb/smuggling.py --only nginx,haproxy              # the peers alone

Each proxy (default configuration apart from the listen address and one backend) gets
every input of CASES on a fresh connection. The backend is a raw socket that records
the bytes it receives and answers every request head with a small 200. Printed per
input and proxy: the status lines the client got, and what the backend saw (its
request lines, and the framing, Host and underscore fields it got). The docs/lb.md
table "Request framing and smuggling" was made from this output; each of its rows also
has a test against vigil (crates/vigil-cli/tests/lb/front.rs, crates/vigil-core/src/http1.rs).

Not a benchmark: nothing is timed except the bounded waits.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

PORTS = {"vigil": 18280, "haproxy": 18282, "nginx": 18283}
VIGIL_ADMIN = 18281
BACKEND = 18290

H = "POST / HTTP/1.1\r\nHost: a\r\n"
CASES = [
    ("underscore Content_Length", H + "Content_Length: 5\r\n\r\nhello"),
    ("absolute form, other Host", "GET http://a/ HTTP/1.1\r\nHost: b\r\n\r\n"),
    ("bare LF in chunk extension", H + "Transfer-Encoding: chunked\r\n\r\n2;\nxx\r\nhi\r\n0\r\n\r\n"),
    ("bare LF ending chunk size", H + "Transfer-Encoding: chunked\r\n\r\n2\nhi\r\n0\r\n\r\n"),
    ("bare LF after chunk data", H + "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\n0\r\n\r\n"),
    ("bare LF in trailer section", H + "Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx: y\n\r\n"),
    ("empty chunk-size line", H + "Transfer-Encoding: chunked\r\n\r\n\r\nhi\r\n0\r\n\r\n"),
    ("space after chunk size", H + "Transfer-Encoding: chunked\r\n\r\n2 \r\nhi\r\n0\r\n\r\n"),
    ("chunk size 0x2", H + "Transfer-Encoding: chunked\r\n\r\n0x2\r\nhi\r\n0\r\n\r\n"),
    ("TE and CL", H + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE chunked, identity", H + "Transfer-Encoding: chunked, identity\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE xchunked", H + "Transfer-Encoding: xchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE tab before value", H + "Transfer-Encoding:\tchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE space before colon", H + "Transfer-Encoding : chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE vertical tab", H + "Transfer-Encoding:\x0bchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE obs-fold", H + "Transfer-Encoding:\r\n chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE twice (chunked, chunked)", H + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("TE in HTTP/1.0", "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("obs-fold in another field", H + "X-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nhi"),
    ("bare LF line ends in head", "POST / HTTP/1.1\nHost: a\nContent-Length: 2\n\nhi"),
    ("two different CL", H + "Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi"),
    ("two equal CL", H + "Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
    ("CL list 2, 2", H + "Content-Length: 2, 2\r\n\r\nhi"),
    ("CL +2", H + "Content-Length: +2\r\n\r\nhi"),
    ("Connection: Content-Length", H + "Connection: Content-Length\r\nContent-Length: 2\r\n\r\nhi"),
    ("Connection: Transfer-Encoding", H + "Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    ("Upgrade: h2c", "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"),
    ("two Host fields", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("NUL in a field value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n"),
]


class Backend:
    """Records every connection's bytes; answers each request head with a 200."""

    def __init__(self, port):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.seen = []
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            c, _ = self.sock.accept()
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        c.settimeout(0.3)
        got = b""
        answered = 0
        while True:
            try:
                b = c.recv(65536)
            except socket.timeout:
                b = None
            except OSError:
                break
            if b == b"":
                break
            if b:
                got += b
                with self.lock:
                    self.seen.append(b)
            heads = got.count(b"\r\n\r\n")
            while answered < heads:
                answered += 1
                try:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                except OSError:
                    return
        c.close()

    def take(self):
        time.sleep(0.5)
        with self.lock:
            s, self.seen = b"".join(self.seen), []
        return s


def wait_port(port, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def start_vigil(tmp, vigil):
    conf = os.path.join(tmp, "lb.toml")
    open(conf, "w").write(f"""listen = "127.0.0.1:{PORTS['vigil']}"
admin_listen = "127.0.0.1:{VIGIL_ADMIN}"
workers = 1
[pools.p]
targets = [{{ addr = "127.0.0.1:{BACKEND}" }}]
[pools.p.health_check]
enabled = false
""")
    p = subprocess.Popen([vigil, "lb", "-c", conf], stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(tmp, "vigil.log"), "w"))
    wait_port(PORTS["vigil"])
    return p


def start_haproxy(tmp):
    conf = os.path.join(tmp, "haproxy.cfg")
    open(conf, "w").write(f"""global
  maxconn 1000
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
frontend f
  bind 127.0.0.1:{PORTS['haproxy']}
  default_backend b
backend b
  http-reuse always
  server s1 127.0.0.1:{BACKEND}
""")
    p = subprocess.Popen(["haproxy", "-db", "-f", conf], stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(tmp, "haproxy.log"), "w"))
    wait_port(PORTS["haproxy"])
    return p


def start_nginx(tmp):
    d = os.path.join(tmp, "nginx")
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    open(conf, "w").write(f"""daemon off; worker_processes 1;
pid {d}/nginx.pid; error_log {d}/error.log info;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}; proxy_temp_path {d};
  upstream up {{ server 127.0.0.1:{BACKEND}; keepalive 8; }}
  server {{
    listen 127.0.0.1:{PORTS['nginx']};
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_set_header Host $host;
    }}
  }}
}}
""")
    p = subprocess.Popen(["nginx", "-p", d, "-c", conf, "-e", f"{d}/error.log"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(PORTS["nginx"])
    return p


def probe(port, raw):
    """Status lines the client got (within 2 s or until close)."""
    s = socket.create_connection(("127.0.0.1", port), 2)
    s.sendall(raw.encode("latin-1"))
    s.settimeout(2)
    got = b""
    end = time.time() + 2
    while time.time() < end:
        try:
            b = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not b:
            break
        got += b
    s.close()
    return [m.decode() for m in re.findall(rb"HTTP/1\.[01] (\d{3})", got)] or ["(none)"]


def summarize(seen):
    """The backend's view: request lines, and the fields that matter here."""
    if not seen:
        return "nothing"
    out = []
    for line in seen.split(b"\n"):
        l = line.rstrip(b"\r")
        low = l.lower()
        if re.match(rb"^[A-Z]+ \S+ HTTP/1\.[01]$", l):
            out.append(l.decode("latin-1"))
        elif low.startswith((b"host:", b"content-length:", b"transfer-encoding:",
                             b"content_length:", b"upgrade:", b"x-a:")):
            out.append(l.decode("latin-1"))
    return " | ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", help="the vigil binary (omit to probe the peers only)")
    ap.add_argument("--only", default="vigil,haproxy,nginx")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="smuggling-")
    backend = Backend(BACKEND)
    starters = {"vigil": lambda: start_vigil(tmp, a.vigil),
                "haproxy": lambda: start_haproxy(tmp), "nginx": lambda: start_nginx(tmp)}
    procs = {}
    try:
        for name in a.only.split(","):
            if name == "vigil" and not a.vigil:
                continue
            procs[name] = starters[name]()
        for title, raw in CASES:
            print(f"## {title}: {raw!r}")
            for name in procs:
                codes = probe(PORTS[name], raw)
                print(f"  {name:8} client got {'/'.join(codes):12} backend saw: {summarize(backend.take())}")
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
