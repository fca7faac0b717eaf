"""FsspecStorage specifics: which errors are retried, write paths per store, appends, metadata parsing.

The behaviour every backend shares is in tests/contract; this file checks what only the fsspec
backend does, with failures injected into its filesystem object.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from fsspec.exceptions import FSTimeoutError
from s3fs.errors import translate_boto_error

from swarm_gdrive.storage.base import (
    FileTooLargeError,
    NotRegularFileError,
    Storage,
    StorageUnavailableError,
    is_temp_of,
)
from swarm_gdrive.storage.fsspec_storage import (
    FsspecStorage,
    client_error,
    entry_mtime,
    is_transient_fsspec_error,
    is_write_conflict,
)

ATTEMPTS = 4


def boto_error(code: str, status: int = 400, operation: str = "PutObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


def s3fs_error(code: str, status: int = 400) -> BaseException:
    """What s3fs raises after its own retries: a Python error with the ClientError as its cause."""
    return translate_boto_error(boto_error(code, status))


class HttpError(Exception):
    """Shaped like gcsfs' HttpError: the HTTP status in ``.code``."""

    def __init__(self, code: int) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code


def failing_first(
    real: Callable[..., Any], errors: list[BaseException], after: bool = False
) -> tuple[Callable[..., Any], list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    """A wrapper of ``real`` that raises ``errors`` one by one on its first calls (after running ``real``
    if ``after``: the call took effect but its reply was lost); records every call."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        if len(calls) <= len(errors):
            if after:
                real(*args, **kwargs)
            raise errors[len(calls) - 1]
        return real(*args, **kwargs)

    return wrapper, calls


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://unit-{uuid.uuid4().hex[:12]}/root"
    yield url
    storage = FsspecStorage(url)
    prefix = storage.root.rsplit("/", 1)[0] + "/"
    for key in [k for k in storage.fs.store if k.startswith(prefix)]:
        storage.fs.store.pop(key, None)


def make(url: str, **kwargs: Any) -> FsspecStorage:
    # its own filesystem instance, so patching its methods touches no other test
    return FsspecStorage(url, {"skip_instance_cache": True}, retry_attempts=ATTEMPTS, retry_max_wait=0.01, **kwargs)


@pytest.fixture
def storage(memory_url: str) -> FsspecStorage:
    return make(memory_url)


# -- construction ----------------------------------------------------------------------------


def test_is_a_storage_and_describes_itself(storage: FsspecStorage, memory_url: str) -> None:
    assert isinstance(storage, Storage)
    assert storage.describe() == f"fsspec {memory_url}"


def test_describe_leaves_credentials_out() -> None:
    storage = FsspecStorage("s3://KEY:SECRET@bucket/prefix", {"anon": True})
    assert storage.describe() == "fsspec s3://bucket/prefix"


@pytest.mark.parametrize(
    ("url", "options", "object_store", "atomic_put", "conditional"),
    [
        ("memory://x/y", {}, True, True, False),
        ("s3://bucket/prefix", {"anon": True}, True, True, True),
        ("file:///tmp/somewhere", {}, False, False, False),
    ],
)
def test_store_kinds(
    url: str, options: dict[str, Any], object_store: bool, atomic_put: bool, conditional: bool
) -> None:
    storage = FsspecStorage(url, options)
    assert (storage.object_store, storage.atomic_put, storage.conditional_writes) == (
        object_store,
        atomic_put,
        conditional,
    )


def test_paths_are_validated_like_local_storage(storage: FsspecStorage) -> None:
    with pytest.raises(ValueError) as info:
        storage.read_bytes("../x")
    assert str(info.value) == "storage path must be relative and stay inside the root: '../x'"


# -- error classification --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (boto_error("SlowDown", 503), True),
        (boto_error("RequestTimeout", 400), True),
        (boto_error("InternalError", 500), True),
        (boto_error("ServiceUnavailable", 503), True),
        (boto_error("Throttling", 400), True),
        (boto_error("ThrottlingException", 400), True),
        (boto_error("RequestLimitExceeded", 400), True),
        (boto_error("SomethingNew", 502), True),
        (boto_error("TooMany", 429), True),
        (boto_error("AccessDenied", 403), False),
        (boto_error("NoSuchKey", 404), False),
        (boto_error("NoSuchBucket", 404), False),
        (boto_error("PreconditionFailed", 412), False),
        (boto_error("InvalidRange", 416), False),
        (s3fs_error("SlowDown", 503), True),
        (s3fs_error("InternalError", 500), True),
        (s3fs_error("RequestTimeout", 400), True),
        (s3fs_error("AccessDenied", 403), False),
        (s3fs_error("NoSuchKey", 404), False),
        (s3fs_error("InvalidAccessKeyId", 403), False),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (ReadTimeoutError(endpoint_url="http://x"), True),
        (ConnectTimeoutError(endpoint_url="http://x"), True),
        (NoCredentialsError(), False),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("truncated"), True),
        (FSTimeoutError(), True),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), True),
        (TimeoutError("timed out"), True),
        (OSError(errno.EIO, "Input/output error"), True),
        (HttpError(503), True),
        (HttpError(429), True),
        (HttpError(404), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (FileTooLargeError("x", 2, 1), False),
        (PermissionError(errno.EACCES, "Permission denied"), False),
        (IsADirectoryError(errno.EISDIR, "Is a directory"), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient_fsspec_error(exc: BaseException, expected: bool) -> None:
    assert is_transient_fsspec_error(exc) is expected


def test_not_found_is_never_transient_whatever_it_wraps() -> None:
    missing = FileNotFoundError("gone")
    missing.__cause__ = boto_error("SlowDown", 503)
    assert is_transient_fsspec_error(missing) is False


def test_client_error_found_through_the_chain() -> None:
    assert client_error(s3fs_error("SlowDown", 503)) == ("SlowDown", 503)
    assert client_error(ValueError("x")) == (None, None)
    try:
        try:
            raise boto_error("Throttling")
        except ClientError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert client_error(outer) == ("Throttling", 400)
        assert is_transient_fsspec_error(outer) is True


def test_is_write_conflict() -> None:
    assert is_write_conflict(s3fs_error("PreconditionFailed", 412))
    assert is_write_conflict(boto_error("ConditionalRequestConflict", 409))
    assert not is_write_conflict(s3fs_error("SlowDown", 503))
    assert not is_write_conflict(OSError(errno.EIO, "x"))


# -- metadata --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"mtime": 12.5}, 12.5),
        ({"LastModified": datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}, 1704164645.0),
        ({"LastModified": datetime(2024, 1, 2, 3, 4, 5)}, 1704164645.0),  # naive: UTC
        ({"LastModified": datetime(2024, 1, 2, 4, 4, 5, tzinfo=timezone(timedelta(hours=1)))}, 1704164645.0),
        ({"updated": "2024-01-02T03:04:05Z"}, 1704164645.0),
        ({"updated": "2024-01-02T03:04:05.500000+00:00"}, 1704164645.5),
        ({"created": 1704164645}, 1704164645.0),
        ({"created": datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}, 1704164645.0),
        ({"mtime": None, "created": 7.0}, 7.0),
        ({"updated": "not a date"}, 0.0),
        ({"name": "x", "size": 1}, 0.0),
    ],
)
def test_entry_mtime(entry: dict[str, Any], expected: float) -> None:
    assert entry_mtime(entry) == expected


# -- retries ---------------------------------------------------------------------------------


def test_transient_read_errors_are_retried(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage.write_bytes("x.json", b"ok")
    errors = [ConnectionResetError(errno.ECONNRESET, "reset"), FSTimeoutError()]
    wrapper, calls = failing_first(storage.fs.cat_file, errors)
    monkeypatch.setattr(storage.fs, "cat_file", wrapper)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.base"):
        assert storage.read_bytes("x.json") == b"ok"
    assert len(calls) == 3
    assert len([r for r in caplog.records if "Retrying" in r.getMessage()]) == 2


def test_throttling_on_write_is_retried(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    errors = [s3fs_error("SlowDown", 503), boto_error("ThrottlingException", 400)]
    wrapper, calls = failing_first(storage.fs.pipe_file, errors)
    monkeypatch.setattr(storage.fs, "pipe_file", wrapper)
    storage.write_bytes("d/x.json", b"payload")
    assert len(calls) == 3
    assert storage.read_bytes("d/x.json") == b"payload"


def test_access_denied_is_not_retried(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper, calls = failing_first(storage.fs.pipe_file, [s3fs_error("AccessDenied", 403)])
    monkeypatch.setattr(storage.fs, "pipe_file", wrapper)
    with pytest.raises(PermissionError):
        storage.write_bytes("d/x.json", b"payload")
    assert len(calls) == 1
    raw, raw_calls = failing_first(storage.fs.ls, [boto_error("AccessDenied", 403, "ListObjectsV2")])
    monkeypatch.setattr(storage.fs, "ls", raw)
    with pytest.raises(ClientError):
        storage.list("d")
    assert len(raw_calls) == 1


def test_transient_list_delete_and_move_errors_are_retried(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.write_bytes("d/x.json", b"1")
    storage.write_bytes("d/y.json", b"2")
    for method, error in [
        ("ls", FSTimeoutError()),
        ("rm_file", boto_error("InternalError", 500, "DeleteObject")),
        ("cp_file", aiohttp.ServerDisconnectedError()),
    ]:
        wrapper, calls = failing_first(getattr(storage.fs, method), [error])
        monkeypatch.setattr(storage.fs, method, wrapper)
    assert [e.name for e in storage.list("d")] == ["x.json", "y.json"]
    storage.delete("d/y.json")
    storage.move("d/x.json", "e/x.json")
    monkeypatch.undo()
    assert [e.name for e in storage.list("e")] == ["x.json"]
    assert storage.list("d") == []


def test_transient_errors_give_up_after_the_attempts(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("x.json", b"ok")
    errors = [ConnectionResetError(errno.ECONNRESET, f"reset #{i}") for i in range(10)]
    wrapper, calls = failing_first(storage.fs.cat_file, errors)
    monkeypatch.setattr(storage.fs, "cat_file", wrapper)
    with pytest.raises(StorageUnavailableError) as info:  # which bounded waits ride out
        storage.read_bytes("x.json")
    assert info.value.errno == errno.ECONNRESET and f"reset #{ATTEMPTS - 1}" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert len(calls) == ATTEMPTS


def test_missing_file_is_not_retried(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper, calls = failing_first(storage.fs.info, [])
    monkeypatch.setattr(storage.fs, "info", wrapper)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("missing.json")
    assert len(calls) == 1


# -- reads -----------------------------------------------------------------------------------


def test_size_cap_is_checked_before_download(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("big.json", b"x" * 100)
    info, info_calls = failing_first(storage.fs.info, [])
    cat, cat_calls = failing_first(storage.fs.cat_file, [])
    monkeypatch.setattr(storage.fs, "info", info)
    monkeypatch.setattr(storage.fs, "cat_file", cat)
    with pytest.raises(FileTooLargeError) as error:
        storage.read_bytes("big.json", max_bytes=99)
    assert (error.value.size, error.value.cap) == (100, 99)
    assert (len(info_calls), len(cat_calls)) == (1, 0)  # not downloaded, not retried


def test_download_is_capped_too(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that grew between the size check and the download is not read past the cap."""
    storage.write_bytes("grows.json", b"x" * 500)
    real_info = storage.fs.info
    monkeypatch.setattr(storage.fs, "info", lambda path, **kw: {**real_info(path, **kw), "size": 10})
    cat, cat_calls = failing_first(storage.fs.cat_file, [])
    monkeypatch.setattr(storage.fs, "cat_file", cat)
    with pytest.raises(FileTooLargeError) as error:
        storage.read_bytes("grows.json", max_bytes=100)
    assert (error.value.size, error.value.cap) == (101, 100)
    assert cat_calls[0][1] == {"start": 0, "end": 101}


def test_object_emptied_since_the_size_check_reads_empty(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.write_bytes("x.json", b"")
    real_info = storage.fs.info
    monkeypatch.setattr(storage.fs, "info", lambda path, **kw: {**real_info(path, **kw), "size": 5})
    monkeypatch.setattr(storage.fs, "cat_file", lambda *a, **k: (_ for _ in ()).throw(s3fs_error("InvalidRange", 416)))
    assert storage.read_bytes("x.json") == b""


def test_reading_a_folder_is_an_error_not_retried(storage: FsspecStorage) -> None:
    storage.write_bytes("d/x.json", b"1")
    with pytest.raises(NotRegularFileError, match="a folder"):
        storage.read_bytes("d")


def test_a_fifo_under_a_file_name_is_refused_without_opening_it(tmp_path: Path) -> None:
    """A FIFO planted where a protocol file belongs would block a reader that opened it for ever."""
    os.mkfifo(tmp_path / "state.json")
    storage = FsspecStorage(f"file://{tmp_path}", retry_max_wait=0.01)
    with pytest.raises(NotRegularFileError, match="type 'other'"):
        storage.read_bytes("state.json")


# -- write paths -----------------------------------------------------------------------------


def test_object_store_writes_the_whole_object_in_one_put(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, calls = failing_first(storage.fs.pipe_file, [])
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    monkeypatch.setattr(storage.fs, "mv", lambda *a, **k: pytest.fail("no move on an object store"))
    storage.write_bytes("d/x.json", b"payload")
    assert [args for args, _ in calls] == [(f"{storage.root}/d/x.json", b"payload")]


def test_filesystem_writes_go_through_a_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(f"file://{tmp_path}")
    pipe, calls = failing_first(storage.fs.pipe_file, [])
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    storage.write_bytes("d/x.json", b"payload")
    (written, _), _kwargs = calls[0]
    assert Path(written).parent == tmp_path / "d"
    assert is_temp_of(Path(written).name, "x.json")
    assert (tmp_path / "d/x.json").read_bytes() == b"payload"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def test_failed_move_keeps_old_content_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(f"file://{tmp_path}")
    storage.write_bytes("d/x.json", b"old")
    monkeypatch.setattr(storage.fs, "mv", lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no")))
    with pytest.raises(PermissionError):
        storage.write_bytes("d/x.json", b"new")
    assert (tmp_path / "d/x.json").read_bytes() == b"old"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def test_transient_move_error_retried_and_temporary_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(f"file://{tmp_path}")
    mv, calls = failing_first(storage.fs.mv, [ConnectionResetError(errno.ECONNRESET, "reset")])
    monkeypatch.setattr(storage.fs, "mv", mv)
    storage.write_bytes("d/x.json", b"payload")
    assert len(calls) == 2
    assert (tmp_path / "d/x.json").read_bytes() == b"payload"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def test_temporary_write_path_can_be_forced(memory_url: str) -> None:
    storage = make(memory_url, atomic_put=False)
    storage.write_bytes("d/x.json", b"1")
    storage.write_bytes("d/x.json", b"2")
    assert storage.read_bytes("d/x.json") == b"2"
    assert [e.name for e in storage.list("d", include_hidden=True)] == ["x.json"]


# -- appends ---------------------------------------------------------------------------------


def test_append_whose_reply_was_lost_is_not_applied_twice(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.append_bytes("logs/m.jsonl", b"1\n")
    pipe, calls = failing_first(storage.fs.pipe_file, [ConnectionResetError(errno.ECONNRESET, "reset")], after=True)
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    storage.append_bytes("logs/m.jsonl", b"2\n")
    assert len(calls) == 1  # the retry saw the append had landed
    assert storage.read_bytes("logs/m.jsonl") == b"1\n2\n"


def test_conditional_appends_send_the_etag_they_read(memory_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(memory_url, conditional_writes=True)
    real_info = storage.fs.info
    monkeypatch.setattr(storage.fs, "info", lambda path, **kw: {**real_info(path, **kw), "ETag": '"etag-1"'})
    pipe, calls = failing_first(storage.fs.pipe_file, [])
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    storage.append_bytes("logs/m.jsonl", b"1\n")
    storage.append_bytes("logs/m.jsonl", b"2\n")
    assert [kwargs for _, kwargs in calls] == [{"IfNoneMatch": "*"}, {"IfMatch": '"etag-1"'}]
    assert storage.read_bytes("logs/m.jsonl") == b"1\n2\n"


def test_conditional_append_that_lost_a_race_is_redone(memory_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = make(memory_url, conditional_writes=True)
    storage.write_bytes("logs/m.jsonl", b"1\n")
    errors = [s3fs_error("PreconditionFailed", 412), boto_error("ConditionalRequestConflict", 409)]
    pipe, calls = failing_first(storage.fs.pipe_file, errors)
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    storage.append_bytes("logs/m.jsonl", b"2\n")
    assert len(calls) == 3
    assert storage.read_bytes("logs/m.jsonl") == b"1\n2\n"


def test_unconditional_store_does_not_retry_a_precondition_failure(
    storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, calls = failing_first(storage.fs.pipe_file, [s3fs_error("PreconditionFailed", 412)])
    monkeypatch.setattr(storage.fs, "pipe_file", pipe)
    with pytest.raises(OSError):
        storage.append_bytes("logs/m.jsonl", b"1\n")
    assert len(calls) == 1
    assert calls[0][1] == {}  # no condition sent where the store has none


# -- folders ---------------------------------------------------------------------------------


def test_remove_empty_dir_of_a_file_is_an_error(storage: FsspecStorage) -> None:
    storage.write_bytes("f.json", b"1")
    with pytest.raises(NotADirectoryError):
        storage.remove_empty_dir("f.json")


def test_object_store_folder_move_uses_one_batch_copy(storage: FsspecStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a.json", "sub/b.json", "sub/deeper/c.json"):
        storage.write_bytes(f"src/{name}", name.encode())
    copy, calls = failing_first(storage.fs.copy, [])
    monkeypatch.setattr(storage.fs, "copy", copy)
    storage.move("src", "dst")
    assert len(calls) == 1
    assert sorted(calls[0][0][1]) == [f"{storage.root}/dst/{n}" for n in ("a.json", "sub/b.json", "sub/deeper/c.json")]
    assert storage.read_bytes("dst/sub/deeper/c.json") == b"sub/deeper/c.json"
    assert storage.list("src") == []
