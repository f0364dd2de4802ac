#!/usr/bin/env python3
"""A TCP proxy that can delay every server->client chunk: a slow database, for real.

    delay_proxy.py --listen 127.0.0.1:0 --upstream 127.0.0.1:5432

Prints `LISTENING <port>` once it accepts. Reads commands on stdin, one a line:

- `delay <ms>`: from now on, every chunk the upstream sends is held `<ms>` ms before it is
  forwarded (`delay 0`: forwarded at once). Order is kept: a chunk never overtakes one
  held before it, so switching the delay off lets the held chunks out first. What the
  client sees is a database whose every answer comes `<ms>` ms late (latency, not a
  throughput cap: pipelined queries on one connection are all late by the same time);
- `stats`: prints `STATS connections=<n> chunks=<n> delayed=<n> held=<n>` (held: chunks
  waiting now);
- end of input: exits (so the proxy dies with the script that started it).

Client->server bytes are forwarded at once. Each connection holds at most MAX_HELD chunks
(its reader waits when full): bounded memory whatever the delay.
"""

import argparse
import asyncio
import sys
import time

MAX_HELD = 10_000
CHUNK = 65536


class Proxy:
    def __init__(self, upstream):
        self.host, self.port = upstream.rsplit(":", 1)
        self.delay = 0.0
        self.connections = 0
        self.chunks = 0
        self.delayed = 0
        self.held = 0
        self.tasks = set()

    async def handle(self, creader, cwriter):
        self.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection(self.host, int(self.port))
        except OSError:
            cwriter.close()
            return
        held = asyncio.Queue(MAX_HELD)

        async def up():
            # client -> server, at once
            try:
                while data := await creader.read(CHUNK):
                    swriter.write(data)
                    await swriter.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                swriter.close()

        async def down_read():
            # server -> queue, each chunk stamped with when it may go out
            last = 0.0
            try:
                while data := await sreader.read(CHUNK):
                    now = time.monotonic()
                    due = max(now + self.delay, last)
                    last = due
                    self.chunks += 1
                    if self.delay > 0:
                        self.delayed += 1
                    self.held += 1
                    await held.put((due, data))
            except OSError:
                pass
            finally:
                await held.put((0.0, None))

        async def down_write():
            # queue -> client, each chunk at its time
            try:
                while True:
                    due, data = await held.get()
                    if data is None:
                        break
                    self.held -= 1
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    cwriter.write(data)
                    await cwriter.drain()
            except OSError:
                pass
            finally:
                cwriter.close()

        tasks = [asyncio.create_task(c()) for c in (up, down_read, down_write)]
        self.tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self.tasks.difference_update(tasks)
            swriter.close()
            cwriter.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--upstream", default="127.0.0.1:5432")
    args = ap.parse_args()
    proxy = Proxy(args.upstream)
    host, port = args.listen.rsplit(":", 1)
    server = await asyncio.start_server(proxy.handle, host, int(port))
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        words = line.decode().split()
        if not words:
            continue
        if words[0] == "delay" and len(words) == 2:
            proxy.delay = max(0.0, float(words[1]) / 1000.0)
            print(f"DELAY {words[1]}", flush=True)
        elif words[0] == "stats":
            print(f"STATS connections={proxy.connections} chunks={proxy.chunks} delayed={proxy.delayed} "
                  f"held={proxy.held}", flush=True)
        else:
            print(f"ERROR unknown command {line.decode().strip()!r}", flush=True)
    server.close()
    for t in list(proxy.tasks):
        t.cancel()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
