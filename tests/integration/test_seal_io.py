"""The seal against real I/O: a real HTTP service process, real subprocesses, real files.

Each refused call is checked where it would have landed (the service's request
count, the file that is not there), not only by the exception.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from replayq.errors import UnrecordedIOError
from replayq.seal import Violation, seal, unsealed
from tests.conftest import missing
from tests.services import Service


def fetch(service: Service) -> bytes:
    """What a handler that bypasses ``ctx`` does: a plain urllib GET."""
    url = f"{service.base_url}/inventory/sku-1"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (127.0.0.1 only)
        body: bytes = response.read()
    return body


def address(service: Service) -> str:
    return service.base_url.removeprefix("http://")


def refusal(error: BaseException) -> UnrecordedIOError:
    """The seal's refusal inside what urllib raised (it wraps every ``OSError`` in ``URLError``)."""
    assert isinstance(error, urllib.error.URLError), error
    assert isinstance(error.reason, UnrecordedIOError), error.reason
    return error.reason


# -- network --------------------------------------------------------------------------------


def test_sealed_http_call_never_reaches_the_server(service: Service) -> None:
    before = service.total()
    with seal(step=lambda: "charge") as report, pytest.raises(urllib.error.URLError) as refused:
        fetch(service)
    assert service.total() == before
    assert (
        str(refusal(refused.value))
        == f"unrecorded I/O at step 'charge': socket.connect {address(service)}"
    )
    assert report.violations == [Violation("socket.connect", address(service), "charge")]


def test_allow_io_lets_the_call_through_and_reports_it_as_allowed(service: Service) -> None:
    before = service.total()
    with seal(step=lambda: "charge", allow_io=True) as report:
        fetch(service)
    assert service.total() == before + 1
    assert report.violations == [
        Violation("socket.connect", address(service), "charge", allowed=True)
    ]
    assert report.refused == []


def test_a_swallowed_refusal_is_still_reported(service: Service) -> None:
    def careless_handler() -> str:
        try:
            fetch(service)
        except Exception:
            return "fallback"
        return "fetched"

    before = service.total()
    with seal(step=lambda: "reserve") as report:
        assert careless_handler() == "fallback"
    assert service.total() == before
    assert [str(v) for v in report.refused] == [
        f"unrecorded I/O at step 'reserve': socket.connect {address(service)}"
    ]


def test_unsealed_lets_replayq_own_connection_through(service: Service) -> None:
    before = service.total()
    with seal() as report, unsealed():
        fetch(service)
    assert service.total() == before + 1
    assert report.violations == []


def test_live_mode_is_unaffected_once_the_hook_is_installed(
    service: Service, tmp_path: Path
) -> None:
    with seal():
        pass  # the hook is now in the interpreter for good
    before = service.total()
    fetch(service)
    subprocess.run(["true"], check=True)
    (tmp_path / "written.txt").write_text("live")
    with sqlite3.connect(tmp_path / "live.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    assert service.total() == before + 1
    assert (tmp_path / "written.txt").read_text() == "live"


def test_resolving_a_host_name_is_refused() -> None:
    with seal(step=lambda: "lookup") as report:
        with pytest.raises(UnrecordedIOError, match=r"socket\.getaddrinfo localhost:80$"):
            socket.getaddrinfo("localhost", 80)
        with pytest.raises(UnrecordedIOError, match=r"socket\.gethostbyname localhost$"):
            socket.gethostbyname("localhost")
        socket.getaddrinfo("127.0.0.1", 80)  # an IP literal needs no lookup
    assert [v.call for v in report.violations] == ["socket.getaddrinfo", "socket.gethostbyname"]


def test_binding_a_listening_socket_and_sending_a_datagram_are_refused() -> None:
    with seal() as report:
        with socket.socket() as server, pytest.raises(UnrecordedIOError):
            server.bind(("127.0.0.1", 0))
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
            pytest.raises(UnrecordedIOError),
        ):
            udp.sendto(b"x", ("127.0.0.1", 9))
    assert [(v.call, v.target) for v in report.violations] == [
        ("socket.bind", "127.0.0.1:0"),
        ("socket.sendto", "127.0.0.1:9"),
    ]


def test_the_redis_cache_backend_connects_only_when_unsealed() -> None:
    import redis

    url = os.environ.get("REPLAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        missing(
            f"Redis at {url} is not reachable: {exc}",
            install="start Redis (redis-server) at 127.0.0.1:6379",
        )
    client.close()  # no pooled connection: the next command has to connect
    try:
        with seal() as report:
            with pytest.raises(redis.ConnectionError, match="unrecorded I/O"):
                client.ping()
            with unsealed():
                assert client.ping()
        assert [v.call for v in report.violations] == ["socket.connect"]
    finally:
        client.close()


# -- processes ------------------------------------------------------------------------------


def test_subprocess_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with seal(step=lambda: "ship") as report:
        with pytest.raises(UnrecordedIOError, match=r"at step 'ship': subprocess\.Popen true$"):
            subprocess.run(["true"], check=True)
        with pytest.raises(UnrecordedIOError):
            subprocess.run(["touch", str(marker)], check=True)
        with pytest.raises(UnrecordedIOError, match=r"os\.system touch "):
            os.system(f"touch {marker}")  # noqa: S605 (a fixed command in a test)
    assert not marker.exists()
    assert [v.call for v in report.violations] == [
        "subprocess.Popen",
        "subprocess.Popen",
        "os.system",
    ]


def test_fork_is_refused() -> None:
    with seal() as report, pytest.raises(UnrecordedIOError, match=r"os\.fork"):
        os.fork()
    assert [v.call for v in report.violations] == ["os.fork"]


# -- files ----------------------------------------------------------------------------------


def test_writing_a_file_outside_the_temp_dir_is_refused_and_the_file_is_not_created(
    tmp_path: Path,
) -> None:
    target = tmp_path / "receipt.txt"
    with seal(step=lambda: "confirm") as report:
        with pytest.raises(UnrecordedIOError) as refused:
            target.write_text("paid")
        with pytest.raises(UnrecordedIOError):
            os.open(target, os.O_WRONLY | os.O_CREAT)
    assert not target.exists()
    assert str(refused.value) == f"unrecorded I/O at step 'confirm': open {target}"
    assert [v.call for v in report.violations] == ["open", "open"]


def test_removing_or_renaming_a_file_outside_is_refused_and_the_file_stays(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("precious")
    with seal() as report:
        with pytest.raises(UnrecordedIOError):
            kept.unlink()
        with pytest.raises(UnrecordedIOError):
            kept.rename(tmp_path / "moved.txt")
        with pytest.raises(UnrecordedIOError):
            kept.rename(report.temp_dir / "stolen.txt")  # out of the world into the run
        with pytest.raises(UnrecordedIOError):
            (tmp_path / "new-dir").mkdir()
    assert kept.read_text() == "precious"
    assert [v.call for v in report.violations] == [
        "os.remove",
        "os.rename",
        "os.rename",
        "os.mkdir",
    ]


def test_writing_inside_the_run_temp_dir_and_allowed_dirs_is_fine(tmp_path: Path) -> None:
    with seal(allow_dirs=[tmp_path]) as report:
        scratch = report.temp_dir / "scratch.txt"
        scratch.write_text("draft")
        scratch.rename(report.temp_dir / "final.txt")
        (report.temp_dir / "sub").mkdir()
        (tmp_path / "allowed.txt").write_text("ok")
        with sqlite3.connect(report.temp_dir / "own.db") as conn:
            conn.execute("CREATE TABLE t (x)")
        conn.close()
        assert (report.temp_dir / "final.txt").read_text() == "draft"
        temp_dir = report.temp_dir
    assert report.violations == []
    assert (tmp_path / "allowed.txt").read_text() == "ok"
    assert not temp_dir.exists()  # the run's own directory goes with the run


def test_a_symlink_in_the_temp_dir_does_not_let_writes_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    with seal() as report:
        link = report.temp_dir / "link.txt"
        link.symlink_to(outside)  # making the link is inside the run
        with pytest.raises(UnrecordedIOError, match=str(outside)):
            link.write_text("escaped")
    assert not outside.exists()


def test_reading_files_and_importing_a_new_module_work_under_the_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "freshly_written_module.py"
    module.write_text("ANSWER = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the import writes its .pyc
    with seal() as report:
        assert module.read_text() == "ANSWER = 42\n"
        assert importlib.import_module("freshly_written_module").ANSWER == 42
        print("stderr still works", file=sys.stderr)
    sys.modules.pop("freshly_written_module", None)
    assert report.violations == []
    assert list((tmp_path / "__pycache__").glob("freshly_written_module.*.pyc"))


def test_sqlite_connect_is_refused_under_the_seal_and_works_unsealed(tmp_path: Path) -> None:
    path = tmp_path / "replayq.db"
    with seal() as report:
        with pytest.raises(UnrecordedIOError, match=r"sqlite3\.connect"):
            sqlite3.connect(path)
        sqlite3.connect(":memory:").close()  # no file, no world
        with unsealed():
            conn = sqlite3.connect(path)
            conn.execute("CREATE TABLE rq_probe (x)")
            conn.commit()
            conn.close()
    assert path.exists()
    assert [v.call for v in report.violations] == ["sqlite3.connect"]


# -- contexts -------------------------------------------------------------------------------


def test_nested_seals_the_innermost_decides_and_records(service: Service) -> None:
    before = service.total()
    with seal(step=lambda: "outer") as outer:
        with seal(step=lambda: "inner", allow_io=True) as inner:
            fetch(service)
        with pytest.raises(urllib.error.URLError, match="at step 'outer'"):
            fetch(service)
    assert service.total() == before + 1
    assert [(v.step, v.allowed) for v in inner.violations] == [("inner", True)]
    assert [(v.step, v.allowed) for v in outer.violations] == [("outer", False)]


def test_threads_see_the_seal_only_with_a_copied_context(service: Service) -> None:
    """The documented gap: a plain thread's I/O is not sealed; a copied context is."""
    before = service.total()
    errors: dict[str, BaseException | None] = {}

    def call(name: str) -> None:
        try:
            fetch(service)
            errors[name] = None
        except BaseException as exc:
            errors[name] = exc

    with seal() as report:
        plain = threading.Thread(target=call, args=("plain",))
        copied = threading.Thread(target=contextvars.copy_context().run, args=(call, "copied"))
        for thread in (plain, copied):
            thread.start()
            thread.join()
    assert errors["plain"] is None
    assert errors["copied"] is not None
    assert refusal(errors["copied"]).call == "socket.connect"
    assert service.total() == before + 1
    assert len(report.violations) == 1
