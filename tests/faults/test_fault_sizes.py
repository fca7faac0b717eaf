"""Sizes that lie (issue #30, class 2): a checkpoint manifest that claims a huge file, a manifest whose sizes are not
the files', a file that grows while it is read. Every size is checked before a byte is read: a checkpoint's against
what a checkpoint of the model being trained can take (its parameters and dtypes, with slack) and against the real
file; a file is streamed and hashed chunk by chunk, never more than its claimed size read, nothing loaded before its
sha256 matches. A restarting worker meeting a planted "newer" checkpoint falls back to its genuine older one, in
little memory and time.

``plant_huge_checkpoint(root, layout, node_id)`` is the planting function the randomised trials can call on a
worker's checkpoint folder (it copies the newest genuine checkpoint to a newer round whose weights are a sparse
file of :data:`HUGE` bytes, listed at that size)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
psutil = pytest.importorskip("psutil")

from swarm_gdrive.protocol.layout import Layout, parse_round_dir  # noqa: E402
from swarm_gdrive.protocol.sapo import ScoredGroup  # noqa: E402
from swarm_gdrive.protocol.workload import StageContext  # noqa: E402
from swarm_gdrive.storage import FileTooLargeError, LocalStorage  # noqa: E402
from swarm_gdrive.training import checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: The planted file: sparse, so it costs no disk; 2 GiB, so today's whole read shows in memory without
#: endangering the machine (the issue's 6 GiB behaves the same, three times over).
HUGE = 2 * 2**30
#: What a restart may grow by while it refuses the planted checkpoint and restores the genuine one.
MAX_GROWTH = 200 * 2**20
CTX = StageContext("w1", 0, 0, 42)


def workload_for(tmp_path: Path, tiny_folder: Path) -> Any:
    from swarm_gdrive.config import from_env
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    (tmp_path / "drive").mkdir(exist_ok=True)
    env = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "sizes",
        "MODEL_NAME": str(tiny_folder),
        "TASKS": "basic_arithmetic",
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "NUM_TRAIN_SAMPLES": "3",
        "NUM_GENERATIONS": "4",
        "MAX_NEW_TOKENS": "8",
        "CHECKPOINT_INTERVAL": "1",
        "CHECKPOINT_OPTIMIZER": "fp32",
    }
    return GRPOWorkload(from_env(env), LocalStorage(env["GDRIVE_PATH"]), "w1", threading.Event())


def trained_and_saved(tmp_path: Path, tiny_folder: Path) -> Any:
    """A worker that trained a round and saved its checkpoint of round 0: the genuine one a restart falls back to."""
    worker = workload_for(tmp_path, tiny_folder)
    groups = list(worker.generate(CTX))
    scored = [
        ScoredGroup("w1", g, tuple(float((i + k) % 2) for i in range(len(g.completions)))) for k, g in enumerate(groups)
    ]
    worker.train(CTX, scored, [])
    worker.end_round(0, final=False)
    return worker


def _newest(root: Path, layout: Layout, node_id: str) -> Path:
    base = root / layout.checkpoint_dir(node_id, 0).rsplit("/", 1)[0]
    rounds = [r for p in base.iterdir() if (r := parse_round_dir(p.name)) is not None]
    return root / layout.checkpoint_dir(node_id, max(rounds))


def plant_checkpoint(
    root: Path, layout: Layout, node_id: str, real: int, claimed: int, name: str = "model.safetensors"
) -> Path:
    """A copy of ``node_id``'s newest checkpoint one round newer, whose ``name`` is a sparse file of ``real`` bytes
    and whose manifest (complete, of the same node and run) lists it at ``claimed`` bytes."""
    source = _newest(root, layout, node_id)
    round_ = parse_round_dir(source.name) + 1
    folder = root / layout.checkpoint_dir(node_id, round_)
    shutil.copytree(source, folder)
    with open(folder / name, "r+b") as fh:
        fh.truncate(real)
    manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
    manifest["round"] = round_
    manifest["files"][name] = {"size": claimed, "sha256": hashlib.sha256(b"planted").hexdigest()}
    (folder / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    return folder


def plant_huge_checkpoint(root: Path, layout: Layout, node_id: str) -> Path:
    """The issue's attack: a "newer" checkpoint whose weights are :data:`HUGE` bytes, listed at that size."""
    return plant_checkpoint(root, layout, node_id, HUGE, HUGE)


class PeakRss:
    """The most this process's resident memory grew over its baseline while the block ran (sampled every 5 ms)."""

    def __enter__(self) -> PeakRss:
        self._process = psutil.Process()
        self.base = self.peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.base


def test_a_planted_newer_checkpoint_claiming_a_huge_file_is_refused_unread(tmp_path, tiny_folder, caplog):
    worker = trained_and_saved(tmp_path, tiny_folder)
    root = tmp_path / "drive"
    planted = plant_huge_checkpoint(root, worker.layout, "w1")
    restarted = workload_for(tmp_path, tiny_folder)
    started = time.monotonic()
    with PeakRss() as rss, caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        assert restarted.resume() == 0  # the genuine checkpoint, not the planted round 1
    took = time.monotonic() - started
    assert rss.growth < MAX_GROWTH, f"resident memory grew by {rss.growth / 2**20:.0f} MiB"
    assert took < 20, f"the restart took {took:.1f} s"
    assert checkpoint.param_digest(restarted.trainer.model) == checkpoint.param_digest(worker.trainer.model)
    # The tiny model's weights, with slack: megabytes, not the 64 GiB a manifest may claim.
    bound = checkpoint.size_limits(restarted.trainer.model).weights
    assert bound < 64 * 2**20, bound
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and planted.name in skipped[0], skipped
    assert f"model.safetensors claims {HUGE} bytes" in skipped[0] and f"over the {bound} bytes" in skipped[0], skipped
    restore = tmp_path / "local" / "restore"
    assert not any(p.name == "model.safetensors" and p.stat().st_size > bound for p in restore.rglob("*"))


@pytest.mark.parametrize("real", [HUGE, 5], ids=["larger than claimed", "shorter than claimed"])
def test_a_file_whose_real_size_is_not_the_claimed_one_is_refused_unread(tmp_path, tiny_folder, caplog, real):
    """The manifest claims the genuine size (within the model's bound) but the file is another size: the listing
    refuses it before a byte is read, and the restart takes the genuine checkpoint."""
    worker = trained_and_saved(tmp_path, tiny_folder)
    root = tmp_path / "drive"
    genuine = json.loads((_newest(root, worker.layout, "w1") / checkpoint.MANIFEST).read_text())
    claimed = genuine["files"]["model.safetensors"]["size"]
    plant_checkpoint(root, worker.layout, "w1", real=real, claimed=claimed)
    storage = LocalStorage(root)
    limits = checkpoint.size_limits(worker.trainer.model)
    with PeakRss() as rss, caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        restored = checkpoint.load_latest(storage, worker.layout, "w1", tmp_path / "restore", limits=limits)
    assert restored is not None and restored.round == 0
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    how = "exceeds" if real > claimed else "falls short of"
    assert len(skipped) == 1 and f"model.safetensors is {real} bytes, which {how} the {claimed} bytes" in skipped[0]
    assert rss.growth < MAX_GROWTH


def growing_storage(root: Path, name: str, grow: int) -> LocalStorage:
    """A shared folder in which the file whose path ends with ``name`` grows by ``grow`` bytes (sparse) right after
    its size was checked: a writer racing the reader, or a FUSE mount whose stat reports a size the file does not
    have (a test double)."""

    class GrowingStorage(LocalStorage):
        @staticmethod
        def _open_regular(target, max_bytes, rel):  # noqa: ANN001, ANN205 - LocalStorage's own signature
            fd = LocalStorage._open_regular(target, max_bytes, rel)
            if rel.endswith(name):
                with open(str(target), "r+b") as fh:
                    fh.truncate(Path(str(target)).stat().st_size + grow)
            return fd

    return GrowingStorage(root)


def test_a_checkpoint_file_that_grows_while_it_is_read_is_refused_after_its_claimed_size(tmp_path, tiny_folder, caplog):
    worker = trained_and_saved(tmp_path, tiny_folder)
    root = tmp_path / "drive"
    genuine = _newest(root, worker.layout, "w1")
    folder = root / worker.layout.checkpoint_dir("w1", 1)
    shutil.copytree(genuine, folder)  # a genuine-looking round 1 (same files, its manifest's round changed)
    manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
    (folder / checkpoint.MANIFEST).write_text(json.dumps({**manifest, "round": 1}))
    storage = growing_storage(root, "round_1/model.safetensors", grow=HUGE)
    limits = checkpoint.size_limits(worker.trainer.model)
    with PeakRss() as rss, caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        restored = checkpoint.load_latest(storage, worker.layout, "w1", tmp_path / "restore", limits=limits)
    assert restored is not None and restored.round == 0
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and "round_1" in skipped[0] and "exceeds" in skipped[0], skipped
    assert rss.growth < MAX_GROWTH
    assert not [
        p for p in (tmp_path / "restore").rglob("*") if not checkpoint.ALLOWED_FILES.fullmatch(p.name) and p.is_file()
    ]


@pytest.mark.parametrize("how", ["read_bytes", "read_chunks"])
def test_a_generic_read_of_a_growing_file_reads_at_most_its_cap_plus_one(tmp_path, how):
    """Any capped read of a shared-folder file: its size is checked first, and a file that grows past the cap
    after that check costs at most the cap + 1 bytes, never the file."""
    from swarm_gdrive.storage.base import read_chunks

    cap = 1 << 20
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "w2.json").write_bytes(b"{}")
    storage = growing_storage(tmp_path, "peers/w2.json", grow=HUGE)
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLargeError, match=f"exceeds the {cap}-byte cap"):
            if how == "read_bytes":
                storage.read_bytes("peers/w2.json", cap)
            else:
                for _ in read_chunks(storage, "peers/w2.json", cap, chunk_bytes=64 * 1024):
                    pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * cap, f"a read capped at {cap} bytes held {peak} bytes"


def test_reads_refuse_a_file_over_its_cap_by_its_size_before_reading(tmp_path):
    from swarm_gdrive.storage.base import read_chunks

    (tmp_path / "big").write_bytes(b"")
    with open(tmp_path / "big", "r+b") as fh:
        fh.truncate(HUGE)
    storage = LocalStorage(tmp_path)
    for read in (lambda: storage.read_bytes("big", 1 << 20), lambda: list(read_chunks(storage, "big", 1 << 20))):
        with pytest.raises(FileTooLargeError, match=f"{HUGE} bytes exceeds"):
            read()


def test_fsspec_read_chunks_is_capped_and_whole(tmp_path):
    from swarm_gdrive.storage.base import read_chunks

    fsspec_storage = pytest.importorskip("swarm_gdrive.storage.fsspec_storage")
    storage = fsspec_storage.FsspecStorage(f"file://{tmp_path}")
    data = bytes(range(256)) * 1000
    storage.write_bytes("a/b.bin", data)
    assert b"".join(read_chunks(storage, "a/b.bin", len(data), chunk_bytes=1000)) == data
    with pytest.raises(FileTooLargeError):
        list(read_chunks(storage, "a/b.bin", len(data) - 1))
