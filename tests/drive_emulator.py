"""A Google Drive v3 API emulator for tests, served over real HTTP on 127.0.0.1.

The emulator speaks enough of the Drive v3 ``files`` resource for the unmodified
google-api-python-client to talk to it: build a client from the bundled discovery document
with its ``rootUrl`` pointed at the emulator (``DriveEmulator.service()`` does that, and
``DriveEmulator.discovery_document()`` hands the patched document to another process).

Served (the tables ``ROUTES`` and ``MEDIA_ROUTES`` below are the router's source of truth; the
unit tests check them against the bundled discovery document):

- ``GET    /drive/v3/files``                 files.list
- ``GET    /drive/v3/files/{fileId}``        files.get (``alt=media`` for the bytes, ``Range`` honoured)
- ``POST   /drive/v3/files``                 files.create, metadata only
- ``PATCH  /drive/v3/files/{fileId}``        files.update, metadata only
- ``DELETE /drive/v3/files/{fileId}``        files.delete (a folder takes its descendants along)
- ``POST   /upload/drive/v3/files``          files.create with ``uploadType=media|multipart|resumable``
- ``PATCH  /upload/drive/v3/files/{fileId}`` files.update with ``uploadType=media|multipart|resumable``
- ``GET    /drive/v3/about``                 about.get (``storageQuota``: ``set_storage_quota``)
- ``PUT`` on a resumable session URI (``...?uploadType=resumable&upload_id=...``, as Drive hands out)
- the discovery document's ``/resumable/upload/drive/v3/files[/{fileId}]`` paths are served too

Drive behaviour reproduced on purpose: names are not unique in a folder; files.list may lag behind a
create (``list_lag_s``) while get by id does not; there is no If-Match; rate limits and server
errors come as Drive's JSON errors (``fail_next``); connections can drop (``drop_next``); ``size``
is a decimal string as in the real API; ``fields`` selects what a response holds, so a list asked
for ``files(id)`` only gets no ``nextPageToken``; a query parameter that the method does not declare
is refused with 400 like Google does; files.list without ``trashed = false`` includes trashed files.
``q`` supports ``'id' in parents``, ``name =``, ``mimeType =``/``!=``, ``trashed =`` joined with
``and``, and one level of parenthesised ``or`` groups of those (Drive's query language has more:
``contains``, ``not``, dates, nesting; they answer 400 here). Simplifications: the default list
order (no ``orderBy``) is createdTime then id (Drive promises no order); ``orderBy`` supports the
keys createdTime, modifiedTime, name and folder, each optionally ``desc``; page tokens are offsets,
so a listing that changes between pages may skip or repeat entries; non-final resumable chunks need
not be multiples of 256 KiB; metadata-only updates keep modifiedTime unless the request sets it;
every change bumps ``version``.

Operational hazards, each behind a switch: a resumable chunk or a ranged download that fails midway
(``fail_transfer``), a member role that may not delete (``member_role``: Drive's Content manager),
quota refusals of each cause (``quota_exceeded``), an account's storage quota that fills up
(``set_storage_quota``: about.get reports it, and content past it is refused as Drive refuses it), a token
endpoint that fails or drops (``fail_token_next``, ``drop_token_next``), a slow link (``transfer_bytes_per_s``, besides
``call_latency_s``). Bytes moved by chunked transfers are counted (``transfer_bytes``).

Credentials: every request's Authorization header is recorded (``authorizations``); ``POST /token``
is an OAuth 2.0 token endpoint (``token_uri``) that grants a bearer token for a service account's
signed JWT or a refresh token, without checking the signature; after ``require_tokens()`` API
requests without a token it granted (or ``accept_token``) get Drive's 401.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import email.message
import hashlib
import json
import logging
import os
import random
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

import google_auth_httplib2
import googleapiclient
import httplib2
from google.auth.credentials import AnonymousCredentials
from googleapiclient.discovery import build_from_document

LOG = logging.getLogger(__name__)

FOLDER_MIME = "application/vnd.google-apps.folder"
DISCOVERY_PATH = os.path.join(
    os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "drive.v3.json"
)


class Route(NamedTuple):
    """One Drive method as the emulator serves it: path is relative to the root URL with a leading slash."""

    http_method: str
    path: str
    params: frozenset[str]


_SHARED_DRIVE_FLAGS = {"supportsAllDrives", "supportsTeamDrives"}
ROUTES: dict[str, Route] = {
    "files.list": Route(
        "GET",
        "/drive/v3/files",
        frozenset(
            {"q", "pageSize", "pageToken", "orderBy", "spaces", "corpora", "includeItemsFromAllDrives"}
            | {"includeTeamDriveItems"}
            | _SHARED_DRIVE_FLAGS
        ),
    ),
    "files.get": Route("GET", "/drive/v3/files/{fileId}", frozenset({"acknowledgeAbuse"} | _SHARED_DRIVE_FLAGS)),
    "files.create": Route(
        "POST",
        "/drive/v3/files",
        frozenset(
            {"keepRevisionForever", "ignoreDefaultVisibility", "useContentAsIndexableText"} | _SHARED_DRIVE_FLAGS
        ),
    ),
    "files.update": Route(
        "PATCH",
        "/drive/v3/files/{fileId}",
        frozenset({"addParents", "removeParents", "keepRevisionForever"} | _SHARED_DRIVE_FLAGS),
    ),
    "files.delete": Route("DELETE", "/drive/v3/files/{fileId}", frozenset(_SHARED_DRIVE_FLAGS)),
    "about.get": Route("GET", "/drive/v3/about", frozenset()),
}
# Upload paths of the methods that take media, keyed like the discovery document's mediaUpload.protocols.
MEDIA_ROUTES: dict[str, dict[str, str]] = {
    "files.create": {"simple": "/upload/drive/v3/files", "resumable": "/resumable/upload/drive/v3/files"},
    "files.update": {
        "simple": "/upload/drive/v3/files/{fileId}",
        "resumable": "/resumable/upload/drive/v3/files/{fileId}",
    },
}
# System parameters every Google API accepts (a subset of the discovery document's top-level "parameters").
STANDARD_PARAMS = frozenset({"alt", "fields", "prettyPrint", "quotaUser", "key", "uploadType", "upload_protocol"})
# The session token in the Location the emulator hands out for a resumable upload (not a method parameter).
SESSION_PARAM = "upload_id"
#: Not part of the Drive API: an OAuth 2.0 token endpoint (Google's is https://oauth2.googleapis.com/token).
TOKEN_PATH = "/token"
TOKEN_GRANTS = ("urn:ietf:params:oauth:grant-type:jwt-bearer", "refresh_token")

_DEFAULT_FILE_FIELDS = "kind,id,name,mimeType"
_DEFAULT_LIST_FIELDS = "kind,incompleteSearch,nextPageToken,files(kind,id,name,mimeType)"
_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_USAGE_LIMIT_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded", "quotaExceeded"}
_FAULT_MESSAGES = {
    "rateLimitExceeded": "Rate Limit Exceeded",
    "userRateLimitExceeded": "User Rate Limit Exceeded",
    "backendError": "Backend Error",
    "internalError": "Internal Error",
    "notFound": "File not found.",
    "badRequest": "Bad Request",
    "insufficientFilePermissions": "The user does not have sufficient permissions for this file.",
    "storageQuotaExceeded": "The user's Drive storage quota has been exceeded.",
    "dailyLimitExceeded": "Daily Limit Exceeded",
}
#: ``quota_exceeded`` causes: (status, reason, message, which requests are refused). The messages are Drive's
#: as reported by its users; the upload-limit one (750 GB a day) is undocumented and reported by rclone's
#: authors as "User rate limit exceeded." with reason userRateLimitExceeded.
QUOTA_CAUSES: dict[str, tuple[int, str, str, str]] = {
    "service_account": (
        403,
        "storageQuotaExceeded",
        "Service Accounts do not have storage quota. Leverage shared drives "
        "(https://developers.google.com/workspace/drive/api/guides/about-shareddrives), or use OAuth delegation "
        "(http://support.google.com/a/answer/7281227) instead.",
        "upload",
    ),
    "storage_full": (403, "storageQuotaExceeded", "The user's Drive storage quota has been exceeded.", "upload"),
    "shared_drive_items": (
        403,
        "teamDriveFileLimitExceeded",
        "The file limit for this shared drive has been exceeded.",
        "create",
    ),
    "daily_limit": (403, "dailyLimitExceeded", "Daily Limit Exceeded", "any"),
    "upload_limit": (403, "userRateLimitExceeded", "User rate limit exceeded.", "upload"),
}
#: ``member_role`` values: what a member of a shared drive may do to files (Drive's "Roles and permissions").
MEMBER_ROLES = ("organizer", "fileOrganizer", "writer")
# Writable metadata the emulator stores and returns, and writable metadata it accepts and ignores.
_STORED_EXTRA = ("description", "properties", "appProperties")
_IGNORED_WRITABLE = {
    "kind",
    "starred",
    "contentHints",
    "originalFilename",
    "copyRequiresWriterPermission",
    "writersCanShare",
    "folderColorRgb",
    "viewedByMeTime",
}
_READ_ONLY = {"id", "size", "md5Checksum", "version", "explicitlyTrashed", "headRevisionId", "webViewLink"}


# ---------------------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """A Drive-style error answer."""

    def __init__(self, status: int, reason: str, message: str, *, domain: str = "global", location: str = "") -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.domain, self.location = status, reason, message, domain, location

    def body(self) -> dict:
        detail = {"domain": self.domain, "reason": self.reason, "message": self.message}
        if self.location:
            detail.update(locationType="parameter", location=self.location)
        return {"error": {"code": self.status, "message": self.message, "errors": [detail]}}


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, "notFound", f"File not found: {file_id}.", location="fileId")


def _invalid(message: str, location: str = "") -> ApiError:
    return ApiError(400, "invalid", message, location=location)


#: Drive's documented limits on custom properties ("Add custom file properties"; the v2 Property resource): 30
#: public properties a file and 30 private ones an app, each key and value together at most 124 bytes of UTF-8.
#: Assumed, not documented: the status and wording of the error (400 badRequest here), and that the limits are
#: checked on the properties as they stand after the request's nulls deleted theirs.
MAX_PROPERTIES = 30
MAX_PROPERTY_BYTES = 124


def _check_properties(field: str, props: dict) -> dict:
    if len(props) > MAX_PROPERTIES:
        raise _invalid(f"The limit of {MAX_PROPERTIES} {field} per file has been exceeded.", field)
    for key, value in props.items():
        if not isinstance(value, str):
            raise _invalid(f"Invalid value for {field}.{key}", field)
        if len(key.encode("utf-8")) + len(value.encode("utf-8")) > MAX_PROPERTY_BYTES:
            raise _invalid(f"The size of the property {key} exceeds the {MAX_PROPERTY_BYTES}-byte limit.", field)
    return props


def _fault_error(status: int, reason: str, message: str | None = None) -> ApiError:
    domain = "usageLimits" if reason in _USAGE_LIMIT_REASONS else "global"
    return ApiError(status, reason, message or _FAULT_MESSAGES.get(reason, reason), domain=domain)


def _no_permission() -> ApiError:
    return ApiError(403, "insufficientFilePermissions", _FAULT_MESSAGES["insufficientFilePermissions"])


# ------------------------------------------------------------------------------------------ time format


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch -> ``2024-05-01T12:00:00.123Z``."""
    stamp = datetime.fromtimestamp(ms // 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ms % 1000:03d}Z"


def parse_rfc3339(text: Any, location: str) -> int:
    if not isinstance(text, str):
        raise _invalid(f"Invalid value for {location}: {text!r}", location)
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _invalid(f"Invalid value for {location}: {text!r}", location) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return round(stamp.timestamp() * 1000)


# ------------------------------------------------------------------------------------- fields selection

_FIELD_TOKEN = re.compile(r"\s*([A-Za-z0-9_*$.]+|[(),/])")


def _tokenize_fields(spec: str) -> list[str]:
    tokens, pos, spec = [], 0, spec.rstrip()
    while pos < len(spec):
        match = _FIELD_TOKEN.match(spec, pos)
        if not match:
            raise _invalid(f"Invalid field selection {spec}", "fields")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


def parse_fields(spec: str) -> dict:
    """Parse a partial-response ``fields`` value into a tree {name: subtree or None (everything)}."""
    tokens = _tokenize_fields(spec)
    tree, pos = _parse_field_list(tokens, 0)
    if pos != len(tokens):
        raise _invalid(f"Invalid field selection {spec}", "fields")
    return tree


def _parse_field_list(tokens: list[str], pos: int) -> tuple[dict, int]:
    tree: dict = {}
    while True:
        name, sub, pos = _parse_field_item(tokens, pos)
        tree[name] = None if name in tree and tree[name] is None else _merge_trees(tree.get(name), sub, name in tree)
        if pos < len(tokens) and tokens[pos] == ",":
            pos += 1
            continue
        return tree, pos


def _merge_trees(old: dict | None, new: dict | None, had_old: bool) -> dict | None:
    if not had_old or new is None:
        return new
    return {**(old or {}), **new}


def _parse_field_item(tokens: list[str], pos: int) -> tuple[str, dict | None, int]:
    if pos >= len(tokens) or tokens[pos] in "(),/":
        raise _invalid("Invalid field selection", "fields")
    name, pos = tokens[pos], pos + 1
    if pos < len(tokens) and tokens[pos] == "/":
        sub_name, sub, pos = _parse_field_item(tokens, pos + 1)
        return name, {sub_name: sub}, pos
    if pos < len(tokens) and tokens[pos] == "(":
        sub_tree, pos = _parse_field_list(tokens, pos + 1)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise _invalid("Invalid field selection", "fields")
        return name, sub_tree, pos + 1
    return name, None, pos


def select_fields(value: Any, tree: dict | None) -> Any:
    """Keep what ``tree`` names (unknown names are ignored); lists apply the tree to each element."""
    if tree is None or ("*" in tree and tree["*"] is None):
        return value
    if isinstance(value, list):
        return [select_fields(item, tree) for item in value]
    if not isinstance(value, dict):
        return value
    return {key: select_fields(value[key], sub) for key, sub in tree.items() if key in value}


# ---------------------------------------------------------------------------------------- query (q)

_Q_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^'\\]|\\.)*')|(?P<op>!=|=)|(?P<word>[A-Za-z_]+)|(?P<paren>[()]))")
Predicate = Callable[[dict], bool]


def _tokenize_query(q: str) -> list[tuple[str, str]]:
    tokens, pos, q = [], 0, q.strip()
    while pos < len(q):
        match = _Q_TOKEN.match(q, pos)
        if not match:
            raise _invalid("Invalid Value", "q")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "str":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        tokens.append((kind, value))
        pos = match.end()
    return tokens


def parse_query(q: str, resolve_id: Callable[[str], str]) -> list[Predicate]:
    """Parse the supported ``q`` forms joined with ``and`` into predicates over file resources; a term may be a
    parenthesised group of supported forms joined with ``or`` (``('a' in parents or 'b' in parents)``), as Drive's
    query language allows. Nothing deeper: no ``not``, no nested groups, no ``or`` outside parentheses."""
    clauses: list[list[tuple[str, str]]] = [[]]
    depth = 0
    for token in _tokenize_query(q):
        if token[0] == "paren":
            depth += 1 if token[1] == "(" else -1
            if depth not in (0, 1):
                raise _invalid("Invalid Value", "q")
            clauses[-1].append(token)
        elif token[0] == "word" and token[1].lower() == "and" and depth == 0:
            clauses.append([])
        else:
            clauses[-1].append(token)
    if depth:
        raise _invalid("Invalid Value", "q")
    return [_group(clause, resolve_id) for clause in clauses]


def _group(clause: list[tuple[str, str]], resolve_id: Callable[[str], str]) -> Predicate:
    """A term: one supported form, or ``( form or form ... )``."""
    if not clause or clause[0] != ("paren", "("):
        return _clause(clause, resolve_id)
    if clause[-1] != ("paren", ")"):
        raise _invalid("Invalid Value", "q")
    alternatives: list[list[tuple[str, str]]] = [[]]
    for token in clause[1:-1]:
        if token[0] == "word" and token[1].lower() == "or":
            alternatives.append([])
        elif token[0] == "paren" or (token[0] == "word" and token[1].lower() == "and"):
            raise _invalid("Invalid Value", "q")  # a group holds simple forms joined with or
        else:
            alternatives[-1].append(token)
    predicates = [_clause(alternative, resolve_id) for alternative in alternatives]
    return lambda res: any(p(res) for p in predicates)


def _clause(clause: list[tuple[str, str]], resolve_id: Callable[[str], str]) -> Predicate:
    kinds = tuple(kind for kind, _ in clause)
    values = [value for _, value in clause]
    if kinds == ("str", "word", "word") and values[1] == "in" and values[2] == "parents":
        parent = resolve_id(values[0])
        return lambda res: parent in res["parents"]
    if kinds == ("word", "op", "str") and values[0] in ("name", "mimeType"):
        key, op, wanted = values
        if key == "name" and op != "=":
            raise _invalid("Invalid Value", "q")
        return (lambda res: res[key] == wanted) if op == "=" else (lambda res: res[key] != wanted)
    if kinds == ("word", "op", "word") and values[0] == "trashed" and values[2] in ("true", "false"):
        wanted_trashed = (values[2] == "true") == (values[1] == "=")
        return lambda res: res["trashed"] == wanted_trashed
    raise _invalid("Invalid Value", "q")


_ORDER_KEYS: dict[str, Callable[[dict], Any]] = {
    "createdTime": lambda res: res["createdTime"],
    "modifiedTime": lambda res: res["modifiedTime"],
    "name": lambda res: res["name"],
    "folder": lambda res: res["mimeType"] != FOLDER_MIME,
}


def sort_resources(resources: list[dict], order_by: str | None) -> list[dict]:
    """Default order createdTime then id; ``orderBy`` keys are applied on top (stable sorts, last key first)."""
    out = sorted(resources, key=lambda res: (res["createdTime"], res["id"]))
    if not order_by:
        return out
    keys = []
    for part in order_by.split(","):
        words = part.split()
        if not words or len(words) > 2 or words[0] not in _ORDER_KEYS or words[1:] not in ([], ["desc"], ["asc"]):
            raise _invalid(f"Invalid Value (orderBy key {part.strip()!r} is not supported)", "orderBy")
        keys.append((_ORDER_KEYS[words[0]], words[1:] == ["desc"]))
    for key, descending in reversed(keys):
        out.sort(key=key, reverse=descending)
    return out


# ------------------------------------------------------------------------------------------ multipart


def parse_multipart(body: bytes, content_type: str) -> tuple[dict, bytes, str]:
    """multipart/related (metadata JSON part, media part) -> (metadata, media bytes, media content type)."""
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise _invalid("Multipart upload without a boundary")
    chunks = body.split(b"--" + boundary.encode())
    parts = [_split_part(chunk) for chunk in chunks[1:] if not chunk.startswith(b"--")]
    if len(parts) != 2:
        raise _invalid(f"Multipart upload needs 2 parts, got {len(parts)}")
    (_, meta_bytes), (media_type, media) = parts
    return _json_object(meta_bytes), media, media_type or "application/octet-stream"


def _split_part(chunk: bytes) -> tuple[str, bytes]:
    chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk[1:] if chunk.startswith(b"\n") else chunk
    crlf, lf = chunk.find(b"\r\n\r\n"), chunk.find(b"\n\n")
    if crlf != -1 and (lf == -1 or crlf < lf):
        head, content = chunk[:crlf], chunk[crlf + 4 :]
    elif lf != -1:
        head, content = chunk[:lf], chunk[lf + 2 :]
    else:
        raise _invalid("Malformed multipart part")
    content = content[:-2] if content.endswith(b"\r\n") else content[:-1] if content.endswith(b"\n") else content
    media_type = ""
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-type":
            media_type = value.strip()
    return media_type, content


def _json_object(raw: bytes) -> dict:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ApiError(400, "parseError", "Parse Error") from None
    if not isinstance(value, dict):
        raise ApiError(400, "parseError", "Parse Error")
    return value


# ------------------------------------------------------------------------------------------ the model


@dataclass
class _File:
    id: str
    name: str
    mime_type: str
    parents: list[str]
    created_ms: int
    modified_ms: int
    born: float  # time.monotonic() at creation, for list lag
    data: bytes | None  # None for folders
    md5: str = ""
    trashed: bool = False
    version: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def is_folder(self) -> bool:
        return self.mime_type == FOLDER_MIME

    def set_data(self, data: bytes) -> None:
        self.data = bytes(data)
        self.md5 = hashlib.md5(self.data).hexdigest()


@dataclass
class _Session:
    file_id: str | None  # None: the upload creates a file
    meta: dict
    media_type: str
    total: int | None
    query: dict[str, str]
    buf: bytearray = field(default_factory=bytearray)
    done_id: str | None = None


class _Request(NamedTuple):
    method: str
    path: str
    query: dict[str, str]
    headers: Any  # email.message.Message from http.server (case-insensitive get)
    body: bytes


class _Response(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def _json_response(status: int, obj: Any, headers: list[tuple[str, str]] | None = None) -> _Response:
    body = json.dumps(obj, indent=1).encode()
    return _Response(status, [("Content-Type", "application/json; charset=UTF-8"), *(headers or [])], body)


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\{(\w+)\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$")


def client_for(discovery_document: dict):
    """A Drive client for an emulator's discovery document (its rootUrl names the server, maybe in another
    process): anonymous credentials over httplib2.Http(timeout=10).

    308 is taken out of httplib2's redirect codes, as googleapiclient.http.build_http() does, or a
    resumable upload's "308 Resume Incomplete" would be followed as a redirect.
    """
    http = httplib2.Http(timeout=10)
    http.redirect_codes = http.redirect_codes - {308}
    authed = google_auth_httplib2.AuthorizedHttp(AnonymousCredentials(), http=http)
    return build_from_document(discovery_document, http=authed)


class _Probe(dict):
    """The fields of a file that ``q`` can test (see ``_clause``); ``trashed``, which walks the ancestors, only when
    a predicate asks for it."""

    FIELDS = frozenset({"name", "mimeType", "parents", "trashed"})

    def __init__(self, emulator: DriveEmulator, f: _File) -> None:
        super().__init__(name=f.name, mimeType=f.mime_type, parents=f.parents)
        self._emulator, self._file = emulator, f

    def __missing__(self, key: str) -> Any:
        if key != "trashed":
            raise KeyError(key)
        self[key] = value = self._emulator._is_trashed(self._file)
        return value


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    emulator: DriveEmulator


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    wbufsize = -1  # buffer headers and body into one send: unbuffered small writes stall on Nagle + delayed ACK

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.emulator._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.emulator._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("drive emulator: " + format, *args)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        started = time.monotonic()
        body = self._read_body()
        latency = self.server.emulator.call_latency_s
        if latency:
            time.sleep(latency)  # outside the emulator's lock: concurrent requests wait in parallel, as on Drive
        response = self.server.emulator._handle(self.command, self.path, self.headers, body)
        if response is None:  # drop_next: close without answering
            self.close_connection = True
            return
        rate = self.server.emulator.transfer_bytes_per_s
        if rate:  # a slow link: the bytes of the request and of the answer take their time, outside the lock
            time.sleep((len(body) + len(response.body)) / rate)
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)
        emulator = self.server.emulator
        with emulator._lock:
            emulator.served.append((self.command, self.path, len(body), len(response.body), started, time.monotonic()))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class DriveEmulator:
    """An in-memory Drive (``files`` resource) behind a real HTTP server on 127.0.0.1."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.RLock()
        self._rng = random.Random(seed)
        self._files: dict[str, _File] = {}
        self._sessions: dict[str, _Session] = {}
        self._faults: deque[tuple[int, str] | None] = deque()  # None: drop the connection
        self._token_faults: deque[tuple[int, str] | None] = deque()  # the token endpoint's: None drops
        self._transfer_faults: dict[str, list[int | tuple[int, str]]] = {"upload": [], "download": []}
        self.transfer_bytes = {"upload": 0, "download": 0}  # bytes of resumable chunks and ranged downloads
        self._quota_exceeded: str | None = None
        self._storage_limit: int | None = None  # None: no limit (about.get then has none)
        self._used_elsewhere = 0  # bytes of the account's Gmail and Photos, beside Drive's files
        self._member_role = "organizer"
        self._transfer_bytes_per_s = 0.0
        self._duplicate_creates = False
        self._list_lag_s = 0.0
        self._call_latency_s = 0.0
        self._accepted_tokens: set[str] | None = None  # None: any caller; else only these bearer tokens
        self._tokens_issued = 0
        self.token_grants: list[str] = []  # grant_type of every POST /token
        self.authorizations: list[str | None] = []  # the Authorization header of every API request
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._doc_text = ""
        self.requests: list[tuple[str, str]] = []
        # (method, path, bytes received, bytes sent, monotonic start, monotonic end) of every request answered
        self.served: list[tuple[str, str, int, int, float, float]] = []
        self.port = 0
        self.root_url = ""
        my_drive = self._new_file("My Drive", FOLDER_MIME, [], None)
        self._files[my_drive.id] = my_drive
        self.my_drive_id = my_drive.id  # the "root" alias: parent of files created without parents
        self.root_id = self._insert("shared", FOLDER_MIME, [self.my_drive_id], None).id
        self._dispatch = self._build_dispatch()

    # ------------------------------------------------------------------------------- lifecycle

    def start(self) -> DriveEmulator:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.emulator = self
        self._server = server
        self.port = server.server_address[1]
        self.root_url = f"http://127.0.0.1:{self.port}/"
        with open(DISCOVERY_PATH, encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["rootUrl"] = self.root_url
        self._doc_text = json.dumps(doc)
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="drive-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> DriveEmulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)

    # ---------------------------------------------------------------------------- client side

    def discovery_document(self) -> dict:
        """The bundled drive.v3 discovery document with rootUrl pointing at this emulator."""
        if not self._doc_text:
            raise RuntimeError("start() the emulator first")
        return json.loads(self._doc_text)

    def service(self):
        """A Drive client on this emulator (:func:`client_for`)."""
        return client_for(self.discovery_document())

    # ------------------------------------------------------------------------- awkward switches

    @property
    def duplicate_creates(self) -> bool:
        with self._lock:
            return self._duplicate_creates

    @duplicate_creates.setter
    def duplicate_creates(self, value: bool) -> None:
        with self._lock:
            self._duplicate_creates = bool(value)

    @property
    def list_lag_s(self) -> float:
        with self._lock:
            return self._list_lag_s

    @list_lag_s.setter
    def list_lag_s(self, value: float) -> None:
        with self._lock:
            self._list_lag_s = float(value)

    @property
    def call_latency_s(self) -> float:
        """Seconds every request waits before it is answered (Drive's round trip is ~0.1-0.3 s)."""
        with self._lock:
            return self._call_latency_s

    @call_latency_s.setter
    def call_latency_s(self, value: float) -> None:
        with self._lock:
            self._call_latency_s = max(0.0, float(value))

    @property
    def transfer_bytes_per_s(self) -> float:
        """A slow link: every request and answer also waits its size / this many bytes per second (0: off)."""
        with self._lock:
            return self._transfer_bytes_per_s

    @transfer_bytes_per_s.setter
    def transfer_bytes_per_s(self, value: float) -> None:
        with self._lock:
            self._transfer_bytes_per_s = max(0.0, float(value))

    @property
    def member_role(self) -> str:
        """The caller's role in the (shared) drive: ``organizer`` (Manager) may delete; ``fileOrganizer``
        (Content manager) gets 403 insufficientFilePermissions from files.delete but may trash; ``writer``
        (Contributor, or an editor who does not own the file) may do neither."""
        with self._lock:
            return self._member_role

    @member_role.setter
    def member_role(self, value: str) -> None:
        if value not in MEMBER_ROLES:
            raise ValueError(f"member_role must be one of {MEMBER_ROLES}, not {value!r}")
        with self._lock:
            self._member_role = value

    @property
    def quota_exceeded(self) -> str | None:
        """None, or a key of QUOTA_CAUSES: the requests of that cause are refused with Drive's error."""
        with self._lock:
            return self._quota_exceeded

    @quota_exceeded.setter
    def quota_exceeded(self, cause: str | None) -> None:
        if cause is not None and cause not in QUOTA_CAUSES:
            raise ValueError(f"quota_exceeded must be None or one of {sorted(QUOTA_CAUSES)}, not {cause!r}")
        with self._lock:
            self._quota_exceeded = cause

    def set_storage_quota(self, limit: int | None, used_elsewhere: int = 0) -> None:
        """The account's storage quota as about.get reports it: ``limit`` bytes (None: unlimited), of which
        ``used_elsewhere`` are taken by Gmail and Photos; every file's content counts too, trashed ones included
        (as on Drive, until they are deleted for good). A create or update whose content would take the usage
        past the limit is refused with Drive's 403 storageQuotaExceeded."""
        with self._lock:
            self._storage_limit = None if limit is None else int(limit)
            self._used_elsewhere = int(used_elsewhere)

    def storage_usage(self) -> tuple[int, int]:
        """Bytes of every file's content in this Drive, and of those in the trash."""
        with self._lock:
            files = [f for f in self._files.values() if f.data is not None]
            return sum(len(f.data) for f in files), sum(len(f.data) for f in files if self._is_trashed(f))

    def _check_room(self, added: int) -> None:
        if self._storage_limit is None or added <= 0:
            return
        in_drive, _ = self.storage_usage()
        if self._used_elsewhere + in_drive + added > self._storage_limit:
            raise _fault_error(403, "storageQuotaExceeded")

    def fail_transfer(
        self, kind: str, after: int, count: int = 1, status: int = 503, reason: str = "backendError"
    ) -> None:
        """Let ``after`` more chunks of ``kind`` (``upload``: resumable chunks carrying bytes; ``download``:
        ranged media GETs) through, then fail the next ``count`` with ``status``: a transfer broken midway."""
        with self._lock:
            self._transfer_faults[kind] = [after, *([(status, reason)] * count)]

    def _transfer_fault(self, kind: str) -> ApiError | None:
        plan = self._transfer_faults[kind]
        if not plan:
            return None
        if isinstance(plan[0], int):
            if plan[0] > 0:
                plan[0] -= 1
                return None
            plan.pop(0)
        status, reason = plan.pop(0)  # type: ignore[misc]
        return _fault_error(status, reason)

    def fail_token_next(self, count: int, status: int = 503, error: str = "server_error") -> None:
        """The token endpoint answers the next ``count`` grants with ``status`` and OAuth error ``error``
        (503 server_error is retryable; 400 invalid_grant is a revoked or expired grant)."""
        with self._lock:
            self._token_faults.extend([(status, error)] * count)

    def drop_token_next(self, count: int) -> None:
        """The token endpoint closes the next ``count`` connections without answering (a network error)."""
        with self._lock:
            self._token_faults.extend([None] * count)

    @property
    def token_uri(self) -> str:
        """An OAuth 2.0 token endpoint on this emulator, for a service-account key's or a token's ``token_uri``."""
        if not self.root_url:
            raise RuntimeError("start() the emulator first")
        return self.root_url.rstrip("/") + TOKEN_PATH

    def require_tokens(self) -> None:
        """From now on an API request must carry ``Authorization: Bearer <t>`` with a token this emulator issued
        at :attr:`token_uri`; others get Drive's 401 authError (which makes a client refresh its token)."""
        with self._lock:
            if self._accepted_tokens is None:
                self._accepted_tokens = set()

    def accept_token(self, token: str) -> None:
        """Accept ``token`` as if this emulator had issued it (a token saved by an earlier sign-in)."""
        with self._lock:
            self.require_tokens()
            assert self._accepted_tokens is not None
            self._accepted_tokens.add(token)

    def _check_bearer(self, authorization: str | None) -> None:
        with self._lock:
            accepted = self._accepted_tokens
            if accepted is None:
                return
            token = (authorization or "").removeprefix("Bearer ").strip()
            if token not in accepted:
                raise ApiError(401, "authError", "Request had invalid authentication credentials.")

    def _h_token(self, method: str, body: bytes) -> _Response:
        """POST /token: grant a bearer token for a signed JWT (service account) or a refresh token."""
        form = dict(parse_qsl(body.decode("utf-8", "replace")))
        grant = form.get("grant_type", "")
        if method != "POST" or grant not in TOKEN_GRANTS or not (form.get("assertion") or form.get("refresh_token")):
            return _json_response(400, {"error": "invalid_grant", "error_description": f"bad grant {grant!r}"})
        with self._lock:
            self._tokens_issued += 1
            token = f"emulated-token-{self._tokens_issued}"
            self.token_grants.append(grant)
            if self._accepted_tokens is not None:
                self._accepted_tokens.add(token)
        return _json_response(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})

    def fail_next(self, count: int, status: int, reason: str = "rateLimitExceeded") -> None:
        """The next ``count`` requests (of any kind) answer ``status`` with a Drive JSON error naming ``reason``."""
        with self._lock:
            self._faults.extend([(status, reason)] * count)

    def drop_next(self, count: int) -> None:
        """The next ``count`` requests get their connection closed without an answer.

        httplib2 silently resends a request once when the connection closes before an answer, so
        one drop costs a request but no error; two in a row reach the caller as
        http.client.RemoteDisconnected (a ConnectionError).
        """
        with self._lock:
            self._faults.extend([None] * count)

    def create_duplicate_folder(self, parent_id: str, name: str) -> str:
        """Add another folder ``name`` under ``parent_id``, created after every same-named sibling."""
        with self._lock:
            self._folder_parent(parent_id)
            newest = max(
                (f.created_ms for f in self._files.values() if f.name == name and parent_id in f.parents),
                default=0,
            )
            created = max(self._now_ms(), newest + 1)
            return self._insert(name, FOLDER_MIME, [parent_id], None, created_ms=created).id

    def create_file(
        self,
        parent_id: str,
        name: str,
        data: bytes,
        modified_time: float | None = None,
        properties: dict[str, str] | None = None,
    ) -> str:
        """Insert a file directly (no request, no duplicate); ``modified_time`` in seconds since the epoch;
        ``properties`` as any writer may set them (a forger's included)."""
        with self._lock:
            self._folder_parent(parent_id)
            modified = None if modified_time is None else round(modified_time * 1000)
            f = self._insert(name, "application/octet-stream", [parent_id], data, modified_ms=modified)
            if properties:
                f.extra["properties"] = dict(properties)
            return f.id

    # ------------------------------------------------------------------------------- inspection

    def files(self) -> list[dict]:
        """Every file and folder that exists (trashed ones included), as full Drive resources."""
        with self._lock:
            resources = [self._resource(f) for f in self._files.values() if f.id != self.my_drive_id]
        return sort_resources(resources, None)

    def content(self, file_id: str) -> bytes:
        with self._lock:
            f = self._files.get(file_id)
            if f is None:
                raise KeyError(file_id)
            if f.data is None:
                raise ValueError(f"{file_id} is a folder")
            return f.data

    # ------------------------------------------------------------------------------- the model

    def _new_id(self, length: int = 33) -> str:
        with self._lock:
            return "".join(self._rng.choice(_ID_ALPHABET) for _ in range(length))

    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    def _new_file(self, name: str, mime: str, parents: list[str], data: bytes | None, **times: int | None) -> _File:
        created = times.get("created_ms") or self._now_ms()
        modified = times.get("modified_ms") or created
        f = _File(self._new_id(), name, mime, list(parents), created, modified, time.monotonic(), None)
        if mime != FOLDER_MIME:
            f.set_data(data or b"")
        return f

    def _insert(self, name: str, mime: str, parents: list[str], data: bytes | None, **times: int | None) -> _File:
        f = self._new_file(name, mime, parents, data, **times)
        self._files[f.id] = f
        return f

    def _resolve(self, file_id: str) -> str:
        return self.my_drive_id if file_id == "root" else file_id

    def _get(self, file_id: str) -> _File:
        f = self._files.get(self._resolve(file_id))
        if f is None:
            raise _not_found(file_id)
        return f

    def _folder_parent(self, parent_id: str) -> _File:
        parent = self._get(parent_id)
        if not parent.is_folder:
            raise _invalid(f"The parent {parent_id} is not a folder.", "parents")
        return parent

    def _is_trashed(self, f: _File) -> bool:
        seen = set()
        while f is not None and f.id not in seen:
            if f.trashed:
                return True
            seen.add(f.id)
            f = next((self._files[p] for p in f.parents if p in self._files), None)
        return False

    def _resource(self, f: _File) -> dict:
        res = {
            "kind": "drive#file",
            "id": f.id,
            "name": f.name,
            "mimeType": f.mime_type,
            "parents": list(f.parents),
            "createdTime": rfc3339(f.created_ms),
            "modifiedTime": rfc3339(f.modified_ms),
            "trashed": self._is_trashed(f),
            "explicitlyTrashed": f.trashed,
            "version": str(f.version),
            "spaces": ["drive"],
        }
        if f.data is not None:
            res["size"] = str(len(f.data))
            res["md5Checksum"] = f.md5
        res.update(copy.deepcopy(f.extra))
        return res

    def _descendants(self, folder_id: str) -> list[str]:
        out, todo = [], [folder_id]
        while todo:
            current = todo.pop()
            children = [f.id for f in self._files.values() if current in f.parents and f.id not in out]
            out.extend(children)
            todo.extend(children)
        return out

    def _check_writable(self, meta: dict, allowed: set[str]) -> None:
        for key in meta:
            if key in _READ_ONLY or (key in ("parents", "createdTime") and key not in allowed):
                raise ApiError(
                    403, "fieldNotWritable", f"The resource body includes fields which are not directly writable: {key}"
                )
            if key not in allowed and key not in _IGNORED_WRITABLE and key not in _STORED_EXTRA:
                raise ApiError(400, "badRequest", f'Invalid JSON payload received. Unknown name "{key}"')

    def _apply_extra(self, f: _File, meta: dict) -> None:
        for key in _STORED_EXTRA:
            if key not in meta:
                continue
            value = meta[key]
            if isinstance(value, dict) and key != "description":
                merged = {**f.extra.get(key, {}), **value}
                f.extra[key] = _check_properties(key, {k: v for k, v in merged.items() if v is not None})
            else:
                f.extra[key] = value

    def _check_quota(self, kind: str) -> None:
        cause = self._quota_exceeded
        if cause is not None and QUOTA_CAUSES[cause][3] == kind:
            status, reason, message, _ = QUOTA_CAUSES[cause]
            raise _fault_error(status, reason, message)

    def _h_about(self, request: _Request) -> _Response:
        if not request.query.get("fields"):  # Drive's answer to an about.get without fields
            raise _invalid("The 'fields' parameter is required for this method.", "fields")
        in_drive, in_trash = self.storage_usage()
        quota = {
            "usage": str(self._used_elsewhere + in_drive),
            "usageInDrive": str(in_drive),
            "usageInDriveTrash": str(in_trash),
        }
        if self._storage_limit is not None:
            quota["limit"] = str(self._storage_limit)
        about = {"kind": "drive#about", "storageQuota": quota, "user": {"kind": "drive#user", "me": True}}
        return _json_response(200, select_fields(about, parse_fields(request.query["fields"])))

    def _create(self, meta: dict, data: bytes | None, media_type: str | None) -> _File:
        self._check_quota("create")
        self._check_room(len(data or b""))
        self._check_writable(meta, {"name", "mimeType", "parents", "modifiedTime", "createdTime"})
        name = meta.get("name", "Untitled")
        if not isinstance(name, str):
            raise _invalid("Invalid Value", "name")
        mime = meta.get("mimeType") or media_type or "application/octet-stream"
        parents = meta.get("parents") or [self.my_drive_id]
        if not isinstance(parents, list) or len(parents) > 1:
            raise ApiError(403, "cannotAddParent", "Increasing the number of parents is not allowed.")
        parents = [self._folder_parent(parents[0]).id]
        created = parse_rfc3339(meta["createdTime"], "createdTime") if "createdTime" in meta else None
        modified = parse_rfc3339(meta["modifiedTime"], "modifiedTime") if "modifiedTime" in meta else None
        f = self._insert(name, mime, parents, data, created_ms=created, modified_ms=modified)
        self._apply_extra(f, meta)
        if self._duplicate_creates and not f.is_folder:
            twin = self._insert(name, mime, parents, f.data, created_ms=f.created_ms + 1, modified_ms=f.modified_ms + 1)
            twin.extra = copy.deepcopy(f.extra)
        return f

    def _update(self, file_id: str, meta: dict, query: dict[str, str], data: bytes | None) -> _File:
        f = self._get(file_id)
        self._check_writable(meta, {"name", "mimeType", "modifiedTime", "trashed"})
        if data is not None:
            self._check_room(len(data) - len(f.data or b""))
        if "name" in meta:
            if not isinstance(meta["name"], str):
                raise _invalid("Invalid Value", "name")
            f.name = meta["name"]
        if "trashed" in meta:
            if self._member_role == "writer":
                raise _no_permission()
            f.trashed = bool(meta["trashed"])
        if "mimeType" in meta and meta["mimeType"] != f.mime_type:
            if f.is_folder or meta["mimeType"] == FOLDER_MIME:
                raise _invalid("A file cannot be turned into a folder or back.", "mimeType")
            f.mime_type = meta["mimeType"]
        self._move(f, query.get("addParents", ""), query.get("removeParents", ""))
        self._apply_extra(f, meta)
        if data is not None:
            if f.is_folder:
                raise _invalid("Folders have no content.")
            f.set_data(data)
            f.modified_ms = self._now_ms()
        if "modifiedTime" in meta:
            f.modified_ms = parse_rfc3339(meta["modifiedTime"], "modifiedTime")
        f.version += 1
        return f

    def _move(self, f: _File, add: str, remove: str) -> None:
        add_ids = [self._resolve(i) for i in add.split(",") if i]
        remove_ids = [self._resolve(i) for i in remove.split(",") if i]
        for parent_id in add_ids:
            self._folder_parent(parent_id)
            if parent_id == f.id or parent_id in self._descendants(f.id):
                raise _invalid("A folder cannot be moved into itself or its descendants.", "addParents")
        parents = [p for p in f.parents if p not in remove_ids]
        parents += [p for p in add_ids if p not in parents]
        if len(parents) > 1:
            raise ApiError(403, "cannotAddParent", "Increasing the number of parents is not allowed.")
        f.parents = parents

    def _delete(self, file_id: str) -> None:
        f = self._get(file_id)
        if f.id == self.my_drive_id:
            raise ApiError(403, "insufficientFilePermissions", "The root folder cannot be deleted.")
        if self._member_role != "organizer":
            raise _no_permission()
        for doomed in [f.id, *self._descendants(f.id)]:
            self._files.pop(doomed, None)

    def _listed(self, predicates: list[Predicate]) -> list[dict]:
        """Every file the predicates accept. They are tried on a :class:`_Probe` (the four fields a query can
        name), and only a match is made into a full resource: a listing costs little per file of the whole
        drive, so a benchmark's thousands of files do not make the emulator its bottleneck."""
        cutoff = time.monotonic() - self._list_lag_s
        out = []
        for f in self._files.values():
            if f.id == self.my_drive_id or f.born > cutoff:
                continue
            probe = self._resource(f) if _Probe.FIELDS & f.extra.keys() else _Probe(self, f)
            if all(predicate(probe) for predicate in predicates):
                out.append(self._resource(f))
        return out

    # ------------------------------------------------------------------------------- HTTP layer

    def _build_dispatch(self) -> list[tuple[str, re.Pattern[str], str | None, Callable[..., _Response]]]:
        api = [
            ("files.list", self._h_list),
            ("files.get", self._h_get),
            ("files.create", self._h_create),
            ("files.update", self._h_update),
            ("files.delete", self._h_delete),
            ("about.get", self._h_about),
        ]
        table = [(ROUTES[name].http_method, _template_regex(ROUTES[name].path), name, fn) for name, fn in api]
        uploads = [("files.create", self._h_upload_create), ("files.update", self._h_upload_update)]
        for name, fn in uploads:
            for path in MEDIA_ROUTES[name].values():
                table.append((ROUTES[name].http_method, _template_regex(path), name, fn))
                table.append(("PUT", _template_regex(path), None, self._h_session_put))
        return table

    def _handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> _Response | None:
        split = urlsplit(raw_path)
        if split.path == TOKEN_PATH:
            with self._lock:
                token_fault = self._token_faults.popleft() if self._token_faults else 0
            if token_fault is None:
                return None
            if token_fault:
                status, error = token_fault
                return _json_response(status, {"error": error, "error_description": f"emulated {error}"})
            return self._h_token(method, body)
        with self._lock:
            self.requests.append((method, raw_path))
            self.authorizations.append(headers.get("Authorization"))
            fault = self._faults.popleft() if self._faults else 0
        if fault is None:
            return None
        try:
            if fault:
                raise _fault_error(*fault)
            self._check_bearer(headers.get("Authorization"))
            self._check_quota("any")
            query = dict(parse_qsl(split.query, keep_blank_values=True))
            request = _Request(method, split.path, query, headers, body)
            handler, path_params = self._route(request)
            with self._lock:
                return handler(request, *path_params)
        except ApiError as error:
            return _json_response(error.status, error.body())
        except Exception as error:  # a bug in the emulator: answer 500 so the test shows it
            LOG.exception("drive emulator failed on %s %s", method, raw_path)
            return _json_response(500, ApiError(500, "internalError", f"emulator bug: {error!r}").body())

    def _route(self, request: _Request) -> tuple[Callable[..., _Response], tuple[str, ...]]:
        path_matched = False
        for http_method, regex, name, handler in self._dispatch:
            match = regex.match(request.path)
            if not match:
                continue
            path_matched = True
            if http_method != request.method:
                continue
            allowed = (ROUTES[name].params if name else {SESSION_PARAM}) | STANDARD_PARAMS
            unknown = sorted(set(request.query) - allowed)
            if unknown:
                message = f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot bind query parameter.'
                raise ApiError(400, "badRequest", message)
            return handler, match.groups()
        if path_matched:
            raise ApiError(405, "httpMethodNotAllowed", f"Method {request.method} is not allowed here.")
        raise ApiError(404, "notFound", f"Not Found: {request.path}")

    def _file_response(self, f: _File, query: dict[str, str], status: int = 200) -> _Response:
        tree = parse_fields(query.get("fields") or _DEFAULT_FILE_FIELDS)
        return _json_response(status, select_fields(self._resource(f), tree))

    def _h_list(self, request: _Request) -> _Response:
        query = request.query
        page_size = _int_param(query, "pageSize", 100)
        if not 1 <= page_size <= 1000:
            raise _invalid(f"Invalid value '{page_size}'. Values must be within the range: [1, 1000]", "pageSize")
        offset = _decode_page_token(query.get("pageToken", ""))
        predicates = parse_query(query["q"], self._resolve) if query.get("q", "").strip() else []
        resources = sort_resources(self._listed(predicates), query.get("orderBy"))
        page = resources[offset : offset + page_size]
        out: dict[str, Any] = {"kind": "drive#fileList", "incompleteSearch": False}
        if offset + page_size < len(resources):
            out["nextPageToken"] = base64.urlsafe_b64encode(f"o{offset + page_size}".encode()).decode()
        out["files"] = page
        return _json_response(200, select_fields(out, parse_fields(query.get("fields") or _DEFAULT_LIST_FIELDS)))

    def _h_get(self, request: _Request, file_id: str) -> _Response:
        f = self._get(file_id)
        if request.query.get("alt") != "media":
            return self._file_response(f, request.query)
        if f.data is None:
            message = "Only files with binary content can be downloaded. Use Export with Docs Editors files."
            raise ApiError(403, "fileNotDownloadable", message, location="alt")
        response = _media_response(f.data, request.headers.get("Range"))
        if request.headers.get("Range"):
            fault = self._transfer_fault("download")
            if fault is not None:
                raise fault
            self.transfer_bytes["download"] += len(response.body)
        return response

    def _h_create(self, request: _Request) -> _Response:
        meta = _json_object(request.body)
        return self._file_response(self._create(meta, None, None), request.query)

    def _h_update(self, request: _Request, file_id: str) -> _Response:
        meta = _json_object(request.body)
        return self._file_response(self._update(file_id, meta, request.query, None), request.query)

    def _h_delete(self, request: _Request, file_id: str) -> _Response:
        self._delete(file_id)
        return _Response(204, [], b"")

    def _upload_parts(self, request: _Request) -> tuple[dict, bytes, str]:
        upload_type = request.query.get("uploadType", "resumable" if request.path.startswith("/resumable/") else "")
        content_type = request.headers.get("Content-Type") or "application/octet-stream"
        if upload_type == "media":
            return {}, request.body, content_type
        if upload_type == "multipart":
            return parse_multipart(request.body, content_type)
        raise _invalid(f"Invalid uploadType {upload_type!r}", "uploadType")

    def _h_upload_create(self, request: _Request) -> _Response:
        self._check_quota("upload")
        if _is_resumable(request):
            return self._start_session(request, None)
        meta, data, media_type = self._upload_parts(request)
        return self._file_response(self._create(meta, data, media_type), request.query)

    def _h_upload_update(self, request: _Request, file_id: str) -> _Response:
        self._check_quota("upload")
        if _is_resumable(request):
            return self._start_session(request, self._get(file_id).id)
        meta, data, _ = self._upload_parts(request)
        return self._file_response(self._update(file_id, meta, request.query, data), request.query)

    def _start_session(self, request: _Request, file_id: str | None) -> _Response:
        meta = _json_object(request.body)
        total = request.headers.get("X-Upload-Content-Length")
        media_type = request.headers.get("X-Upload-Content-Type") or "application/octet-stream"
        upload_id = self._new_id(48)
        self._sessions[upload_id] = _Session(file_id, meta, media_type, int(total) if total else None, request.query)
        location = f"{self.root_url}{request.path.lstrip('/')}?uploadType=resumable&{SESSION_PARAM}={upload_id}"
        return _Response(200, [("Location", location), ("X-GUploader-UploadID", upload_id)], b"")

    def _h_session_put(self, request: _Request, file_id: str | None = None) -> _Response:
        session = self._sessions.get(request.query.get(SESSION_PARAM, ""))
        if session is None:
            raise ApiError(404, "notFound", "No such upload session.", location=SESSION_PARAM)
        if session.done_id is not None:
            return self._file_response(self._get(session.done_id), session.query)
        if request.body:
            fault = self._transfer_fault("upload")
            if fault is not None:
                raise fault
            self.transfer_bytes["upload"] += len(request.body)
        start, total = _content_range(request.headers.get("Content-Range"), len(request.body), session)
        if start is not None and start <= len(session.buf):
            session.buf += request.body[len(session.buf) - start :]
        if total is not None:
            session.total = total
        if session.total is None or len(session.buf) < session.total:
            received = len(session.buf)
            return _Response(308, [("Range", f"bytes=0-{received - 1}")] if received else [], b"")
        if len(session.buf) > session.total:
            raise _invalid("The upload is longer than its declared size.")
        return self._finish_session(session)

    def _finish_session(self, session: _Session) -> _Response:
        data = bytes(session.buf)
        if session.file_id is None:
            f = self._create(session.meta, data, session.media_type)
        else:
            f = self._update(session.file_id, session.meta, session.query, data)
        session.done_id = f.id
        session.buf = bytearray()
        return self._file_response(f, session.query)


def _is_resumable(request: _Request) -> bool:
    return request.query.get("uploadType") == "resumable" or request.path.startswith("/resumable/")


def _int_param(query: dict[str, str], name: str, default: int) -> int:
    try:
        return int(query.get(name, default))
    except ValueError:
        raise _invalid(f"Invalid value '{query[name]}'", name) from None


def _decode_page_token(token: str) -> int:
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        if not text.startswith("o"):
            raise ValueError(text)
        return int(text[1:])
    except ValueError:
        raise _invalid("Invalid Value", "pageToken") from None


_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")


def _content_range(header: str | None, length: int, session: _Session) -> tuple[int | None, int | None]:
    """A chunk's Content-Range -> (first byte or None for a status query, total or None when unknown)."""
    if header is None:  # a single request with the whole content (the client does this for empty files)
        session.buf = bytearray()
        return 0, length
    match = _RANGE.match(header.strip())
    if not match:
        raise _invalid(f"Invalid Content-Range {header!r}")
    first, last, total = match.groups()
    total_value = None if total == "*" else int(total)
    if first is None:
        return None, total_value
    if int(last) - int(first) + 1 != length:
        raise _invalid(f"Content-Range {header!r} does not match the {length} bytes sent")
    return int(first), total_value


def _media_response(data: bytes, range_header: str | None) -> _Response:
    headers = [("Content-Type", "application/octet-stream")]
    match = re.match(r"^bytes=(\d+)-(\d*)$", (range_header or "").strip())
    if not match:
        return _Response(200, headers, data)
    first = int(match.group(1))
    last = min(int(match.group(2)) if match.group(2) else len(data) - 1, len(data) - 1)
    if first >= len(data):
        return _Response(416, [("Content-Range", f"bytes */{len(data)}")], b"")
    headers.append(("Content-Range", f"bytes {first}-{last}/{len(data)}"))
    return _Response(206, headers, data[first : last + 1])
