"""The overload benchmark's clients: a bounded, open-loop HTTP/1.1 load generator (asyncio).

No dependency beyond the standard library: a raw HTTP/1.1 client with keep-alive
connections (a connection whose attempt timed out or failed is closed, never reused, as
real clients do), and a generator of open-loop arrivals (fixed rate or Poisson) whose
every request has a per-attempt timeout and one retry after a jittered backoff.

What is counted, per second of arrival of the *request* (not of the attempt):
- offered: requests issued, by kind (`db`: `GET /items/{id}`, needs the database;
  `cpu`: `GET /work?ms=N`, does not);
- ok: requests that got a 2xx within the timeout of one of their attempts (goodput),
  by kind, and for `db` whether the answer came from the database or the cache
  (`x-served-from`);
- failures of attempts by cause (timeout, a status such as 503, a connection error),
  counted in the second the attempt was sent; and attempts sent per second (what the
  balancer receives from the clients).
Bounded: at most `max_in_flight` requests at once (more arrivals are counted as
`overflow` failures and not sent) and at most `max_conns` connections.
"""

import asyncio
import random
import time
from collections import defaultdict, deque

KINDS = ("db", "cpu")


class HttpError(Exception):
    """An attempt that got no HTTP answer (refused, reset, closed, garbage)."""


class Closed(Exception):
    """The connection closed before any byte of the answer."""


class Client:
    """Keep-alive HTTP/1.1 GETs to one host:port, at most `max_conns` connections.

    As common HTTP clients do (Go's net/http, urllib3): an idle connection is reused for
    at most IDLE_S after its last answer (a server closes idle keep-alive connections,
    vigil lb after `timeouts.client_header`, 10 s), and a request whose reused connection
    turns out closed before any answer byte is sent again once on a new connection (not
    counted as an attempt of its own: the server never saw it)."""

    IDLE_S = 4.0

    def __init__(self, host, port, max_conns=2048):
        self.host, self.port, self.max_conns = host, port, max_conns
        self.idle = deque()  # (connection, idle since), the most recent on the right
        self.open = 0
        self.stale_resends = 0

    async def _connect(self, fresh=False):
        now = time.monotonic()
        while self.idle and now - self.idle[0][1] > self.IDLE_S:
            self._discard(self.idle.popleft()[0])
        if self.idle and not fresh:
            return self.idle.pop()[0], True
        if self.open >= self.max_conns:
            raise HttpError("connection limit")
        self.open += 1
        try:
            return await asyncio.open_connection(self.host, self.port), False
        except OSError as e:
            self.open -= 1
            raise HttpError(f"connect: {e}") from e

    def _discard(self, conn):
        if conn is None:
            return
        self.open -= 1
        try:
            conn[1].close()
        except Exception:  # noqa: BLE001 (an already broken transport)
            pass

    async def _exchange(self, conn, path):
        reader, writer = conn
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: vigil-bench-overload\r\n\r\n".encode())
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise Closed() from e
            raise
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise HttpError(f"not HTTP: {lines[0][:40]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        keep = headers.get("connection", "").lower() != "close"
        if "content-length" in headers:
            await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await reader.readexactly(size + 2)
                if size == 0:
                    break
        elif status not in (204, 304):
            await reader.read()
            keep = False
        return status, headers, keep

    async def get(self, path, timeout):
        """(status, headers) of one attempt; asyncio.TimeoutError or HttpError otherwise."""
        deadline = time.monotonic() + timeout
        conn, reused = await self._connect()
        try:
            try:
                status, headers, keep = await asyncio.wait_for(self._exchange(conn, path), timeout)
            except (Closed, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                # The server had closed this idle connection: send it again on a new one.
                self._discard(conn)
                conn = None
                self.stale_resends += 1
                conn, _ = await self._connect(fresh=True)
                status, headers, keep = await asyncio.wait_for(self._exchange(conn, path),
                                                               max(0.001, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            self._discard(conn)
            raise
        except (OSError, Closed, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self._discard(conn)
            raise HttpError(str(e) or type(e).__name__) from e
        except BaseException:  # HttpError from a new connection, cancellation
            self._discard(conn)
            raise
        if keep:
            self.idle.append((conn, time.monotonic()))
        else:
            self._discard(conn)
        return status, headers

    def close(self):
        for conn, _ in self.idle:
            self._discard(conn)
        self.idle.clear()


class Counts:
    """Per-second counters, keyed by whole seconds since the run's start."""

    def __init__(self):
        self.offered = {k: defaultdict(int) for k in KINDS}
        self.ok = {k: defaultdict(int) for k in KINDS}
        self.ok_cache = defaultdict(int)
        self.attempts = defaultdict(int)
        self.retries = defaultdict(int)
        self.failures = defaultdict(lambda: defaultdict(int))  # second -> cause -> n
        self.latency = {k: defaultdict(list) for k in KINDS}  # ok requests' latencies (s)

    def seconds(self):
        keys = set(self.attempts)
        for k in KINDS:
            keys |= set(self.offered[k])
        return max(keys) + 1 if keys else 0


class Generator:
    """Open-loop arrivals at `rate` per second for `duration` seconds (see the module docs)."""

    def __init__(self, client, rate, db_share=0.4, cpu_ms=2, timeout=1.0, backoff=(0.05, 0.25),
                 arrivals="fixed", max_in_flight=4000, seed=1, items=100):
        self.client, self.rate, self.db_share, self.cpu_ms = client, rate, db_share, cpu_ms
        self.timeout, self.backoff, self.arrivals = timeout, backoff, arrivals
        self.max_in_flight, self.items = max_in_flight, items
        self.rng = random.Random(seed)
        self.counts = Counts()
        self.in_flight = 0
        self.tasks = set()
        self.t0 = None

    def now(self):
        return time.monotonic() - self.t0

    async def request(self, kind, sec):
        c = self.counts
        c.offered[kind][sec] += 1
        path = f"/items/{self.rng.randint(1, self.items)}" if kind == "db" else f"/work?ms={self.cpu_ms}"
        started = time.monotonic()
        try:
            for attempt in range(2):
                if attempt:
                    c.retries[int(self.now())] += 1
                c.attempts[int(self.now())] += 1
                at = int(self.now())
                try:
                    status, headers = await self.client.get(path, self.timeout)
                except asyncio.TimeoutError:
                    c.failures[at]["timeout"] += 1
                except HttpError as e:
                    c.failures[at]["connection limit" if "limit" in str(e) else "connection error"] += 1
                else:
                    if 200 <= status < 300:
                        c.ok[kind][sec] += 1
                        c.latency[kind][sec].append(time.monotonic() - started)
                        if headers.get("x-served-from") == "cache":
                            c.ok_cache[sec] += 1
                        return
                    c.failures[at][str(status)] += 1
                    if status < 500:
                        return  # a 4xx is not retried
                if attempt == 0:
                    await asyncio.sleep(self.rng.uniform(*self.backoff))
        finally:
            self.in_flight -= 1

    def _spawn(self):
        sec = int(self.now())
        if self.in_flight >= self.max_in_flight:
            kind = "db" if self.rng.random() < self.db_share else "cpu"
            self.counts.offered[kind][sec] += 1
            self.counts.failures[sec]["overflow"] += 1
            return
        self.in_flight += 1
        kind = "db" if self.rng.random() < self.db_share else "cpu"
        t = asyncio.create_task(self.request(kind, sec))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def run(self, duration, t0, drain=5.0):
        """Arrivals from t0 (monotonic) for `duration` s; then waits at most `drain` s for
        the requests in flight and cancels the rest."""
        self.t0 = t0
        next_at = 0.0
        while True:
            now = self.now()
            if now >= duration:
                break
            while next_at <= now and next_at < duration:
                self._spawn()
                gap = 1.0 / self.rate
                next_at += self.rng.expovariate(self.rate) if self.arrivals == "poisson" else gap
            await asyncio.sleep(min(0.005, max(0.0, next_at - self.now())))
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=drain)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


async def closed_loop(client, users, duration, db_share=0.4, cpu_ms=2, timeout=1.0, seed=2, items=100):
    """Capacity probe: `users` clients each sending its next request when the last one
    is answered, for `duration` s, no retries. Returns (ok answers per second, p50, p99 latency, errors)."""
    rng = random.Random(seed)
    done, errors, lat = 0, 0, []
    end = time.monotonic() + duration

    async def user():
        nonlocal done, errors
        while time.monotonic() < end:
            path = f"/items/{rng.randint(1, items)}" if rng.random() < db_share else f"/work?ms={cpu_ms}"
            t = time.monotonic()
            try:
                status, _ = await client.get(path, timeout)
                if 200 <= status < 300:
                    done += 1
                    lat.append(time.monotonic() - t)
                else:
                    errors += 1
            except (asyncio.TimeoutError, HttpError):
                errors += 1

    started = time.monotonic()
    await asyncio.gather(*(user() for _ in range(users)))
    took = time.monotonic() - started
    lat.sort()
    q = (lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan"))
    return done / took, q(0.5), q(0.99), errors
