#!/usr/bin/env python3
"""Memory of vigil lb under slow HTTP/2 clients that send half a header block (issue 38).

    python3 bench/lb/slow_h2.py --vigil target/release/vigil
    python3 bench/lb/slow_h2.py --vigil target/release/vigil --clients 3000 --client-header 10s

Starts `vigil lb` (1 worker, one target that is never reached, health checks off, the
default `timeouts.client_header` of 10 s unless told otherwise), then opens `--clients`
cleartext HTTP/2 connections (prior knowledge) that each send the preface, an empty
SETTINGS and a HEADERS frame without END_HEADERS (the request's first two fields, no
CONTINUATION ever), and nothing more. Samples the balancer's RSS (VmRSS) and counts
the connections it has closed, every 0.5 s, until all are closed and `--after` more
seconds have passed. Prints the samples, then the figures: RSS before, with every
client open, per open client, and after they were closed; when the connections were
closed (from each one's HEADERS frame) and how many got a GOAWAY first.

Before issue 38 every such connection stayed open (3,000 after 23 s, RSS 14 -> 64 MiB);
now each is told GOAWAY and closed `client_header` after its header block began.
Raises its own open-file limit to fit the clients. Loopback only; no peers needed.
"""
import argparse
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def half_headers():
    """A HEADERS frame on stream 1 with END_STREAM and without END_HEADERS: `:method GET`
    and `:scheme http` (HPACK static table entries 2 and 6), the block never finished."""
    block = bytes([0x82, 0x86])
    return len(block).to_bytes(3, "big") + bytes([0x1, 0x1]) + (1).to_bytes(4, "big") + block


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_port(port, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", required=True, help="the vigil binary")
    ap.add_argument("--clients", type=int, default=3000)
    ap.add_argument("--client-header", default="10s", help="timeouts.client_header")
    ap.add_argument("--after", type=float, default=15.0,
                    help="seconds to keep sampling once every client is closed")
    ap.add_argument("--port", type=int, default=18380)
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.clients + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    tmp = tempfile.mkdtemp(prefix="slow-h2-")
    conf = os.path.join(tmp, "lb.toml")
    open(conf, "w").write(f"""listen = "127.0.0.1:{a.port}"
admin_listen = "127.0.0.1:{a.port + 1}"
workers = 1
[timeouts]
client_header = "{a.client_header}"
[limits]
max_client_connections = {max(a.clients + 100, 10000)}
[pools.p]
targets = [{{ addr = "127.0.0.1:9" }}]
[pools.p.health_check]
enabled = false
""")
    lb = subprocess.Popen([a.vigil, "lb", "-c", conf], stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(tmp, "lb.log"), "w"))
    try:
        wait_port(a.port)
        time.sleep(0.5)
        base = rss_kib(lb.pid)
        sel = selectors.DefaultSelector()
        sent_at, closed_at, goaway = {}, {}, set()
        frame = PREFACE + SETTINGS + half_headers()
        t0 = time.monotonic()
        for i in range(a.clients):
            s = socket.create_connection(("127.0.0.1", a.port))
            s.sendall(frame)
            s.setblocking(False)
            sent_at[s] = time.monotonic()
            sel.register(s, selectors.EVENT_READ, b"")
        opened = time.monotonic() - t0
        samples = []
        peak = 0
        all_closed = None
        next_sample = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_sample:
                r = rss_kib(lb.pid)
                peak = max(peak, r)
                samples.append((now - t0, len(closed_at), r))
                next_sample += 0.5
                if all_closed is not None and now - all_closed >= a.after:
                    break
                if all_closed is None and now - t0 > 120:
                    break
            for key, _ in sel.select(timeout=0.1):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    buf = key.data + data
                    # Frames from the balancer: SETTINGS, SETTINGS ACK, GOAWAY (type 7).
                    while len(buf) >= 9:
                        n = int.from_bytes(buf[:3], "big")
                        if len(buf) < 9 + n:
                            break
                        if buf[3] == 0x7:
                            goaway.add(s)
                        buf = buf[9 + n:]
                    sel.modify(s, selectors.EVENT_READ, buf)
                    continue
                closed_at[s] = time.monotonic()
                sel.unregister(s)
                s.close()
            if all_closed is None and len(closed_at) == a.clients:
                all_closed = time.monotonic()
        lived = sorted(closed_at[s] - sent_at[s] for s in closed_at)
        print("t (s)  closed  RSS (KiB)")
        for t, c, r in samples:
            print(f"{t:5.1f}  {c:6}  {r:9}")
        with_all = max(r for t, c, r in samples if c == 0) if any(c == 0 for _, c, _ in samples) else peak
        print()
        print(f"clients                       {a.clients} (opened in {opened:.1f} s), "
              f"timeouts.client_header = {a.client_header}")
        print(f"RSS before                    {base} KiB")
        print(f"RSS with every client open    {with_all} KiB (peak {peak} KiB)")
        print(f"per open client               {(with_all - base) / a.clients:.1f} KiB")
        if lived:
            print(f"closed by the balancer        {len(lived)} of {a.clients}, "
                  f"{lived[0]:.2f} to {lived[-1]:.2f} s after their HEADERS "
                  f"(median {lived[len(lived) // 2]:.2f} s); GOAWAY first: {len(goaway)}")
        else:
            print(f"closed by the balancer        none of {a.clients}")
        if all_closed is not None:
            print(f"all closed after              {all_closed - t0:.1f} s")
            print(f"RSS {a.after:.0f} s after the last close   {samples[-1][2]} KiB")
        for s in list(sent_at):
            if s not in closed_at:
                s.close()
    finally:
        lb.send_signal(signal.SIGTERM)
        try:
            lb.wait(15)
        except subprocess.TimeoutExpired:
            lb.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
