"""LocalStorage: the storage contract, atomic writes, and retries of transient errors only."""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarm_gdrive.storage import local as local_module
from swarm_gdrive.storage.base import FileInfo, FileTooLargeError, Storage, StorageError, is_temp_of, temp_name_for
from swarm_gdrive.storage.local import LocalStorage, is_transient_os_error

ATTEMPTS = 4


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path, retry_attempts=ATTEMPTS, retry_max_wait=0.01)


def failing_first(
    real: Callable[..., Any], errors: list[BaseException], when: Callable[..., bool] = lambda *a, **k: True
) -> tuple[Callable[..., Any], list[int]]:
    """A wrapper of ``real`` that raises ``errors`` one by one on its first matching calls; counts the calls."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not when(*args, **kwargs):
            return real(*args, **kwargs)
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return real(*args, **kwargs)

    return wrapper, calls


# -- basic contract --------------------------------------------------------------------------


def test_is_a_storage(storage: LocalStorage, tmp_path: Path) -> None:
    assert isinstance(storage, Storage)
    assert storage.describe() == f"local folder {tmp_path}"


def test_write_read_round_trip(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("experiments/e/state/current_state.json", b'{"a": 1}')
    assert storage.read_bytes("experiments/e/state/current_state.json") == b'{"a": 1}'
    assert (tmp_path / "experiments/e/state/current_state.json").read_bytes() == b'{"a": 1}'
    storage.write_bytes("experiments/e/state/current_state.json", b"{}")
    assert storage.read_bytes("experiments/e/state/current_state.json") == b"{}"


def test_write_accepts_bytearray_and_empty(storage: LocalStorage) -> None:
    storage.write_bytes("a.bin", bytearray(b"\x00\x01"))
    storage.write_bytes("empty.bin", b"")
    assert storage.read_bytes("a.bin") == b"\x00\x01"
    assert storage.read_bytes("empty.bin") == b""


def test_write_leaves_no_temporary(storage: LocalStorage, tmp_path: Path) -> None:
    for i in range(3):
        storage.write_bytes("d/x.json", b"%d" % i)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def opening(name: str) -> Callable[..., bool]:
    """``failing_first``'s filter for the os.open calls of one name (each component is opened on its own)."""
    return lambda path, *a, **k: path == name


def test_read_missing_raises_not_found_without_retry(storage: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    wrapper, calls = failing_first(os.open, [], when=opening("nope"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("nope/missing.json")
    assert calls[0] == 1


def test_read_over_cap_raises_without_retry(storage: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("big.json", b"x" * 100)
    wrapper, calls = failing_first(os.open, [], when=opening("big.json"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    with pytest.raises(FileTooLargeError) as info:
        storage.read_bytes("big.json", max_bytes=99)
    assert str(info.value) == "big.json: 100 bytes exceeds the 99-byte cap for this file"
    assert (info.value.path, info.value.size, info.value.cap) == ("big.json", 100, 99)
    assert isinstance(info.value, StorageError)
    assert calls[0] == 1
    assert storage.read_bytes("big.json", max_bytes=100) == b"x" * 100


def test_append(storage: LocalStorage, tmp_path: Path) -> None:
    storage.append_bytes("logs/w/metrics.jsonl", b"one\n")
    storage.append_bytes("logs/w/metrics.jsonl", b"two\n")
    assert storage.read_bytes("logs/w/metrics.jsonl") == b"one\ntwo\n"
    assert (tmp_path / "logs/w/metrics.jsonl").read_bytes() == b"one\ntwo\n"


def test_delete(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("d/x.json", b"1")
    storage.delete("d/x.json")
    assert not (tmp_path / "d/x.json").exists()
    storage.delete("d/x.json")  # absent is fine
    storage.delete("never/was/here.json")
    assert storage.list("d") == []


def test_move_creates_parents(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("rollouts/round_0/stage_0/w.json", b"r")
    storage.move("rollouts/round_0/stage_0/w.json", "archives/e/rollouts/round_0/stage_0/w.json")
    assert not (tmp_path / "rollouts/round_0/stage_0/w.json").exists()
    assert storage.read_bytes("archives/e/rollouts/round_0/stage_0/w.json") == b"r"


def test_move_a_folder(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("experiments/e/state/current_state.json", b"s")
    storage.write_bytes("experiments/e/peers/w.json", b"p")
    storage.move("experiments/e", "archives/e/reset_1")
    assert not (tmp_path / "experiments/e").exists()
    assert storage.read_bytes("archives/e/reset_1/state/current_state.json") == b"s"
    assert storage.read_bytes("archives/e/reset_1/peers/w.json") == b"p"


def test_move_missing_source(storage: LocalStorage) -> None:
    with pytest.raises(FileNotFoundError):
        storage.move("missing.json", "dst/missing.json")


def test_remove_empty_dir(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("r/round_0/stage_0/w.json", b"1")
    assert storage.remove_empty_dir("r/round_0/stage_0") is False
    assert (tmp_path / "r/round_0/stage_0/w.json").exists()
    storage.delete("r/round_0/stage_0/w.json")
    assert storage.remove_empty_dir("r/round_0/stage_0") is True
    assert not (tmp_path / "r/round_0/stage_0").exists()
    assert storage.remove_empty_dir("r/round_0/stage_0") is True  # already gone
    assert storage.remove_empty_dir("r/round_0") is True


# -- listing ---------------------------------------------------------------------------------


def test_list_entries(storage: LocalStorage, tmp_path: Path) -> None:
    before = time.time()
    storage.write_bytes("d/b.json", b"12345")
    storage.write_bytes("d/a.json", b"1")
    storage.write_bytes("d/sub/c.json", b"1")
    entries = storage.list("d")
    assert [(e.name, e.size, e.is_dir) for e in entries if not e.is_dir] == [("a.json", 1, False), ("b.json", 5, False)]
    assert [e.name for e in entries] == ["a.json", "b.json", "sub"]
    assert entries[2].is_dir is True
    assert all(isinstance(e, FileInfo) for e in entries)
    b = entries[1]
    assert b.mtime == os.stat(tmp_path / "d/b.json").st_mtime
    assert before - 5 <= b.mtime <= time.time() + 5


def test_list_excludes_temporary_names(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("d/x.json", b"1")
    hidden = [".x.json.abc.tmp", ".hidden", "~lock", "y.tmp", "z.partial", "w.part"]
    for name in hidden:
        (tmp_path / "d" / name).write_bytes(b"partial")
    assert [e.name for e in storage.list("d")] == ["x.json"]
    assert [e.name for e in storage.list("d", include_hidden=True)] == sorted([*hidden, "x.json"])


def test_killed_writer_temporary_is_ignored(storage: LocalStorage, tmp_path: Path) -> None:
    storage.write_bytes("peers/x.json", b'{"v": 1}')
    (tmp_path / "peers" / ".x.json.abc.tmp").write_bytes(b'{"v": 2, "trunc')
    assert [e.name for e in storage.list("peers")] == ["x.json"]
    assert storage.read_bytes("peers/x.json") == b'{"v": 1}'


def test_list_missing_folder_is_empty(storage: LocalStorage) -> None:
    assert storage.list("experiments/none/peers") == []


def test_list_of_a_file_is_empty(storage: LocalStorage) -> None:
    storage.write_bytes("f.json", b"1")
    assert storage.list("f.json") == []


def test_temp_names() -> None:
    temp = temp_name_for("x.json")
    assert temp.startswith(".x.json.") and temp.endswith(".tmp")
    assert temp != temp_name_for("x.json")
    assert is_temp_of(temp, "x.json")
    assert not is_temp_of(temp, "x.jso")
    assert not is_temp_of(temp_name_for("y.json"), "x.json")


# -- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../x", "/abs", "a/../b", "", ".", "..", "a/..", "/etc/passwd"])
def test_paths_escaping_the_root(storage: LocalStorage, path: str) -> None:
    operations: list[Callable[[], object]] = [
        lambda: storage.read_bytes(path),
        lambda: storage.write_bytes(path, b"x"),
        lambda: storage.append_bytes(path, b"x"),
        lambda: storage.list(path),
        lambda: storage.delete(path),
        lambda: storage.remove_empty_dir(path),
        lambda: storage.move(path, "ok.json"),
        lambda: storage.move("ok.json", path),
    ]
    for operation in operations:
        with pytest.raises(ValueError) as info:
            operation()
        assert str(info.value) == f"storage path must be relative and stay inside the root: {path!r}"


def test_escape_attempt_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    storage = LocalStorage(root, retry_attempts=ATTEMPTS, retry_max_wait=0.01)
    with pytest.raises(ValueError):
        storage.write_bytes("../outside.json", b"x")
    assert not (tmp_path / "outside.json").exists()


# -- atomicity -------------------------------------------------------------------------------


def _rewrite_many(root: str, rel: str, count: int, start: Any) -> None:
    storage = LocalStorage(root, retry_attempts=ATTEMPTS, retry_max_wait=0.01)
    start.wait()
    for i in range(count):
        size = (i * 7919) % 20_000  # 0 .. 20k characters, in no particular order
        storage.write_bytes(rel, json.dumps({"i": i, "pad": "x" * size}).encode())


def test_write_is_atomic_for_a_concurrent_reader(storage: LocalStorage, tmp_path: Path) -> None:
    rel = "experiments/e/state/current_state.json"
    storage.write_bytes(rel, json.dumps({"i": -1, "pad": ""}).encode())
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    writer = ctx.Process(target=_rewrite_many, args=(str(tmp_path), rel, 1000, start))
    writer.start()
    reads, failures, seen = 0, [], set()
    try:
        start.set()
        while writer.is_alive():
            data = storage.read_bytes(rel)
            try:
                seen.add(json.loads(data)["i"])
                reads += 1
            except ValueError as exc:
                failures.append(f"{len(data)} bytes: {exc}")
    finally:
        writer.join(timeout=30)
    assert writer.exitcode == 0
    assert failures == []
    assert reads > 0
    assert len(seen) > 1  # the reader really saw the file change
    assert json.loads(storage.read_bytes(rel))["i"] == 999
    assert [e.name for e in storage.list("experiments/e/state", include_hidden=True)] == ["current_state.json"]


def test_failed_write_keeps_old_content(storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("d/x.json", b"old")

    def refuse(src: object, dst: object, **dir_fds: int) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(local_module.os, "replace", refuse)
    with pytest.raises(PermissionError):
        storage.write_bytes("d/x.json", b"new")
    monkeypatch.undo()
    assert storage.read_bytes("d/x.json") == b"old"
    assert [e.name for e in storage.list("d", include_hidden=True)] == ["x.json"]


# -- retries ---------------------------------------------------------------------------------


def test_transient_read_errors_are_retried(
    storage: LocalStorage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage.write_bytes("x.json", b"ok")
    errors = [OSError(errno.EIO, "Input/output error"), OSError(errno.ENOTCONN, "Transport endpoint is not connected")]
    wrapper, calls = failing_first(os.open, errors, when=opening("x.json"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage.base"):
        assert storage.read_bytes("x.json") == b"ok"
    assert calls[0] == 3
    retries = [r for r in caplog.records if r.levelno == logging.WARNING and "Retrying" in r.getMessage()]
    assert len(retries) == 2


def test_transient_write_errors_are_retried(
    storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = [OSError(errno.EIO, "Input/output error"), OSError(errno.ESTALE, "Stale file handle")]
    wrapper, calls = failing_first(os.open, errors, when=lambda path, *a, **k: str(path).endswith(".tmp"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    storage.write_bytes("d/x.json", b"payload")
    monkeypatch.undo()
    assert calls[0] == 3
    assert storage.read_bytes("d/x.json") == b"payload"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def test_transient_replace_error_cleans_its_temporary(
    storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, calls = failing_first(os.replace, [OSError(errno.EIO, "Input/output error")])
    monkeypatch.setattr(local_module.os, "replace", wrapper)
    storage.write_bytes("d/x.json", b"payload")
    monkeypatch.undo()
    assert calls[0] == 2
    assert storage.read_bytes("d/x.json") == b"payload"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x.json"]


def test_transient_list_and_append_errors_are_retried(storage: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("d/x.json", b"1")
    scandir, scans = failing_first(os.scandir, [OSError(errno.ENOTCONN, "Transport endpoint is not connected")])
    monkeypatch.setattr(local_module.os, "scandir", scandir)
    assert [e.name for e in storage.list("d")] == ["x.json"]
    assert scans[0] == 2
    write, writes = failing_first(os.write, [OSError(errno.EAGAIN, "Resource temporarily unavailable")])
    monkeypatch.setattr(local_module.os, "write", write)
    storage.append_bytes("d/log.jsonl", b"line\n")
    monkeypatch.undo()
    assert writes[0] == 2
    assert storage.read_bytes("d/log.jsonl") == b"line\n"


def test_transient_errors_give_up_after_the_attempts(storage: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("x.json", b"ok")
    errors = [OSError(errno.EIO, f"Input/output error #{i}") for i in range(10)]
    wrapper, calls = failing_first(os.open, errors, when=opening("x.json"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    with pytest.raises(OSError) as info:
        storage.read_bytes("x.json")
    assert info.value.errno == errno.EIO
    assert str(info.value) == f"[Errno {errno.EIO}] Input/output error #{ATTEMPTS - 1}"
    assert calls[0] == ATTEMPTS


def test_non_transient_error_raised_at_once(storage: LocalStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    storage.write_bytes("x.json", b"ok")
    denied = PermissionError(errno.EACCES, "Permission denied")
    wrapper, calls = failing_first(os.open, [denied], when=opening("x.json"))
    monkeypatch.setattr(local_module.os, "open", wrapper)
    with pytest.raises(PermissionError) as info:
        storage.read_bytes("x.json")
    assert info.value.errno == errno.EACCES
    assert calls[0] == 1


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(errno.EIO, "Input/output error"), True),
        (OSError(errno.ENOTCONN, "x"), True),
        (OSError(errno.ESTALE, "x"), True),
        (OSError(errno.EAGAIN, "x"), True),
        (OSError(errno.ETIMEDOUT, "x"), True),
        (OSError(errno.ECONNABORTED, "x"), True),
        (OSError(errno.EBUSY, "x"), True),
        (OSError("Transport endpoint is not connected"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (IsADirectoryError(errno.EISDIR, "Is a directory"), False),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory"), False),
        (FileTooLargeError("x", 2, 1), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient_os_error(exc: BaseException, expected: bool) -> None:
    assert is_transient_os_error(exc) is expected


# -- move_in: a local file renamed into the folder (checkpoints) ------------------------------------------------------


def test_move_in_renames_the_file_into_place_without_a_copy(storage: LocalStorage, tmp_path: Path) -> None:
    own = tmp_path.parent / f"{tmp_path.name}-own"
    own.mkdir()
    (own / "optimizer.safetensors").write_bytes(b"x" * 4096)
    inode = (own / "optimizer.safetensors").stat().st_ino
    assert storage.move_in("experiments/e/checkpoints/w1/round_0/optimizer.safetensors", own / "optimizer.safetensors")
    moved = tmp_path / "experiments/e/checkpoints/w1/round_0/optimizer.safetensors"
    assert moved.read_bytes() == b"x" * 4096 and moved.stat().st_ino == inode  # the same file: renamed, not copied
    assert not (own / "optimizer.safetensors").exists()
    assert not [p for p in moved.parent.iterdir() if p.name != moved.name]  # no temporary left


def test_move_in_refuses_another_file_system_and_put_file_writes_it_instead(
    storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no rename reaches (EXDEV: another file system, or another mount of this one), ``move_in`` changes
    nothing and answers False; ``put_file`` then writes the bytes as write_bytes does, and the local file stays."""
    from swarm_gdrive.storage.base import put_file

    own = tmp_path.parent / f"{tmp_path.name}-own"
    own.mkdir()
    (own / "model.safetensors").write_bytes(b"weights")
    real_replace = os.replace

    def no_rename_across(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
        if src_dir_fd != dst_dir_fd:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "replace", no_rename_across)
    assert not storage.move_in("ckpt/model.safetensors", own / "model.safetensors")
    assert not (tmp_path / "ckpt/model.safetensors").exists() and (own / "model.safetensors").exists()
    put_file(storage, "ckpt/model.safetensors", own / "model.safetensors")
    assert (tmp_path / "ckpt/model.safetensors").read_bytes() == b"weights"
    assert (own / "model.safetensors").read_bytes() == b"weights"  # written, not taken


def test_put_file_writes_through_a_storage_without_move_in(tmp_path: Path) -> None:
    from swarm_gdrive.storage.base import put_file

    class Plain:  # any other backend: bytes only
        def __init__(self) -> None:
            self.written: dict[str, bytes] = {}

        def write_bytes(self, path: str, data: bytes) -> None:
            self.written[path] = data

    (tmp_path / "f.json").write_bytes(b"{}")
    plain = Plain()
    put_file(plain, "a/f.json", tmp_path / "f.json")  # type: ignore[arg-type]
    assert plain.written == {"a/f.json": b"{}"} and (tmp_path / "f.json").exists()
