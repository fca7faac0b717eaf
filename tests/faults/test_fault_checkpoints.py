"""Pruning after a save and loading at a restart, against what a peer or a kill leaves in a node's checkpoint folder:
a checkpoint interrupted by a kill must not take the place of a whole one that a later restart needs; a folder
that merely sits under the node's name (no manifest, another node's or another run's manifest, a planted one) is
never deleted; a malformed manifest (deep nesting, a huge integer, wrong types, a folder or a FIFO in its place) is
skipped with a logged reason, never a crash."""

from __future__ import annotations

import json
import logging
import os

import pytest
from faultkit import LAYOUT

from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.training import checkpoint

FILES = ("config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json")
RUN = "0123456789abcdef"


def make(root, round_: int, files=FILES, manifest: bool = True, temp: bool = False, **fields) -> None:
    folder = root / LAYOUT.checkpoint_dir("w1", round_)
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"x")
    if temp:  # what a process killed while writing model.safetensors leaves
        (folder / ".model.safetensors.0123456789ab.tmp").write_bytes(b"half")
    if manifest:
        entries = {name: {"size": 1, "sha256": "0" * 64} for name in files}
        body = {"kind": "checkpoint", "schema_version": 1, "node_id": "w1", "round": round_, "files": entries}
        (folder / "checkpoint.json").write_text(json.dumps({**body, **fields}))


def rounds_left(root) -> list[str]:
    return sorted(p.name for p in (root / LAYOUT.checkpoint_dir("w1", 0)).parent.iterdir())


def test_only_whole_checkpoints_older_than_the_new_one_count_and_only_own_ones_are_removed(tmp_path, caplog):
    make(tmp_path, 0)
    make(tmp_path, 1)
    make(tmp_path, 2, files=("config.json",), manifest=False, temp=True)  # killed before any manifest: not provable
    make(tmp_path, 3, files=("config.json", "model.bin", "optimizer.safetensors", "trainer_state.json"))  # planted
    make(tmp_path, 4, schema_version=2, run_id=RUN, complete=False)  # killed mid-save: its first manifest says so
    make(tmp_path, 5)  # the one just saved
    make(tmp_path, 7, manifest=False)  # newer than the save: not this save's business
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=2, keep=5, run_id=RUN)
    # round 1 is the whole one a restart falls back to; round 0 was one too many; round 4 was provably w1's.
    assert rounds_left(tmp_path) == ["round_1", "round_2", "round_3", "round_5", "round_7"]
    left = [r.getMessage() for r in caplog.records if "left" in r.getMessage()]
    assert any("round_2 alone: no manifest" in m for m in left), left
    assert any("round_3 alone: file 'model.bin' is not an allowed checkpoint file" in m for m in left), left


def test_keep_one_keeps_only_the_new_checkpoint(tmp_path):
    for round_ in (0, 1, 2):
        make(tmp_path, round_)
    checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=1, keep=2)
    assert rounds_left(tmp_path) == ["round_2"]


def test_pruning_removes_only_what_the_manifest_lists(tmp_path, caplog):
    make(tmp_path, 0, temp=True)
    folder = tmp_path / LAYOUT.checkpoint_dir("w1", 0)
    (folder / "planted.txt").write_bytes(b"not in the manifest")
    (folder / ".checkpoint.json.0123456789ab.tmp").write_bytes(b"{")  # a killed manifest write: its own temporary
    make(tmp_path, 1)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=1, keep=1)
    assert sorted(p.name for p in folder.iterdir()) == ["planted.txt"]
    said = [r.getMessage() for r in caplog.records]
    assert any("left experiments/faults/checkpoints/w1/round_0: it holds files" in m for m in said), said


def test_another_runs_and_another_nodes_checkpoints_under_this_name_are_left(tmp_path):
    make(tmp_path, 0, schema_version=2, run_id="fedcba9876543210", complete=True)  # a folder copied from another run
    make(tmp_path, 1, node_id="w1-other")  # another node's manifest in w1's folder (a name that collided)
    make(tmp_path, 2)
    checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=1, keep=2, run_id=RUN)
    assert rounds_left(tmp_path) == ["round_0", "round_1", "round_2"]


def _plant_manifest(root, round_: int, kind: str) -> None:
    make(root, round_)
    path = root / LAYOUT.checkpoint_dir("w1", round_) / "checkpoint.json"
    if kind == "deep":
        path.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    elif kind == "huge integer":
        head = b'{"kind": "checkpoint", "schema_version": 1, "node_id": "w1", "round": 1'
        path.write_bytes(head + b"1" * 5000 + b"}")
    elif kind == "wrong types":
        body = json.loads(path.read_text())
        body["files"]["config.json"] = {"size": True, "sha256": ["0" * 64]}
        path.write_text(json.dumps(body))
    elif kind == "folder":
        path.unlink()
        (path / "inside").mkdir(parents=True)
    else:
        path.unlink()
        os.mkfifo(path)


MALFORMED = {
    "deep": "manifest is not JSON: nested too deeply",
    "huge integer": "manifest is not JSON: Exceeds the limit (4300 digits)",
    "wrong types": "file 'config.json' has no valid size",
    "folder": "a folder, not a regular file",
    "fifo": "a FIFO, not a regular file",
}


def test_malformed_manifests_are_skipped_by_loading_and_pruning_never_a_crash(tmp_path, caplog):
    """A manifest 400 KB deep, with a 5,000-digit integer (Python's int conversion limit), with booleans and lists
    for sizes and hashes, or a folder or a FIFO in its place: each is a logged skip, and the good one still loads."""
    storage = LocalStorage(tmp_path)
    make(tmp_path, 0)
    data = (tmp_path / LAYOUT.checkpoint_dir("w1", 0) / "config.json").read_bytes()
    body = json.loads((tmp_path / LAYOUT.checkpoint_dir("w1", 0) / "checkpoint.json").read_text())
    for name in FILES:  # round 0: a whole checkpoint whose files match its manifest
        body["files"][name] = {"size": len(data), "sha256": checkpoint._sha256(data)}
    (tmp_path / LAYOUT.checkpoint_dir("w1", 0) / "checkpoint.json").write_text(json.dumps(body))
    for round_, kind in enumerate(MALFORMED, start=1):
        _plant_manifest(tmp_path, round_, kind)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        restored = checkpoint.load_latest(storage, LAYOUT, "w1", tmp_path / "restore")
        checkpoint._prune(storage, LAYOUT, "w1", keep_last=1, keep=len(MALFORMED) + 1)
    assert restored is not None and restored.round == 0
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping checkpoint")]
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pruning: left")]
    for round_, (kind, reason) in enumerate(MALFORMED.items(), start=1):
        folder = LAYOUT.checkpoint_dir("w1", round_)
        assert any(folder in m and reason in m for m in skipped), (kind, skipped)
        assert any(folder in m and reason in m for m in left), (kind, left)
    # Round 0, whole and this node's, was pruned (keep_last=1); the malformed ones are not provably w1's: left.
    assert rounds_left(tmp_path) == [f"round_{r}" for r in range(1, len(MALFORMED) + 1)]


@pytest.mark.parametrize("kind", ["a file", "a link"])
def test_a_round_that_is_not_a_folder_is_ignored(tmp_path, kind):
    make(tmp_path, 0)
    base = (tmp_path / LAYOUT.checkpoint_dir("w1", 0)).parent
    if kind == "a file":
        (base / "round_3").write_bytes(b"planted")
    else:
        os.symlink(tmp_path, base / "round_3")
    storage = LocalStorage(tmp_path)
    assert checkpoint.load_latest(storage, LAYOUT, "w1", tmp_path / "restore") is None  # round 0's hashes are fake
    checkpoint._prune(storage, LAYOUT, "w1", keep_last=1, keep=5)
    assert rounds_left(tmp_path) == ["round_3"]  # round 0 pruned; the planted entry left as it was
