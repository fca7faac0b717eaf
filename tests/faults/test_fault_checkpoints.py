"""Pruning after a save: a checkpoint interrupted by a kill, or a folder a peer planted, must not take the
place of a whole checkpoint that a later restart needs."""

from __future__ import annotations

import json

from faultkit import LAYOUT

from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.training import checkpoint

FILES = ("config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json")


def make(root, round_: int, files=FILES, manifest: bool = True, temp: bool = False) -> None:
    folder = root / LAYOUT.checkpoint_dir("w1", round_)
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"x")
    if temp:  # what a process killed while writing model.safetensors leaves
        (folder / ".model.safetensors.0123456789ab.tmp").write_bytes(b"half")
    if manifest:
        entries = {name: {"size": 1, "sha256": "0" * 64} for name in files}
        body = {"kind": "checkpoint", "schema_version": 1, "node_id": "w1", "round": round_, "files": entries}
        (folder / "checkpoint.json").write_text(json.dumps(body))


def test_only_whole_checkpoints_older_than_the_new_one_count_and_newer_folders_are_left_alone(tmp_path):
    make(tmp_path, 0)
    make(tmp_path, 1)
    make(tmp_path, 2, files=("config.json",), manifest=False, temp=True)  # killed mid-save
    make(tmp_path, 3, files=("config.json", "model.bin", "optimizer.safetensors", "trainer_state.json"))  # planted
    make(tmp_path, 5)  # the one just saved
    make(tmp_path, 7, manifest=False)  # newer than the save: not this save's business
    checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=2, keep=5)
    left = sorted(p.name for p in (tmp_path / LAYOUT.checkpoint_dir("w1", 0)).parent.iterdir())
    assert left == ["round_1", "round_5", "round_7"]  # round 1 is the whole one a restart falls back to


def test_keep_one_keeps_only_the_new_checkpoint(tmp_path):
    for round_ in (0, 1, 2):
        make(tmp_path, round_)
    checkpoint._prune(LocalStorage(tmp_path), LAYOUT, "w1", keep_last=1, keep=2)
    assert sorted(p.name for p in (tmp_path / LAYOUT.checkpoint_dir("w1", 0)).parent.iterdir()) == ["round_2"]
