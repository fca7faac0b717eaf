"""fsspec backend: object stores (``s3://``, ``gs://``, ``az://``), ``memory://``, and any other fsspec URL.

What each kind of store guarantees (rule 2 of the shared-folder protocol, atomic visibility):

==================  ==============================================  =========================================
store               write_bytes                                     folders, move, remove_empty_dir
==================  ==============================================  =========================================
s3, gs, az, ...     one whole-object PUT (multipart above 100 MB    no real folders: a folder exists while a
                    on S3, also atomic): readers see the old or     key is under its prefix; move is
                    the new object, never a mix. S3/GCS/Azure are   server-side copy then delete (a reader may
                    read-after-write and list-after-write           briefly see both, never a partial file);
                    consistent. append_bytes on S3 is a             remove_empty_dir deletes nothing and is
                    conditional PUT (If-Match ETag /                True when nothing is under the prefix
                    If-None-Match ``*``), so a lost update is
                    detected and retried
memory              whole-object replace (one dict assignment)      as object stores (process-local; tests)
gdrive              whole-file upload, atomic per file (untested    real folders, the implementation's mv;
                    here; Drive names are not unique: prefer        remove_empty_dir as for file
                    DriveStorage)
file, sftp, ...     hidden temporary sibling (``.name.<hex>.tmp``)  real folders; mv is the filesystem's
                    then ``mv`` over the target (atomic where       rename; remove_empty_dir removes an
                    the filesystem's rename is: local POSIX yes)    empty folder, False while one is not
==================  ==============================================  =========================================

``append_bytes`` is read-modify-write on every store: each file has one writer (rule 1), so no
update can be lost to another node; a retry after a reply was lost does not append twice. It
costs a read of the whole file per append, which is why metrics and events are buffered. On a
file system with links (``file://``) nothing is written in place (the temporary name and a
rename, whatever ``atomic_put`` says), and an append whose file is a link (symbolic, or a hard
link: more than one name) does not take its content: a fresh file replaces the link.

Retries (tenacity, via :func:`~swarm_gdrive.storage.base.retrying`) cover transient errors only:
connection errors, timeouts, HTTP 5xx/429, and S3 throttling codes (``SlowDown``, ...). s3fs
retries some of these itself first. fsspec's listing cache is invalidated before every read and
listing, so a node sees what other nodes wrote.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, TypeVar

import fsspec

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    NotRegularFileError,
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
from swarm_gdrive.storage.local import TRANSIENT_ERRNOS

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Stores without real folders, whose PUT replaces a whole object atomically.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "oci", "memory"})
#: Stores with real folders that still upload a whole file at once.
ATOMIC_UPLOAD_PROTOCOLS = frozenset({"gdrive"})
#: Stores whose PutObject honours If-Match / If-None-Match (S3 since 2024; MinIO; moto).
CONDITIONAL_WRITE_PROTOCOLS = frozenset({"s3", "s3a"})

#: Stores on a file system with links (hard and symbolic): never written in place, only by a rename over the name.
LINKED_PROTOCOLS = frozenset({"file", "local"})

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: Error codes (botocore ``ClientError``) that mean "try again later".
TRANSIENT_ERROR_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "OperationAborted",
        "PriorRequestNotComplete",
        "500",
        "502",
        "503",
        "504",
    }
)
#: A conditional write lost its race; re-reading and writing again is the cure.
CONFLICT_ERROR_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})

#: Exception class names (anywhere in the MRO) of network failures in botocore, aiohttp,
#: requests, urllib3, http.client and fsspec, matched by name so none of them must be installed.
TRANSIENT_CLASS_NAMES = frozenset(
    {
        "ConnectionError",  # botocore's and requests' own, not only the builtin
        "HTTPClientError",  # botocore: ReadTimeoutError, ConnectionClosedError, ...
        "ClientConnectionError",  # aiohttp: ServerDisconnectedError, ClientOSError, ...
        "ClientPayloadError",
        "ServerDisconnectedError",
        "IncompleteRead",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ReadTimeout",
        "ConnectTimeout",
        "Timeout",
        "ChunkedEncodingError",
        "ProtocolError",
        "RemoteDisconnected",
        "FSTimeoutError",
    }
)

_USERINFO = re.compile(r"(://)[^/@]*@")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps (``raise ... from``, then implicit context), without cycles."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def client_error(exc: BaseException) -> tuple[str | None, int | None]:
    """(error code, HTTP status) of a botocore-style ``ClientError`` in ``exc``'s chain, else (None, None).

    s3fs turns ``ClientError`` into ``OSError``/``PermissionError``/... with the original as ``__cause__``.
    """
    for cause in _causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), (status if isinstance(status, int) else None)
    return None, None


def _http_status(exc: BaseException) -> int | None:
    """An HTTP status carried by a non-botocore error (gcsfs ``HttpError.code``, ``.status``)."""
    for attr in ("status", "code", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _is_retryable_status(status: int | None) -> bool:
    return status is not None and (status >= 500 or status in (408, 429))


def is_transient_fsspec_error(exc: BaseException) -> bool:
    """True for errors worth retrying: network failures, timeouts, throttling, 5xx. Never a missing file."""
    if isinstance(exc, (FileNotFoundError, FileTooLargeError)):
        return False
    code, status = client_error(exc)
    if code is not None or status is not None:
        return code in TRANSIENT_ERROR_CODES or _is_retryable_status(status)
    if isinstance(exc, (PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if any(cls.__name__ in TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    if _is_retryable_status(_http_status(exc)):
        return True
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def is_write_conflict(exc: BaseException) -> bool:
    """True if a conditional write failed because the object changed since it was read."""
    code, status = client_error(exc)
    return code in CONFLICT_ERROR_CODES or status in (409, 412)


def entry_mtime(entry: dict[str, Any]) -> float:
    """Modification time (epoch seconds) of an fsspec listing entry; 0.0 when the store does not say."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modifiedTime", "modified", "created"):
        value = _to_epoch(entry.get(key))
        if value:
            return value
    return 0.0


def _version(entry: dict[str, Any]) -> str | None:
    """An object store's ETag (or a filesystem's checksum) of a listed entry, where it reports one."""
    for key in ("ETag", "etag", "md5Hash", "md5", "checksum"):
        value = entry.get(key)
        if value:
            return str(value)
    return None


def _to_epoch(value: object) -> float:
    if isinstance(value, bool) or value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return 0.0
    if isinstance(value, datetime):
        if value.tzinfo is None:  # object stores report UTC
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    return 0.0


def _protocols(fs: fsspec.AbstractFileSystem) -> frozenset[str]:
    protocol = fs.protocol
    return frozenset([protocol] if isinstance(protocol, str) else protocol)


class FsspecStorage:
    """A :class:`~swarm_gdrive.storage.base.Storage` over any fsspec URL (``s3://bucket/prefix``, ...).

    ``atomic_put`` (default: by protocol) says whether one PUT replaces a file atomically; when it
    does not, writes go to a hidden temporary name and are moved over the target.
    ``conditional_writes`` (default: on for S3) makes appends conditional on the ETag they read;
    turn it off for S3-compatible stores that refuse ``If-Match``.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry_attempts: int = 8,
        retry_max_wait: float = 10.0,
        *,
        atomic_put: bool | None = None,
        conditional_writes: bool | None = None,
    ) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.root = root.rstrip("/")
        protocols = _protocols(self.fs)
        self.object_store = bool(protocols & OBJECT_STORE_PROTOCOLS)
        self.atomic_put = (
            atomic_put
            if atomic_put is not None
            else bool(protocols & (OBJECT_STORE_PROTOCOLS | ATOMIC_UPLOAD_PROTOCOLS))
        )
        #: A file system with links (``file://``): appends read their file through a checked descriptor.
        self.linked = bool(protocols & LINKED_PROTOCOLS)
        if self.atomic_put and self.linked:  # pipe_file opens the name "wb": through a hard link
            logger.warning("%s: atomic_put ignored: a local folder is written by renames only", self.describe())
            self.atomic_put = False
        self.conditional_writes = (
            conditional_writes if conditional_writes is not None else bool(protocols & CONDITIONAL_WRITE_PROTOCOLS)
        )
        self._attempts = retry_attempts
        self._max_wait = retry_max_wait

    def describe(self) -> str:
        return "fsspec " + _USERINFO.sub(r"\1", self.url)  # credentials in a URL stay out of logs

    # -- paths and retries -----------------------------------------------------------------

    def _full(self, rel: str) -> str:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise ValueError(f"storage path must be relative and stay inside the root: {rel!r}")
        joined = "/".join(parts)
        return self.fs._strip_protocol(f"{self.root}/{joined}" if self.root else joined)

    def _retry(self, fn: Callable[..., T], *args: Any, transient: Callable[[BaseException], bool] | None = None) -> T:
        is_transient = transient or is_transient_fsspec_error
        try:
            for attempt in retrying(is_transient, self._attempts, self._max_wait):
                with attempt:
                    return fn(*args)
        except StorageError:
            raise
        except Exception as exc:
            if is_transient(exc):  # still failing after every attempt: bounded waits ride it out, as on Drive
                code = exc.errno if isinstance(exc, OSError) and exc.errno is not None else errno.EAGAIN
                raise StorageUnavailableError(code, str(exc)) from exc
            raise
        raise StorageError(f"unreachable retry exit in {fn.__name__}")  # pragma: no cover

    def _invalidate(self, full: str) -> None:
        """Forget cached listings of ``full`` and its parents, so the next call asks the store."""
        self.fs.invalidate_cache(full)

    def _parent(self, full: str) -> str:
        return self.fs._parent(full)

    def _name(self, full: str) -> str:
        return full.rstrip("/").rsplit("/", 1)[-1]

    # -- reads -----------------------------------------------------------------------------

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        return self._retry(self._read, self._full(path), max_bytes, path)

    def _read(self, full: str, max_bytes: int, rel: str) -> bytes:
        self._invalidate(full)
        info = self.fs.info(full)
        kind = info.get("type")
        if kind == "directory":
            raise NotRegularFileError(rel, "a folder")
        if kind not in (None, "file"):  # a FIFO or a device under file://: opening it could block for ever
            raise NotRegularFileError(rel, f"an entry of type {kind!r}")
        size = info.get("size")
        if size is not None:
            if int(size) > max_bytes:
                raise FileTooLargeError(rel, int(size), max_bytes)
            if int(size) == 0:
                return b""
        try:  # one ranged GET: a snapshot of one version, never more than the cap (+1 to see growth)
            data = self.fs.cat_file(full, start=0, end=max_bytes + 1)
        except OSError as exc:
            if client_error(exc)[0] == "InvalidRange":  # bytes=0-N fails only on an object that became empty
                return b""
            raise
        if len(data) > max_bytes:  # replaced by a bigger file since info
            raise FileTooLargeError(rel, len(data), max_bytes)
        return bytes(data)

    def read_chunks(self, path: str, max_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The file in ranged reads of at most ``chunk_bytes`` (:func:`~swarm_gdrive.storage.base.read_chunks`),
        for a file too large to hold in memory. Its size (``info``) is checked against ``max_bytes`` before a byte
        is read; each range is retried alone; past ``max_bytes`` (a file replaced by a larger one while it was
        read) FileTooLargeError, after at most ``max_bytes + 1`` bytes."""
        full = self._full(path)
        self._retry(self._check_readable, full, max_bytes, path)
        yield from capped_chunks(
            lambda offset, length: self._retry(self._range, full, offset, offset + length), path, max_bytes, chunk_bytes
        )

    def _check_readable(self, full: str, max_bytes: int, rel: str) -> None:
        self._invalidate(full)
        info = self.fs.info(full)
        kind = info.get("type")
        if kind == "directory":
            raise NotRegularFileError(rel, "a folder")
        if kind not in (None, "file"):
            raise NotRegularFileError(rel, f"an entry of type {kind!r}")
        if info.get("size") is not None and int(info["size"]) > max_bytes:
            raise FileTooLargeError(rel, int(info["size"]), max_bytes)

    def _range(self, full: str, start: int, end: int) -> bytes:
        try:
            return bytes(self.fs.cat_file(full, start=start, end=end))
        except OSError as exc:
            if client_error(exc)[0] == "InvalidRange":  # a range past the end of the object
                return b""
            raise

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return self._retry(self._list, self._full(folder), include_hidden, folder)

    def _ls(self, full: str) -> list[dict[str, Any]] | None:
        """Entries under ``full``; None if ``full`` is a file; [] if it does not exist."""
        self._invalidate(full)
        try:
            entries = self.fs.ls(full, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        own = [e for e in entries if self.fs._strip_protocol(e["name"]).rstrip("/") == full]
        if any(e.get("type") != "directory" for e in own):
            return None  # fsspec lists a file as itself
        return [e for e in entries if e not in own]

    def _list(self, full: str, include_hidden: bool, rel: str) -> list[FileInfo]:
        out: dict[str, FileInfo] = {}
        for entry in self._ls(full) or []:
            name = self._name(entry["name"])
            if not name or (not include_hidden and is_temporary(name)) or not listable_name(rel, name):
                continue
            is_dir = entry.get("type") == "directory"
            size = 0 if is_dir else int(entry.get("size") or 0)
            if name not in out or not is_dir:  # a key and a "folder" of one name: the file wins
                out[name] = FileInfo(name, size, entry_mtime(entry), is_dir, _version(entry))
        return [out[name] for name in sorted(out)]

    # -- writes ----------------------------------------------------------------------------

    def write_bytes(self, path: str, data: bytes) -> None:
        self._retry(self._put, self._full(path), bytes(data))

    def _put(self, full: str, data: bytes, condition: dict[str, str] | None = None) -> None:
        if self.atomic_put:
            self.fs.pipe_file(full, data, **(condition or {}))
        else:
            self._put_via_temporary(full, data)
        self._invalidate(full)

    def _put_via_temporary(self, full: str, data: bytes) -> None:
        parent = self._parent(full)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/{temp_name_for(self._name(full))}"
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, full)
        except BaseException:
            try:
                self.fs.rm_file(tmp)
            except Exception:  # cleanup is best effort; the original error is what matters
                logger.debug("could not remove temporary %s", tmp, exc_info=True)
            raise

    def make_dirs(self, folder: str) -> None:
        """Create ``folder`` and its missing parents (a no-op on stores without folders)."""
        full = self._full(folder)
        self._retry(lambda: self.fs.makedirs(full, exist_ok=True))
        self._invalidate(full)

    def append_bytes(self, path: str, data: bytes) -> None:
        full, data = self._full(path), bytes(data)
        attempted: list[bytes] = []

        def append_once() -> None:
            old, etag = self._read_for_update(full)
            if attempted and old == attempted[-1]:
                return  # an earlier attempt landed although its reply was lost
            new = (old or b"") + data
            attempted.append(new)
            self._put(full, new, self._condition(old is not None, etag))

        self._retry(append_once, transient=lambda exc: is_transient_fsspec_error(exc) or self._lost_race(exc))

    def _read_for_update(self, full: str) -> tuple[bytes | None, str | None]:
        """Whole content and ETag (if the store has one); (None, None) if the file does not exist."""
        self._invalidate(full)
        try:
            info = self.fs.info(full)
        except FileNotFoundError:
            return None, None
        if info.get("type") == "directory":
            raise IsADirectoryError(errno.EISDIR, "Is a directory", full)
        if self.linked:
            return self._read_own_file(full), None
        data = self.fs.cat_file(full) if info.get("size") != 0 else b""
        return bytes(data), info.get("ETag")

    @staticmethod
    def _read_own_file(full: str) -> bytes | None:
        """A local file this node appends to, read from one descriptor checked to be a plain file with one name:
        what is checked is what is read, even if the name is swapped meanwhile. None where there is nothing of
        the node's own to keep (a link, symbolic or hard, whose bytes another name reaches and may be a file
        outside the root; a FIFO or device): it is never read, and the append's rename replaces it. The name must
        still reach the opened file: a planted link whose planted name went between the open and the check has one
        name left, outside the root."""
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EMLINK, errno.ENXIO):
                raise
            what: str | None = "a symbolic link" if exc.errno != errno.ENXIO else "a socket"
        else:
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory", full)
                what = hard_link_kind(st.st_nlink) if stat.S_ISREG(st.st_mode) else "not a regular file"
                if what is None and not still_named(full, st):
                    what = "a file its name no longer reaches (swapped while it was opened)"
                if what is None:
                    os.set_blocking(fd, True)
                    with os.fdopen(os.dup(fd), "rb") as fh:
                        return fh.read()
            finally:
                os.close(fd)
        logger.warning("%s: %s where this node appends: replaced by a fresh file (never followed)", full, what)
        return None

    def _condition(self, exists: bool, etag: str | None) -> dict[str, str]:
        """PutObject arguments that make an update fail if the object changed since it was read."""
        if not self.conditional_writes:
            return {}
        if not exists:
            return {"IfNoneMatch": "*"}
        return {"IfMatch": etag} if etag else {}

    def _lost_race(self, exc: BaseException) -> bool:
        return self.conditional_writes and (isinstance(exc, FileExistsError) or is_write_conflict(exc))

    def delete(self, path: str) -> None:
        self._retry(self._delete, self._full(path))

    def _delete(self, full: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # absent is fine
            self.fs.rm_file(full)
        self._invalidate(full)

    def remove_empty_dir(self, folder: str) -> bool:
        return self._retry(self._rmdir, self._full(folder))

    def _rmdir(self, full: str) -> bool:
        entries = self._ls(full)
        if entries is None:
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", full)
        if entries:
            return False
        if self.object_store:  # no real folders: an empty prefix is already gone
            return True
        try:
            self.fs.rmdir(full)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) or self._ls(full):
                return False
            raise
        self._invalidate(full)
        return True

    def move(self, src: str, dst: str) -> None:
        self._retry(self._move, self._full(src), self._full(dst))

    def _move(self, src: str, dst: str) -> None:
        self._invalidate(src)
        info = self.fs.info(src)  # FileNotFoundError if absent
        if info.get("type") == "directory":
            self._move_tree(src, dst)
        else:
            self._move_file(src, dst)
        self._invalidate(src)
        self._invalidate(dst)

    def _move_file(self, src: str, dst: str) -> None:
        if self.object_store:  # server-side copy, then delete
            self.fs.cp_file(src, dst)
            self.fs.rm_file(src)
        else:
            self.fs.makedirs(self._parent(dst), exist_ok=True)
            self.fs.mv(src, dst)

    def _move_tree(self, src: str, dst: str) -> None:
        """Move ``src`` and everything under it to ``dst`` (merging into ``dst`` on object stores)."""
        if not self.object_store:  # one rename of the whole folder where the filesystem has one
            self.fs.makedirs(self._parent(dst), exist_ok=True)
            self.fs.mv(src, dst, recursive=True)
            return
        sources = [p for p in self.fs.find(src, withdirs=False) if p != src]
        targets = [dst + p[len(src) :] for p in sources]
        if sources:  # fsspec copies and deletes a list in batches (concurrently on async stores)
            self.fs.copy(sources, targets)
            self.fs.rm(sources)
