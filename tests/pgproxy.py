"""A real TCP proxy in front of PostgreSQL that can lose one COMMIT's reply.

    proxy = PgProxy(upstream_port=5432).start()
    url = proxy.url(pg_url)              # the same URL, through the proxy's port
    proxy.arm_commit_cut(b"deliver:7:parcel.deliver")
    proxy.cut.wait(30)                   # set once a COMMIT was cut

Every byte goes through unchanged until the proxy is armed. The client→server stream
is read as PostgreSQL frontend messages (type byte + int32 length that counts itself;
the startup packet has no type byte). Armed with markers, the proxy watches each
transaction (from ``BEGIN`` to ``COMMIT``/``ROLLBACK``: simple-query ``Q`` messages
from psycopg, or ``Parse`` messages from replayq's pipelined group commit) for messages
containing every marker: the text of a ``Q`` or a ``Parse``, or the parameters of a
``Bind``. Once a transaction has shown them all, its ``COMMIT`` is forwarded (a
pipelined one with the messages after it, up to its ``Sync``), the server's reply to
it is read and dropped (its ``ReadyForQuery`` proves the server committed), and both
sides are closed: the server committed, the client never hears it. One cut per arming.

Why markers may be parameters: psycopg 3 prepares a statement after
``prepare_threshold`` (5) executions on a connection, and then sends only its name
and a ``Bind``; a parameter (a business key, a job's result) is sent every time.

The proxy refuses SSL and GSS encryption requests itself (``N``): it must read the
messages, and libpq falls back to a plain connection under ``sslmode=prefer``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from urllib.parse import urlsplit, urlunsplit

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104
_READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
# The longest wait for the server's reply to a cut COMMIT before closing anyway.
_REPLY_WAIT = 5.0


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _statement(message_type: bytes, body: bytes) -> bytes:
    """The SQL text of a ``Q`` or ``Parse`` message (b"" for other messages)."""
    if message_type == b"Q":
        return body.rstrip(b"\x00")
    if message_type == b"P":
        name_end = body.index(b"\x00")
        return body[name_end + 1 : body.index(b"\x00", name_end + 1)]
    return b""


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: PgProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = socket.create_connection((proxy.upstream_host, proxy.upstream_port))
        self.cutting = threading.Event()
        self.closed = threading.Event()
        self.seen: set[bytes] = set()

    def run(self) -> None:
        threading.Thread(target=self._server_to_client, daemon=True).start()
        try:
            self._client_to_server()
        except (EOFError, OSError):
            pass
        finally:
            if self.cutting.is_set():
                # The reply is being dropped; close once it is in, or after a bound.
                self.closed.wait(_REPLY_WAIT)
            self.close()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _client_to_server(self) -> None:
        while True:  # the startup packet, after any encryption requests we refuse
            length = struct.unpack("!i", _read_exactly(self.client, 4))[0]
            body = _read_exactly(self.client, length - 4)
            if struct.unpack("!i", body[:4])[0] in (_SSL_REQUEST, _GSS_REQUEST):
                self.client.sendall(b"N")
                continue
            self.server.sendall(struct.pack("!i", length) + body)
            break
        while not self.closed.is_set():
            head = _read_exactly(self.client, 5)
            message_type, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = _read_exactly(self.client, length - 4)
            if self._cuts_here(message_type, body):
                self.cutting.set()  # before forwarding: the reply must never pass
                self.server.sendall(head + body)
                if message_type == b"P":
                    self._forward_to_sync()  # a pipelined COMMIT runs at its Sync
                return
            self.server.sendall(head + body)

    def _forward_to_sync(self) -> None:
        """Forward the client's messages up to and including the next ``Sync``."""
        while True:
            head = _read_exactly(self.client, 5)
            body = _read_exactly(self.client, struct.unpack("!i", head[1:])[0] - 4)
            self.server.sendall(head + body)
            if head[:1] == b"S":
                return

    def _cuts_here(self, message_type: bytes, body: bytes) -> bool:
        statement = _statement(message_type, body).strip().upper()
        control = message_type in (b"Q", b"P")  # a Parse: a pipelined BEGIN or COMMIT
        if control and statement == b"COMMIT":
            cut = bool(self.seen) and self.proxy._take_cut(self.seen)
            self.seen = set()
            return cut
        if control and statement in (b"BEGIN", b"ROLLBACK"):
            self.seen = set()
        elif message_type in (b"Q", b"P", b"B"):
            self.seen |= {m for m in self.proxy._markers() if m in body}
        return False

    def _server_to_client(self) -> None:
        dropped = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                if self.cutting.is_set():
                    dropped += data
                    if _READY_FOR_QUERY in dropped:
                        break  # the server has committed; the client will never know
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            if self.cutting.is_set():
                self.proxy.cut_replies.append(dropped)
                self.proxy.cut.set()
            self.close()


class PgProxy:
    """A thread forwarding 127.0.0.1:<port> to the PostgreSQL server; see the module."""

    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.cut = threading.Event()
        self.cut_replies: list[bytes] = []  # the server replies the cuts dropped
        self.connections = 0
        self._lock = threading.Lock()
        self._armed: frozenset[bytes] = frozenset()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._links: list[_Link] = []
        self._stopped = threading.Event()

    def start(self) -> PgProxy:
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="pgproxy", daemon=True).start()
        return self

    def url(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(database_url)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def arm_commit_cut(self, *markers: bytes) -> None:
        """Cut the reply of the next COMMIT of a transaction that sent every marker."""
        with self._lock:
            self._armed = frozenset(markers)
            self.cut.clear()

    def _markers(self) -> frozenset[bytes]:
        return self._armed

    def _take_cut(self, seen: set[bytes]) -> bool:
        with self._lock:
            if not self._armed or not self._armed <= seen:
                return False
            self._armed = frozenset()  # one cut per arming
            return True

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                link = _Link(self, client)
            except OSError:
                client.close()  # the server is down: the client sees a closed connection
                continue
            self.connections += 1
            self._links.append(link)
            threading.Thread(target=link.run, daemon=True).start()

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        for link in self._links:
            link.close()
