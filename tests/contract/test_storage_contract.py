"""The storage contract: what every backend (local, fsspec, Drive) must do, asserted on outcomes.

Differences the contract allows, through :class:`Backend` flags:

- ``real_dirs``: on a backend with real folders an emptied folder stays listed until
  ``remove_empty_dir`` removes it, and a folder that holds only an empty subfolder is not empty.
  Object stores have keys only: a "folder" is a prefix that vanishes with its last object, so
  ``remove_empty_dir`` has nothing to remove and is True exactly when nothing is under the prefix.
- ``knows_mtime``: whether listings carry a modification time for files.

Listings are compared as sorted names: the order of entries is not part of the contract.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from swarm_gdrive.protocol.exchange import listing_key
from swarm_gdrive.storage.base import FileInfo, FileTooLargeError, Storage, StorageError, free_space, make_dirs

TEMPORARY_NAMES = [".x.json.abc123.tmp", ".hidden", "~lock", "y.tmp", "z.partial", "w.part"]
if TYPE_CHECKING:
    from conftest import Backend

ESCAPING_PATHS = ["../x", "/abs", "a/../b", "", ".", "..", "a/..", "/etc/passwd"]


def names(entries: list[FileInfo]) -> list[str]:
    return sorted(e.name for e in entries)


def by_name(entries: list[FileInfo]) -> dict[str, FileInfo]:
    return {e.name: e for e in entries}


def write_temporaries(storage: Storage, backend: Backend, folder: str) -> None:
    """Temporary-looking files, made through the backend's own write (what a killed writer leaves)."""
    for name in TEMPORARY_NAMES:
        try:
            storage.write_bytes(f"{folder}/{name}", b'{"partial')
        except ValueError:
            pytest.skip(f"{backend.name} refuses to write a temporary-looking name ({name})")


def test_is_a_storage(storage: Storage) -> None:
    assert isinstance(storage, Storage)
    assert isinstance(storage.describe(), str) and storage.describe()


# -- reads and writes ------------------------------------------------------------------------


def test_free_space_is_unknown_or_sane(backend: Backend) -> None:
    """The optional ``free_space``: None (an object store) or a Space with non-negative figures and a place."""
    backend.storage.write_bytes("room/a.bin", b"x" * 1000)  # the folder exists (a local root is made by a write)
    space = free_space(backend.storage)
    if backend.name in ("local", "drive", "pydrive2"):
        assert space is not None and space.where
    if space is not None:
        assert space.free is None or space.free >= 0
        assert space.total is None or space.free is None or space.total >= space.free


def test_round_trip_binary_empty_and_one_megabyte(storage: Storage) -> None:
    binary = bytes(range(256)) * 4
    big = random.Random(7).randbytes(1024 * 1024)
    storage.write_bytes("d/binary.bin", binary)
    storage.write_bytes("d/empty.bin", b"")
    storage.write_bytes("d/big.bin", big)
    storage.write_bytes("d/from_bytearray.bin", bytearray(b"\x00\x01"))  # type: ignore[arg-type]
    assert storage.read_bytes("d/binary.bin") == binary
    assert storage.read_bytes("d/empty.bin") == b""
    assert storage.read_bytes("d/big.bin") == big
    assert storage.read_bytes("d/from_bytearray.bin") == b"\x00\x01"
    sizes = {e.name: e.size for e in storage.list("d")}
    assert sizes == {"binary.bin": 1024, "empty.bin": 0, "big.bin": 1024 * 1024, "from_bytearray.bin": 2}


def test_overwrite_replaces(storage: Storage) -> None:
    storage.write_bytes("state/current_state.json", b'{"round": 1, "padding": "xxxxxxxx"}')
    storage.write_bytes("state/current_state.json", b'{"round": 2}')
    assert storage.read_bytes("state/current_state.json") == b'{"round": 2}'
    storage.write_bytes("state/current_state.json", b"")
    assert storage.read_bytes("state/current_state.json") == b""
    assert [(e.name, e.size) for e in storage.list("state", include_hidden=True)] == [("current_state.json", 0)]


def test_write_creates_nested_folders(storage: Storage) -> None:
    storage.write_bytes("rollouts/round_3/stage_1/worker-1.json", b"[]")
    assert [(e.name, e.is_dir) for e in storage.list("rollouts")] == [("round_3", True)]
    assert [(e.name, e.is_dir) for e in storage.list("rollouts/round_3")] == [("stage_1", True)]
    assert [(e.name, e.is_dir) for e in storage.list("rollouts/round_3/stage_1")] == [("worker-1.json", False)]
    assert storage.read_bytes("rollouts/round_3/stage_1/worker-1.json") == b"[]"


def test_writes_leave_no_temporary(storage: Storage) -> None:
    for i in range(3):
        storage.write_bytes("d/x.json", b"%d" % i)
    assert names(storage.list("d", include_hidden=True)) == ["x.json"]


def test_read_missing_raises_file_not_found(storage: Storage) -> None:
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("missing.json")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("no/such/folder/missing.json")
    storage.write_bytes("d/present.json", b"1")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("d/missing.json")


def test_size_cap(storage: Storage) -> None:
    storage.write_bytes("big.json", b"x" * 100)
    with pytest.raises(FileTooLargeError) as info:
        storage.read_bytes("big.json", max_bytes=99)
    assert (info.value.path, info.value.size, info.value.cap) == ("big.json", 100, 99)
    assert isinstance(info.value, StorageError)
    assert storage.read_bytes("big.json", max_bytes=100) == b"x" * 100
    storage.write_bytes("empty.json", b"")
    assert storage.read_bytes("empty.json", max_bytes=0) == b""


def test_append(storage: Storage) -> None:
    storage.append_bytes("logs/w/metrics.jsonl", b'{"step": 1}\n')
    storage.append_bytes("logs/w/metrics.jsonl", b'{"step": 2}\n')
    storage.append_bytes("logs/w/metrics.jsonl", b"")
    storage.append_bytes("logs/w/metrics.jsonl", b'{"step": 3}\n')
    assert storage.read_bytes("logs/w/metrics.jsonl") == b'{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    assert [(e.name, e.size) for e in storage.list("logs/w", include_hidden=True)] == [("metrics.jsonl", 36)]


def test_reader_never_sees_a_partial_write(backend: Backend) -> None:
    """300 rewrites by another handle (another node) while this one polls: every read is whole, valid JSON."""
    rel = "experiments/e/state/current_state.json"
    reader = backend.storage
    reader.write_bytes(rel, json.dumps({"i": -1, "pad": ""}).encode())
    writer, writer_errors = backend.reopen(), []

    def rewrite() -> None:
        try:
            for i in range(300):
                size = (i * 7919) % 20_000  # 0 .. 20k characters, in no particular order
                writer.write_bytes(rel, json.dumps({"i": i, "pad": "x" * size}).encode())
                time.sleep(0.0005)  # let the reader in, even on a store that writes in microseconds
        except BaseException as exc:  # reported by the assertion below
            writer_errors.append(exc)

    thread = threading.Thread(target=rewrite, name="contract-writer")
    thread.start()
    seen, failures = [], []
    try:
        while True:
            alive = thread.is_alive()
            data = reader.read_bytes(rel)
            try:
                seen.append(json.loads(data)["i"])
            except ValueError as exc:
                failures.append(f"{len(data)} bytes: {exc}")
            if not alive:
                break
            time.sleep(0.002)  # a polling reader, not a busy loop that starves the writer of the GIL
    finally:
        thread.join(timeout=60)
    assert writer_errors == []
    assert failures == []
    assert len(set(seen)) > 1  # the reader really saw the file change
    assert seen == sorted(seen)  # and never went back to an older version
    assert seen[-1] == 299
    assert names(reader.list("experiments/e/state", include_hidden=True)) == ["current_state.json"]


# -- listing ---------------------------------------------------------------------------------


def test_list_entries(backend: Backend) -> None:
    storage = backend.storage
    before = time.time()
    storage.write_bytes("d/b.json", b"12345")
    storage.write_bytes("d/a.json", b"1")
    storage.write_bytes("d/sub/c.json", b"1")
    entries = storage.list("d")
    assert all(isinstance(e, FileInfo) for e in entries)
    assert names(entries) == ["a.json", "b.json", "sub"]
    info = by_name(entries)
    assert (info["a.json"].size, info["a.json"].is_dir) == (1, False)
    assert (info["b.json"].size, info["b.json"].is_dir) == (5, False)
    assert info["sub"].is_dir is True
    for name in ("a.json", "b.json"):
        assert isinstance(info[name].mtime, float)
        if backend.knows_mtime:
            assert info[name].mtime > 0
            assert before - 3600 <= info[name].mtime <= time.time() + 3600  # a store's clock may be off a bit


def test_list_leaves_out_temporary_names(backend: Backend) -> None:
    storage = backend.storage
    storage.write_bytes("d/x.json", b"1")
    write_temporaries(storage, backend, "d")
    assert names(storage.list("d")) == ["x.json"]
    assert names(storage.list("d", include_hidden=True)) == sorted([*TEMPORARY_NAMES, "x.json"])
    assert storage.read_bytes("d/x.json") == b"1"


def test_list_missing_folder_is_empty(storage: Storage) -> None:
    assert storage.list("experiments/none/peers") == []
    assert storage.list("experiments/none/peers", include_hidden=True) == []


def test_list_of_a_file_is_empty(storage: Storage) -> None:
    storage.write_bytes("f.json", b"1")
    assert storage.list("f.json") == []


def test_another_handle_sees_new_rewritten_and_deleted_files(backend: Backend) -> None:
    """What one node writes, another sees at once: no stale listing or metadata cache."""
    mine, other = backend.storage, backend.reopen()
    assert other.list("peers") == []  # prime whatever the other handle caches
    mine.write_bytes("peers/w1.json", b"1")
    assert names(other.list("peers")) == ["w1.json"]
    assert other.read_bytes("peers/w1.json") == b"1"
    mine.write_bytes("peers/w1.json", b"22")
    mine.write_bytes("peers/w2.json", b"3")
    assert {e.name: e.size for e in other.list("peers")} == {"w1.json": 2, "w2.json": 1}
    assert other.read_bytes("peers/w1.json") == b"22"
    mine.delete("peers/w1.json")
    assert names(other.list("peers")) == ["w2.json"]
    with pytest.raises(FileNotFoundError):
        other.read_bytes("peers/w1.json")


# -- delete, move, remove_empty_dir ----------------------------------------------------------


def test_delete(storage: Storage) -> None:
    storage.write_bytes("d/x.json", b"1")
    storage.write_bytes("d/y.json", b"2")
    storage.delete("d/x.json")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("d/x.json")
    assert names(storage.list("d")) == ["y.json"]
    storage.delete("d/x.json")  # absent is fine
    storage.delete("never/was/here.json")
    assert storage.read_bytes("d/y.json") == b"2"


def test_move_a_file_creates_parents(storage: Storage) -> None:
    storage.write_bytes("rollouts/round_0/stage_0/w.json", b"r")
    storage.write_bytes("rollouts/round_0/stage_0/v.json", b"v")
    storage.move("rollouts/round_0/stage_0/w.json", "archives/e/rollouts/round_0/stage_0/w.json")
    assert storage.read_bytes("archives/e/rollouts/round_0/stage_0/w.json") == b"r"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("rollouts/round_0/stage_0/w.json")
    assert names(storage.list("rollouts/round_0/stage_0")) == ["v.json"]


def test_move_a_folder_tree(storage: Storage) -> None:
    tree = {
        "state/current_state.json": b"s",
        "peers/w.json": b"p",
        "rollouts/round_0/stage_0/w.json": b"r",
        "experiment.json": b"e",
    }
    for rel, data in tree.items():
        storage.write_bytes(f"experiments/e/{rel}", data)
    storage.write_bytes("experiments/other/experiment.json", b"o")
    storage.move("experiments/e", "archives/e/reset_1")
    for rel, data in tree.items():
        assert storage.read_bytes(f"archives/e/reset_1/{rel}") == data
        with pytest.raises(FileNotFoundError):
            storage.read_bytes(f"experiments/e/{rel}")
    assert names(storage.list("archives/e/reset_1")) == ["experiment.json", "peers", "rollouts", "state"]
    assert names(storage.list("experiments")) == ["other"]
    assert storage.list("experiments/e") == []
    assert storage.read_bytes("experiments/other/experiment.json") == b"o"


def test_move_missing_source(storage: Storage) -> None:
    with pytest.raises(FileNotFoundError):
        storage.move("missing.json", "dst/missing.json")
    with pytest.raises(FileNotFoundError):
        storage.move("missing_folder", "dst/missing_folder")


def test_remove_empty_dir(backend: Backend) -> None:
    storage = backend.storage
    storage.write_bytes("r/round_0/stage_0/w.json", b"1")
    assert storage.remove_empty_dir("r/round_0/stage_0") is False
    assert storage.remove_empty_dir("r/round_0") is False
    assert storage.read_bytes("r/round_0/stage_0/w.json") == b"1"

    storage.delete("r/round_0/stage_0/w.json")
    if backend.real_dirs:  # the emptied folder stays, and its parent is not empty while it does
        assert [(e.name, e.is_dir) for e in storage.list("r/round_0")] == [("stage_0", True)]
        assert storage.remove_empty_dir("r/round_0") is False
    else:  # object store: the prefix vanished with its last object; nothing is left to remove
        assert storage.list("r/round_0") == []
        assert storage.remove_empty_dir("r/round_0") is True
    assert storage.remove_empty_dir("r/round_0/stage_0") is True
    assert storage.list("r/round_0") == []
    assert storage.remove_empty_dir("r/round_0/stage_0") is True  # already gone
    assert storage.remove_empty_dir("r/round_0") is True
    assert storage.remove_empty_dir("never/existed") is True
    assert storage.list("r") == []


def test_remove_empty_dir_counts_temporaries_as_content(backend: Backend) -> None:
    storage = backend.storage
    write_temporaries(storage, backend, "d")
    assert storage.list("d") == []  # looks empty to readers ...
    assert storage.remove_empty_dir("d") is False  # ... but is not: nothing is deleted behind a writer's back
    assert len(storage.list("d", include_hidden=True)) == len(TEMPORARY_NAMES)


# -- paths -----------------------------------------------------------------------------------


def test_paths_escaping_the_root_raise_value_error(storage: Storage) -> None:
    storage.write_bytes("ok.json", b"1")
    for path in ESCAPING_PATHS:
        operations: list[Callable[[], object]] = [
            lambda p=path: storage.read_bytes(p),
            lambda p=path: storage.write_bytes(p, b"x"),
            lambda p=path: storage.append_bytes(p, b"x"),
            lambda p=path: storage.list(p),
            lambda p=path: storage.delete(p),
            lambda p=path: storage.remove_empty_dir(p),
            lambda p=path: storage.move(p, "moved.json"),
            lambda p=path: storage.move("ok.json", p),
        ]
        for operation in operations:
            with pytest.raises(ValueError):
                operation()
    assert storage.read_bytes("ok.json") == b"1"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("moved.json")


# -- what the coordinator's economy relies on (issue #16) --------------------------------------------------


def test_make_dirs_creates_a_folder_ahead_of_writes_once(backend: Backend) -> None:
    storage, other = backend.storage, backend.reopen()
    assert make_dirs(storage, "rewards/round_1/stage_0") is True
    make_dirs(storage, "rewards/round_1/stage_0")  # again: nothing changes, nothing fails
    if backend.real_dirs:
        assert [(e.name, e.is_dir) for e in other.list("rewards/round_1")] == [("stage_0", True)]
    other.write_bytes("rewards/round_1/stage_0/w1.json", b"1")  # another node writes into it
    assert names(storage.list("rewards/round_1/stage_0")) == ["w1.json"]
    if backend.real_dirs:
        assert [e.name for e in storage.list("rewards") if e.is_dir] == ["round_1"], "no duplicate folder"


def test_a_rewrite_of_the_same_size_changes_the_listing_key(backend: Backend) -> None:
    """A reader reuses what it read while (size, mtime, version) is unchanged: every rewrite must change it."""
    storage, other = backend.storage, backend.reopen()
    storage.write_bytes("state/current_state.json", b'{"round": 1}')
    first = listing_key(by_name(other.list("state"))["current_state.json"])
    storage.write_bytes("state/current_state.json", b'{"round": 2}')
    second = listing_key(by_name(other.list("state"))["current_state.json"])
    assert first != second
