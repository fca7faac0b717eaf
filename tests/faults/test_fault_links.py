"""Hard links planted where a node writes (issue #30, class 1): no write lands in a file that another name reaches.

A participant on the same file system as the shared folder can link a file in (``ln outside/victim
logs/w1/metrics.jsonl``): a node that opened that name and appended would write its lines into the victim, outside
GDRIVE_PATH. Every writer is tried on every backend with links (a local folder; an fsspec ``file://`` folder), with
a hard link to a file outside the root and one to another file inside, planted before the node writes and swapped in
while it runs. What must hold: the linked file keeps every byte (and its other names), the node's lines go to a
plain file with one name that holds its lines and nothing else, and a WARNING names the file.

:func:`plant_hard_link` is the planting step for the fault harness (the randomised trials, hostile_mix.py) and for
this file's hypothesis fuzzer, which interleaves plantings with a live writer's appends.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from faultkit import LAYOUT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_gdrive.protocol.metrics import NodeLog
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, decode_lines
from swarm_gdrive.storage.base import Storage
from swarm_gdrive.storage.fsspec_storage import FsspecStorage
from swarm_gdrive.storage.local import LocalStorage

VICTIM = b"the victim's own bytes: a file outside the shared folder\n"
OTHER = b'{"another node\'s file inside the shared folder": true}\n'

BACKENDS: dict[str, Callable[[Path], Storage]] = {
    "local": lambda root: LocalStorage(root, retry_max_wait=0.01),
    "file": lambda root: FsspecStorage(f"file://{root}", retry_max_wait=0.01),
}


def plant_hard_link(root: Path, rel: str, target: Path) -> Path:
    """Make ``root/rel`` another name of ``target`` (replacing what is there), as a hostile participant on the same
    file system would: ``ln target root/rel``. Returns the planted path. The harness can call it with ``target``
    outside the shared folder (a victim file it then checks byte for byte) or inside (another node's file)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.link(target, path)
    return path


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path]:
    """The shared folder and, beside it on the same file system, a victim file outside it."""
    root = tmp_path / "drive"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(VICTIM)
    return root, outside / "victim.txt"


def own_plain_file(path: Path) -> bytes:
    """The bytes of ``path``, after checking that it is a plain file with one name (the node's own)."""
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, (path, st)
    return path.read_bytes()


def the_other_link_target(root: Path, where: str, victim: Path) -> Path:
    """What the planted link names: the victim outside, or another node's metrics file inside."""
    if where == "outside":
        return victim
    other = root / LAYOUT.metrics_file("w2")
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(OTHER)
    return other


def expected(where: str) -> bytes:
    return VICTIM if where == "outside" else OTHER


WRITERS = ["metrics", "events", "append_bytes", "write_bytes"]


def write_once(storage: Storage, writer: str, value: int) -> str:
    """One write of ``writer``; returns the relative path it writes."""
    if writer in ("metrics", "events"):
        log = NodeLog(storage, LAYOUT, "w1")
        if writer == "metrics":
            log.metric({"a": value}, round_=value)
        else:
            log.event("hello", f"line {value}", round_=value)
        assert log.flush()
        return LAYOUT.metrics_file("w1") if writer == "metrics" else LAYOUT.events_file("w1")
    path = f"{LAYOUT.root}/logs/w1/{writer}.jsonl"
    getattr(storage, writer)(path, b'{"v": %d}\n' % value)
    return path


def written_path(writer: str) -> str:
    if writer == "metrics":
        return LAYOUT.metrics_file("w1")
    if writer == "events":
        return LAYOUT.events_file("w1")
    return f"{LAYOUT.root}/logs/w1/{writer}.jsonl"


def check_lines(data: bytes, writer: str, values: list[int]) -> None:
    """``data`` holds exactly the node's own lines for ``values``: not a byte of the linked file."""
    assert VICTIM not in data and OTHER not in data, data
    if writer == "metrics":
        records, problems = decode_lines(data, MetricRecord)
        assert [r.values["a"] for r in records] == values and not problems, (records, problems)
    elif writer == "events":
        records, problems = decode_lines(data, EventRecord)
        assert [r.message for r in records] == [f"line {v}" for v in values] and not problems, (records, problems)
    elif writer == "append_bytes":
        assert data == b"".join(b'{"v": %d}\n' % v for v in values)
    else:
        assert data == b'{"v": %d}\n' % values[-1]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_hard_link_planted_where_a_node_writes_is_replaced_and_its_target_keeps_every_byte(
    place: tuple[Path, Path], backend: str, writer: str, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, victim = place
    target = the_other_link_target(root, where, victim)
    planted = plant_hard_link(root, written_path(writer), target)
    storage = BACKENDS[backend](root)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.storage"):
        write_once(storage, writer, 1)
        write_once(storage, writer, 2)  # the next write goes on in the node's own file
    assert target.read_bytes() == expected(where)  # not a byte written into the linked file
    assert os.lstat(target).st_nlink == 1  # only the planted name went; the file keeps its own
    check_lines(own_plain_file(planted), writer, [1, 2])
    if writer != "write_bytes":  # a replace-write never needed the link's name: it renames over it, unsaid
        warned = [r.getMessage() for r in caplog.records if "hard link" in r.getMessage()]
        assert len(warned) == 1 and planted.name in warned[0], warned


@pytest.mark.parametrize("writer", ["metrics", "events", "append_bytes"])
def test_a_log_swapped_for_a_hard_link_mid_run_is_caught_at_the_next_append(
    place: tuple[Path, Path], backend: str, writer: str
) -> None:
    root, victim = place
    storage = BACKENDS[backend](root)
    log = NodeLog(storage, LAYOUT, "w1")  # one long-lived writer, as a running node has
    rel = LAYOUT.metrics_file("w1") if writer == "metrics" else LAYOUT.events_file("w1")
    if writer == "append_bytes":
        rel = f"{LAYOUT.root}/logs/w1/raw.jsonl"

    def write(value: int) -> None:
        if writer == "metrics":
            log.metric({"a": value}, round_=value)
        elif writer == "events":
            log.event("hello", f"line {value}", round_=value)
        else:
            storage.append_bytes(rel, b'{"v": %d}\n' % value)
        assert log.flush()

    write(1)
    write(2)
    plant_hard_link(root, rel, victim)  # swapped while the node runs: its earlier lines went with the old name
    write(3)
    write(4)
    assert victim.read_bytes() == VICTIM and os.lstat(victim).st_nlink == 1
    check_lines(own_plain_file(root / rel), writer, [3, 4])


def test_a_link_whose_other_name_went_before_the_check_is_not_appended_to(place: tuple[Path, Path]) -> None:
    """The race of a link planted and its other name removed between the node's open and its check: the file at the
    log's name is then a plain file with one name, yet not the log. The local backend remembers the file it appended
    to last and replaces any other (the fsspec backend rewrites by rename, so it never appends in place)."""
    root, victim = place
    storage = BACKENDS["local"](root)
    rel = f"{LAYOUT.root}/logs/w1/raw.jsonl"
    storage.append_bytes(rel, b'{"v": 1}\n')
    plant_hard_link(root, rel, victim)
    victim.unlink()  # the other name goes: the planted file now has one name, the log's
    assert os.lstat(root / rel).st_nlink == 1
    storage.append_bytes(rel, b'{"v": 2}\n')
    assert own_plain_file(root / rel) == b'{"v": 2}\n'  # a fresh log: not a byte of the planted file


def test_the_log_is_kept_across_a_restart_and_a_rewrite_by_its_own_writer(tmp_path: Path) -> None:
    """What the memory of the appended file must not break: a restarted node (a new process: nothing remembered)
    goes on in its log, and a log this process rewrote or moved itself is appended to, not replaced."""
    from swarm_gdrive.storage import local

    storage = BACKENDS["local"](tmp_path)
    rel = f"{LAYOUT.root}/logs/w1/raw.jsonl"
    storage.append_bytes(rel, b"1\n")
    local._appended.clear()  # what a restarted process remembers
    storage.append_bytes(rel, b"2\n")
    storage.write_bytes(rel, b"rewritten\n")
    storage.append_bytes(rel, b"3\n")
    storage.move(rel, rel + ".old")
    storage.move(rel + ".old", rel)
    storage.append_bytes(rel, b"4\n")
    assert own_plain_file(tmp_path / rel) == b"rewritten\n3\n4\n"


def test_a_swapper_racing_the_appends_never_gets_a_byte_outside(place: tuple[Path, Path], backend: str) -> None:
    """The link is planted again and again while the node appends: the check is made on what was opened (local) or
    the write is a rename (file://), so no window between a check and the write lets a line into the victim."""
    root, victim = place
    storage = BACKENDS[backend](root)
    rel = LAYOUT.metrics_file("w1")
    log_path = root / rel
    stop, swaps = threading.Event(), [0]

    def swapper() -> None:
        while not stop.is_set():
            try:
                plant_hard_link(root, rel, victim)
                swaps[0] += 1
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    log = NodeLog(storage, LAYOUT, "w1")
    written = 0
    try:
        for value in range(300):
            log.metric({"a": value}, round_=value)
            written += log.flush()
    finally:
        stop.set()
        thread.join(5)
    assert swaps[0] > 10 and written > 0, (swaps, written)
    assert victim.read_bytes() == VICTIM  # not a byte written into it, by an append or a rename
    log.metric({"a": 300}, round_=300)
    assert log.flush()  # the swapper gone, the node's next append: its own file, with none of the victim's bytes
    data = own_plain_file(log_path)
    assert VICTIM not in data and decode_lines(data, MetricRecord)[0][-1].values["a"] == 300


def test_a_hard_link_at_a_checkpoint_or_state_file_is_renamed_over(place: tuple[Path, Path], backend: str) -> None:
    """Whole-file writes (state, peers, checkpoints) were never affected: they write a temporary and rename it over
    the name, which replaces the planted link and leaves its file alone. Kept here so that stays true."""
    root, victim = place
    storage = BACKENDS[backend](root)
    rel = LAYOUT.checkpoint_dir("w1", 3) + "/model.safetensors"
    plant_hard_link(root, rel, victim)
    storage.write_bytes(rel, b"weights")
    assert victim.read_bytes() == VICTIM and os.lstat(victim).st_nlink == 1
    assert own_plain_file(root / rel) == b"weights"


def test_a_symbolic_link_at_a_log_on_file_is_neither_read_nor_kept(place: tuple[Path, Path], backend: str) -> None:
    """The same rule for the other kind of link: file:// read a linked log's bytes through the link before (and
    kept them in the node's log, in the shared folder); a local folder never followed one."""
    root, victim = place
    storage = BACKENDS[backend](root)
    rel = LAYOUT.metrics_file("w1")
    (root / rel).parent.mkdir(parents=True)
    os.symlink(victim, root / rel)
    write_once(storage, "metrics", 1)
    assert victim.read_bytes() == VICTIM
    check_lines(own_plain_file(root / rel), "metrics", [1])


def test_only_a_second_name_is_refused() -> None:
    """A FUSE mount may report a count of 0 for every file (or a file is removed once opened): nothing else names
    it, so it is the node's own; two names or more are a hard link."""
    from swarm_gdrive.storage.base import hard_link_kind

    assert hard_link_kind(0) is None and hard_link_kind(1) is None
    assert "a hard link" in (hard_link_kind(2) or "") and "3 names" in (hard_link_kind(3) or "")


# -- the hypothesis fuzzer of the class ---------------------------------------------------------

LINK_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("plant"), st.sampled_from(["outside", "inside"])),
        st.tuples(st.just("race"), st.just("outside")),
    ),
    min_size=1,
    max_size=10,
)


class PlantedNameRemovedAfterOpen:
    """The swap raced between a node's open and its check: armed, the next ``os.open`` of the log's name (a bare
    name beside a folder descriptor, local; a whole path, file://) opens the planted link and then removes the
    planted name, so that the opened file has one name left, the victim's own outside the folder."""

    def __init__(self, planted: Path) -> None:
        self.planted, self.armed, self.real = planted, False, os.open

    def __call__(self, path, flags, *args, **kwargs):
        fd = self.real(path, flags, *args, **kwargs)
        if self.armed and os.path.basename(os.fsdecode(path)) == self.planted.name:
            self.armed = False
            self.planted.unlink()
        return fd


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backend=st.sampled_from(list(BACKENDS)), writer=st.sampled_from(["metrics", "append_bytes"]), ops=LINK_OPS)
def test_any_sequence_of_appends_and_planted_links_writes_no_byte_into_a_linked_file(backend, writer, ops) -> None:
    """A long-lived writer's appends interleaved with hard links planted at its log: to a file outside the folder, to
    another node's file inside it, or to an outside file with the planted name removed between the node's next open
    and its check (a raced swap, also on a first append). Every linked file keeps its bytes (read through a
    descriptor held from before); the log ends as a plain file with one name holding exactly the lines appended since
    the last planting: not a byte of a linked file."""
    from swarm_gdrive.storage import local

    local._appended.clear()  # a new node process: nothing remembered (a folder of an earlier example may have had
    # this one's inode number)
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "drive", Path(tmp) / "outside"
        root.mkdir()
        outside.mkdir()
        storage = BACKENDS[backend](root)
        log = NodeLog(storage, LAYOUT, "w1")
        rel = LAYOUT.metrics_file("w1") if writer == "metrics" else f"{LAYOUT.root}/logs/w1/raw.jsonl"
        race = PlantedNameRemovedAfterOpen(root / rel)
        held: list[tuple[int, bytes]] = []  # (descriptor, the bytes it must keep) of every linked file
        since: list[int] = []
        value = 0
        try:
            with mock.patch.object(os, "open", race):
                for i, (op, arg) in enumerate(ops):
                    if op == "append":
                        for _ in range(arg):
                            value += 1
                            if writer == "metrics":
                                log.metric({"a": value}, round_=value)
                                assert log.flush()
                            else:
                                storage.append_bytes(rel, b'{"v": %d}\n' % value)
                            since.append(value)
                        continue
                    if arg == "inside":
                        target, content = root / f"{LAYOUT.root}/logs/w2/other-{i}.jsonl", OTHER
                    else:
                        target, content = outside / f"victim-{i}.txt", VICTIM
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                    held.append((race.real(target, os.O_RDONLY), content))
                    plant_hard_link(root, rel, target)
                    race.armed = op == "race"
                    since = []
            for fd, content in held:
                assert os.pread(fd, 1 << 16, 0) == content, ops
            if since:
                check_lines(own_plain_file(root / rel), writer, since)
        finally:
            for fd, _ in held:
                os.close(fd)
