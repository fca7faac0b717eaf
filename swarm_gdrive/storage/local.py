"""Local-folder backend: Colab's mounted Drive, Drive for desktop, or any POSIX path.

Atomic writes go to a hidden temporary name in the same folder, are fsynced, then
renamed over the target. Transient errors of a FUSE mount (EIO, ENOTCONN, ESTALE, ...)
are retried with exponential backoff; one that outlasts the retries is raised as a
StorageUnavailableError (with the same errno and message), which bounded waits ride out.

Symbolic links under the root are never followed. The root (GDRIVE_PATH, which may itself be
a link: Colab's ``/content/drive``, a Drive for desktop folder) is resolved once; every path
under it is then walked one component at a time from an open folder descriptor with
``O_NOFOLLOW`` (``openat``/``mkdirat``/``unlinkat``/``renameat`` with ``dir_fd``), so a link
planted between a check and a use is refused too, and nothing is read or written outside the
root. A reader meeting a link gets :class:`LinkRefusedError`; a listing or deletion under one
finds nothing (and logs it once). A writer's own path is the writer's alone: a link, a file
where a folder belongs or a folder where its file belongs is removed (never followed, a
WARNING names it) and the write goes on; :class:`PathBlockedError` if it cannot be. Hard links too: a
write replaces its file by a rename, and an append writes only into a file with one name
(:func:`_open_for_append`), so no write lands in a file that another name (outside the root) reaches.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    LinkRefusedError,
    NotRegularFileError,
    PathBlockedError,
    Space,
    StorageError,
    StorageUnavailableError,
    capped_chunks,
    hard_link_kind,
    is_temporary,
    listable_name,
    retrying,
    still_named,
    temp_name_for,
)

logger = logging.getLogger(__name__)

#: errno values a FUSE mount (Colab's Drive, Drive for desktop) returns while it reconnects.
TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNABORTED, errno.EBUSY}
)

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
#: What open(O_NOFOLLOW) answers for a link (EMLINK on FreeBSD), or open(O_DIRECTORY) for a non-folder.
_NOT_FOLLOWED = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})
#: Times one component may be cleared of a blocker before a write gives up (someone keeps planting it back).
_MAX_CLEARS = 4
#: A planted tree blocking a writer's own file is removed only up to this depth and this many entries.
_MAX_TREE_DEPTH, _MAX_TREE_ENTRIES = 32, 10_000
#: The calls that take dir_fd here: all of them on Linux and macOS (WSL 2 included), none on native Windows.
_MISSING_DIR_FD = [
    f.__name__
    for f in (os.open, os.mkdir, os.unlink, os.rmdir, os.rename, os.stat, os.readlink)
    if f not in os.supports_dir_fd
]

_warned: set[str] = set()

#: One read of a file: reads of a file larger than this are made of several.
_READ_CHUNK = 4 << 20

#: Google Drive's top folders as Colab's mount (``/content/drive/MyDrive``) and Drive for desktop (``My Drive``)
#: show them: a folder under one of them is on Drive, where a deleted file goes to Drive's trash.
DRIVE_TOP_FOLDERS = frozenset({"MyDrive", "My Drive", "Shareddrives", "Shared drives"})
SHARED_DRIVE_TOP_FOLDERS = frozenset({"Shareddrives", "Shared drives"})


def on_google_drive(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` lies under a top folder of a mounted or synced Google Drive (:data:`DRIVE_TOP_FOLDERS`).
    Used for messages (deletes there fill Drive's trash) and to report the room left (:meth:`LocalStorage.free_space`:
    a shared drive's folder has no figure of its own); never to change what a node writes or reads."""
    return bool(DRIVE_TOP_FOLDERS & set(Path(path).parts))


def is_transient_os_error(exc: BaseException) -> bool:
    """True for the errors a network mount gives while it recovers."""
    if isinstance(exc, (FileNotFoundError, FileTooLargeError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, OSError):
        return exc.errno in TRANSIENT_ERRNOS or "Transport endpoint is not connected" in str(exc)
    return False


class RootedPath(type(Path())):  # type: ignore[misc]
    """An absolute path under a storage root that knows which of its components lie under the root.

    The backend's operations take one (``LocalStorage._read(target, ...)`` and so on) so that they can walk
    ``inner`` from ``storage_root`` without following a link; as a ``Path`` it also serves code that wraps them.
    """

    storage_root: str
    inner: tuple[str, ...]

    @property
    def rel(self) -> str:
        return "/".join(self.inner)


class LocalStorage:
    """A :class:`~swarm_gdrive.storage.base.Storage` over a local or mounted folder."""

    def __init__(self, root: str | os.PathLike[str], retry_attempts: int = 8, retry_max_wait: float = 10.0) -> None:
        if _MISSING_DIR_FD or not _NOFOLLOW:
            raise StorageError(
                f"GDRIVE_PATH={os.fspath(root)!r}: a local folder needs Linux, macOS or WSL 2 (this system lacks "
                f"dir_fd for {_MISSING_DIR_FD or ['open']}, with which links are never followed); use WSL 2"
            )
        self.root = Path(root).resolve()  # once: GDRIVE_PATH may itself be a link, nothing under it may
        self._attempts = retry_attempts
        self._max_wait = retry_max_wait
        self.on_google_drive = on_google_drive(root) or on_google_drive(self.root)

    def describe(self) -> str:
        return f"local folder {self.root}"

    def free_space(self) -> Space:
        """The file system's free bytes as it reports them; OSError if unknown. Colab's Drive mount reports the
        account's Drive quota (``df -h /content/drive/MyDrive`` matches Drive's storage page: colabtools issue
        6051); under a shared drive's folder that figure is the account's, not the shared drive's, so free is None
        (unknown) there, as for a shared drive through the API."""
        where = ("the Google Drive mounted at " if self.on_google_drive else "the file system of ") + str(self.root)
        if SHARED_DRIVE_TOP_FOLDERS & set(self.root.parts):
            return Space(None, None, where, deletes_to_trash=True)
        usage = shutil.disk_usage(self.root)
        return Space(usage.free, usage.total, where, deletes_to_trash=self.on_google_drive)

    def _path(self, rel: str) -> RootedPath:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise ValueError(f"storage path must be relative and stay inside the root: {rel!r}")
        target = RootedPath(self.root, *parts)
        target.storage_root, target.inner = str(self.root), tuple(parts)
        return target

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

    @classmethod
    def _read(cls, target: RootedPath, max_bytes: int, rel: str) -> bytes:
        fd = cls._open_regular(target, max_bytes, rel)
        try:
            return _read_capped(fd, max_bytes, rel)
        finally:
            os.close(fd)

    def read_chunks(self, path: str, max_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The file in chunks of at most ``chunk_bytes`` (:func:`~swarm_gdrive.storage.base.read_chunks`), for a
        file too large to hold in memory (a checkpoint's weights). Its size is checked before a byte is read; each
        chunk is read at its offset and retried alone on a transient error; past ``max_bytes`` (a file that grew,
        or one whose mount reports a size it does not have) FileTooLargeError, after at most ``max_bytes + 1``."""
        fd = self._retry(self._open_regular, self._path(path), max_bytes, path)
        try:
            yield from capped_chunks(
                lambda offset, length: self._retry(os.pread, fd, length, offset), path, max_bytes, chunk_bytes
            )
        finally:
            os.close(fd)

    @staticmethod
    def _open_regular(target: RootedPath, max_bytes: int, rel: str) -> int:
        """A descriptor of the regular file at ``target`` no larger than ``max_bytes`` by its size (fstat)."""
        # Opened non-blocking, so that a FIFO planted under a protocol name cannot hang the reader, and
        # read only if it is a regular file (a link, a folder, a FIFO or a device is refused, not retried).
        with _Parent(target, create=False) as parent:
            try:
                fd = os.open(target.name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC, dir_fd=parent.fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise LinkRefusedError(rel, rel) from None
                if exc.errno == errno.ENXIO:  # a socket
                    raise NotRegularFileError(rel, _lkind(parent.fd, target.name) or "gone") from None
                raise
        try:  # checked before fdopen, which refuses a folder with an error of its own
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFileError(rel, _kind(st.st_mode))
            if st.st_size > max_bytes:
                raise FileTooLargeError(rel, st.st_size, max_bytes)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return self._retry(self._list, self._path(folder), include_hidden)

    @staticmethod
    def _list(target: RootedPath, include_hidden: bool) -> list[FileInfo]:
        try:
            with _Parent(target, create=False) as parent:
                fd = os.open(target.name, _DIR, dir_fd=parent.fd)
        except FileNotFoundError:
            return []
        except LinkRefusedError as exc:
            _warn_once(exc.link, "%s: not listed: %s is a symbolic link (never followed)", target.rel, exc.link)
            return []
        except OSError as exc:
            if exc.errno not in _NOT_FOLLOWED:
                raise
            if exc.errno != errno.ENOTDIR:  # a file where a folder is listed is just empty, as the contract says
                _warn_once(target.rel, "%s: not listed: a symbolic link (never followed)", target.rel)
            return []
        try:
            out = _entries(fd, include_hidden, target.rel)
        finally:
            os.close(fd)
        out.sort(key=lambda info: info.name)
        return out

    # -- writes ----------------------------------------------------------------------------

    def write_bytes(self, path: str, data: bytes) -> None:
        target, data = self._path(path), bytes(data)
        for _ in range(_MAX_CLEARS):
            try:
                self._retry(self._write, target, data)
                return
            except _TemporaryGone:
                continue  # written again from the start, under a new temporary name
        raise PathBlockedError(target.rel, target.rel, "its temporary file keeps disappearing before the rename")

    @staticmethod
    def _write(target: RootedPath, data: bytes) -> None:
        with _Parent(target, create=True) as parent:
            tmp = temp_name_for(target.name)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=parent.fd)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    _replace(parent.fd, tmp, parent.fd, target)
                except FileNotFoundError:
                    if _lkind(parent.fd, tmp) is None:  # removed by another process (a twin cleaning "its" leftovers)
                        raise _TemporaryGone(tmp) from None
                    raise
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent.fd)
                raise
            _fsync_fd(parent.fd)

    def append_bytes(self, path: str, data: bytes) -> None:
        self._retry(self._append, self._path(path), bytes(data))

    @staticmethod
    def _append(target: RootedPath, data: bytes) -> None:
        with _Parent(target, create=True) as parent:
            fd = _open_for_append(parent.fd, target)
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
    def _delete(target: RootedPath) -> None:
        try:
            with _Parent(target, create=False) as parent:
                try:
                    _forget_appended(parent.fd, target.name)
                    os.unlink(target.name, dir_fd=parent.fd)  # a link itself goes: unlink never follows one
                except FileNotFoundError:
                    return
                except OSError:
                    kind = _lkind(parent.fd, target.name)
                    if kind is None:
                        return
                    if kind != "a folder":
                        raise
                    _warn_once(target.rel, "%s: not deleted: a folder where a file belongs", target.rel)
        except FileNotFoundError:  # a parent is missing, or is a file: nothing there to delete
            return
        except LinkRefusedError as exc:
            _warn_once(exc.link, "%s: not deleted: %s is a symbolic link (never followed)", target.rel, exc.link)

    def make_dirs(self, folder: str) -> None:
        """Create ``folder`` and its missing parents, never following a link. Unlike a writer's own path, nothing
        in the way is cleared: a file or link where a folder belongs raises (NotADirectoryError, LinkRefusedError)."""
        self._retry(self._mkdirs, self._path(folder))

    @staticmethod
    def _mkdirs(target: RootedPath) -> None:
        fd = _open_root(target.storage_root, True)
        try:
            for depth, name in enumerate(target.inner):
                try:
                    child = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):  # a racing creator
                        os.mkdir(name, 0o755, dir_fd=fd)
                    child = os.open(name, _DIR, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.EMLINK) or _lkind(fd, name) == "a symbolic link":
                        raise LinkRefusedError(target.rel, "/".join(target.inner[: depth + 1])) from None
                    raise
                os.close(fd)
                fd = child
        finally:
            os.close(fd)

    def remove_empty_dir(self, folder: str) -> bool:
        return self._retry(self._rmdir, self._path(folder))

    @staticmethod
    def _rmdir(target: RootedPath) -> bool:
        try:
            with _Parent(target, create=False) as parent:
                try:
                    os.rmdir(target.name, dir_fd=parent.fd)
                except FileNotFoundError:
                    return True
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        return False
                    kind = _lkind(parent.fd, target.name)
                    if kind is None:
                        return True
                    if exc.errno != errno.ENOTDIR or kind == "a folder":
                        raise
                    _warn_once(target.rel, "%s: not removed: %s where a folder belongs", target.rel, kind)
                    return False
        except FileNotFoundError:
            return True
        except LinkRefusedError as exc:
            _warn_once(exc.link, "%s: not removed: %s is a symbolic link (never followed)", target.rel, exc.link)
            return False
        return True

    def move(self, src: str, dst: str) -> None:
        self._retry(self._move, self._path(src), self._path(dst))

    def move_in(self, path: str, local: str | os.PathLike[str]) -> bool:
        """Put this process's own file ``local`` (outside the folder, not used after) at ``path`` by renaming it
        there, when both are on one file system: no copy of what may be a gigabyte of checkpoint. As durable as
        :meth:`write_bytes` (the file synced before the rename, the folder after). False, with nothing changed,
        where a rename cannot reach (another file system): :func:`~swarm_gdrive.storage.base.put_file` then
        writes it."""
        return self._retry(self._move_in, self._path(path), Path(local))

    @staticmethod
    def _move_in(target: RootedPath, local: Path) -> bool:
        source = os.open(local.parent, _DIR)
        try:
            with _Parent(target, create=True) as parent:
                if os.fstat(source).st_dev != os.fstat(parent.fd).st_dev:
                    return False
                fd = os.open(local.name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=source)
                try:
                    mode = os.fstat(fd).st_mode
                    if not stat.S_ISREG(mode):
                        raise NotRegularFileError(str(local), _kind(mode))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    _replace(source, local.name, parent.fd, target)
                except OSError as exc:
                    if exc.errno == errno.EXDEV:  # one device, two mounts (a bind mount): no rename between them
                        return False
                    raise
                _fsync_fd(parent.fd)
                return True
        finally:
            os.close(source)

    @staticmethod
    def _move(src: RootedPath, dst: RootedPath) -> None:
        with _Parent(src, create=False) as source:
            os.stat(src.name, dir_fd=source.fd, follow_symlinks=False)  # FileNotFoundError before making dst's parents
            with _Parent(dst, create=True) as target:
                _replace(source.fd, src.name, target.fd, dst)
            _forget_appended(source.fd, src.name)


class _Parent:
    """The open folder holding a path's last component, reached from the root without following a link.

    ``create``: missing folders are made, and a link, file or other entry where a folder belongs is removed (a
    writer's own path); otherwise a link raises LinkRefusedError and a non-folder counts as absent.
    """

    def __init__(self, target: RootedPath, create: bool) -> None:
        self.target, self.create, self.fd = target, create, -1

    def __enter__(self) -> _Parent:
        self.fd = _open_root(self.target.storage_root, self.create)
        try:
            for depth, name in enumerate(self.target.inner[:-1]):
                child = self._step(name, depth)
                os.close(self.fd)
                self.fd = child
        except BaseException:
            os.close(self.fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def _step(self, name: str, depth: int) -> int:
        target, where = self.target, "/".join(self.target.inner[: depth + 1])
        for _ in range(_MAX_CLEARS):
            try:
                return os.open(name, _DIR, dir_fd=self.fd)
            except FileNotFoundError:
                if not self.create:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", target.rel) from None
                with contextlib.suppress(FileExistsError):  # a racing creator, or a blocker the next open meets
                    os.mkdir(name, 0o755, dir_fd=self.fd)
                continue
            except OSError as exc:
                if exc.errno not in _NOT_FOLLOWED:
                    raise
            kind = _lkind(self.fd, name)
            if kind is None or kind == "a folder":  # changed under us: look again
                continue
            if not self.create:
                if kind == "a symbolic link":
                    raise LinkRefusedError(target.rel, where)
                _warn_once(where, "%s is %s where a folder belongs: nothing under it is read", where, kind)
                raise FileNotFoundError(errno.ENOENT, f"{where} is {kind}, not a folder", target.rel)
            _clear(self.fd, name, where, kind, target.rel)
        raise PathBlockedError(target.rel, where, "keeps being replaced by something that is not a folder")


def _entries(fd: int, include_hidden: bool, rel: str) -> list[FileInfo]:
    """The entries of the open folder ``fd`` (at ``rel``), each stat'ed without following a link (a link is not a
    folder); a name that is not UTF-8 left out (:func:`~swarm_gdrive.storage.base.listable_name`)."""
    out: list[FileInfo] = []
    with os.scandir(fd) as it:
        for entry in it:
            if (not include_hidden and is_temporary(entry.name)) or not listable_name(rel, entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)  # relative to fd: before fd is closed
            except FileNotFoundError:  # removed between scandir and stat
                continue
            out.append(FileInfo(entry.name, st.st_size, st.st_mtime, stat.S_ISDIR(st.st_mode), str(st.st_ino)))
    return out


def _open_root(root: str, create: bool) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
    try:
        return os.open(root, flags)
    except FileNotFoundError:
        if not create:
            raise
    os.makedirs(root, exist_ok=True)
    return os.open(root, flags)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


class _TemporaryGone(Exception):
    """A write's own temporary file vanished before its rename: the write starts again."""


def _lkind(dir_fd: int, name: str) -> str | None:
    """What ``name`` is, without following it; None if it is gone."""
    try:
        return _kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None


def _warn_once(key: str, message: str, *args: object) -> None:
    """A WARNING per path and process: polls meet the same planted entry many times."""
    if key in _warned:
        return
    if len(_warned) > 10_000:
        _warned.clear()
    _warned.add(key)
    logger.warning(message, *args)


def _say_removed(dir_fd: int, name: str, where: str, kind: str, rel: str) -> None:
    pointing = ""
    if kind == "a symbolic link":
        with contextlib.suppress(OSError):
            pointing = f" to {os.readlink(name, dir_fd=dir_fd)!r}"
    logger.warning("removed %s%s at %s: it blocked writing %s (links are never followed)", kind, pointing, where, rel)


def _clear(dir_fd: int, name: str, where: str, kind: str, rel: str) -> None:
    """Remove what sits where a writer's own path must go: a link itself (never its target), a file, a tree."""
    _say_removed(dir_fd, name, where, kind, rel)
    try:
        if kind == "a folder":
            _remove_tree(dir_fd, name, 0, [_MAX_TREE_ENTRIES])
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except PathBlockedError:
        raise PathBlockedError(rel, where, f"is {kind} too large to remove") from None
    except OSError as exc:
        if is_transient_os_error(exc):
            raise
        if _lkind(dir_fd, name) != kind:  # another writer cleared it first (made its folder): the caller looks again
            return
        raise PathBlockedError(rel, where, f"is {kind} that could not be removed ({exc.strerror})") from None


def _remove_tree(dir_fd: int, name: str, depth: int, budget: list[int]) -> None:
    """Remove the folder ``name`` and everything in it, never following a link; bounded in depth and entries."""
    if depth > _MAX_TREE_DEPTH:
        raise PathBlockedError(name, name, "is nested too deeply")
    fd = os.open(name, _DIR, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        budget[0] -= len(entries)
        if budget[0] < 0:
            raise PathBlockedError(name, name, "holds too many entries")
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(fd, entry.name, depth + 1, budget)
                else:
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _replace(src_fd: int, src_name: str, dst_fd: int, dst: RootedPath) -> None:
    """Rename onto ``dst``'s name; a folder in the way of a file (the writer's own path) is removed first.

    A link, FIFO or device at the name is replaced by the rename itself (which never follows it), and said.
    """
    _forget_appended(dst_fd, dst.name)
    kind = _lkind(dst_fd, dst.name)
    if kind not in (None, "a file", "a folder"):
        _say_removed(dst_fd, dst.name, dst.rel, kind, dst.rel)
    for _ in range(_MAX_CLEARS):
        try:
            os.replace(src_name, dst.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            return
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            if _lkind(dst_fd, dst.name) != "a folder" or _lkind(src_fd, src_name) == "a folder":
                raise
        _clear(dst_fd, dst.name, dst.rel, "a folder", dst.rel)
    raise PathBlockedError(dst.rel, dst.rel, "keeps being replaced by a folder")


#: The file each of this process's appends went into last, by (parent folder's device and inode, name): an append
#: that finds another file under the same name (one swapped in since, even a plain file with a single name, such as
#: a hard link whose other name was removed between the open and the check) replaces it. Forgotten when this
#: process replaces, moves or deletes that name itself.
_appended: dict[tuple[int, int, str], tuple[int, int]] = {}


def _append_key(dir_fd: int, name: str) -> tuple[int, int, str]:
    st = os.fstat(dir_fd)
    return st.st_dev, st.st_ino, name


def _forget_appended(dir_fd: int, name: str) -> None:
    if _appended:
        _appended.pop(_append_key(dir_fd, name), None)


def _open_for_append(dir_fd: int, target: RootedPath) -> int:
    """The writer's own log opened for appending: the one way this backend writes into an existing file.

    A link, folder, FIFO or device at its name is removed first, and so is a hard link: a file with another name
    (:func:`~swarm_gdrive.storage.base.hard_link_kind`), which may be a file outside the root that a participant
    linked in (the same file system), or another node's file. Only the planted name is unlinked (the file it
    names keeps its bytes and its other names); the log goes on in a fresh file. What is checked is the opened
    descriptor (``fstat``), not the name before the open, so a name swapped between a check and the write cannot
    slip through; every append opens and checks again, so a log swapped for a link mid-run is caught at the next.
    A file that is not the one this process appended to last (:data:`_appended`) is replaced too: a link whose
    other name went between the open and the check has one name, but it is still not the node's log; on a first
    append, which remembers nothing, the name must still reach the opened file
    (:func:`~swarm_gdrive.storage.base.still_named`), so that the opened file's one name is the log's. The fresh file
    is created exclusively, so nothing planted in between is taken for it.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC
    key = _append_key(dir_fd, target.name)
    fresh = 0  # O_EXCL once a foreign file was cleared: only a file this call creates is taken
    for _ in range(_MAX_CLEARS):
        try:
            fd = os.open(target.name, flags | fresh, 0o644, dir_fd=dir_fd)
        except FileExistsError:  # planted between the clearing and the exclusive create
            kind = _lkind(dir_fd, target.name)
            if kind == "a file":
                kind = "a file planted where the log was being recreated"
        except OSError as exc:  # ELOOP: a link; EISDIR: a folder; ENXIO: a FIFO nobody reads
            if exc.errno not in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO):
                raise
            kind = _lkind(dir_fd, target.name)
        else:
            st = os.fstat(fd)
            kind = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else hard_link_kind(st.st_nlink)
            known = _appended.get(key)
            if kind is None and not fresh and known is not None and known != (st.st_dev, st.st_ino):
                kind = "another file than the log appended to before (swapped in since)"
            if kind is None and not fresh and not still_named(target.name, st, dir_fd):
                kind = "a file its name no longer reaches (swapped while it was opened)"
            if kind is None:  # a plain file with this one name: ours to append to
                _appended[key] = (st.st_dev, st.st_ino)
                os.set_blocking(fd, True)
                return fd
            os.close(fd)
        if kind is not None and kind != "a file":
            _clear(dir_fd, target.name, target.rel, kind, target.rel)
            fresh = os.O_EXCL
    raise PathBlockedError(target.rel, target.rel, "keeps being replaced by something that is not a file of its own")


def _read_capped(fd: int, max_bytes: int, rel: str) -> bytes:
    """At most ``max_bytes + 1`` bytes of ``fd``, in bounded reads (never one buffer of the cap's size: a cap is
    an upper bound, the file is usually far smaller); FileTooLargeError past ``max_bytes``: a file that grew
    since its size was checked, or a mount that reports a size the file does not have."""
    chunks, total = [], 0
    while total <= max_bytes:
        chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise FileTooLargeError(rel, total, max_bytes)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _unavailable(exc: OSError) -> StorageUnavailableError:
    """The same error (errno, message, file name) as a StorageUnavailableError."""
    if exc.errno is None:
        return StorageUnavailableError(*exc.args)
    extra = () if exc.filename is None else (exc.filename,)
    return StorageUnavailableError(exc.errno, exc.strerror, *extra)


def _fsync_fd(fd: int) -> None:
    """Make a rename durable; some FUSE mounts refuse to fsync a folder, which is harmless."""
    with contextlib.suppress(OSError):
        os.fsync(fd)
