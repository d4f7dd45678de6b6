"""The seal: while a replay runs a handler, code that bypasses ``ctx`` cannot reach the world.

A dry-run or a fork must not charge a card twice. Inside ``with seal(...)``,
handler code that reaches the outside world without going through ``ctx`` is
refused with ``UnrecordedIOError`` (a ``PermissionError`` raised from inside the
refused call, so libraries that wrap ``OSError`` carry it: ``urllib`` raises
``URLError`` with it as ``reason``) and listed in the seal's report::

    with seal(step=lambda: engine.step_name) as report:
        run_the_handler()            # urlopen(...) -> URLError(reason=UnrecordedIOError(...))
        with unsealed():
            storage.trace_append()   # replayq's own connections pass
    report.violations                # [Violation(call='socket.connect', target='127.0.0.1:8123',
                                     #             step='charge', allowed=False)]

What is refused (the interpreter's audit events, ``sys.addaudithook``):

=====================  ===============================================================
what                   audit events
=====================  ===============================================================
network                ``socket.connect`` (also ``connect_ex``), ``socket.bind``,
                       ``socket.sendto``, ``socket.sendmsg`` to an address
name resolution        ``socket.getaddrinfo`` and ``socket.gethostbyname`` of a host
                       name (an IP literal resolves without I/O and passes, so a
                       connection to one is reported as its ``socket.connect``),
                       ``socket.gethostbyaddr``, ``socket.getnameinfo``
processes              ``subprocess.Popen``, ``os.system``, ``os.exec``,
                       ``os.posix_spawn``, ``os.spawn``, ``os.fork``, ``os.forkpty``,
                       ``os.kill``, ``os.killpg``
file writes            ``open`` for writing (a mode with ``w a x +``, or ``os.open``
                       flags with ``O_WRONLY O_RDWR O_CREAT O_APPEND O_TRUNC``),
                       ``os.remove``, ``os.rmdir``, ``os.rename`` (also ``os.replace``),
                       ``os.mkdir``, ``os.link``, ``os.symlink``, ``os.truncate``,
                       ``os.chmod``, ``os.chown``, ``os.utime``, ``os.setxattr``,
                       ``os.removexattr``, ``shutil.rmtree``, ``sqlite3.connect``
                       (a database file, not ``:memory:``) — outside the allowed
                       directories
=====================  ===============================================================

Allowed directories: the run's own temporary directory (``report.temp_dir``,
created on entry and removed on exit) and any ``allow_dirs``; paths are
compared after resolving symbolic links. ``os.devnull`` and the interpreter's
bytecode cache (``__pycache__``, ``sys.pycache_prefix``) are writable too, so
imports keep working. Reading files is never refused. A refused call raises
*before* it happens: the socket is not connected, the file is not created.

Every refused call is also appended to ``report.violations`` at once, so a
handler that catches and swallows ``UnrecordedIOError`` is still reported. With
``allow_io=True`` nothing is refused; each such call is recorded with
``allowed=True`` and happens.

The hook is added to the interpreter on the first ``seal()`` and never
removed (the interpreter offers no way to). A process that never seals pays
nothing; after that every audit event of every thread pays one call and one
``ContextVar.get`` while no seal is active (``benchmarks/seal_overhead.py``).

Known gaps, each with the reason:

* **Threads started inside the seal are not sealed.** The seal is a
  ``ContextVar``; ``threading.Thread`` and ``concurrent.futures`` executors start
  with an empty context in Python 3.11, so their I/O is not seen. asyncio tasks
  and ``asyncio.to_thread`` copy the context and stay sealed; so does a thread
  started with ``contextvars.copy_context().run``. (A process-wide seal would
  also refuse the live worker threads of the same process.)
* **I/O without an audit event is invisible**: C extensions that open their
  own sockets or files (libpq under psycopg, grpc, pycurl, database drivers
  written in C), ``ctypes`` calls, and processes started by
  ``_posixsubprocess.fork_exec`` directly (multiprocessing's ``spawn`` and
  ``forkserver`` start methods; its ``fork`` method is caught by ``os.fork``).
  Pure-Python clients (urllib, http.client, requests/urllib3, httpx, redis-py)
  go through ``socket`` and are caught. Two standard calls have no event either:
  ``os.mkfifo`` and ``os.mknod`` create a file unseen.
* **Events seen but let pass**: ``syslog.syslog`` (the system log, through libc's
  own socket) and ``fcntl.flock``/``lockf`` (an advisory lock on a file opened for
  reading, which other processes then wait on) are not refused.
* **Channels opened before the seal are not watched**: ``socket.send``/``recv``
  and writes to an open file have no audit event, so a connection pool or a
  file handle opened outside the seal (a module-level session with a kept-alive
  connection, an open log file) is used unseen. The seal guards the opening of
  new channels, not traffic on old ones.
* **Relative paths with ``dir_fd`` on ``open``**: the ``open`` event does not
  carry ``dir_fd``, so ``os.open(name, flags, dir_fd=fd)`` is judged as if
  ``name`` were relative to the working directory. The other file events carry
  ``dir_fd`` and are resolved through ``/proc/self/fd`` (refused if it cannot
  be resolved).
* **Hard links are not resolved**: ``os.link`` is refused unless both ends are
  allowed, but a hard link made before the seal inside an allowed directory
  writes through to its other name.
* **Nested seals**: the innermost seal decides and records; the outer seal's
  report does not see calls made inside the inner one. ``unsealed()`` inside a
  seal lifts it until its block ends; ``seal()`` inside ``unsealed()`` seals again.
* **Writes replayq itself must make under a seal** (a log file rotated by
  ``RotatingFileHandler``, a ``tempfile`` in the system temporary directory,
  a delayed ``FileHandler``) are refused like any other unless they run inside
  ``unsealed()`` or write under ``report.temp_dir``.
* Another audit hook added earlier that raises on ``sys.addaudithook`` would
  stop this one from being added; ``seal()`` checks and raises ``RuntimeError``.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from replayq.errors import UnrecordedIOError

__all__ = ["SealReport", "Violation", "is_sealed", "seal", "unsealed"]


@dataclass(frozen=True)
class Violation:
    """One call that bypassed ``ctx`` under the seal: refused, or allowed by ``allow_io``."""

    call: str
    target: str
    step: str | None
    allowed: bool = False

    def error(self) -> UnrecordedIOError:
        """The exception that refuses this call (its message is ``str(self)``)."""
        return UnrecordedIOError(self.call, self.target, self.step)

    def __str__(self) -> str:
        return str(self.error())


@dataclass
class SealReport:
    """What a seal saw. ``violations`` fills in while the block runs, in order.

    ``temp_dir`` is the run's own directory, created on first use (most runs write
    no file: creating and removing a directory per dry-run was half its cost).
    """

    reserved_dir: Path
    allow_io: bool
    violations: list[Violation] = field(default_factory=list)
    created: bool = False

    @property
    def temp_dir(self) -> Path:
        if not self.created:
            with unsealed():
                self.reserved_dir.mkdir(mode=0o700)  # fails if it exists, as mkdtemp's does
            self.created = True
        return self.reserved_dir

    @property
    def refused(self) -> list[Violation]:
        """The calls the seal stopped (empty under ``allow_io``)."""
        return [v for v in self.violations if not v.allowed]


class _Seal:
    """One active seal: its report, the current step's name, the directories it may write.

    A plain class, not a dataclass: it is never compared, and a frozen dataclass
    compiles its methods when the module is imported, at every process's start.
    """

    __slots__ = ("allowed_dirs", "report", "step")

    def __init__(
        self, report: SealReport, step: Callable[[], str | None], allowed_dirs: tuple[str, ...]
    ) -> None:
        self.report = report
        self.step = step
        self.allowed_dirs = allowed_dirs

    def permits(self, path: str) -> bool:
        """Whether writing ``path`` (absolute, symbolic links resolved) stays inside the run."""
        if path == os.devnull or _is_bytecode_cache(path):
            return True
        return any(path == d or path.startswith(d + os.sep) for d in self.allowed_dirs)


_ACTIVE: ContextVar[_Seal | None] = ContextVar("replayq_seal", default=None)
_install_lock = threading.Lock()
_installed = False
_PROBE = "replayq.seal.probe"


def _no_step() -> str | None:
    return None


@contextmanager
def seal(
    step: Callable[[], str | None] = _no_step,
    *,
    allow_dirs: Sequence[str | os.PathLike[str]] = (),
    allow_io: bool = False,
) -> Iterator[SealReport]:
    """Seal the current context: unrecorded I/O raises ``UnrecordedIOError`` and is reported.

    ``step`` is called at each violation for the name of the handler's current
    step (``None``: outside any step). ``allow_dirs`` are directories the
    handler may write under, besides ``report.temp_dir``, which is created here
    and removed with its contents when the block ends. ``allow_io=True``
    refuses nothing and records each such call as allowed.
    """
    _install()
    # The run's own directory: a name no one else can guess, created on first use. The
    # root's ``Path`` is made once (``_temp_root_path``) and the name is ``uuid4().hex``'s
    # 16 random bytes with its version and variant bits, without the ``UUID`` object: a
    # ``Path`` parsed from the whole text and a UUID were ~half of a seal's cost.
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    temp_dir = _temp_root_path() / f"replayq-seal-{raw.hex()}"
    report = SealReport(reserved_dir=temp_dir, allow_io=allow_io)
    allowed = (str(temp_dir), *(os.path.realpath(d) for d in allow_dirs))
    active = _Seal(report, step, allowed)
    token = _ACTIVE.set(active)
    try:
        yield report
    finally:
        _ACTIVE.reset(token)
        if report.created:
            with unsealed():
                shutil.rmtree(temp_dir, ignore_errors=True)


_TEMP_ROOT: list[str] = []
_TEMP_ROOT_PATH: list[Path] = []


def _temp_root_path() -> Path:
    """``_temp_root()`` as a ``Path`` (made once)."""
    if not _TEMP_ROOT_PATH:
        _TEMP_ROOT_PATH.append(Path(_temp_root()))
    return _TEMP_ROOT_PATH[0]


def _temp_root() -> str:
    """The system's temporary directory with symbolic links resolved (looked up once)."""
    if not _TEMP_ROOT:
        with unsealed():
            # Imported here: a seal is a replay's, and importing tempfile cost every
            # process's start.
            import tempfile

            _TEMP_ROOT.append(os.path.realpath(tempfile.gettempdir()))
    return _TEMP_ROOT[0]


class _Unsealed:
    """``unsealed()``'s block: a class, not a ``@contextmanager`` generator, whose making,
    entering and leaving took four more calls (a traced job's every ``ctx.call`` and
    ``ctx.effect`` runs in one)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _ACTIVE.set(None)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _ACTIVE.reset(self._token)


def unsealed() -> AbstractContextManager[None]:
    """Lift the seal for this block: replayq's own storage, cache and log I/O runs here."""
    return _Unsealed()


def is_sealed() -> bool:
    """Whether a seal is active in the current context."""
    return _ACTIVE.get() is not None


# -- the hook -------------------------------------------------------------------------------


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        sys.addaudithook(_audit)
        _installed = True
    # An earlier hook can veto sys.addaudithook without an error: make sure ours runs.
    probe = SealReport(reserved_dir=Path(_temp_root()), allow_io=True, created=True)
    token = _ACTIVE.set(_Seal(probe, _no_step, ()))
    try:
        sys.audit(_PROBE)
    finally:
        _ACTIVE.reset(token)
    if not probe.violations:
        raise RuntimeError("the seal's audit hook could not be added (another hook refused it)")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    active = _ACTIVE.get()
    if active is None:  # live mode: the only line every audit event pays
        return
    check = _CHECKS.get(event)
    if check is None:
        return
    # The check and the step name run unsealed: their own calls must not re-enter the hook.
    token = _ACTIVE.set(None)
    try:
        target = check(active, args)
        if target is None:
            return
        violation = Violation(event, target, active.step(), allowed=active.report.allow_io)
    finally:
        _ACTIVE.reset(token)
    active.report.violations.append(violation)
    if not violation.allowed:
        raise violation.error()


# Each check returns the target it refuses (for the message), or None when the call is fine.
_Check = Callable[[_Seal, tuple[Any, ...]], "str | None"]


def _address(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    if isinstance(address, bytes):
        return os.fsdecode(address)
    return str(address)


def _network(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # socket.connect, .bind, .sendto, .sendmsg: (socket, address); sendmsg's may be None.
    address = args[1]
    return None if address is None else _address(address)


def _is_literal(host: Any) -> bool:
    if host is None or host in ("", b""):
        return True  # the wildcard or loopback address: no lookup
    try:
        text = host.decode() if isinstance(host, bytes) else str(host)
        ipaddress.ip_address(text.split("%", 1)[0])
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _lookup(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # socket.getaddrinfo: (host, port, family, type, proto); gethostbyname(_ex): (host,)
    if _is_literal(args[0]):
        return None
    host = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    return f"{host}:{args[1]}" if len(args) > 1 and args[1] is not None else host


def _reverse_lookup(active: _Seal, args: tuple[Any, ...]) -> str:
    # socket.gethostbyaddr: (ip,); socket.getnameinfo: (sockaddr,)
    return _address(args[0])


def _command(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args)
    import shlex  # here: only a sealed block's refused subprocess is named with it

    try:
        return shlex.join(os.fsdecode(a) for a in args)
    except TypeError:
        return repr(args)


def _process(position: int | None) -> _Check:
    """subprocess.Popen (executable, args, …): args at 1; os.exec (path, args, env): 1; …"""

    def check(active: _Seal, args: tuple[Any, ...]) -> str:
        if position is None:
            return "(a new process)"
        return _command(args[position])

    return check


def _signal(active: _Seal, args: tuple[Any, ...]) -> str:
    return f"pid {args[0]} signal {args[1]}"


def _resolve(path: Any, dir_fd: Any = None) -> str | None:
    """The absolute, link-resolved path; None for an already open file descriptor."""
    if isinstance(path, int):
        return None
    text = os.fsdecode(os.fspath(path))
    if dir_fd not in (None, -1) and not os.path.isabs(text):
        try:
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        except OSError:
            return f"<dir_fd {dir_fd}>/{text}"  # not absolute: no allowed directory matches
    return os.path.realpath(text)


def _is_bytecode_cache(path: str) -> bool:
    prefix = sys.pycache_prefix
    if prefix and path.startswith(os.path.realpath(prefix) + os.sep):
        return True
    parent, name = os.path.split(path)
    if name == "__pycache__":
        return True  # importlib creates the directory
    return os.path.basename(parent) == "__pycache__" and ".pyc" in name


def _outside(active: _Seal, path: Any, dir_fd: Any = None) -> str | None:
    resolved = _resolve(path, dir_fd)
    if resolved is None or active.permits(resolved):
        return None
    return resolved


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _open(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # open: (path, mode, flags); mode is None for os.open, flags are always given.
    path, mode, flags = args
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
        (flags or 0) & _WRITE_FLAGS
    )
    return _outside(active, path) if writes else None


def _one_path(dir_fd_at: int | None) -> _Check:
    """Events whose first argument is the path changed, with ``dir_fd`` at ``dir_fd_at``."""

    def check(active: _Seal, args: tuple[Any, ...]) -> str | None:
        dir_fd = args[dir_fd_at] if dir_fd_at is not None and len(args) > dir_fd_at else None
        return _outside(active, args[0], dir_fd)

    return check


def _two_paths(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # os.rename, os.link: (src, dst, src_dir_fd, dst_dir_fd); both ends must stay inside.
    src, dst = _outside(active, args[0], args[2]), _outside(active, args[1], args[3])
    if src is None and dst is None:
        return None
    return f"{_resolve(args[0], args[2])} -> {_resolve(args[1], args[3])}"


def _symlink(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # os.symlink: (src, dst, dir_fd); the link is made at dst. Writing through a link to
    # outside is caught later: paths are resolved.
    return _outside(active, args[1], args[2])


def _sqlite(active: _Seal, args: tuple[Any, ...]) -> str | None:
    # sqlite3.connect: (database,). SQLite opens its file in C, with no ``open`` event.
    database = args[0]
    if isinstance(database, bytes):
        database = os.fsdecode(database)
    text = str(os.fspath(database))
    if text in ("", ":memory:"):
        return None
    if text.startswith("file:"):  # a URI (uri=True): read-only and in-memory modes pass
        path, _, query = text[5:].partition("?")
        if "mode=ro" in query or "mode=memory" in query or path in ("", ":memory:"):
            return None
        text = path
    return _outside(active, text)


_CHECKS: dict[str, _Check] = {
    "socket.connect": _network,
    "socket.bind": _network,
    "socket.sendto": _network,
    "socket.sendmsg": _network,
    "socket.getaddrinfo": _lookup,
    "socket.gethostbyname": _lookup,
    "socket.gethostbyaddr": _reverse_lookup,
    "socket.getnameinfo": _reverse_lookup,
    "subprocess.Popen": _process(1),
    "os.system": _process(0),
    "os.exec": _process(1),
    "os.posix_spawn": _process(1),
    "os.spawn": _process(2),
    "os.fork": _process(None),
    "os.forkpty": _process(None),
    "os.kill": _signal,
    "os.killpg": _signal,
    "open": _open,
    "os.remove": _one_path(1),
    "os.rmdir": _one_path(1),
    "os.mkdir": _one_path(2),
    "os.truncate": _one_path(None),
    "os.chmod": _one_path(2),
    "os.chown": _one_path(3),
    "os.utime": _one_path(3),
    "os.setxattr": _one_path(None),
    "os.removexattr": _one_path(None),
    "shutil.rmtree": _one_path(1),
    "os.rename": _two_paths,
    "os.link": _two_paths,
    "os.symlink": _symlink,
    "sqlite3.connect": _sqlite,
    _PROBE: lambda active, args: "probe",
}
