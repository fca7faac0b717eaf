"""The storage contract every backend satisfies, and the retry policy backends share.

Paths are relative POSIX strings (``experiments/x/state/current_state.json``) built by
:mod:`swarm_gdrive.protocol.layout`. Retries and backoff live in backends and only there.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_all,
    wait_random_exponential,
)
from tenacity.wait import wait_base

# The temporaries' rule is part of this contract; it is defined on the bottom floor (names), under storage, so that
# settings can check names without importing storage. Backends and tests import it from here.
from swarm_gdrive.names import is_temporary  # noqa: F401

logger = logging.getLogger(__name__)

#: Default cap for one read; callers pass tighter caps per file kind.
DEFAULT_MAX_READ_BYTES = 16 * 1024 * 1024


class StorageError(OSError):
    """A storage operation failed for good (after any retries)."""


class StorageUnavailableError(StorageError):
    """The store kept answering with transient errors past the retry budget; a later try may work."""


class FileTooLargeError(StorageError):
    """A file is larger than the cap its reader allows; it was not read."""

    def __init__(self, path: str, size: int, cap: int) -> None:
        self.path, self.size, self.cap = path, size, cap
        super().__init__(f"{path}: {size} bytes exceeds the {cap}-byte cap for this file")


class NotRegularFileError(StorageError):
    """A name in the folder that is not a regular file (a FIFO, a device, a link to a folder); it was not read."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        super().__init__(f"{path}: {what}, not a regular file")


class LinkRefusedError(NotRegularFileError):
    """A symbolic link at or above a path under the root: never followed, so nothing was read through it."""

    def __init__(self, path: str, link: str) -> None:
        what = "a symbolic link" if link == path else f"under the symbolic link {link}"
        StorageError.__init__(
            self, f"{path}: refused: {link} is a symbolic link, and links under the root are never followed"
        )
        self.path, self.what, self.link = path, what, link


class PathBlockedError(StorageError):
    """Something at or above a writer's own path could not be cleared out of the way; nothing was written."""

    def __init__(self, path: str, where: str, why: str) -> None:
        self.path, self.where = path, where
        super().__init__(f"{path}: not written: {where} {why}; remove {where} by hand")


def hard_link_kind(nlink: int) -> str | None:
    """What a regular file with ``nlink`` names is to a writer that appends or rewrites in place: None for a file
    of its own (one name), else a description for the WARNING that says it was replaced ("a hard link ...").

    A second name means that someone else can reach the bytes by it: a participant on the same file system who
    linked a file outside the shared folder (or another node's file) in where a node appends would have the node
    write into that file. Writers that append therefore write only into a file with one name, and replace any
    other (a local folder, :func:`swarm_gdrive.storage.local._open_for_append`; an fsspec ``file://`` folder,
    :meth:`swarm_gdrive.storage.fsspec_storage.FsspecStorage.append_bytes`). A count of 0 (a file removed since it
    was opened, or a FUSE mount that reports no count) names nothing else and is not refused. Folders cannot be
    hard-linked on Linux (``link(2)`` answers EPERM), so only files are checked.
    """
    if nlink <= 1:
        return None
    return f"a hard link (a file with {nlink} names, one of them maybe outside the root)"


def still_named(path: str, st: os.stat_result, dir_fd: int | None = None) -> bool:
    """Whether ``path`` (beside ``dir_fd``, when given; never followed if it is a link) still names the file opened
    as ``st``. With one link, the opened file's only name is then this one: not a file outside the root whose
    planted second name was removed between a writer's open and its check."""
    try:
        now = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return os.path.samestat(now, st)


# -- temporary names: part of the storage contract (is_temporary: imported above) ----------------------------


def temp_name_for(name: str) -> str:
    """Hidden temporary sibling of ``name``; it starts with the final name so its owner can find it."""
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


def is_temp_of(temp: str, name: str) -> bool:
    """True if ``temp`` is a temporary name made by :func:`temp_name_for` for ``name``."""
    return temp.startswith(f".{name}.") and temp.endswith(".tmp")


# -- names that are not text: never part of a listing ---------------------------------------------------------

_unlisted: set[str] = set()


def escaped_name(name: str) -> str:
    """``name`` printable whatever it holds: the bytes of a name that is not UTF-8 as ``\\xff``, a lone surrogate
    as ``\\udcff``; a name that is valid text comes back unchanged."""
    try:
        raw = name.encode("utf-8", "surrogateescape")  # the bytes the folder holds, where Python listed them so
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def listable_name(folder: str, name: str) -> bool:
    """False (and a WARNING once per name and process, showing it escaped) for a name that is not valid Unicode.

    A POSIX folder may hold a name whose bytes are not UTF-8 (``b"run\\xff"``): Python lists it with surrogate
    escapes (PEP 383), a string that every later ``encode("utf-8")`` (a log, a JSON file, a web page) refuses; a
    lone surrogate can also come out of a JSON listing (Drive's ``"\\udcff"``). No protocol name is such a name
    (:func:`swarm_gdrive.names.validate_name` allows letters, digits, '.', '_' and '-'), so every backend leaves
    it out of its listings, and each reader, command and page meets only names it can print.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        key = f"{escaped_name(folder)}/{escaped_name(name)}"
        if key not in _unlisted:
            if len(_unlisted) > 10_000:
                _unlisted.clear()
            _unlisted.add(key)
            logger.warning("%s: left out of the listing: the name is not UTF-8 (no protocol name is)", key)
        return False
    return True


@dataclass(frozen=True)
class FileInfo:
    """One entry of a listing."""

    name: str
    size: int
    mtime: float
    is_dir: bool
    #: What changes with every write where the backend knows it (Drive's md5, an object store's ETag, a local
    #: file's inode, new at each atomic replace): with size and mtime, the key under which a read is reused.
    version: str | None = None
    #: The file's whole content where the listing itself carried it and the backend checked it against the
    #: listing's own checksum (Drive's small files, :mod:`swarm_gdrive.storage.drive`); None where it did not. A
    #: reader may use it instead of a download; it is as untrusted as downloaded bytes.
    inline: bytes | None = field(default=None, compare=False, repr=False)


@runtime_checkable
class Storage(Protocol):
    """What the protocol needs from a shared folder."""

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        """Whole file. FileNotFoundError if absent; FileTooLargeError over ``max_bytes``."""
        ...

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace the file atomically: readers see the old or the new content, never a mix."""
        ...

    def append_bytes(self, path: str, data: bytes) -> None:
        """Append to a file only this node writes (logs). Readers may see a partial last line."""
        ...

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        """Entries of ``folder`` (empty if it does not exist), temporary names and names that are not UTF-8
        (:func:`listable_name`) left out."""
        ...

    def delete(self, path: str) -> None:
        """Remove a file; absent is fine."""
        ...

    def remove_empty_dir(self, folder: str) -> bool:
        """Remove ``folder`` only if it is empty; True if it is gone."""
        ...

    def move(self, src: str, dst: str) -> None:
        """Move a file or folder, creating the destination's parents."""
        ...

    def describe(self) -> str:
        """Human-readable location, for logs."""
        ...


def prefetch_folders(storage: Storage, folders: list[str]) -> None:
    """Let the backend resolve several folders it is about to use in one go, where it can (its
    ``prefetch_folders``: Drive looks up same-named levels of several paths in one query). Optional."""
    prefetch = getattr(storage, "prefetch_folders", None)
    if prefetch is not None:
        prefetch(folders)


def read_chunks(storage: Storage, path: str, max_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The file at ``path`` in chunks, for a file too large to hold in memory at once (a checkpoint's weights),
    where the backend can (its ``read_chunks``: its size is checked against ``max_bytes`` before a byte is read,
    and at most ``max_bytes + 1`` bytes are read however the file changes); else the whole file in one chunk
    (``read_bytes``, which holds the same caps). FileTooLargeError over ``max_bytes``."""
    stream = getattr(storage, "read_chunks", None)
    if stream is None:
        yield storage.read_bytes(path, max_bytes)
    else:
        yield from stream(path, max_bytes, chunk_bytes)


def capped_chunks(read: Callable[[int, int], bytes], path: str, max_bytes: int, chunk_bytes: int) -> Iterator[bytes]:
    """The chunks ``read(offset, length)`` gives from offset 0 until an empty one, each at most ``chunk_bytes``:
    a backend's ``read_chunks`` once it checked the size. However the file changes meanwhile, at most
    ``max_bytes + 1`` bytes are read, and over ``max_bytes`` is FileTooLargeError."""
    offset = 0
    while offset <= max_bytes:
        chunk = read(offset, min(chunk_bytes, max_bytes + 1 - offset))
        if not chunk:
            return
        offset += len(chunk)
        if offset > max_bytes:
            raise FileTooLargeError(path, offset, max_bytes)
        yield chunk


@dataclass(frozen=True)
class Space:
    """Room left for writes where a backend can tell (its ``free_space()``): bytes free (None: no limit known),
    the total, and where (an account, a file system), for messages."""

    free: int | None
    total: int | None
    where: str
    #: Bytes in Drive's trash that still count against ``total`` (None: not known).
    trash: int | None = None
    #: True where a delete moves the file to Drive's trash instead of freeing its bytes (a mounted Drive).
    deletes_to_trash: bool = False


def put_file(storage: Storage, path: str, local: Path) -> None:
    """Write the local file ``local`` (this process's own, not used after) at ``path``: renamed into place where
    the storage can (:meth:`LocalStorage.move_in <swarm_gdrive.storage.local.LocalStorage.move_in>`, a folder on
    the same file system), else read and written whole."""
    move_in = getattr(storage, "move_in", None)
    if move_in is None or not move_in(path, local):
        storage.write_bytes(path, local.read_bytes())


def human_bytes(n: int | None) -> str:
    """Bytes for a person: 1.08 GB, 41.2 MB, 812 KB, 96 B; "unknown" for None."""
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def free_space(storage: Storage) -> Space | None:
    """The backend's :class:`Space` (its optional ``free_space``); None where it cannot tell. Optional: an object
    store has no quota to read; Drive answers ``about.get``, a local or mounted folder its file system."""
    get = getattr(storage, "free_space", None)
    return None if get is None else get()


def make_dirs(storage: Storage, folder: str) -> bool:
    """Create ``folder`` ahead of the writes into it, where the backend can (its ``make_dirs``); False where it
    cannot. Optional: every write creates its own folders anyway; a backend gains from it when creating a folder
    costs requests and racing creators make duplicates (Drive)."""
    make = getattr(storage, "make_dirs", None)
    if make is None:
        return False
    make(folder)
    return True


class wait_truncated_exponential(wait_base):  # noqa: N801 - named like tenacity's own wait strategies
    """Google's truncated exponential backoff: before retry n (1, 2, ...) wait
    ``min(first * 2**(n - 1) + U(0, jitter), cap)`` seconds: about 1, 2, 4, 8, 16, 32, 32 ... s with
    ``first = jitter = 1`` and ``cap = 32``.

    Source: Google Drive API, "Usage limits", section "Resolve time-based quota errors"
    (https://developers.google.com/workspace/drive/api/guides/limits#exponential): wait
    ``min((2^n + random_number_milliseconds), maximum_backoff)`` with n = 0, 1, 2 ..., the random part
    at most 1000 ms and ``maximum_backoff`` "typically 32 or 64 seconds".
    """

    def __init__(self, first: float = 1.0, cap: float = 32.0, jitter: float | None = None) -> None:
        self.first, self.cap = first, cap
        self.jitter = first if jitter is None else jitter

    def __call__(self, retry_state: object) -> float:
        n = max(1, getattr(retry_state, "attempt_number", 1))
        return min(self.first * 2 ** (n - 1) + random.uniform(0.0, self.jitter), self.cap)


def retrying(
    is_transient: Callable[[BaseException], bool],
    attempts: int,
    max_wait: float,
    min_seconds: float = 0.0,
    wait: wait_base | None = None,
) -> Retrying:
    """A tenacity policy: exponential backoff with jitter on transient errors only.

    It gives up after ``attempts`` tries, but not before ``min_seconds`` have passed: a burst of
    rate-limit answers can outlast a handful of quick retries. The default wait before retry n is
    uniform in ``[0, min(0.2 * 2**(n - 1), max_wait)]``; a backend passes ``wait`` to follow its
    service's own guidance (Drive: :class:`wait_truncated_exponential`).
    """
    stop = stop_after_attempt(attempts)
    if min_seconds > 0:
        stop = stop_all(stop, stop_after_delay(min_seconds))
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop,
        wait=wait if wait is not None else wait_random_exponential(multiplier=0.2, max=max_wait),
        before_sleep=before_sleep_log(logger, logging.WARNING),
        reraise=True,
    )
