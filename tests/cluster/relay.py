#!/usr/bin/python3
"""A delaying TCP relay: the "slow link" of the cluster tests.

The kernel here has no netem qdisc, so latency comes from this process.  The
harness runs it inside a store host's network namespace, listening on an
address of that host and forwarding every connection to the store's real data
endpoint; the store advertises the relay's address (moonlet-store
--advertise), so every transfer to that node crosses it.

Each direction of a connection is a queue of chunks stamped with the time
they arrived; a writer releases a chunk once `delay_ms` has passed since its
arrival, so the relay adds latency without limiting throughput (except for
the bounded buffering below).  The delay is read from a JSON control file
({"delay_ms": N}) whenever its modification time changes, so the harness
changes the link's speed without breaking connections.  A file with a
"seq" number is acknowledged on stdout once it applies ("applied seq N"),
so the harness waits for that instead of for the poll interval.  With
{"per_connection": true} in the file, a connection keeps the delay that held
when it was accepted: the stale-writer tests (tests/python/test_stale_writer.py)
hold one client's bytes back while another client's pass at once.  With
{"announce_accepts": true}, each accepted connection is announced on stdout
("accepted delay_ms=N", N its delay), so a test can wait for a client to
have connected.

Bounded: a direction buffers at most MAX_QUEUED bytes before it stops
reading (backpressure); a connection that fails on one side is closed on
both.  Prints "listening on HOST:PORT" once it serves; exits on SIGTERM.
"""
import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import time

MAX_QUEUED = 8 << 20
CHUNK = 256 << 10
CONTROL_POLL_S = 0.05


class Control:
    """The current delay, reloaded from the control file when it changes."""

    def __init__(self, path):
        self.path = path
        self.delay_s = 0.0
        self.per_connection = False
        self.announce_accepts = False
        self._mtime = None

    def reload(self):
        try:
            st = os.stat(self.path)
            # The inode too: a file replaced twice within one timestamp tick
            # keeps its mtime.
            mtime = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            with open(self.path) as f:
                conf = json.load(f)
        except (OSError, ValueError):
            return  # half-written: the next poll reads it whole
        self._mtime = mtime
        self.delay_s = max(0.0, float(conf.get("delay_ms", 0))) / 1000.0
        self.per_connection = bool(conf.get("per_connection", False))
        self.announce_accepts = bool(conf.get("announce_accepts", False))
        if "seq" in conf:
            print(f"applied seq {int(conf['seq'])}", flush=True)

    async def watch(self):
        while True:
            self.reload()
            await asyncio.sleep(CONTROL_POLL_S)


async def pump(reader, writer, control):
    """Copies reader to writer, each chunk held back until its delay passed."""
    queue = collections.deque()
    queued = 0
    more = asyncio.Event()
    room = asyncio.Event()
    room.set()
    done = False

    async def read_side():
        nonlocal queued, done
        try:
            while True:
                await room.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                queue.append((time.monotonic() + control.delay_s, data))
                queued += len(data)
                if queued >= MAX_QUEUED:
                    room.clear()
                more.set()
        finally:
            done = True
            more.set()

    async def write_side():
        nonlocal queued
        while True:
            while not queue:
                if done:
                    return
                more.clear()
                await more.wait()
            due, data = queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queue.popleft()
            queued -= len(data)
            if queued < MAX_QUEUED:
                room.set()
            writer.write(data)
            await writer.drain()

    rtask = asyncio.ensure_future(read_side())
    try:
        await write_side()
        if writer.can_write_eof():
            writer.write_eof()
    finally:
        rtask.cancel()


class Fixed:
    """The delay of one connection in per-connection mode."""

    def __init__(self, delay_s):
        self.delay_s = delay_s


async def handle(client_r, client_w, target, control):
    host, port = target
    control.reload()
    if control.announce_accepts:
        print(f"accepted delay_ms={round(control.delay_s * 1000)}", flush=True)
    if control.per_connection:
        control = Fixed(control.delay_s)
    try:
        server_r, server_w = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except (OSError, asyncio.TimeoutError):
        client_w.close()
        return
    up = asyncio.ensure_future(pump(client_r, server_w, control))
    down = asyncio.ensure_future(pump(server_r, client_w, control))
    try:
        # Either side failing ends the connection on both.
        pending = {up, down}
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() for t in finished if not t.cancelled()):
                break
    except Exception:  # noqa: BLE001 - a relay must never die of one connection
        pass
    finally:
        for t in (up, down):
            t.cancel()
        for w in (client_w, server_w):
            w.close()


def split(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    ap.add_argument("--target", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--control", required=True, help='JSON file {"delay_ms": N}')
    args = ap.parse_args()
    control = Control(args.control)
    control.reload()
    target = split(args.target)
    host, port = split(args.listen)
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, target, control), host, port, reuse_address=True)
    sock = server.sockets[0].getsockname()
    print(f"listening on {sock[0]}:{sock[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.ensure_future(control.watch())
    await stop.wait()
    watcher.cancel()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
