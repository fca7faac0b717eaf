"""Google Drive v3 backend, on google-api-python-client: GDRIVE_PATH=gdrive://<folder-id>/<path>.

Drive is not a filesystem, and this backend turns its quirks into the storage contract:

- Names are not unique in a folder. Folders are resolved to one deterministic folder (the
  oldest by createdTime) when a race created duplicates; a reader faced with duplicate file
  names takes the newest by modifiedTime; a writer updates its file by id and removes the
  duplicates of its own files.
- Listings lag behind creates (reads by id do not): ids are cached, the node's own writes are
  merged into its listings, and the protocol's bounded waits retry what is still missing. A young
  folder (one a lagging node may still duplicate) is looked up again after half its age, at least
  RECHECK_YOUNG_S and at most until it is YOUNG_FOLDER_S old.
- An upload replaces a file's content whole, so a reader sees the old or the new content;
  downloads are checked against the md5 Drive reports.
- Rate limits, 5xx, dropped connections and transient token-refresh failures are retried with
  Google's truncated exponential backoff (about 1, 2, 4 ... 32 s, with jitter); other errors fail at
  once with a message that names the cause and the fix (:mod:`swarm_gdrive.storage.drive_errors`).

Operations: every thread has its own authorized HTTP connection (httplib2 is not thread-safe), so a
heartbeat never waits behind another thread's transfer. Files above 5 MiB go up resumable, in
chunks; a failed chunk is retried from the last byte Drive acknowledged, and a large download is
read by ranges, a failed range retried alone. A delete that Drive refuses for want of a role
(a shared drive's Content manager may trash, not delete) moves the file to the trash instead, or
leaves it with one warning. :func:`open_drive_storage` checks the root folder first: a wrong or
unshared id is one line naming GDRIVE_PATH.

Economy: ``fields`` is restricted to what is used, listings ask for 1000 entries a page and
one listing of a folder serves the reads of the files in it. The first write of a path looks for a
file of that name left by an earlier process of the node, except in a folder created after this
process first wrote (Drive's own clock): nothing of an earlier process can be there, and the write
is one request. :meth:`DriveStorage.make_dirs` lets the coordinator create a round's folders before
anyone writes into them, with no lookup under a folder it has just created itself. Every API call and byte is counted
in :attr:`DriveStorage.counters`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    Space,
    StorageError,
    StorageUnavailableError,
    is_temporary,
    listable_name,
    retrying,
    wait_truncated_exponential,
)
from swarm_gdrive.storage.drive_errors import (
    DriveAuthError,
    DriveError,
    DrivePermissionError,
    DriveQuotaError,
    describe_account,
    exhausted_message,
    explain,
    is_transient_drive_error,
)

__all__ = [
    "DriveAuthError",
    "DriveError",
    "DrivePermissionError",
    "DriveQuotaError",
    "DriveStorage",
    "build_service",
    "find_credentials",
    "is_transient_drive_error",
    "open_drive_storage",
    "parse_drive_url",
]

logger = logging.getLogger(__name__)


class _NoClientRetryNotes(logging.Filter):
    """googleapiclient logs a WARNING for every 403/429 it sees, even with its own retries off; this backend
    retries and reports those itself (once per refusal, with the fix), so the client's notes are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Encountered ")


logging.getLogger("googleapiclient.http").addFilter(_NoClientRetryNotes())

FOLDER_MIME = "application/vnd.google-apps.folder"
SCOPES = ["https://www.googleapis.com/auth/drive"]
RESUMABLE_ABOVE = 5 * 1024 * 1024
#: Chunk of a resumable upload and range of a chunked download: what one failure costs at most. A
#: multiple of 256 KiB, as Drive requires of every chunk but the last.
CHUNK_BYTES = 32 * 1024 * 1024
#: A folder younger than this may still get a duplicate from a node whose listing lags: re-check it.
YOUNG_FOLDER_S = 120.0
RECHECK_YOUNG_S = 2.0
#: A resumable session that Drive forgot (404/410 on a chunk) starts over, at most this many times.
MAX_SESSION_RESTARTS = 3
#: A small file also travels in its own listing entry, split over public ``properties`` (Drive allows 30 a file
#: and 124 UTF-8 bytes of key and value each): ``sg00`` .. ``sg23``, 120 printable ASCII characters each, so a
#: reader of the listing needs no download (the coordinator's reward and peer files, a worker's state: one
#: request a file saved, GDRIVE_IMPLEMENTATION.md §15.5). Public, not ``appProperties``: those are visible only
#: to the OAuth client that set them, and the nodes of a swarm may each use their own.
INLINE_PARTS = 24
INLINE_PART_CHARS = 120
INLINE_MAX_BYTES = INLINE_PARTS * INLINE_PART_CHARS
_INLINE_KEYS = tuple(f"sg{i:02d}" for i in range(INLINE_PARTS))
_FILE_FIELDS = "id,name,mimeType,size,md5Checksum,modifiedTime,createdTime,properties"
_LIST_FIELDS = f"nextPageToken,files({_FILE_FIELDS})"
#: Shared drives (where a service account can own files) need these on every request.
_ALL_DRIVES = {"supportsAllDrives": True}
_LIST_ALL_DRIVES = {"supportsAllDrives": True, "includeItemsFromAllDrives": True}


class _SessionLost(Exception):
    """Drive no longer knows a resumable upload session (404 or 410 on a chunk): start it again."""


@dataclass(frozen=True)
class _Entry:
    id: str
    name: str
    is_dir: bool
    size: int
    md5: str | None
    mtime: float
    ctime: float
    parent: str = ""
    inline: bytes | None = dataclasses.field(default=None, compare=False, repr=False)


def _time(value: str | None) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _entry(raw: dict[str, Any]) -> _Entry:
    return _Entry(
        raw["id"],
        raw["name"],
        raw.get("mimeType") == FOLDER_MIME,
        int(raw.get("size") or 0),
        raw.get("md5Checksum"),
        _time(raw.get("modifiedTime")),
        _time(raw.get("createdTime")),
        inline=_inline_of(raw),
    )


def inline_properties(data: bytes, clear: bool) -> dict[str, str | None]:
    """The ``properties`` that carry ``data`` in its listing entry (see :data:`INLINE_PARTS`). Data that cannot
    travel so (larger than :data:`INLINE_MAX_BYTES`, or not printable ASCII) gets none. With ``clear`` (an
    update), every key not used is sent as null, which deletes what an earlier content left there."""
    fits = 0 < len(data) <= INLINE_MAX_BYTES and all(0x20 <= b < 0x7F for b in data)
    text = data.decode("ascii") if fits else ""
    parts = [text[i : i + INLINE_PART_CHARS] for i in range(0, len(text), INLINE_PART_CHARS)]
    out: dict[str, str | None] = dict(zip(_INLINE_KEYS, parts, strict=False))
    if clear:
        out.update(dict.fromkeys(_INLINE_KEYS[len(parts) :]))
    return out


def _inline_of(raw: dict[str, Any]) -> bytes | None:
    """The content a listing entry carries in its properties, only if it is exactly the content Drive holds: its
    length is the listed size and its md5 the listed md5Checksum, which Drive computes from the bytes. Anything
    else (no properties, a stale copy left by a writer that does not set them, a forgery, malformed values) is
    None: the reader downloads instead."""
    try:
        props = raw.get("properties")
        if not isinstance(props, dict) or _INLINE_KEYS[0] not in props:
            return None
        parts: list[str] = []
        for key in _INLINE_KEYS:
            value = props.get(key)
            if value is None:
                break
            if not isinstance(value, str) or len(value) > INLINE_PART_CHARS or not value.isascii():
                return None
            parts.append(value)
        data = "".join(parts).encode("ascii")
        md5 = raw.get("md5Checksum")
        if not isinstance(md5, str) or len(data) != int(raw.get("size") or -1):
            return None
        return data if hashlib.md5(data).hexdigest() == md5 else None  # noqa: S324 - Drive's checksum is md5
    except Exception:  # noqa: BLE001 - whatever a listing holds, it only costs a download
        return None


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _http_factory_of(service: Any) -> Callable[[], Any] | None:
    """A maker of fresh authorized connections like the client's own, or None when its transport is
    not google-auth's (then every request goes through the client's one connection, under a lock).

    ``copy.copy`` of an ``httplib2.Http`` keeps its settings (timeout, proxy, certificates, redirect
    codes) and drops its open connections (``Http.__getstate__``).
    """
    import google_auth_httplib2

    base = getattr(service, "_http", None)
    if not isinstance(base, google_auth_httplib2.AuthorizedHttp):
        return None

    same = {  # the client's refresh settings, where this version of google-auth-httplib2 keeps them
        key: getattr(base, f"_{key}")
        for key in ("refresh_status_codes", "max_refresh_attempts")
        if hasattr(base, f"_{key}")
    }

    def make() -> Any:
        return google_auth_httplib2.AuthorizedHttp(base.credentials, http=copy.copy(base.http), **same)

    return make


class DriveStorage:
    """A :class:`~swarm_gdrive.storage.base.Storage` over a Drive folder, addressed by its id."""

    def __init__(
        self,
        root_folder_id: str,
        prefix: str = "",
        service: Any = None,
        retry_attempts: int = 7,
        retry_max_wait: float = 32.0,
        cache_ttl: float = 60.0,
        min_retry_s: float = 60.0,
        http_factory: Callable[[], Any] | None = None,
        location: str | None = None,
        account: str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.root_folder_id = root_folder_id
        self.prefix = [p for p in PurePosixPath(prefix).parts if p not in ("", "/")] if prefix else []
        self._service = service
        self._attempts = retry_attempts
        self._max_wait = retry_max_wait
        self._min_retry_s = min_retry_s
        # Google's guidance: 1, 2, 4 ... s plus up to 1 s of jitter, truncated at the cap (a test's small cap
        # scales the whole schedule down).
        first = min(1.0, retry_max_wait)
        self._wait = wait_truncated_exponential(first=first, cap=retry_max_wait, jitter=first)
        self._http_factory = http_factory
        self._local = threading.local()  # this thread's own connection
        self.location = location or "GDRIVE_PATH=gdrive://" + "/".join([root_folder_id, *self.prefix])
        self._account = account
        self.chunk_bytes = chunk_bytes
        self._lock = threading.RLock()
        self._resolving: dict[tuple[str, ...], threading.Lock] = {}  # folder path -> held while it is looked up
        self._suspect: set[str] = set()  # paths whose last write failed: Drive may hold a copy this node lost
        self._api_lock = threading.Lock()  # only for a client whose connection cannot be duplicated
        # folder path -> (ids of every folder at that path, oldest first; when resolved; newest createdTime)
        self._folders: dict[tuple[str, ...], tuple[list[str], float, float]] = {}
        self._oldest_ctime: dict[tuple[str, ...], float] = {}  # folder path -> createdTime of its oldest folder
        # Drive's clock when this process first wrote: a folder created later holds nothing of an earlier process.
        self._epoch: float | None = None
        self._listing: dict[str, dict[str, _Entry]] = {}  # folder id -> name -> entry (newest duplicate)
        self._listed_at: dict[str, float] = {}  # folder id -> when it was listed (monotonic)
        self._cache_ttl = cache_ttl  # ids are re-resolved after this long: folders can be moved (a reset)
        self._own: dict[tuple[str, str], _Entry] = {}  # (folder id, name) -> what this node wrote last
        self._own_by_path: dict[str, _Entry] = {}  # storage path -> the same entry
        self._appended: dict[str, bytes] = {}  # own append-only files: content, so an append is one upload
        self._warned: set[str] = set()
        self._shared_drive: bool | None = None  # the root lies in a shared drive (learnt by free_space)
        self.counters = {
            "api_calls": 0,
            "bytes_up": 0,
            "bytes_down": 0,
            "retries": 0,
            "trashed": 0,
            "deletes_refused": 0,
        }

    def describe(self) -> str:
        return f"Google Drive folder {self.root_folder_id}" + (f"/{'/'.join(self.prefix)}" if self.prefix else "")

    @property
    def service(self) -> Any:
        if self._service is None:
            self._service = build_service()
        return self._service

    @property
    def account(self) -> str:
        """Who the node signs in as, for messages."""
        if self._account is None:
            self._account = describe_account(getattr(getattr(self.service, "_http", None), "credentials", None))
        return self._account

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n
        if key == "api_calls":
            self._local.api_calls = getattr(self._local, "api_calls", 0) + n

    def thread_api_calls(self) -> int:
        """API calls made by the calling thread so far: what one storage call cost, while other threads (a
        heartbeat, concurrent downloads) make calls of their own."""
        return getattr(self._local, "api_calls", 0)

    # -- calls -------------------------------------------------------------------------------

    def _http(self) -> Any:
        """This thread's own authorized connection (made on first use), or None to share the client's."""
        http = getattr(self._local, "http", False)
        if http is False:
            factory = self._http_factory or _http_factory_of(self.service)
            http = factory() if factory is not None else None
            self._local.http = http
        return http

    def _execute(self, request: Any) -> Any:
        return self._bind(request)(lambda: request.execute(num_retries=0))

    def _bind(self, request: Any) -> Callable[[Callable[[], Any]], Any]:
        """Point ``request`` at this thread's connection; the returned runner runs a step of it (under the
        lock when the client's one connection is shared)."""
        http = self._http()
        if http is not None:
            request.http = http
            return lambda step: step()

        def locked(step: Callable[[], Any]) -> Any:
            with self._api_lock:  # one shared connection: httplib2 is not thread-safe
                return step()

        return locked

    def _call(self, request_factory: Any) -> Any:
        """Execute a request (built fresh per attempt), retrying transient failures only."""
        return self._retry(lambda: self._execute(request_factory()))

    def _retry(self, step: Callable[[], Any], upload: bool = False) -> Any:
        """Run ``step`` (one request), retrying transient failures with Google's backoff."""
        started = time.monotonic()
        try:
            for attempt in retrying(
                is_transient_drive_error, self._attempts, self._max_wait, self._min_retry_s, wait=self._wait
            ):
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        self._count("retries")
                    self._count("api_calls")
                    try:
                        return step()
                    except _SessionLost:
                        raise
                    except Exception as exc:
                        raise explain(exc, self.location, self.account) from exc
        except (StorageError, FileNotFoundError, FileTooLargeError, _SessionLost):
            raise
        except Exception as exc:  # retries exhausted on a transient error: an OSError callers handle
            message = exhausted_message(exc, self._attempts, time.monotonic() - started, upload)
            raise StorageUnavailableError(message) from exc
        raise StorageError("unreachable")  # pragma: no cover

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        """WARNING the first time, DEBUG after: a refusal that repeats every round is said once."""
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        logger.log(logging.WARNING if first else logging.DEBUG, message, *args)

    @contextlib.contextmanager
    def _root_guard(self, parent_id: str) -> Any:
        """A 404 on creating something in the root folder means the root is gone (deleted, unshared since the
        start): say that, naming GDRIVE_PATH, rather than 'not found'."""
        try:
            yield
        except FileNotFoundError:
            if parent_id == self.root_folder_id:
                self.check_root()
            raise

    def check_root(self) -> None:
        """Raise DriveError, naming GDRIVE_PATH and the fix, unless the root id is a folder this account
        can open (Drive answers 404 both for an unknown id and for a folder not shared with the account)."""
        try:
            meta = self._call(
                lambda: self.service.files().get(
                    **_ALL_DRIVES, fileId=self.root_folder_id, fields="id,name,mimeType,trashed"
                )
            )
        except FileNotFoundError:
            raise DriveError(
                f"{self.location}: Drive has no folder {self.root_folder_id} that {self.account} can open (404 "
                "notFound): check the id (what follows /folders/ in the folder's address in a browser) and share "
                f"the folder with {self.account} (Editor; in a shared drive, Manager)",
                404,
                frozenset({"notFound"}),
            ) from None
        if meta.get("mimeType") != FOLDER_MIME:
            raise DriveError(
                f"{self.location}: {self.root_folder_id} is a file ({meta.get('name')!r}), not a folder: use the id "
                "of the folder that holds experiments/"
            )
        if meta.get("trashed"):
            raise DriveError(
                f"{self.location}: the folder {meta.get('name')!r} is in Drive's trash: restore it, or use another"
            )

    def free_space(self) -> Space | None:
        """The signed-in account's room (``about.get`` storageQuota: limit minus usage, with what its trash holds);
        None for a folder in a shared drive (its files count against the organisation's pool, not the account)
        and for an account without a limit (free is then None). OSError as any call's."""
        with self._lock:
            shared = self._shared_drive
        if shared is None:
            meta = self._call(
                lambda: self.service.files().get(**_ALL_DRIVES, fileId=self.root_folder_id, fields="id,driveId")
            )
            shared = bool(meta.get("driveId"))
            with self._lock:
                self._shared_drive = shared
        if shared:
            return None
        about = self._call(lambda: self.service.about().get(fields="storageQuota"))
        quota = about.get("storageQuota") or {}

        def number(key: str) -> int | None:
            value = quota.get(key)
            return int(value) if isinstance(value, (str, int)) and str(value).isdigit() else None

        limit, usage = number("limit"), number("usage")
        free = None if limit is None or usage is None else max(0, limit - usage)
        return Space(free, limit, f"the Google Drive of {self.account}", trash=number("usageInDriveTrash"))

    # -- folders -----------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        parts = PurePosixPath(path).parts
        if not parts or PurePosixPath(path).is_absolute() or any(p in ("..", ".", "") for p in parts):
            raise ValueError(f"storage path must be relative and stay inside the root: {path!r}")
        return self.prefix + list(parts)

    def _folder(self, parts: list[str], create: bool) -> str | None:
        """The folder that writes go to: the oldest at ``parts``, created (idempotently) if asked."""
        ids = self._folder_ids(parts, create)
        return ids[0] if ids else None

    def folder_id(self, create: bool = False) -> str | None:
        """The id of the folder this storage addresses (its prefix under the root; the oldest of duplicates),
        created first when ``create``; None when it does not exist. What another account needs to join."""
        return self._folder(self.prefix, create) if self.prefix else self.root_folder_id

    def _folder_ids(self, parts: list[str], create: bool = False) -> list[str]:
        """Every folder at ``parts``, oldest first: a race (or a lagging listing) can make duplicates,
        and readers look in all of them, so a file written into a duplicate is never lost.

        Resolutions are cached; a young folder (created in the last YOUNG_FOLDER_S seconds, when
        another node may still be creating a duplicate it cannot see yet) is looked up again after
        RECHECK_YOUNG_S, an old one after ``cache_ttl``.
        """
        current = [self.root_folder_id]
        for depth, name in enumerate(parts):
            key = tuple(parts[: depth + 1])
            with self._lock:
                cached = self._folders.get(key)
            if cached is not None and not self._expired(*cached[1:]):
                current = cached[0]
                continue
            with self._resolving_lock(key):  # threads reading one folder's files at once look it up once, not each
                with self._lock:
                    cached = self._folders.get(key)
                if cached is not None and not self._expired(*cached[1:]):
                    current = cached[0]
                    continue
                found = sorted(
                    (e for pid in current for e in self._find_folders(pid, name)), key=lambda e: (e.ctime, e.id)
                )
                if not found and create:
                    with self._root_guard(current[0]):
                        found = [self._create_folder(current[0], name)]
                if not found:
                    return []
                self._remember_folders(key, found)
            current = [e.id for e in found]
        return current

    def _resolving_lock(self, key: tuple[str, ...]) -> threading.Lock:
        """The lock held while the folder path ``key`` is looked up: one per path, so a heartbeat's lookup never
        waits behind another folder's."""
        with self._lock:
            return self._resolving.setdefault(key, threading.Lock())

    def _remember_folders(self, key: tuple[str, ...], found: list[_Entry]) -> None:
        with self._lock:
            self._folders[key] = ([e.id for e in found], time.monotonic(), max(e.ctime for e in found))
            self._oldest_ctime[key] = min(e.ctime for e in found)

    def _expired(self, resolved_at: float, youngest_ctime: float) -> bool:
        """A resolution is looked up again after ``cache_ttl``; a young folder's (a lagging node may still create a
        duplicate of it) after half the folder's age, at least RECHECK_YOUNG_S: the chance of a duplicate falls as
        every node's listing catches up, and so does how often it is looked for."""
        since = time.monotonic() - resolved_at
        age = time.time() - youngest_ctime
        if age < YOUNG_FOLDER_S:
            return since > max(RECHECK_YOUNG_S, age / 2)
        return since > self._cache_ttl

    def make_dirs(self, folder: str) -> None:
        """Create ``folder`` and its missing parents ahead of the writes into it (the coordinator's round folders).

        Each missing level costs a lookup and a create, and a level under one this call created costs the create
        only: nobody else can have made a folder inside one that did not exist a moment ago. Unlike a writer's
        creation, there is no second lookup for a racing duplicate: the caller is the folders' designated creator,
        and a duplicate made by a lagging writer is found by the readers' re-checks of young folders.
        """
        parts = self._parts(folder)
        current: list[str] = [self.root_folder_id]
        created_parent = False
        for depth, name in enumerate(parts):
            key = tuple(parts[: depth + 1])
            with self._lock:
                cached = self._folders.get(key)
            if cached is not None and not created_parent:
                current, created_parent = cached[0], False
                continue
            found = [] if created_parent else [e for pid in current for e in self._find_folders(pid, name)]
            created_parent = not found
            if not found:
                body = {"name": name, "mimeType": FOLDER_MIME, "parents": [current[0]]}
                with self._root_guard(current[0]):
                    raw = self._call(
                        lambda body=body: self.service.files().create(**_ALL_DRIVES, body=body, fields=_FILE_FIELDS)
                    )
                found = [_entry(raw)]
                self._note_epoch(found[0].ctime)
            found.sort(key=lambda e: (e.ctime, e.id))
            self._remember_folders(key, found)
            current = [e.id for e in found]

    def prefetch_folders(self, folders: list[str]) -> None:
        """Resolve several folder paths at once, level by level: a level the paths share by name under different
        parents (``round_5`` under ``rewards/`` and ``rollouts/``) is one query for all of them
        (``('a' in parents or 'b' in parents)``). Missing folders are left missing (writers create them);
        what is cached and fresh costs nothing."""
        pending = [self._parts(folder) for folder in folders]
        depth = 0
        # No lock: a lookup racing another thread's only repeats it.
        while pending:
            todo: dict[str, list[tuple[list[str], list[str]]]] = {}
            resolved: list[list[str]] = []
            for parts in pending:
                if depth >= len(parts):
                    continue
                with self._lock:
                    cached = self._folders.get(tuple(parts[: depth + 1]))
                    parent = self._folders.get(tuple(parts[:depth])) if depth else None
                if cached is not None and not self._expired(*cached[1:]):
                    resolved.append(parts)
                    continue
                if depth and parent is None:  # forgotten meanwhile (a move, a removal): left to the writer
                    continue
                parent_ids = parent[0] if parent is not None else [self.root_folder_id]
                todo.setdefault(parts[depth], []).append((parts, parent_ids))
            for name, items in todo.items():
                found = self._find_folders_under(sorted({p for _, ids in items for p in ids}), name)
                for parts, ids in items:
                    mine = sorted((e for e in found if e.parent in ids), key=lambda e: (e.ctime, e.id))
                    if mine:
                        self._remember_folders(tuple(parts[: depth + 1]), mine)
                        resolved.append(parts)
            pending = resolved
            depth += 1

    def _find_folders_under(self, parents: list[str], name: str) -> list[_Entry]:
        """Folders named ``name`` in any of ``parents`` (one query), each with the parent it was found in."""
        if len(parents) == 1:
            return [dataclasses.replace(e, parent=parents[0]) for e in self._find_folders(parents[0], name)]
        within = " or ".join(f"{_quote(p)} in parents" for p in parents)
        q = f"({within}) and name = {_quote(name)} and mimeType = '{FOLDER_MIME}' and trashed = false"
        out: list[_Entry] = []
        token = None
        wanted = set(parents)
        while True:
            page = self._call(
                lambda token=token: self.service.files().list(
                    q=q,
                    pageSize=1000,
                    pageToken=token,
                    fields=f"nextPageToken,files({_FILE_FIELDS},parents)",
                    spaces="drive",
                    **_LIST_ALL_DRIVES,
                )
            )
            for raw in page.get("files", []):
                parent = next((p for p in raw.get("parents", []) if p in wanted), None)
                if parent is not None:
                    out.append(dataclasses.replace(_entry(raw), parent=parent))
            token = page.get("nextPageToken")
            if not token:
                return out

    def _note_epoch(self, server_time: float) -> None:
        with self._lock:
            if self._epoch is None and server_time > 0:
                self._epoch = server_time

    def _fresh_since_epoch(self, folder_parts: list[str]) -> bool:
        """True if every folder at ``folder_parts`` was created after this process first wrote (Drive's clock)."""
        with self._lock:
            oldest = self._oldest_ctime.get(tuple(folder_parts))
            return self._epoch is not None and oldest is not None and oldest > self._epoch

    def _find_folders(self, parent: str, name: str) -> list[_Entry]:
        q = f"{_quote(parent)} in parents and name = {_quote(name)} and mimeType = '{FOLDER_MIME}' and trashed = false"
        return self._list_query(q)

    def _create_folder(self, parent: str, name: str) -> _Entry:
        body = {"name": name, "mimeType": FOLDER_MIME, "parents": [parent]}
        created = _entry(self._call(lambda: self.service.files().create(**_ALL_DRIVES, body=body, fields=_FILE_FIELDS)))
        self._note_epoch(created.ctime)
        # Another node may have created the same folder meanwhile: settle on the oldest one we can see.
        seen = self._find_folders(parent, name)
        return min(seen + [created], key=lambda e: (e.ctime, e.id))

    def _list_query(self, q: str) -> list[_Entry]:
        out: list[_Entry] = []
        token = None
        while True:
            page = self._call(
                lambda token=token: self.service.files().list(
                    q=q, pageSize=1000, pageToken=token, fields=_LIST_FIELDS, spaces="drive", **_LIST_ALL_DRIVES
                )
            )
            out += [_entry(raw) for raw in page.get("files", [])]
            token = page.get("nextPageToken")
            if not token:
                return out

    def _children(self, folder_id: str) -> dict[str, _Entry]:
        """One listing of a folder, duplicates resolved (newest modifiedTime), own writes merged in."""
        newest: dict[str, _Entry] = {}
        for raw in self._list_query(f"{_quote(folder_id)} in parents and trashed = false"):
            entry = dataclasses.replace(raw, parent=folder_id)
            current = newest.get(entry.name)
            if current is None or (entry.mtime, entry.id) > (current.mtime, current.id):
                newest[entry.name] = entry
        with self._lock:
            for (parent, name), own in self._own.items():
                if parent == folder_id and (name not in newest or newest[name].mtime < own.mtime):
                    newest[name] = own  # the listing lags behind our own write
            self._listing[folder_id] = newest
            self._listed_at[folder_id] = time.monotonic()
        return newest

    def _children_all(self, parts: list[str]) -> dict[str, _Entry]:
        """The union of the children of every folder at ``parts``; on a name clash the newest wins."""
        merged: dict[str, _Entry] = {}
        for folder_id in self._folder_ids(parts):
            for name, entry in self._children(folder_id).items():
                if name not in merged or (entry.mtime, entry.id) > (merged[name].mtime, merged[name].id):
                    merged[name] = entry
        return merged

    # -- Storage -----------------------------------------------------------------------------

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        entries = self._children_all(self._parts(folder)).values()
        return sorted(
            (
                FileInfo(e.name, e.size, e.mtime, e.is_dir, e.md5, e.inline)
                for e in entries
                if (include_hidden or not is_temporary(e.name)) and listable_name(folder, e.name)
            ),
            key=lambda info: info.name,
        )

    def _locate(self, parts: list[str]) -> _Entry | None:
        """The newest file named ``parts[-1]`` in any folder at ``parts[:-1]`` (cached listings first)."""
        name = parts[-1]
        folder_ids = self._folder_ids(parts[:-1])
        best: _Entry | None = None
        stale = False
        with self._lock:
            for folder_id in folder_ids:
                fresh = time.monotonic() - self._listed_at.get(folder_id, float("-inf")) < self._cache_ttl
                stale |= not fresh
                for entry in (
                    (self._listing.get(folder_id, {}).get(name) if fresh else None),
                    self._own.get((folder_id, name)),
                ):
                    if entry is not None and (best is None or (entry.mtime, entry.id) > (best.mtime, best.id)):
                        best = entry
        if best is None or stale:
            best = self._children_all(parts[:-1]).get(name) or best
        if best is None:  # maybe a duplicate folder appeared since the folder ids were cached
            with self._lock:
                self._folders.pop(tuple(parts[:-1]), None)
            best = self._children_all(parts[:-1]).get(name)
        return best

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        parts = self._parts(path)
        entry = self._locate(parts)
        if entry is None or entry.is_dir:
            raise FileNotFoundError(path)
        try:
            return self._download(entry, max_bytes, path)
        except FileNotFoundError:  # stale id (deleted or replaced): look again once
            with self._lock:
                self._listing.clear()
                self._listed_at.clear()
            fresh = self._children_all(parts[:-1]).get(parts[-1])
            if fresh is None or fresh.id == entry.id:
                raise FileNotFoundError(path) from None
            return self._download(fresh, max_bytes, path)

    def _download(self, entry: _Entry, max_bytes: int, path: str) -> bytes:
        """The file's bytes, checked against Drive's md5.

        A mismatch is either a listing older than the content or a file rewritten between the
        download and the metadata call; the file is read again. A file its writer keeps
        rewriting (a heartbeat under a rate-limit storm) may never line up: when Drive reported a
        different md5 each time, the mismatch is explained by the rewrites and the last download,
        a whole revision, is returned. The same md5 reported twice against other bytes is
        corruption and raises.
        """
        expected, size = entry.md5, entry.size
        reported: list[str | None] = []
        data = b""
        for attempt in range(5):
            if attempt > 1:  # the file is being rewritten as we read: back off a little before the next try
                time.sleep(min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
            if size > max_bytes:
                raise FileTooLargeError(path, size, max_bytes)
            data = self._fetch(entry.id, size, max_bytes, path)
            self._count("bytes_down", len(data))
            if len(data) > max_bytes:
                raise FileTooLargeError(path, len(data), max_bytes)
            digest = hashlib.md5(data).hexdigest()  # noqa: S324 - Drive's checksum is md5
            if expected is None or digest == expected:
                return data
            meta = self._call(
                lambda: self.service.files().get(**_ALL_DRIVES, fileId=entry.id, fields="md5Checksum,size")
            )
            if meta.get("md5Checksum") == digest:
                self._refresh_cached(entry, digest, len(data))
                return data
            if meta.get("md5Checksum") in reported:
                raise StorageError(f"{path}: the download does not match the md5 Drive reports; try again")
            reported.append(meta.get("md5Checksum"))
            expected, size = meta.get("md5Checksum"), int(meta.get("size") or 0)
        logger.info(
            "%s changed on every read (%d revisions seen): using the last complete download", path, len(reported)
        )
        return data

    def _fetch(self, file_id: str, size: int, max_bytes: int, path: str) -> bytes:
        """One download: a single request up to ``chunk_bytes``, else by ranges of ``chunk_bytes``, each
        retried alone, so a failure midway costs one range, not the file."""
        if size <= self.chunk_bytes:
            # A range of at most max_bytes + 1, also for a file listed empty: one rewritten larger since it was
            # listed is not downloaded whole (an empty file answers 416, read as no bytes).
            return self._media(file_id, 0, max_bytes + 1)
        from googleapiclient.http import MediaIoBaseDownload

        request = self.service.files().get_media(**_ALL_DRIVES, fileId=file_id)
        run = self._bind(request)
        buffer = io.BytesIO()
        downloader = MediaIoBaseDownload(buffer, request, chunksize=self.chunk_bytes)
        done = False
        while not done:
            status, done = self._retry(lambda: run(lambda: downloader.next_chunk(num_retries=0)))
            if (status.total_size or 0) > max_bytes or buffer.tell() > max_bytes:
                raise FileTooLargeError(path, max(status.total_size or 0, buffer.tell()), max_bytes)
        return buffer.getvalue()

    def _media(self, file_id: str, start: int, length: int) -> bytes:
        """``length`` bytes of the file from ``start`` (fewer at its end; none past it): one ranged GET, retried."""

        def request() -> Any:
            get = self.service.files().get_media(**_ALL_DRIVES, fileId=file_id)
            get.headers["Range"] = f"bytes={start}-{start + length - 1}"
            return get

        try:
            data = self._call(request)
        except DriveError as exc:
            if exc.status == 416:  # the range starts past the end: the file is shorter than that
                return b""
            raise
        return data if isinstance(data, bytes) else bytes(data)

    def read_chunks(self, path: str, max_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The file in ranged downloads of at most ``chunk_bytes`` (:func:`~swarm_gdrive.storage.base.read_chunks`),
        for a file too large to hold in memory. Drive's own ``size`` is checked against ``max_bytes`` before a byte
        is downloaded, and no more than that size is ever requested; each range is retried alone. Drive's md5 is
        not checked: the caller checks its own digest of what it streamed (a checkpoint's sha256)."""
        entry = self._locate(self._parts(path))
        if entry is None or entry.is_dir:
            raise FileNotFoundError(path)
        if entry.size > max_bytes:
            raise FileTooLargeError(path, entry.size, max_bytes)
        offset = 0
        while offset < entry.size:
            chunk = self._media(entry.id, offset, min(chunk_bytes, entry.size - offset))
            self._count("bytes_down", len(chunk))
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    def _refresh_cached(self, entry: _Entry, md5: str, size: int) -> None:
        """Remember a file's new checksum, so the next read of it costs one call, not two."""
        with self._lock:
            listed = self._listing.get(entry.parent, {})
            if entry.name in listed and listed[entry.name].id == entry.id:
                listed[entry.name] = dataclasses.replace(listed[entry.name], md5=md5, size=size, inline=None)

    def write_bytes(self, path: str, data: bytes) -> None:
        parts = self._parts(path)
        data = bytes(data)
        with self._lock:
            own = self._own_by_path.get(path)
            suspect = path in self._suspect
        if own is None and not suspect and self._folder_ids(parts[:-1]) and self._fresh_since_epoch(parts[:-1]):
            existing = None  # a folder younger than this process's first write holds no earlier process's file
        else:
            existing = own if own is not None else self._own_file(parts)
        try:
            self._write_entry(path, parts, data, existing)
        except BaseException:
            with self._lock:  # a create whose answer was lost may have left a copy: the next write looks first
                self._suspect.add(path)
            raise
        with self._lock:
            self._suspect.discard(path)

    def _write_entry(self, path: str, parts: list[str], data: bytes, existing: _Entry | None) -> None:
        name = parts[-1]
        files = self.service.files()
        if existing is None:
            folder_id = self._folder(parts[:-1], create=True)
            assert folder_id is not None
            body: dict[str, Any] = {"name": name, "parents": [folder_id]}
            if properties := inline_properties(data, clear=False):
                body["properties"] = properties
            with self._root_guard(folder_id):
                raw = self._upload(
                    lambda media: files.create(**_ALL_DRIVES, body=body, media_body=media, fields=_FILE_FIELDS), data
                )
        else:
            folder_id = existing.parent
            body = {"properties": inline_properties(data, clear=True)}
            raw = self._upload(
                lambda media: files.update(
                    **_ALL_DRIVES, fileId=existing.id, body=body, media_body=media, fields=_FILE_FIELDS
                ),
                data,
            )
        self._count("bytes_up", len(data))
        entry = dataclasses.replace(_entry(raw), parent=folder_id)
        self._note_epoch(entry.mtime)
        with self._lock:
            self._own[(folder_id, name)] = entry
            self._own_by_path[path] = entry
            self._listing.setdefault(folder_id, {})[name] = entry

    def _upload(self, make_request: Callable[[Any], Any], data: bytes) -> dict[str, Any]:
        """Upload ``data`` with the request ``make_request(media)`` builds: whole in one request up to
        RESUMABLE_ABOVE, else in a resumable session whose chunks are retried one by one: after a failed
        chunk the client asks Drive how much it holds and goes on from there (googleapiclient's
        ``next_chunk`` in its error state), so a failure costs one chunk, not the file."""
        from googleapiclient.http import MediaIoBaseUpload

        def media(resumable: bool) -> Any:
            return MediaIoBaseUpload(
                io.BytesIO(data), mimetype="application/octet-stream", resumable=resumable, chunksize=self.chunk_bytes
            )

        if len(data) <= RESUMABLE_ABOVE:
            return self._retry(lambda: self._execute(make_request(media(False))), upload=True)
        for _ in range(MAX_SESSION_RESTARTS + 1):
            request = make_request(media(True))
            try:
                return self._chunks(request, self._bind(request))
            except _SessionLost:
                logger.info("Drive forgot a resumable upload session: starting the upload again")
        raise StorageUnavailableError(f"Drive lost {MAX_SESSION_RESTARTS + 1} upload sessions in a row; try again")

    def _chunks(self, request: Any, run: Callable[[Callable[[], Any]], Any]) -> dict[str, Any]:
        from googleapiclient.errors import HttpError

        def step() -> Any:
            session = request.resumable_uri
            try:
                return run(lambda: request.next_chunk(num_retries=0))[1]
            except HttpError as exc:
                if session is not None and exc.resp.status in (404, 410):
                    raise _SessionLost from exc
                raise

        while True:
            done = self._retry(step, upload=True)
            if done is not None:
                return done

    def _own_file(self, parts: list[str]) -> _Entry | None:
        """The file to update for a path this node writes: the newest of its name in any duplicate of its
        folder. One writer per file, so every other copy is a stale duplicate of ours and is removed."""
        found: list[_Entry] = []
        for folder_id in self._folder_ids(parts[:-1]):
            q = f"{_quote(folder_id)} in parents and name = {_quote(parts[-1])} and trashed = false"
            found += [dataclasses.replace(e, parent=folder_id) for e in self._list_query(q)]
        found.sort(key=lambda e: (e.mtime, e.id), reverse=True)
        for duplicate in found[1:]:
            logger.info("removing a duplicate %s (%s)", "/".join(parts), duplicate.id)
            self._delete_id(duplicate.id, "/".join(parts))
        return found[0] if found else None

    def _delete_id(self, file_id: str, what: str) -> bool:
        """Delete for good; if Drive refuses for want of a role, move to the trash; if that is refused too,
        leave the file and say so once. Never raises for a refusal (pruning and cleanup go on); False when
        the file is still there."""
        try:
            self._call(lambda: self.service.files().delete(**_ALL_DRIVES, fileId=file_id))
            return True
        except FileNotFoundError:  # already gone is what we wanted
            return True
        except DrivePermissionError as refused:
            why = ", ".join(sorted(refused.reasons)) or "403"
        try:
            self._call(
                lambda: self.service.files().update(**_ALL_DRIVES, fileId=file_id, body={"trashed": True}, fields="id")
            )
        except FileNotFoundError:
            return True
        except DrivePermissionError:
            self._count("deletes_refused")
            self._warn_once(
                "keep",
                "Drive refused to delete or trash %s (%s): left in place; deletes (retention, checkpoint pruning) "
                "need %s to be Manager of the shared drive, or the files' owner in a My Drive (docs/storage.md)",
                what,
                why,
                self.account,
            )
            return False
        self._count("trashed")
        self._warn_once(
            "trash",
            "Drive refused to delete %s (%s): moved it to Drive's trash instead, where it still counts against the "
            "storage quota for 30 days; give %s the Manager role of the shared drive so that deletes are permanent "
            "(docs/storage.md)",
            what,
            why,
            self.account,
        )
        return True

    def append_bytes(self, path: str, data: bytes) -> None:
        with self._lock:
            current = self._appended.get(path)
        if current is None:
            try:
                current = self.read_bytes(path, 1 << 40)
            except FileNotFoundError:
                current = b""
        content = current + bytes(data)
        self.write_bytes(path, content)  # one writer per log file: read-modify-write is safe
        with self._lock:
            self._appended[path] = content

    def delete(self, path: str) -> None:
        parts = self._parts(path)
        for folder_id in self._folder_ids(parts[:-1]):
            q = f"{_quote(folder_id)} in parents and name = {_quote(parts[-1])} and trashed = false"
            for entry in self._list_query(q):
                self._delete_id(entry.id, path)
            with self._lock:
                self._own.pop((folder_id, parts[-1]), None)
                self._listing.get(folder_id, {}).pop(parts[-1], None)
        with self._lock:
            self._own_by_path.pop(path, None)
            self._appended.pop(path, None)

    def remove_empty_dir(self, folder: str) -> bool:
        parts = self._parts(folder)
        ids = self._folder_ids(parts)
        if any(self._list_query(f"{_quote(fid)} in parents and trashed = false") for fid in ids):
            return False
        gone = [self._delete_id(folder_id, folder) for folder_id in ids]
        self._forget_folder(parts)
        return all(gone)

    def move(self, src: str, dst: str) -> None:
        src_parts, dst_parts = self._parts(src), self._parts(dst)
        entry = self._locate(src_parts)
        if entry is None:
            raise FileNotFoundError(src)
        dst_parent = self._folder(dst_parts[:-1], create=True)
        # Within one folder only the name changes: the same id in addParents and removeParents is a no-op at
        # best and refused at worst.
        parents = {} if dst_parent == entry.parent else {"addParents": dst_parent, "removeParents": entry.parent}
        self._call(
            lambda: self.service.files().update(
                **_ALL_DRIVES, fileId=entry.id, body={"name": dst_parts[-1]}, fields="id", **parents
            )
        )
        with self._lock:
            self._own.pop((entry.parent, src_parts[-1]), None)
            self._own_by_path.pop(src, None)
            self._listing.pop(entry.parent, None)
            self._listing.pop(dst_parent, None)
        if entry.is_dir:
            self._forget_folder(src_parts)

    def _forget_folder(self, parts: list[str]) -> None:
        """Drop what is cached at and under a folder that moved or vanished, and its parent's listing.

        The rest of the cache stays: a node that removes an emptied round folder keeps its folder ids
        and the content of its append-only logs, so its next flush is one upload, not a download.
        """
        key = tuple(parts)

        def under(path: str) -> bool:
            return tuple(self._parts(path))[: len(key)] == key

        with self._lock:
            gone = [k for k in self._folders if k[: len(key)] == key]
            ids = {fid for k in gone for fid in self._folders[k][0]}
            parent = self._folders.get(key[:-1])
            parent_ids = parent[0] if parent else [self.root_folder_id] if len(key) == 1 else []
            for k in gone:
                del self._folders[k]
                self._oldest_ctime.pop(k, None)
            for folder_id in ids.union(parent_ids):  # the parent's listing still shows the folder
                self._listing.pop(folder_id, None)
                self._listed_at.pop(folder_id, None)
            self._own = {k: e for k, e in self._own.items() if k[0] not in ids}
            self._own_by_path = {p: e for p, e in self._own_by_path.items() if not under(p)}
            self._appended = {p: d for p, d in self._appended.items() if not under(p)}


def parse_drive_url(url: str) -> tuple[str, str]:
    """``gdrive://<folder-id>/a/b`` -> (folder id, "a/b")."""
    rest = url[len("gdrive://") :]
    folder_id, _, prefix = rest.partition("/")
    return folder_id, prefix.strip("/")


def open_drive_storage(
    location: str,
    credentials_file: str | None = None,
    token_file: str | None = None,
    api_url: str | None = None,
    **options: Any,
) -> DriveStorage:
    """A :class:`DriveStorage` on ``gdrive://<folder-id>/<path>`` whose root is checked first: a wrong or
    unshared folder id is a DriveError (one line naming GDRIVE_PATH and the fix), before anything runs."""
    folder_id, prefix = parse_drive_url(location)
    service = build_service(credentials_file, token_file, api_url)
    storage = DriveStorage(folder_id, prefix, service=service, location=f"GDRIVE_PATH={location}", **options)
    storage.check_root()
    return storage


def build_service(
    credentials_file: str | None = None, token_file: str | None = None, api_url: str | None = None, http: Any = None
) -> Any:
    """A Drive v3 client with the first credentials found (see :func:`find_credentials`), or on ``http``,
    an already authorized ``httplib2.Http`` (PyDrive2's)."""
    from googleapiclient.discovery import build, build_from_document

    _quiet_per_request_timeout_warning()
    auth: dict[str, Any]
    if http is not None:
        if api_url is not None:
            check_credentialed_url(api_url)  # an authorized http carries the sign-in's token
        auth = {"http": http}
    elif api_url is not None and not (credentials_file or token_file) and not _in_colab():
        # Another endpoint (a proxy, the test emulator) and no key: do not look for Google's default
        # credentials, which would probe the cloud metadata server. In Colab the sign-in's credentials are
        # there (find_credentials): a proxy there carries them.
        from google.auth.credentials import AnonymousCredentials

        logger.warning("GDRIVE_API_URL is set and no credentials are: talking to %s anonymously", api_url)
        auth = {"credentials": AnonymousCredentials()}
    else:
        if api_url is not None:
            check_credentialed_url(api_url)
        auth = {"credentials": find_credentials(credentials_file, token_file)}
    if api_url is None:
        return build("drive", "v3", cache_discovery=False, **auth)
    import googleapiclient

    doc_path = PurePosixPath(googleapiclient.__file__).parent / "discovery_cache/documents/drive.v3.json"
    doc = json.loads(open(doc_path, encoding="utf-8").read())  # noqa: SIM115
    doc["rootUrl"] = api_url if api_url.endswith("/") else api_url + "/"
    return build_from_document(doc, **auth)


_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def check_credentialed_url(api_url: str) -> None:
    """Refuse a GDRIVE_API_URL that would carry Google credentials (a bearer token for the whole Drive) in the
    clear: only ``https://`` or plain ``http://`` to this machine's loopback address (a local proxy or emulator)."""
    from urllib.parse import urlsplit

    parts = urlsplit(api_url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host:
        return
    if parts.scheme == "http" and (host in _LOOPBACK_HOSTS or host.startswith("127.")):
        return
    raise ValueError(
        f"GDRIVE_API_URL={api_url!r} would receive your Google credentials (a token for your whole Drive) "
        "unencrypted or at an address that is not a URL: use an https:// endpoint, or http:// on this machine "
        "(localhost, 127.0.0.1, ::1); unset GDRIVE_API_URL to talk to Google"
    )


def _in_colab() -> bool:
    """A Colab runtime (``google.colab`` importable): its sign-in's credentials are the default ones."""
    import importlib.util

    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False


class _PerRequestTimeoutFilter(logging.Filter):
    """Drops google-auth-httplib2's "httplib2 transport does not support per-request timeout" warning.

    google-auth passes a timeout to the transport on some of its own requests (refreshing or probing the
    credentials); httplib2 takes its timeout when the connection is made instead, which googleapiclient does
    (``build_http``: 60 s, or ``socket.getdefaulttimeout()``), so every request of this client has one. The
    warning (4-6 a notebook in Colab, shown red as stderr) reads like an error and asks nothing of the user.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "does not support per-request timeout" not in record.getMessage()


_TIMEOUT_FILTER = _PerRequestTimeoutFilter()


def _quiet_per_request_timeout_warning() -> None:
    log = logging.getLogger("google_auth_httplib2")
    if _TIMEOUT_FILTER not in log.filters:
        log.addFilter(_TIMEOUT_FILTER)


def _key_file_credentials(path: str) -> Any:
    """A service account's key or an authorized-user file, by its ``type``. Other kinds (external accounts
    run a command to get a token) are refused rather than loaded generically."""
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    try:
        with open(path, encoding="utf-8") as fh:
            kind = json.load(fh).get("type")
    except (OSError, ValueError, AttributeError) as exc:
        raise DriveAuthError(f"GOOGLE_APPLICATION_CREDENTIALS={path}: not a readable JSON key file ({exc})") from None
    if kind == "service_account":
        return service_account.Credentials.from_service_account_file(path, scopes=SCOPES)
    if kind == "authorized_user":
        return user_credentials.Credentials.from_authorized_user_file(path, scopes=SCOPES)
    raise DriveAuthError(
        f"GOOGLE_APPLICATION_CREDENTIALS={path}: a key file of type {kind!r}; use a service account's JSON key "
        "(type service_account) or an authorized-user file (type authorized_user)"
    )


def find_credentials(credentials_file: str | None, token_file: str | None) -> Any:
    """Service-account or authorized-user JSON, else Colab's or the machine's default credentials."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    if credentials_file:
        return _key_file_credentials(credentials_file)
    if token_file:
        from google.oauth2.credentials import Credentials

        return Credentials.from_authorized_user_file(token_file, scopes=SCOPES)
    try:
        from google.colab import auth  # type: ignore[import-not-found]

        auth.authenticate_user()
    except ImportError:
        pass
    try:
        credentials, _ = google.auth.default(scopes=SCOPES)
        return credentials
    except DefaultCredentialsError:
        raise DriveAuthError(
            "no Google credentials for GDRIVE_PATH=gdrive://...: set GOOGLE_APPLICATION_CREDENTIALS to a service "
            "account's JSON key (and share the folder with its e-mail), or GDRIVE_TOKEN_FILE to an authorized-user "
            "token file, or run in Colab (it asks you to sign in); see docs/storage.md"
        ) from None
