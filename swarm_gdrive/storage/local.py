"""Local-folder backend: Colab's mounted Drive, Drive for desktop, or any POSIX path.

Atomic writes go to a hidden temporary name in the same folder, are fsynced, then
renamed over the target. Transient errors of a FUSE mount (EIO, ENOTCONN, ESTALE, ...)
are retried with exponential backoff; one that outlasts the retries is raised as a
StorageUnavailableError (with the same errno and message), which bounded waits ride out.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    NotRegularFileError,
    StorageError,
    StorageUnavailableError,
    is_temporary,
    retrying,
    temp_name_for,
)

logger = logging.getLogger(__name__)

#: errno values a FUSE mount (Colab's Drive, Drive for desktop) returns while it reconnects.
TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNABORTED, errno.EBUSY}
)


def is_transient_os_error(exc: BaseException) -> bool:
    """True for the errors a network mount gives while it recovers."""
    if isinstance(exc, (FileNotFoundError, FileTooLargeError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS or "Transport endpoint is not connected" in str(exc)
    return False


class LocalStorage:
    """A :class:`~swarm_gdrive.storage.base.Storage` over a local or mounted folder."""

    def __init__(self, root: str | os.PathLike[str], retry_attempts: int = 8, retry_max_wait: float = 10.0) -> None:
        self.root = Path(root)
        self._attempts = retry_attempts
        self._max_wait = retry_max_wait

    def describe(self) -> str:
        return f"local folder {self.root}"

    def _path(self, rel: str) -> Path:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise ValueError(f"storage path must be relative and stay inside the root: {rel!r}")
        return self.root.joinpath(*parts)

    def _retry(self, fn, *args):
        try:
            for attempt in retrying(is_transient_os_error, self._attempts, self._max_wait):
                with attempt:
                    return fn(*args)
        except OSError as exc:
            if is_transient_os_error(exc):  # still failing after every attempt: a bounded wait rides it out
                raise _unavailable(exc) from exc
            raise
        raise StorageError(f"unreachable retry exit in {fn.__name__}")  # pragma: no cover

    # -- reads -----------------------------------------------------------------------------

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        return self._retry(self._read, self._path(path), max_bytes, path)

    @staticmethod
    def _read(target: Path, max_bytes: int, rel: str) -> bytes:
        # Opened non-blocking, so that a FIFO planted under a protocol name cannot hang the reader, and
        # read only if it is a regular file (a link to a folder, a FIFO or a device is refused, not retried).
        try:
            fh = open(target, "rb", opener=_open_nonblocking)  # noqa: SIM115 - closed below
        except IsADirectoryError:
            raise NotRegularFileError(rel, "a folder") from None
        with fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFileError(rel, "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device")
            if st.st_size > max_bytes:
                raise FileTooLargeError(rel, st.st_size, max_bytes)
            os.set_blocking(fh.fileno(), True)
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew while we read
            raise FileTooLargeError(rel, len(data), max_bytes)
        return data

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return self._retry(self._list, self._path(folder), include_hidden)

    @staticmethod
    def _list(target: Path, include_hidden: bool) -> list[FileInfo]:
        out: list[FileInfo] = []
        try:
            entries = list(os.scandir(target))
        except (FileNotFoundError, NotADirectoryError):
            return out
        for entry in entries:
            if not include_hidden and is_temporary(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed between scandir and stat
                continue
            out.append(FileInfo(entry.name, st.st_size, st.st_mtime, entry.is_dir(follow_symlinks=False)))
        out.sort(key=lambda info: info.name)
        return out

    # -- writes ----------------------------------------------------------------------------

    def write_bytes(self, path: str, data: bytes) -> None:
        self._retry(self._write, self._path(path), bytes(data))

    @staticmethod
    def _write(target: Path, data: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(temp_name_for(target.name))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)

    def append_bytes(self, path: str, data: bytes) -> None:
        self._retry(self._append, self._path(path), bytes(data))

    @staticmethod
    def _append(target: Path, data: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            view = memoryview(data)
            while view:  # a FUSE mount may write less than asked
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, path: str) -> None:
        self._retry(self._delete, self._path(path))

    @staticmethod
    def _delete(target: Path) -> None:
        target.unlink(missing_ok=True)

    def remove_empty_dir(self, folder: str) -> bool:
        return self._retry(self._rmdir, self._path(folder))

    @staticmethod
    def _rmdir(target: Path) -> bool:
        try:
            target.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True

    def move(self, src: str, dst: str) -> None:
        self._retry(self._move, self._path(src), self._path(dst))

    @staticmethod
    def _move(src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(os.fspath(src), os.fspath(dst))


def _unavailable(exc: OSError) -> StorageUnavailableError:
    """The same error (errno, message, file name) as a StorageUnavailableError."""
    if exc.errno is None:
        return StorageUnavailableError(*exc.args)
    extra = () if exc.filename is None else (exc.filename,)
    return StorageUnavailableError(exc.errno, exc.strerror, *extra)


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable; some FUSE mounts refuse to open a folder, which is harmless."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
