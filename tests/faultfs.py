"""A FUSE passthrough file system whose storage can be made to fail, for fault tests.

``python -m tests.faultfs BACKING MOUNTPOINT`` mounts ``BACKING`` (a plain directory) at
``MOUNTPOINT`` with libfuse 3 (``mfusepy``, with ``FUSE_LIBRARY_NAME=fuse3``; Debian's
``fuse3``) and serves it until its standard input closes or it is unmounted. It reads
one command a line on stdin and answers each on stdout, once the new mode is in force:

* ``ok`` — a plain passthrough;
* ``readonly`` — what a file system remounted read-only after errors answers: every
  write, ``fsync``, truncate and ``fallocate``, an open for writing, a create, a rename
  or an unlink fails ``EROFS``; reads still work;
* ``eio`` — a failing disk: every read, write and ``fsync`` fails ``EIO`` (opens,
  metadata and the rest still work).

Whose reads, writes and ``fsync`` fail: every file's but ``-shm``'s. SQLite maps its WAL
index (``-shm``) into memory and keeps it in shared memory, not on the disk: a fault
there would only show when the kernel writes the mapping back, out of SQLite's sight.
The database file and its WAL are where every read and write of a transaction goes.
Opens for writing, creates, renames and unlinks are refused on every file in
``readonly`` mode, ``-shm`` included, as on a real read-only file system (so a
connection opened during the fault gets a read-only one, as SQLite does there).

Files other than ``-shm`` are opened ``direct_io``: every ``read`` and ``write`` system
call reaches this process (no page cache answers a read in the kernel), so a fault in
force is met by the very next call. ``-shm`` keeps the page cache (shared ``mmap``
needs it). Locks are the kernel's own (no ``lock`` operation is served), as on a local
disk: every process on the mount sees the same ``fcntl`` locks.

A real mount in a real process: the workers' system calls get the real ``errno`` from
the kernel, and SQLite turns it into its own result code as on a failing disk.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from typing import Any

import mfusepy

MODES = ("ok", "readonly", "eio")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class FaultFS(mfusepy.Operations):  # type: ignore[misc]
    """Passthrough of ``root`` whose reads and writes fail while ``mode`` says so."""

    use_ns = True

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.mode = "ok"

    # -- the faults --------------------------------------------------------------------

    def _faulty(self, path: str) -> bool:
        return not path.endswith("-shm")

    def _refuse_write(self, path: str) -> None:
        if self.mode == "readonly" and self._faulty(path):
            raise mfusepy.FuseOSError(errno.EROFS)
        if self.mode == "eio" and self._faulty(path):
            raise mfusepy.FuseOSError(errno.EIO)

    def _refuse_read(self, path: str) -> None:
        if self.mode == "eio" and self._faulty(path):
            raise mfusepy.FuseOSError(errno.EIO)

    def _refuse_change(self, path: str) -> None:
        """Metadata changes (create, unlink, rename): refused on a read-only file system."""
        if self.mode == "readonly":
            raise mfusepy.FuseOSError(errno.EROFS)

    # -- passthrough -------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = os.lstat(self._full(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_dev")
        attrs = {key: getattr(st, key) for key in keys}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path: str, amode: int) -> int:
        if amode & os.W_OK and self.mode == "readonly":
            raise mfusepy.FuseOSError(errno.EROFS)
        if not os.access(self._full(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {key: getattr(st, key) for key in (*keys, "f_flag", "f_frsize", "f_namemax")}

    def _set_cache(self, path: str, fi: Any) -> None:
        fi.direct_io = 1 if self._faulty(path) else 0

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & _WRITE_FLAGS:
            self._refuse_change(path)
        fi.fh = os.open(self._full(path), fi.flags)
        self._set_cache(path, fi)
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        self._refuse_change(path)
        fi.fh = os.open(self._full(path), fi.flags | os.O_CREAT, mode)
        self._set_cache(path, fi)
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        self._refuse_read(path)
        return os.pread(fh.fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        self._refuse_write(path)
        return os.pwrite(fh.fh, data, offset)

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        self._refuse_write(path)
        if fh is not None:
            os.ftruncate(fh.fh, length)
        else:
            os.truncate(self._full(path), length)
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: Any) -> int:
        self._refuse_write(path)
        os.posix_fallocate(fh.fh, offset, size)
        return 0

    def fsync(self, path: str, datasync: int, fh: Any) -> int:
        self._refuse_write(path)
        if datasync:
            os.fdatasync(fh.fh)
        else:
            os.fsync(fh.fh)
        return 0

    def flush(self, path: str, fh: Any) -> int:
        return 0

    def release(self, path: str, fh: Any) -> int:
        os.close(fh.fh)
        return 0

    def unlink(self, path: str) -> int:
        self._refuse_change(path)
        os.unlink(self._full(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._refuse_change(new)
        os.rename(self._full(old), self._full(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._refuse_change(path)
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._refuse_change(path)
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._refuse_change(path)
        os.utime(self._full(path), ns=times)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._refuse_change(path)
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._refuse_change(path)
        os.rmdir(self._full(path))
        return 0


def _commands(fs: FaultFS, mountpoint: str) -> None:
    """Apply each mode read on stdin, answer it; at EOF unmount (``fuse_main`` returns)."""
    for line in sys.stdin:
        mode = line.strip()
        if mode not in MODES:
            print(f"error: unknown mode {mode!r}; one of {', '.join(MODES)}", flush=True)
            continue
        fs.mode = mode
        print(mode, flush=True)
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)


def main() -> None:
    backing, mountpoint = sys.argv[1:3]
    fs = FaultFS(backing)
    threading.Thread(target=_commands, args=(fs, mountpoint), daemon=True).start()
    # Multi-threaded: a worker blocked in one call never stalls another's.
    mfusepy.FUSE(fs, mountpoint, raw_fi=True, foreground=True, allow_other=True)


if __name__ == "__main__":
    main()
