"""The Drive v3 emulator, driven only through the unmodified google-api-python-client."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from googleapiclient.errors import HttpError
from googleapiclient.http import MediaInMemoryUpload, MediaIoBaseDownload, MediaIoBaseUpload

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from drive_emulator import (  # noqa: E402
    DISCOVERY_PATH,
    FOLDER_MIME,
    MEDIA_ROUTES,
    ROUTES,
    SESSION_PARAM,
    STANDARD_PARAMS,
    DriveEmulator,
)

pytestmark = pytest.mark.drive

FILE_FIELDS = "id,name,parents,mimeType,size,md5Checksum,createdTime,modifiedTime,trashed"
OCTET = "application/octet-stream"


@pytest.fixture
def emu():
    with DriveEmulator(seed=1) as emulator:
        yield emulator


@pytest.fixture
def files(emu):
    return emu.service().files()


def _folder(files, parent, name):
    body = {"name": name, "mimeType": FOLDER_MIME, "parents": [parent]}
    return files.create(body=body, fields=FILE_FIELDS).execute()


def _upload(files, parent, name, data, **media_kwargs):
    media = MediaInMemoryUpload(data, mimetype=OCTET, **media_kwargs)
    request = files.create(body={"name": name, "parents": [parent]}, media_body=media, fields=FILE_FIELDS)
    if not media_kwargs.get("resumable"):
        return request.execute()
    response = None
    while response is None:
        _, response = request.next_chunk()
    return response


def _names(files, q, **kwargs):
    return sorted(f["name"] for f in files.list(q=q, fields="files(id,name)", **kwargs).execute()["files"])


def _reason(error: HttpError) -> str:
    return error.error_details[0]["reason"]


# ------------------------------------------------------------------------------------ discovery check


def test_routes_match_bundled_discovery_document():
    with open(DISCOVERY_PATH, encoding="utf-8") as fh:
        doc = json.load(fh)
    methods = doc["resources"]["files"]["methods"]
    standard = set(doc["parameters"])
    assert set(ROUTES) == {"files.list", "files.get", "files.create", "files.update", "files.delete", "about.get"}
    assert standard >= STANDARD_PARAMS
    for name, route in ROUTES.items():
        resource, verb = name.split(".")
        method = doc["resources"][resource]["methods"][verb]
        assert method["id"] == f"drive.{name}"
        assert route.http_method == method["httpMethod"], name
        assert route.path == "/" + doc["servicePath"] + method["path"], name
        declared = set(method.get("parameters", {}))
        assert route.params <= declared, (name, route.params - declared)
    assert SESSION_PARAM not in standard  # a token in the session URI the emulator hands out, not a parameter
    for name, paths in MEDIA_ROUTES.items():
        protocols = methods[name.split(".")[1]]["mediaUpload"]["protocols"]
        assert paths == {"simple": protocols["simple"]["path"], "resumable": protocols["resumable"]["path"]}
    assert methods["get"]["supportsMediaDownload"]


def test_discovery_document_points_at_the_emulator(emu):
    doc = emu.discovery_document()
    assert doc["rootUrl"] == emu.root_url == f"http://127.0.0.1:{emu.port}/"
    doc["rootUrl"] = "changed"  # a copy
    assert emu.discovery_document()["rootUrl"] == emu.root_url


def test_subprocess_builds_its_own_client(emu):
    script = (
        "import json, sys, httplib2\n"
        "from googleapiclient.discovery import build_from_document\n"
        "doc = json.loads(sys.stdin.read())\n"
        "svc = build_from_document(doc, http=httplib2.Http(timeout=10))\n"
        "print(svc.files().get(fileId=sys.argv[1], fields='name').execute()['name'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, emu.root_id],
        input=json.dumps(emu.discovery_document()),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "shared"


# ------------------------------------------------------------------------------------- create and get


def test_root_folder_and_create_folder(emu, files):
    root = files.get(fileId=emu.root_id, fields=FILE_FIELDS).execute()
    assert root["name"] == "shared" and root["mimeType"] == FOLDER_MIME
    folder = _folder(files, emu.root_id, "rollouts")
    assert folder["parents"] == [emu.root_id]
    assert "size" not in folder and "md5Checksum" not in folder
    assert folder["createdTime"].endswith("Z") and len(folder["createdTime"]) == len("2024-01-01T00:00:00.000Z")
    assert files.get(fileId=folder["id"], fields=FILE_FIELDS).execute() == folder
    default = files.get(fileId=folder["id"]).execute()
    assert default == {"kind": "drive#file", "id": folder["id"], "name": "rollouts", "mimeType": FOLDER_MIME}


def test_create_metadata_only_file_is_empty(emu, files):
    made = files.create(body={"name": "empty.json", "parents": [emu.root_id]}, fields=FILE_FIELDS).execute()
    assert made["size"] == "0" and made["md5Checksum"] == hashlib.md5(b"").hexdigest()
    assert emu.content(made["id"]) == b""


@pytest.mark.parametrize("kind", ["multipart", "media", "resumable", "resumable-stream", "resumable-empty"])
def test_create_with_content(emu, files, kind):
    data = b"" if kind == "resumable-empty" else os.urandom(10_000) + b"\r\n--\n"
    emu.requests.clear()
    if kind == "multipart":
        made = _upload(files, emu.root_id, "m.bin", data)
    elif kind == "media":
        made = files.create(media_body=MediaInMemoryUpload(data, mimetype=OCTET), fields=FILE_FIELDS).execute()
        assert made["name"] == "Untitled" and made["parents"] == [emu.my_drive_id]
    elif kind == "resumable-stream":
        media = MediaIoBaseUpload(io.BytesIO(data), mimetype=OCTET, chunksize=4096, resumable=True)
        request = files.create(body={"name": "s.bin", "parents": [emu.root_id]}, media_body=media, fields=FILE_FIELDS)
        made, progress = None, []
        while made is None:
            status, made = request.next_chunk()
            progress.append(status and status.resumable_progress)
        assert progress == [4096, 8192, None]  # two 308 answers, then the file
    else:
        made = _upload(files, emu.root_id, "r.bin", data, resumable=True, chunksize=1024)
    assert emu.content(made["id"]) == data
    assert made["size"] == str(len(data)) and made["md5Checksum"] == hashlib.md5(data).hexdigest()
    upload_type = {"multipart": "multipart", "media": "media"}.get(kind, "resumable")
    assert emu.requests[0][0] == "POST" and emu.requests[0][1].startswith("/upload/drive/v3/files?")
    assert f"uploadType={upload_type}" in emu.requests[0][1]
    expected_puts = {"resumable": 10, "resumable-stream": 3, "resumable-empty": 1}.get(kind, 0)
    assert sum(method == "PUT" for method, _ in emu.requests) == expected_puts


def test_resumable_path_of_the_discovery_document_is_served(emu):
    import httplib2

    http = httplib2.Http(timeout=10)
    http.redirect_codes = http.redirect_codes - {308}
    meta = json.dumps({"name": "direct.bin", "parents": [emu.root_id]})
    headers = {"Content-Type": "application/json", "X-Upload-Content-Length": "3"}
    resp, _ = http.request(emu.root_url + "resumable/upload/drive/v3/files", "POST", body=meta, headers=headers)
    assert resp.status == 200 and SESSION_PARAM + "=" in resp["location"]
    resp, _ = http.request(resp["location"], "PUT", body=b"ab", headers={"Content-Range": "bytes 0-1/3"})
    assert resp.status == 308 and resp["range"] == "bytes=0-1"
    session = emu.requests[-1][1]
    resp, content = http.request(
        emu.root_url + session.lstrip("/"), "PUT", body=b"c", headers={"Content-Range": "bytes 2-2/3"}
    )
    assert resp.status == 200 and emu.content(json.loads(content)["id"]) == b"abc"


def test_create_errors(emu, files):
    with pytest.raises(HttpError) as missing:
        files.create(body={"name": "x", "parents": ["nope"]}).execute()
    assert missing.value.resp.status == 404 and _reason(missing.value) == "notFound"
    with pytest.raises(HttpError) as two_parents:
        files.create(body={"name": "x", "parents": [emu.root_id, emu.my_drive_id]}).execute()
    assert two_parents.value.resp.status == 403 and _reason(two_parents.value) == "cannotAddParent"
    with pytest.raises(HttpError) as read_only:
        files.create(body={"name": "x", "id": "mine"}).execute()
    assert read_only.value.resp.status == 403 and _reason(read_only.value) == "fieldNotWritable"


# ------------------------------------------------------------------------------------------ list


def test_list_query_forms(emu, files):
    sub = _folder(files, emu.root_id, "sub")
    emu.create_file(emu.root_id, "a.txt", b"1")
    emu.create_file(emu.root_id, "it's \\ odd.json", b"2")
    emu.create_file(sub["id"], "a.txt", b"3")
    gone = emu.create_file(emu.root_id, "gone.txt", b"4")
    files.update(fileId=gone, body={"trashed": True}).execute()
    root = emu.root_id
    assert _names(files, f"'{root}' in parents") == ["a.txt", "gone.txt", "it's \\ odd.json", "sub"]
    assert _names(files, f"'{root}' in parents and trashed = false") == ["a.txt", "it's \\ odd.json", "sub"]
    assert _names(files, f"'{root}' in parents and trashed = true") == ["gone.txt"]
    assert _names(files, "name = 'a.txt'") == ["a.txt", "a.txt"]
    assert _names(files, "name = 'it\\'s \\\\ odd.json' and trashed = false") == ["it's \\ odd.json"]
    assert _names(files, f"mimeType = '{FOLDER_MIME}' and '{root}' in parents") == ["sub"]
    assert _names(files, f"'{root}' in parents and mimeType != '{FOLDER_MIME}' and trashed = false") == [
        "a.txt",
        "it's \\ odd.json",
    ]
    assert _names(files, "'root' in parents") == ["shared"]
    # A parenthesised group joined with or, as Drive's query language allows (and DriveStorage.prefetch_folders
    # sends): the one form of or the emulator serves.
    assert _names(files, f"({_q(root)} in parents or {_q(sub['id'])} in parents) and name = 'a.txt'") == [
        "a.txt",
        "a.txt",
    ]
    assert _names(files, f"'{root}' in parents and (trashed = true)") == ["gone.txt"]
    unsupported = ["name = 'a' or name = 'b'", "((trashed = false))", "(trashed = false and name = 'a')", "(name = 'a'"]
    for bad in ["name contains 'a'", "name = 'unterminated", *unsupported]:
        with pytest.raises(HttpError) as error:
            files.list(q=bad).execute()
        assert error.value.resp.status == 400 and _reason(error.value) == "invalid", bad


def _q(file_id: str) -> str:
    return f"'{file_id}'"


def test_list_paging_and_page_size(emu, files):
    folder = _folder(files, emu.root_id, "many")["id"]
    planted = {emu.create_file(folder, f"f{i:04d}", b"x") for i in range(1005)}
    q = f"'{folder}' in parents and trashed = false"
    first = files.list(q=q, pageSize=1000, fields="nextPageToken,files(id)").execute()
    assert len(first["files"]) == 1000 and first["nextPageToken"]
    second = files.list(q=q, pageSize=1000, pageToken=first["nextPageToken"], fields="nextPageToken,files(id)")
    second = second.execute()
    assert len(second["files"]) == 5 and "nextPageToken" not in second
    assert {f["id"] for f in first["files"] + second["files"]} == planted
    assert len(files.list(q=q).execute()["files"]) == 100  # default pageSize
    assert "nextPageToken" not in files.list(q=q, fields="files(id)").execute()  # only what fields asks for
    for bad in [{"pageSize": 1001}, {"pageSize": 0}, {"pageToken": "garbage"}]:
        with pytest.raises(HttpError) as error:
            files.list(q=q, **bad).execute()
        assert error.value.resp.status == 400


def test_list_order_by(emu, files):
    old = emu.create_file(emu.root_id, "b", b"", modified_time=1_000_000)
    new = emu.create_file(emu.root_id, "a", b"", modified_time=2_000_000)
    q = f"'{emu.root_id}' in parents"
    by_created = files.list(q=q, orderBy="createdTime", fields="files(id)").execute()["files"]
    assert [f["id"] for f in by_created] == [old, new]
    by_modified = files.list(q=q, orderBy="modifiedTime desc", fields="files(id,modifiedTime)").execute()["files"]
    assert [f["id"] for f in by_modified] == [new, old]
    assert by_modified[0]["modifiedTime"] == "1970-01-24T03:33:20.000Z"
    assert _names(files, q, orderBy="name") == ["a", "b"]
    with pytest.raises(HttpError):
        files.list(q=q, orderBy="quotaBytesUsed").execute()


def test_unknown_query_parameter_is_refused(emu, files):
    request = files.get(fileId=emu.root_id)
    request.uri += "&notAParameter=1" if "?" in request.uri else "?notAParameter=1"
    with pytest.raises(HttpError) as error:
        request.execute()
    assert error.value.resp.status == 400 and "notAParameter" in str(error.value)


# ------------------------------------------------------------------------------------ update and get


@pytest.mark.parametrize("kind", ["media", "multipart", "resumable"])
def test_update_content(emu, files, kind):
    made = emu.create_file(emu.root_id, "state.json", b"old", modified_time=1_000)
    before = files.get(fileId=made, fields=FILE_FIELDS).execute()
    data = os.urandom(3000)
    resumable = kind == "resumable"
    media = MediaInMemoryUpload(data, mimetype=OCTET, resumable=resumable, chunksize=1024)
    body = {"name": "state2.json"} if kind == "multipart" else None
    request = files.update(fileId=made, body=body, media_body=media, fields=FILE_FIELDS)
    if resumable:
        after = None
        while after is None:
            _, after = request.next_chunk()
    else:
        after = request.execute()
    assert emu.content(made) == data
    assert after["md5Checksum"] == hashlib.md5(data).hexdigest() and after["size"] == "3000"
    assert after["modifiedTime"] > before["modifiedTime"] and after["createdTime"] == before["createdTime"]
    assert after["name"] == ("state2.json" if kind == "multipart" else "state.json")
    assert any(path.startswith(f"/upload/drive/v3/files/{made}?") for _, path in emu.requests)


def test_update_metadata_rename_move_trash(emu, files):
    a = _folder(files, emu.root_id, "a")["id"]
    b = _folder(files, emu.root_id, "b")["id"]
    made = emu.create_file(a, "x.tmp", b"data")
    renamed = files.update(fileId=made, body={"name": "x.json"}, fields="name,parents").execute()
    assert renamed == {"name": "x.json", "parents": [a]}
    moved = files.update(fileId=made, addParents=b, removeParents=a, fields="parents").execute()
    assert moved["parents"] == [b]
    assert _names(files, f"'{a}' in parents") == [] and _names(files, f"'{b}' in parents") == ["x.json"]
    with pytest.raises(HttpError) as error:
        files.update(fileId=made, addParents=a).execute()  # a second parent
    assert error.value.resp.status == 403 and _reason(error.value) == "cannotAddParent"
    with pytest.raises(HttpError) as cycle:
        files.update(fileId=a, addParents=a, removeParents=emu.root_id).execute()
    assert cycle.value.resp.status == 400
    files.update(fileId=b, body={"trashed": True}).execute()
    assert files.get(fileId=made, fields="trashed").execute() == {"trashed": True}  # trashed with its folder
    assert _names(files, f"'{b}' in parents and trashed = false") == []
    assert emu.content(made) == b"data"


def test_get_media_and_download(emu, files):
    data = os.urandom(10_000)
    made = emu.create_file(emu.root_id, "blob", data)
    assert files.get_media(fileId=made).execute() == data
    out = io.BytesIO()
    downloader = MediaIoBaseDownload(out, files.get_media(fileId=made), chunksize=4096)
    done, chunks = False, 0
    while not done:
        _, done = downloader.next_chunk()
        chunks += 1
    assert out.getvalue() == data and chunks == 3
    empty = emu.create_file(emu.root_id, "empty", b"")
    out = io.BytesIO()
    assert MediaIoBaseDownload(out, files.get_media(fileId=empty)).next_chunk()[1] is True
    assert out.getvalue() == b""
    with pytest.raises(HttpError) as folder:
        files.get_media(fileId=emu.root_id).execute()
    assert folder.value.resp.status == 403 and _reason(folder.value) == "fileNotDownloadable"


def test_get_unknown_id_is_not_found(files):
    with pytest.raises(HttpError) as error:
        files.get(fileId="doesNotExist").execute()
    assert error.value.resp.status == 404 and _reason(error.value) == "notFound"
    assert "File not found: doesNotExist." in str(error.value)


# ------------------------------------------------------------------------------------------ delete


def test_delete_folder_cascades(emu, files):
    top = _folder(files, emu.root_id, "top")["id"]
    inner = _folder(files, top, "inner")["id"]
    leaf = emu.create_file(inner, "leaf", b"1")
    keep = emu.create_file(emu.root_id, "keep", b"2")
    assert files.delete(fileId=top).execute() == ""
    assert {f["id"] for f in emu.files()} == {emu.root_id, keep}
    for gone in (top, inner, leaf):
        with pytest.raises(HttpError) as error:
            files.get(fileId=gone).execute()
        assert error.value.resp.status == 404
    with pytest.raises(HttpError):
        files.delete(fileId=top).execute()


# ----------------------------------------------------------------------------------- awkwardness


def test_duplicate_creates(emu, files):
    emu.duplicate_creates = True
    made = _upload(files, emu.root_id, "dup.json", b"{}")
    _upload(files, emu.root_id, "dup2.json", b"[]", resumable=True, chunksize=1024)
    folder = _folder(files, emu.root_id, "dir")
    emu.duplicate_creates = False
    listed = files.list(q="name = 'dup.json'", fields=f"files({FILE_FIELDS})").execute()["files"]
    assert len(listed) == 2 and made["id"] in {f["id"] for f in listed}
    assert {f["md5Checksum"] for f in listed} == {made["md5Checksum"]}
    assert len(_names(files, "name = 'dup2.json'")) == 2
    assert _names(files, "name = 'dir'") == ["dir"]  # folders are never duplicated by the switch
    twin = emu.create_duplicate_folder(emu.root_id, "dir")
    folders = files.list(q=f"name = 'dir' and mimeType = '{FOLDER_MIME}'", fields="files(id,createdTime)").execute()
    by_id = {f["id"]: f["createdTime"] for f in folders["files"]}
    assert set(by_id) == {folder["id"], twin} and by_id[twin] > by_id[folder["id"]]
    emu.create_file(emu.root_id, "dup.json", b"hostile")
    assert len(_names(files, "name = 'dup.json'")) == 3


def test_list_lag(emu, files):
    emu.list_lag_s = 0.3
    made = _upload(files, emu.root_id, "late.json", b"1")
    q = f"'{emu.root_id}' in parents and name = 'late.json'"
    assert _names(files, q) == []
    assert files.get(fileId=made["id"], fields="name").execute() == {"name": "late.json"}
    time.sleep(0.35)
    assert _names(files, q) == ["late.json"]


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (403, "userRateLimitExceeded"),
        (403, "rateLimitExceeded"),
        (429, "rateLimitExceeded"),
        (500, "backendError"),
        (503, "backendError"),
        (404, "notFound"),
        (400, "badRequest"),
        (403, "insufficientFilePermissions"),
    ],
)
def test_fail_next(emu, files, status, reason):
    emu.fail_next(2, status, reason)
    for _ in range(2):
        with pytest.raises(HttpError) as error:
            files.get(fileId=emu.root_id).execute()
        assert error.value.resp.status == status
        assert _reason(error.value) == reason
        body = json.loads(error.value.content)["error"]
        assert body["code"] == status and body["errors"][0]["reason"] == reason and body["message"]
        expected_domain = "usageLimits" if "RateLimit" in reason or "rateLimit" in reason else "global"
        assert body["errors"][0]["domain"] == expected_domain
    assert files.get(fileId=emu.root_id, fields="name").execute() == {"name": "shared"}


def test_fail_next_hits_resumable_chunks(emu, files):
    media = MediaInMemoryUpload(b"x" * 3000, mimetype=OCTET, resumable=True, chunksize=1024)
    request = files.create(body={"name": "r", "parents": [emu.root_id]}, media_body=media, fields="id")
    request.next_chunk()
    emu.fail_next(1, 503, "backendError")
    with pytest.raises(HttpError) as error:
        request.next_chunk()
    assert error.value.resp.status == 503
    response = None
    while response is None:  # the client asks the session where it stands, then carries on
        _, response = request.next_chunk()
    assert emu.content(response["id"]) == b"x" * 3000


def test_drop_next(emu, files):
    emu.requests.clear()
    emu.drop_next(1)  # httplib2 resends once by itself: no error, two requests
    assert files.get(fileId=emu.root_id, fields="name").execute() == {"name": "shared"}
    assert len(emu.requests) == 2
    emu.drop_next(2)
    with pytest.raises(http.client.RemoteDisconnected) as error:
        files.get(fileId=emu.root_id).execute()
    assert isinstance(error.value, ConnectionError)
    assert len(emu.requests) == 4
    assert files.get(fileId=emu.root_id, fields="name").execute() == {"name": "shared"}


def test_requests_counts_calls(emu, files):
    emu.requests.clear()
    made = _upload(files, emu.root_id, "c.json", b"{}")
    files.get(fileId=made["id"]).execute()
    files.list(q="trashed = false").execute()
    files.delete(fileId=made["id"]).execute()
    assert [method for method, _ in emu.requests] == ["POST", "GET", "GET", "DELETE"]
    assert emu.requests[1][1].startswith(f"/drive/v3/files/{made['id']}")
    assert emu.requests[2][1].startswith("/drive/v3/files?")


def test_concurrent_clients(emu):
    errors = []

    def work(n):
        try:
            files = emu.service().files()
            for i in range(10):
                _upload(files, emu.root_id, f"t{n}-{i}", b"x")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len([f for f in emu.files() if f["name"].startswith("t")]) == 80
    assert len({f["id"] for f in emu.files()}) == len(emu.files())


def test_files_snapshot_and_content(emu):
    made = emu.create_file(emu.root_id, "snap", b"abc", modified_time=1_700_000_000.5)
    snap = {f["id"]: f for f in emu.files()}
    assert snap[made]["modifiedTime"] == "2023-11-14T22:13:20.500Z"
    assert snap[made]["size"] == "3" and snap[made]["md5Checksum"] == hashlib.md5(b"abc").hexdigest()
    assert snap[made]["trashed"] is False and snap[made]["parents"] == [emu.root_id]
    assert emu.content(made) == b"abc"
    with pytest.raises(KeyError):
        emu.content("nope")


def test_call_latency_delays_every_request_without_serialising_them():
    with DriveEmulator() as emu:
        emu.call_latency_s = 0.3
        services = [emu.service() for _ in range(4)]
        started = time.monotonic()
        threads = [
            threading.Thread(target=lambda s=s: s.files().list(q="trashed = false", fields="files(id)").execute())
            for s in services
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.0  # four at once wait together, not 4 x 0.3 s one after another


# ------------------------------------------------------------------------------ operational hazards


def test_member_roles_decide_who_may_delete_and_trash(emu, files):
    made = [_upload(files, emu.root_id, f"r{i}", b"x")["id"] for i in range(2)]
    emu.member_role = "fileOrganizer"  # Content manager: trash yes, delete no
    with pytest.raises(HttpError) as error:
        files.delete(fileId=made[0]).execute()
    assert error.value.resp.status == 403 and _reason(error.value) == "insufficientFilePermissions"
    files.update(fileId=made[0], body={"trashed": True}).execute()
    emu.member_role = "writer"  # neither
    with pytest.raises(HttpError):
        files.update(fileId=made[1], body={"trashed": True}).execute()
    emu.member_role = "organizer"
    files.delete(fileId=made[1]).execute()
    assert {f["id"]: f["trashed"] for f in emu.files() if f["id"] in made} == {made[0]: True}
    with pytest.raises(ValueError):
        emu.member_role = "owner"


@pytest.mark.parametrize("cause", ["service_account", "storage_full", "shared_drive_items", "daily_limit"])
def test_quota_causes_refuse_their_requests_with_drive_s_error(emu, files, cause):
    from drive_emulator import QUOTA_CAUSES

    status, reason, message, scope = QUOTA_CAUSES[cause]
    emu.quota_exceeded = cause
    with pytest.raises(HttpError) as error:
        _upload(files, emu.root_id, "q.json", b"{}")
    assert error.value.resp.status == status and _reason(error.value) == reason
    assert json.loads(error.value.content)["error"]["errors"][0]["message"] == message
    if scope != "any":
        assert files.get(fileId=emu.root_id, fields="name").execute() == {"name": "shared"}  # reads still work
    emu.quota_exceeded = None
    assert _upload(files, emu.root_id, "q.json", b"{}")["name"] == "q.json"


def test_fail_transfer_breaks_a_chunk_or_a_range_midway(emu, files):
    data = os.urandom(5000)
    emu.fail_transfer("upload", after=2, count=1)
    media = MediaInMemoryUpload(data, mimetype=OCTET, resumable=True, chunksize=1024)
    request = files.create(body={"name": "big", "parents": [emu.root_id]}, media_body=media, fields="id")
    request.next_chunk()
    request.next_chunk()
    with pytest.raises(HttpError):
        request.next_chunk()  # the third chunk
    response = None
    while response is None:
        _, response = request.next_chunk()
    assert emu.content(response["id"]) == data and emu.transfer_bytes["upload"] == len(data)
    emu.fail_transfer("download", after=1, count=1)
    out = io.BytesIO()
    download = MediaIoBaseDownload(out, files.get_media(fileId=response["id"]), chunksize=2048)
    download.next_chunk()
    with pytest.raises(HttpError):
        download.next_chunk()
    done = False
    while not done:
        _, done = download.next_chunk()
    assert out.getvalue() == data and emu.transfer_bytes["download"] == len(data)


def test_token_endpoint_faults(emu):
    import httplib2

    http = httplib2.Http(timeout=5)
    body = "grant_type=refresh_token&refresh_token=r"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    emu.fail_token_next(1, 503)
    emu.fail_token_next(1, 400, "invalid_grant")
    answers = [http.request(emu.token_uri, "POST", body=body, headers=headers) for _ in range(3)]
    assert [(r.status, json.loads(c).get("error")) for r, c in answers] == [
        (503, "server_error"),
        (400, "invalid_grant"),
        (200, None),
    ]
    emu.drop_token_next(2)  # httplib2 resends one drop; the second reaches the caller
    with pytest.raises(http_client_errors()):
        http.request(emu.token_uri, "POST", body=body, headers=headers)
    assert emu.token_grants == ["refresh_token"]


def http_client_errors() -> tuple[type[BaseException], ...]:
    import httplib2

    return (http.client.HTTPException, httplib2.HttpLib2Error, ConnectionError)


def test_transfer_rate_slows_big_requests_only():
    with DriveEmulator() as emu:
        files = emu.service().files()
        emu.transfer_bytes_per_s = 1_000_000
        started = time.monotonic()
        _upload(files, emu.root_id, "small", b"x")
        small = time.monotonic() - started
        started = time.monotonic()
        _upload(files, emu.root_id, "big", b"x" * 500_000)
        big = time.monotonic() - started
    assert small < 0.2 and big >= 0.5
