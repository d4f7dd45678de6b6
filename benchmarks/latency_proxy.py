"""A TCP proxy that delays what a server sends by a fixed time: a database across a network.

    python benchmarks/latency_proxy.py --upstream 127.0.0.1:5432 --rtt-ms 0.5
    # prints the port it listens on, then forwards until killed

Every byte the server sends reaches the client ``--rtt-ms`` later than it arrived (the
client's bytes go through at once), so each round trip a client waits for costs that much
more, as it would to a server on another host; bytes that arrive together leave together,
and a long reply is not delayed more than a short one. It also counts the server's replies
(bursts of bytes, about one a round trip) and writes the count to ``--count-file`` when
asked by ``SIGUSR1``, so a benchmark can say how many round trips its work waited for.

A separate process: in the measured process its threads would take the interpreter's lock
from the work being timed.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path

_CHUNK = 65536


class Counter:
    def __init__(self) -> None:
        self.replies = 0
        self.lock = threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.replies += 1


def _forward(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _delayed(source: socket.socket, target: socket.socket, delay: float, count: Counter) -> None:
    """``source``'s bytes to ``target``, each burst ``delay`` seconds after it arrived."""
    pending: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def write() -> None:
        try:
            while True:
                due, data = pending.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                target.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_RDWR)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while data := source.recv(_CHUNK):
            count.add()
            pending.put((time.monotonic() + delay, data))
    except OSError:
        pass
    pending.put((0.0, b""))


def serve(upstream: tuple[str, int], delay: float, count: Counter) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            try:
                server = socket.create_connection(upstream)
            except OSError as exc:
                # The server is down or refusing: this client is refused, as it would be
                # without the proxy, and the proxy keeps accepting the next ones.
                print(f"latency_proxy: {upstream[0]}:{upstream[1]}: {exc}", file=sys.stderr)
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_forward, args=(client, server), daemon=True).start()
            threading.Thread(
                target=_delayed, args=(server, client, delay, count), daemon=True
            ).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", default="127.0.0.1:5432", help="host:port of the server")
    parser.add_argument("--rtt-ms", type=float, required=True, help="added round-trip time")
    parser.add_argument("--count-file", type=Path, default=None, help="written on SIGUSR1")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    count = Counter()
    listener = serve((host, int(port)), args.rtt_ms / 1000, count)

    def report(*_: object) -> None:
        if args.count_file is not None:
            args.count_file.write_text(str(count.replies))

    signal.signal(signal.SIGUSR1, report)
    print(listener.getsockname()[1], flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
