"""Checkpoints in the shared folder: round trip, pruning, and every reason a checkpoint is skipped."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from swarm_gdrive.protocol.layout import Layout  # noqa: E402
from swarm_gdrive.storage.local import LocalStorage  # noqa: E402
from swarm_gdrive.training import checkpoint  # noqa: E402
from swarm_gdrive.training.checkpoint import (  # noqa: E402
    ALLOWED_FILES,
    MANIFEST,
    OPTIMIZER_FILE,
    STATE_FILE,
    load_latest,
    optimizer_from_files,
    optimizer_to_files,
    param_digest,
    restore_training_state,
)
from swarm_gdrive.training.models import load_model_and_tokenizer  # noqa: E402

CPU = torch.device("cpu")
NODE = "node-a"
LAYOUT = Layout("exp")


pytestmark = pytest.mark.usefixtures("one_thread")


# --- fixtures and helpers -----------------------------------------------------------------------------------------


def load(folder: Path) -> tuple[Any, Any, torch.optim.Optimizer]:
    model, tokenizer = load_model_and_tokenizer(str(folder), CPU, torch.float32)
    return model, tokenizer, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: Any, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One real optimizer step (so that AdamW has exp_avg, exp_avg_sq and step)."""
    ids = torch.randint(6, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(seed))
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def ckpt_path(root: Path, round_: int, node: str = NODE) -> Path:
    return root / LAYOUT.checkpoint_dir(node, round_)


def read_manifest(root: Path, round_: int) -> dict[str, Any]:
    return json.loads((ckpt_path(root, round_) / MANIFEST).read_text())


def write_manifest(root: Path, round_: int, manifest: dict[str, Any]) -> None:
    (ckpt_path(root, round_) / MANIFEST).write_text(json.dumps(manifest))


def entry_for(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, tiny_folder: Path) -> tuple[Path, dict[int, str]]:
    """A shared folder with valid checkpoints of rounds 1 and 2 (different weights); copied by each test."""
    root = tmp_path_factory.mktemp("template")
    storage = LocalStorage(root)
    model, tokenizer, optimizer = load(tiny_folder)
    digests = {}
    for round_ in (1, 2):
        train_step(model, optimizer, seed=round_)
        checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, keep_last=5)
        digests[round_] = param_digest(model)
    assert digests[1] != digests[2]
    return root, digests


@pytest.fixture
def shared(tmp_path: Path, template: tuple[Path, dict[int, str]]) -> Path:
    root = tmp_path / "shared"
    shutil.copytree(template[0], root)
    return root


def restored_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True)


def restored_digest(folder: Path) -> str:
    return param_digest(restored_model(folder))


class RecordingStorage(LocalStorage):
    """LocalStorage that records its writes and deletes, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[str] = []
        self.deletes: list[str] = []
        self.events: list[tuple[str, str]] = []

    def write_bytes(self, path: str, data: bytes) -> None:
        self.writes.append(path)
        self.events.append(("write", path))
        super().write_bytes(path, data)

    def move_in(self, path: str, local: str | os.PathLike[str]) -> bool:
        moved = super().move_in(path, local)
        self.writes.append(path)
        self.events.append(("move" if moved else "write", path))
        return moved

    def delete(self, path: str) -> None:
        self.deletes.append(path)
        self.events.append(("delete", path))
        super().delete(path)


# --- save, load_latest and restore --------------------------------------------------------------------------------


def test_save_load_restore_round_trip(tmp_path: Path, tiny_folder: Path) -> None:
    storage = LocalStorage(tmp_path / "shared")
    model, tokenizer, optimizer = load(tiny_folder)
    train_step(model, optimizer, seed=0)
    train_step(model, optimizer, seed=1)
    # fp32 moments (CHECKPOINT_OPTIMIZER=fp32) resume exactly; bf16's are in tests/unit/test_storage_budget.py.
    folder = checkpoint.save(storage, LAYOUT, NODE, 7, model, tokenizer, optimizer, optimizer_state="fp32")
    assert folder == LAYOUT.checkpoint_dir(NODE, 7)
    # What the RNGs give right after the save is what they must give right after a restore.
    torch_draw, python_draw = torch.rand(4), random.random()

    restored = load_latest(storage, LAYOUT, NODE, tmp_path / "restore")
    assert restored is not None
    assert restored.round == 7
    assert restored.folder == tmp_path / "restore" / "round_7"

    fresh = restored_model(restored.folder)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert param_digest(fresh) == param_digest(model)
    torch.manual_seed(12345)
    random.seed(12345)
    assert restore_training_state(restored.folder, fresh_optimizer) == 7

    assert torch.equal(torch.rand(4), torch_draw)
    assert random.random() == python_draw
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys()
    for index, values in saved["state"].items():
        assert values.keys() == loaded["state"][index].keys()
        for name, value in values.items():
            assert torch.equal(loaded["state"][index][name], value), (index, name)
    assert float(loaded["state"][0]["step"]) == 2.0
    for key in ("lr", "eps", "weight_decay"):
        assert loaded["param_groups"][0][key] == saved["param_groups"][0][key]
    assert tuple(loaded["param_groups"][0]["betas"]) == tuple(saved["param_groups"][0]["betas"])

    # Training goes on exactly as if there had been no interruption.
    train_step(model, optimizer, seed=2)
    train_step(fresh, fresh_optimizer, seed=2)
    assert param_digest(fresh) == param_digest(model)


def test_save_writes_only_allowed_files_with_a_manifest_written_last(tmp_path: Path, tiny_folder: Path) -> None:
    storage = RecordingStorage(tmp_path)
    model, tokenizer, optimizer = load(tiny_folder)
    train_step(model, optimizer, seed=0)
    folder = checkpoint.save(storage, LAYOUT, NODE, 0, model, tokenizer, optimizer)
    assert storage.writes[0] == storage.writes[-1] == f"{folder}/{MANIFEST}"  # incomplete first, complete last
    # What save_pretrained wrote to the node's temporary folder (on the folder's file system here) is renamed into
    # place, not copied: a checkpoint's gigabyte is written once.
    assert ("move", f"{folder}/model.safetensors") in storage.events
    manifest = read_manifest(tmp_path, 0)
    assert manifest["kind"] == "checkpoint"
    assert manifest["node_id"] == NODE
    assert manifest["round"] == 0
    assert (manifest["schema_version"], manifest["complete"], manifest["run_id"]) == (2, True, None)  # no run here
    names = set(manifest["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json", OPTIMIZER_FILE, STATE_FILE} <= names
    on_disk = {p.name for p in ckpt_path(tmp_path, 0).iterdir()}
    assert on_disk == names | {MANIFEST}
    for name, entry in manifest["files"].items():
        assert ALLOWED_FILES.fullmatch(name), name
        assert entry == entry_for((ckpt_path(tmp_path, 0) / name).read_bytes()), name
    # Every file save_pretrained writes for this model is kept (nothing is silently dropped).
    reference = tmp_path / "reference"
    model.save_pretrained(reference, safe_serialization=True)
    tokenizer.save_pretrained(reference)
    assert {p.name for p in reference.iterdir()} <= names


def test_optimizer_files_round_trip_adamw_state(tiny_folder: Path) -> None:
    model, _, optimizer = load(tiny_folder)
    train_step(model, optimizer, seed=0)
    optimizer.state[next(iter(optimizer.state))]["note"] = 5  # a non-tensor value goes to the JSON part
    tensors, meta = optimizer_to_files(optimizer)
    assert all(isinstance(t, torch.Tensor) and t.is_contiguous() for t in tensors.values())
    assert all(key.startswith("optim.") for key in tensors)
    meta = json.loads(json.dumps(meta))  # the scalar part survives JSON

    state = optimizer_from_files({**tensors, "rng.torch": torch.get_rng_state()}, meta)
    other = torch.optim.AdamW(model.parameters(), lr=0.5)
    other.load_state_dict(state)
    original, loaded = optimizer.state_dict(), other.state_dict()
    assert original["state"].keys() == loaded["state"].keys()
    for index, values in original["state"].items():
        assert values.keys() == loaded["state"][index].keys()
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(loaded["state"][index][name], value), (index, name)
            else:
                assert loaded["state"][index][name] == value
    assert loaded["param_groups"][0]["lr"] == 1e-3
    assert loaded["param_groups"][0]["params"] == original["param_groups"][0]["params"]


def test_param_digest_tracks_the_weights(tiny_folder: Path) -> None:
    model, _, optimizer = load(tiny_folder)
    same, _, _ = load(tiny_folder)
    assert param_digest(model) == param_digest(same)
    train_step(model, optimizer, seed=0)
    assert param_digest(model) != param_digest(same)


def test_keep_last_prunes_older_checkpoints_manifest_first(tmp_path: Path, tiny_folder: Path) -> None:
    storage = RecordingStorage(tmp_path)
    model, tokenizer, optimizer = load(tiny_folder)
    train_step(model, optimizer, seed=0)
    for round_ in range(5):
        checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, keep_last=2)
    base = ckpt_path(tmp_path, 0).parent
    assert sorted(p.name for p in base.iterdir()) == ["round_3", "round_4"]
    for round_ in (0, 1, 2):  # each pruned checkpoint was made incomplete before any file went, its manifest last
        folder = LAYOUT.checkpoint_dir(NODE, round_)
        mine = [d for d in storage.deletes if d.startswith(f"{folder}/")]
        assert mine and mine[-1] == f"{folder}/{MANIFEST}" and len(mine) == len(set(mine))
        first_delete = storage.events.index(("delete", mine[0]))
        assert ("write", f"{folder}/{MANIFEST}") in storage.events[first_delete - 1 : first_delete]
    restored = load_latest(storage, LAYOUT, NODE, tmp_path / "restore")
    assert restored is not None and restored.round == 4


def test_the_checkpoint_just_saved_survives_pruning_even_behind_newer_rounds(tmp_path: Path, tiny_folder: Path) -> None:
    storage = RecordingStorage(tmp_path)
    model, tokenizer, optimizer = load(tiny_folder)
    for round_ in (5, 6, 3):
        checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, keep_last=2)
    assert sorted(p.name for p in ckpt_path(tmp_path, 0).parent.iterdir()) == ["round_3", "round_5", "round_6"]


def test_prune_leaves_other_nodes_alone(tmp_path: Path, tiny_folder: Path) -> None:
    storage = LocalStorage(tmp_path)
    model, tokenizer, optimizer = load(tiny_folder)
    train_step(model, optimizer, seed=0)
    checkpoint.save(storage, LAYOUT, "node-b", 0, model, tokenizer, optimizer, keep_last=1)
    for round_ in (1, 2):
        checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, keep_last=1)
    assert (ckpt_path(tmp_path, 0, "node-b") / MANIFEST).exists()
    assert sorted(p.name for p in ckpt_path(tmp_path, 0).parent.iterdir()) == ["round_2"]


# --- what load_latest skips ---------------------------------------------------------------------------------------


def _remove_manifest(root: Path) -> None:
    (ckpt_path(root, 2) / MANIFEST).unlink()


def _name_file(name: str, write: bool = True) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        data = b"\x80\x04K\x01."  # a pickle (of 1), in case anything ever reads it
        if write:
            (ckpt_path(root, 2) / name).write_bytes(data)
        manifest = read_manifest(root, 2)
        manifest["files"][name] = entry_for(data)
        write_manifest(root, 2, manifest)

    return tamper


def _flip_a_byte(name: str) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        path = ckpt_path(root, 2) / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    return tamper


def _append_bytes(root: Path) -> None:
    with open(ckpt_path(root, 2) / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 16)


def _delete_file(root: Path) -> None:
    (ckpt_path(root, 2) / "config.json").unlink()


def _edit_manifest(**changes: Any) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        manifest = read_manifest(root, 2)
        for key, value in changes.items():
            if value is None:
                del manifest[key]
            else:
                manifest[key] = value
        write_manifest(root, 2, manifest)

    return tamper


def _manifest_bytes(data: bytes) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        (ckpt_path(root, 2) / MANIFEST).write_bytes(data)

    return tamper


def _drop_from_manifest(name: str) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        manifest = read_manifest(root, 2)
        del manifest["files"][name]
        write_manifest(root, 2, manifest)

    return tamper


def _bad_size(size: Any) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        manifest = read_manifest(root, 2)
        manifest["files"]["config.json"]["size"] = size
        write_manifest(root, 2, manifest)

    return tamper


def _manifest_is(kind: str) -> Callable[[Path], None]:
    def tamper(root: Path) -> None:
        path = ckpt_path(root, 2) / MANIFEST
        path.unlink()
        path.mkdir() if kind == "folder" else os.mkfifo(path)

    return tamper


NOT_ALLOWED = "is not an allowed checkpoint file"
MISMATCH = "does not match the manifest"
NOT_THIS = "does not describe this node's checkpoint of this round"
NOT_KIND = "manifest is not an object of kind 'checkpoint'"
NOT_FILES = "manifest's files is not an object"
NOT_JSON = "manifest is not JSON"
HUGE = b'{"kind": "checkpoint", "schema_version": 2, "round": 1' + b"0" * 5000 + b"}"
LACKS = "lacks the optimizer or trainer state"
#: How a checkpoint of round 2 is spoiled, and the reason load_latest must log for skipping it.
TAMPERINGS: dict[str, tuple[Callable[[Path], None], str]] = {
    "no manifest (incomplete)": (_remove_manifest, "no manifest"),
    "names model.bin": (_name_file("model.bin"), NOT_ALLOWED),
    "names pytorch_model.bin": (_name_file("pytorch_model.bin"), NOT_ALLOWED),
    "names optimizer.pt": (_name_file("optimizer.pt"), NOT_ALLOWED),
    "names rng_state.pkl": (_name_file("rng_state.pkl"), NOT_ALLOWED),
    "names ../x": (_name_file("../x", write=False), NOT_ALLOWED),
    "names a sub-folder path": (_name_file("sub/model.safetensors", write=False), NOT_ALLOWED),
    "model.safetensors corrupted": (_flip_a_byte("model.safetensors"), MISMATCH),
    "optimizer corrupted": (_flip_a_byte(OPTIMIZER_FILE), MISMATCH),
    "model.safetensors grew": (_append_bytes, "exceeds"),
    "a listed file is missing": (_delete_file, "No such file"),
    "another node's manifest": (_edit_manifest(node_id="node-b"), NOT_THIS),
    "another round's manifest": (_edit_manifest(round=1), NOT_THIS),
    "not a checkpoint manifest": (_edit_manifest(kind="rollout"), NOT_KIND),
    "files is not a dict": (_edit_manifest(files=["model.safetensors"]), NOT_FILES),
    "manifest without files": (_edit_manifest(files=None), NOT_FILES),
    "manifest not JSON": (_manifest_bytes(b'{"kind": "checkpoint", '), NOT_JSON),
    "manifest not UTF-8": (_manifest_bytes(b"\xff\xfe\xfa\x00garbage"), NOT_JSON),
    "manifest is a list": (_manifest_bytes(b"[]"), NOT_KIND),
    "manifest nested 100,000 deep": (_manifest_bytes(b"[" * 100_000 + b"]" * 100_000), NOT_JSON),
    "manifest with a 5,000-digit integer": (_manifest_bytes(HUGE), NOT_JSON),
    "manifest over 1 MiB": (_manifest_bytes(b" " * (2 << 20) + b"{}"), "exceeds the 1048576-byte cap"),
    "manifest is a folder": (_manifest_is("folder"), "a folder, not a regular file"),
    "manifest is a FIFO": (_manifest_is("fifo"), "a FIFO, not a regular file"),
    "round is a boolean": (_edit_manifest(round=True), "no valid node_id, round or complete"),
    "schema version 3": (_edit_manifest(schema_version=3), "schema_version 3 is not supported"),
    "an interrupted save": (_edit_manifest(complete=False), "an interrupted save"),
    "complete is a string": (_edit_manifest(complete="yes"), "no valid node_id, round or complete"),
    "run id is not hex": (_edit_manifest(run_id="../x"), "no valid run_id"),
    "sha256 is not hex": (_edit_manifest(files={"config.json": {"size": 1, "sha256": 5}}), "no valid sha256"),
    "manifest lacks the optimizer": (_drop_from_manifest(OPTIMIZER_FILE), LACKS),
    "manifest lacks the trainer state": (_drop_from_manifest(STATE_FILE), LACKS),
    "manifest lacks the model weights": (_drop_from_manifest("model.safetensors"), "lacks the model"),
    "manifest lacks the model config": (_drop_from_manifest("config.json"), "lacks the model"),
    "size is a string": (_bad_size("12"), "no valid size"),
    "size is negative": (_bad_size(-1), "no valid size"),
    "size is a boolean": (_bad_size(True), "no valid size"),
    "size is too large": (_bad_size(checkpoint.MAX_FILE_BYTES + 1), "no valid size"),
}


@pytest.mark.parametrize("tamper", list(TAMPERINGS))
def test_load_latest_skips_a_bad_checkpoint_for_the_next_older(
    tmp_path: Path,
    shared: Path,
    template: tuple[Path, dict[int, str]],
    caplog: pytest.LogCaptureFixture,
    tamper: str,
) -> None:
    spoil, reason = TAMPERINGS[tamper]
    spoil(shared)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        restored = load_latest(LocalStorage(shared), LAYOUT, NODE, tmp_path / "restore")
    assert restored is not None
    assert restored.round == 1
    assert restored_digest(restored.folder) == template[1][1]
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and "round_2" in skipped[0] and reason in skipped[0], skipped
    assert not [p for p in (tmp_path / "restore").rglob("*") if p.is_file() and not ALLOWED_FILES.fullmatch(p.name)]
    assert not (tmp_path / "x").exists()


def test_load_latest_takes_the_newest_valid_checkpoint(
    tmp_path: Path, shared: Path, template: tuple[Path, dict[int, str]]
) -> None:
    restored = load_latest(LocalStorage(shared), LAYOUT, NODE, tmp_path / "restore")
    assert restored is not None and restored.round == 2
    assert restored_digest(restored.folder) == template[1][2]
    assert load_latest(LocalStorage(shared), LAYOUT, "node-b", tmp_path / "other") is None


def test_load_latest_ignores_folders_that_are_not_rounds(tmp_path: Path, shared: Path) -> None:
    base = ckpt_path(shared, 2).parent
    shutil.copytree(ckpt_path(shared, 2), base / "round_09")  # not canonical
    shutil.copytree(ckpt_path(shared, 2), base / "latest")
    restored = load_latest(LocalStorage(shared), LAYOUT, NODE, tmp_path / "restore")
    assert restored is not None and restored.round == 2


def test_load_latest_returns_none_when_no_checkpoint_is_valid(tmp_path: Path, shared: Path) -> None:
    storage = LocalStorage(shared)
    assert load_latest(LocalStorage(tmp_path / "empty"), LAYOUT, NODE, tmp_path / "restore") is None
    _remove_manifest(shared)
    (ckpt_path(shared, 1) / MANIFEST).write_bytes(b"not json")
    assert load_latest(storage, LAYOUT, NODE, tmp_path / "restore") is None


# --- pickles are never loaded -------------------------------------------------------------------------------------


class PlantedPayload:
    """Unpickling this creates the marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_the_planted_payload_would_fire_if_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    pickle.loads(pickle.dumps(PlantedPayload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed"])
def test_a_planted_pickle_is_never_downloaded_or_unpickled(
    tmp_path: Path, shared: Path, template: tuple[Path, dict[int, str]], listed: bool
) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(PlantedPayload(marker))
    for round_ in (1, 2):
        (ckpt_path(shared, round_) / "pytorch_model.bin").write_bytes(payload)
    # A newer checkpoint made only of the pickle, under a manifest that is otherwise in order.
    round_3 = ckpt_path(shared, 3)
    round_3.mkdir()
    (round_3 / "pytorch_model.bin").write_bytes(payload)
    manifest = read_manifest(shared, 2)
    manifest["round"] = 3
    manifest["files"] = {"pytorch_model.bin": entry_for(payload)}
    write_manifest(shared, 3, manifest)
    if listed:  # round 2 lists it too (with the right sha256)
        manifest = read_manifest(shared, 2)
        manifest["files"]["pytorch_model.bin"] = entry_for(payload)
        write_manifest(shared, 2, manifest)

    into = tmp_path / "restore"
    restored = load_latest(LocalStorage(shared), LAYOUT, NODE, into)

    assert restored is not None
    assert restored.round == (1 if listed else 2)
    assert not list(into.rglob("*.bin"))
    model = restored_model(restored.folder)
    assert param_digest(model) == template[1][restored.round]
    assert restore_training_state(restored.folder, torch.optim.AdamW(model.parameters())) == restored.round
    assert not marker.exists()


# --- allowed names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "model.safetensors",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "optimizer.safetensors",
        "trainer_state.json",
    ],
)
def test_allowed_files_accept_safetensors_and_json(name: str) -> None:
    assert ALLOWED_FILES.fullmatch(name)


@pytest.mark.parametrize(
    "name",
    [
        "pytorch_model.bin",
        "model.bin",
        "pytorch_model-00001-of-00002.bin",
        "optimizer.pt",
        "training_args.bin",
        "rng_state.pkl",
        "scheduler.pt",
        "model.safetensors.bak",
        "model-1-of-2.safetensors",
        "../model.safetensors",
        "sub/config.json",
        "checkpoint.json",
        ".model.safetensors.0123.tmp",
        "",
    ],
)
def test_allowed_files_reject_pickles_and_paths(name: str) -> None:
    assert not ALLOWED_FILES.fullmatch(name)
