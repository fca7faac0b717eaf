"""Google Drive v3 backend, on google-api-python-client: GDRIVE_PATH=gdrive://<folder-id>/<path>.

Drive is not a filesystem, and this backend turns its quirks into the storage contract:

- Names are not unique in a folder. Folders are resolved to one deterministic folder (the
  oldest by createdTime) when a race created duplicates; a reader faced with duplicate file
  names takes the newest by modifiedTime; a writer updates its file by id and removes the
  duplicates of its own files.
- Listings lag behind creates (reads by id do not): ids are cached, the node's own writes are
  merged into its listings, and the protocol's bounded waits retry what is still missing.
- An upload replaces a file's content whole, so a reader sees the old or the new content;
  downloads are checked against the md5 Drive reports.
- Rate limits (403 userRateLimitExceeded / rateLimitExceeded, 429), 5xx and dropped
  connections are retried with exponential backoff and jitter (tenacity); 404, a 403 for
  missing permission, 400 and 401 fail at once with a message that says what to fix.

Economy: ``fields`` is restricted to what is used, listings ask for 1000 entries a page and
one listing of a folder serves the reads of the files in it; uploads above 5 MB are resumable.
Every API call and byte is counted in :attr:`DriveStorage.counters`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from swarm_gdrive.storage.base import (
    DEFAULT_MAX_READ_BYTES,
    FileInfo,
    FileTooLargeError,
    StorageError,
    StorageUnavailableError,
    is_temporary,
    retrying,
)

logger = logging.getLogger(__name__)

FOLDER_MIME = "application/vnd.google-apps.folder"
SCOPES = ["https://www.googleapis.com/auth/drive"]
RESUMABLE_ABOVE = 5 * 1024 * 1024
#: A folder younger than this may still get a duplicate from a node whose listing lags: re-check it.
YOUNG_FOLDER_S = 120.0
RECHECK_YOUNG_S = 2.0
_FILE_FIELDS = "id,name,mimeType,size,md5Checksum,modifiedTime,createdTime"
_LIST_FIELDS = f"nextPageToken,files({_FILE_FIELDS})"
#: Shared drives (where a service account can own files) need these on every request.
_ALL_DRIVES = {"supportsAllDrives": True}
_LIST_ALL_DRIVES = {"supportsAllDrives": True, "includeItemsFromAllDrives": True}
_RETRY_REASONS = {"userRateLimitExceeded", "rateLimitExceeded", "backendError", "internalError"}


class DriveError(StorageError):
    """A Drive error that retrying cannot fix; the message says what to do."""


class DriveAuthError(DriveError):
    """No usable credentials; the message says how to get some."""


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
    )


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _http_status(exc: BaseException) -> int | None:
    resp = getattr(exc, "resp", None)
    return int(resp.status) if resp is not None and getattr(resp, "status", None) else None


def _reasons(exc: BaseException) -> set[str]:
    try:
        payload = json.loads(exc.content.decode("utf-8"))  # type: ignore[attr-defined]
        return {e.get("reason", "") for e in payload.get("error", {}).get("errors", [])}
    except Exception:  # noqa: BLE001 - an unparseable body simply has no reasons
        return set()


def is_transient_drive_error(exc: BaseException) -> bool:
    """Rate limits, 5xx and dropped connections: worth retrying with backoff."""
    from googleapiclient.errors import HttpError

    if isinstance(exc, HttpError):
        status = _http_status(exc)
        if status == 429 or (status is not None and status >= 500):
            return True
        return status == 403 and bool(_reasons(exc) & _RETRY_REASONS)
    if isinstance(exc, (FileNotFoundError, FileTooLargeError, DriveError)):
        return False
    import http.client

    import httplib2

    return isinstance(
        exc,
        (ConnectionError, TimeoutError, http.client.HTTPException, httplib2.HttpLib2Error, BrokenPipeError, OSError),
    )


class DriveStorage:
    """A :class:`~swarm_gdrive.storage.base.Storage` over a Drive folder, addressed by its id."""

    def __init__(
        self,
        root_folder_id: str,
        prefix: str = "",
        service: Any = None,
        retry_attempts: int = 8,
        retry_max_wait: float = 30.0,
        cache_ttl: float = 60.0,
        min_retry_s: float = 60.0,
    ) -> None:
        self.root_folder_id = root_folder_id
        self.prefix = [p for p in PurePosixPath(prefix).parts if p not in ("", "/")] if prefix else []
        self._service = service
        self._attempts = retry_attempts
        self._max_wait = retry_max_wait
        self._min_retry_s = min_retry_s
        self._lock = threading.RLock()
        self._api_lock = threading.Lock()
        # folder path -> (ids of every folder at that path, oldest first; when resolved; newest createdTime)
        self._folders: dict[tuple[str, ...], tuple[list[str], float, float]] = {}
        self._listing: dict[str, dict[str, _Entry]] = {}  # folder id -> name -> entry (newest duplicate)
        self._listed_at: dict[str, float] = {}  # folder id -> when it was listed (monotonic)
        self._cache_ttl = cache_ttl  # ids are re-resolved after this long: folders can be moved (a reset)
        self._own: dict[tuple[str, str], _Entry] = {}  # (folder id, name) -> what this node wrote last
        self._own_by_path: dict[str, _Entry] = {}  # storage path -> the same entry
        self._appended: dict[str, bytes] = {}  # own append-only files: content, so an append is one upload
        self.counters = {"api_calls": 0, "bytes_up": 0, "bytes_down": 0, "retries": 0}

    def describe(self) -> str:
        return f"Google Drive folder {self.root_folder_id}" + (f"/{'/'.join(self.prefix)}" if self.prefix else "")

    @property
    def service(self) -> Any:
        if self._service is None:
            self._service = build_service()
        return self._service

    # -- calls -------------------------------------------------------------------------------

    def _call(self, request_factory: Any) -> Any:
        """Execute a request (built fresh per attempt), retrying transient failures only."""
        try:
            for attempt in retrying(is_transient_drive_error, self._attempts, self._max_wait, self._min_retry_s):
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        self.counters["retries"] += 1
                    self.counters["api_calls"] += 1
                    try:
                        with self._api_lock:  # httplib2 connections are not thread-safe (heartbeat vs main)
                            return request_factory().execute(num_retries=0)
                    except Exception as exc:
                        raise self._explain(exc) from exc
        except (StorageError, FileNotFoundError, FileTooLargeError):
            raise
        except Exception as exc:  # retries exhausted on a transient error: an OSError callers handle
            raise StorageUnavailableError(f"Drive kept failing after {self._attempts} attempts: {exc}") from exc
        raise StorageError("unreachable")  # pragma: no cover

    def _explain(self, exc: Exception) -> Exception:
        from google.auth.exceptions import RefreshError
        from googleapiclient.errors import HttpError

        if isinstance(exc, RefreshError):
            return DriveAuthError(f"the Google credentials could not be refreshed ({exc}): create a new token or key")
        if not isinstance(exc, HttpError) or is_transient_drive_error(exc):
            return exc
        status, reasons = _http_status(exc), _reasons(exc)
        if status == 404:
            return FileNotFoundError(f"Drive answered 404 ({', '.join(reasons) or 'notFound'})")
        if status == 401:
            return DriveAuthError("Drive refused the credentials (401): refresh or recreate the token")
        if status == 403 and "storageQuotaExceeded" in reasons:
            return DriveError(
                "Drive refused to store the file (403 storageQuotaExceeded): a service account has no Drive storage "
                "of its own; put the folder in a shared drive with the service account as a member, or use "
                "GDRIVE_TOKEN_FILE (a user's OAuth token)"
            )
        if status == 403:
            return DriveError(
                f"Drive refused access (403 {', '.join(reasons) or 'forbidden'}) to folder {self.root_folder_id}: "
                "share the folder with the service account's e-mail (Editor), or check the folder id in GDRIVE_PATH"
            )
        return DriveError(f"Drive rejected the request ({status} {', '.join(reasons)}): {exc}")

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
            found = sorted((e for pid in current for e in self._find_folders(pid, name)), key=lambda e: (e.ctime, e.id))
            if not found and create:
                found = [self._create_folder(current[0], name)]
            if not found:
                return []
            with self._lock:
                self._folders[key] = ([e.id for e in found], time.monotonic(), max(e.ctime for e in found))
            current = [e.id for e in found]
        return current

    def _expired(self, resolved_at: float, youngest_ctime: float) -> bool:
        age = time.monotonic() - resolved_at
        young = time.time() - youngest_ctime < YOUNG_FOLDER_S
        return age > (RECHECK_YOUNG_S if young else self._cache_ttl)

    def _find_folders(self, parent: str, name: str) -> list[_Entry]:
        q = f"{_quote(parent)} in parents and name = {_quote(name)} and mimeType = '{FOLDER_MIME}' and trashed = false"
        return self._list_query(q)

    def _create_folder(self, parent: str, name: str) -> _Entry:
        body = {"name": name, "mimeType": FOLDER_MIME, "parents": [parent]}
        created = _entry(self._call(lambda: self.service.files().create(**_ALL_DRIVES, body=body, fields=_FILE_FIELDS)))
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
                FileInfo(e.name, e.size, e.mtime, e.is_dir)
                for e in entries
                if include_hidden or not is_temporary(e.name)
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
            data = self._call(lambda: self.service.files().get_media(**_ALL_DRIVES, fileId=entry.id))
            data = data if isinstance(data, bytes) else bytes(data)
            self.counters["bytes_down"] += len(data)
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

    def _refresh_cached(self, entry: _Entry, md5: str, size: int) -> None:
        """Remember a file's new checksum, so the next read of it costs one call, not two."""
        with self._lock:
            listed = self._listing.get(entry.parent, {})
            if entry.name in listed and listed[entry.name].id == entry.id:
                listed[entry.name] = dataclasses.replace(listed[entry.name], md5=md5, size=size)

    def write_bytes(self, path: str, data: bytes) -> None:
        from googleapiclient.http import MediaIoBaseUpload

        parts = self._parts(path)
        name = parts[-1]
        data = bytes(data)
        with self._lock:
            own = self._own_by_path.get(path)
        existing = own if own is not None else self._own_file(parts)

        def media() -> Any:
            return MediaIoBaseUpload(
                io.BytesIO(data),
                mimetype="application/octet-stream",
                resumable=len(data) > RESUMABLE_ABOVE,
                chunksize=RESUMABLE_ABOVE,
            )

        files = self.service.files()
        if existing is None:
            folder_id = self._folder(parts[:-1], create=True)
            assert folder_id is not None
            body = {"name": name, "parents": [folder_id]}
            raw = self._call(lambda: files.create(**_ALL_DRIVES, body=body, media_body=media(), fields=_FILE_FIELDS))
        else:
            folder_id = existing.parent
            raw = self._call(
                lambda: files.update(**_ALL_DRIVES, fileId=existing.id, media_body=media(), fields=_FILE_FIELDS)
            )
        self.counters["bytes_up"] += len(data)
        entry = dataclasses.replace(_entry(raw), parent=folder_id)
        with self._lock:
            self._own[(folder_id, name)] = entry
            self._own_by_path[path] = entry
            self._listing.setdefault(folder_id, {})[name] = entry

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
            self._delete_id(duplicate.id)
        return found[0] if found else None

    def _delete_id(self, file_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # already gone is what we wanted
            self._call(lambda: self.service.files().delete(**_ALL_DRIVES, fileId=file_id))

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
                self._delete_id(entry.id)
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
        for folder_id in ids:
            self._delete_id(folder_id)
        self._forget_folder(parts)
        return True

    def move(self, src: str, dst: str) -> None:
        src_parts, dst_parts = self._parts(src), self._parts(dst)
        entry = self._locate(src_parts)
        if entry is None:
            raise FileNotFoundError(src)
        dst_parent = self._folder(dst_parts[:-1], create=True)
        self._call(
            lambda: self.service.files().update(
                **_ALL_DRIVES,
                fileId=entry.id,
                addParents=dst_parent,
                removeParents=entry.parent,
                body={"name": dst_parts[-1]},
                fields="id",
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


def build_service(
    credentials_file: str | None = None, token_file: str | None = None, api_url: str | None = None, http: Any = None
) -> Any:
    """A Drive v3 client with the first credentials found (see :func:`find_credentials`), or on ``http``,
    an already authorized ``httplib2.Http`` (PyDrive2's)."""
    from googleapiclient.discovery import build, build_from_document

    auth: dict[str, Any]
    if http is not None:
        auth = {"http": http}
    elif api_url is not None and not (credentials_file or token_file):
        # Another endpoint (a proxy, the test emulator) and no key: do not look for Google's default
        # credentials, which would probe the cloud metadata server.
        from google.auth.credentials import AnonymousCredentials

        logger.warning("GDRIVE_API_URL is set and no credentials are: talking to %s anonymously", api_url)
        auth = {"credentials": AnonymousCredentials()}
    else:
        auth = {"credentials": find_credentials(credentials_file, token_file)}
    if api_url is None:
        return build("drive", "v3", cache_discovery=False, **auth)
    import googleapiclient

    doc_path = PurePosixPath(googleapiclient.__file__).parent / "discovery_cache/documents/drive.v3.json"
    doc = json.loads(open(doc_path, encoding="utf-8").read())  # noqa: SIM115
    doc["rootUrl"] = api_url if api_url.endswith("/") else api_url + "/"
    return build_from_document(doc, **auth)


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
