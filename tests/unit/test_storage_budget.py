"""The storage budget (issue 27, build 1): checkpoints sized to what they hold (CHECKPOINT_OPTIMIZER), the free
space checked before a checkpoint is written (a local folder's file system, Drive's about.get quota on the
emulator), and a pruned checkpoint on a mounted Drive said to go to Drive's trash."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from swarm_gdrive.protocol.layout import Layout  # noqa: E402
from swarm_gdrive.protocol.worker import GiveUpError  # noqa: E402
from swarm_gdrive.storage.base import Space, free_space  # noqa: E402
from swarm_gdrive.storage.drive import DriveStorage  # noqa: E402
from swarm_gdrive.storage.local import LocalStorage, on_google_drive  # noqa: E402
from swarm_gdrive.training import checkpoint  # noqa: E402
from swarm_gdrive.training.checkpoint import (  # noqa: E402
    MANIFEST,
    OPTIMIZER_FILE,
    SPACE_RESERVE_BYTES,
    STATE_FILE,
    StorageFullError,
    load_latest,
    resolve_optimizer_state,
    restore_training_state,
)
from swarm_gdrive.training.models import load_model_and_tokenizer  # noqa: E402
from tests.drive_emulator import DriveEmulator  # noqa: E402

CPU = torch.device("cpu")
NODE = "node-a"
LAYOUT = Layout("exp")

pytestmark = pytest.mark.usefixtures("one_thread")


def trained(folder: Path, steps: int = 2) -> tuple[Any, Any, torch.optim.Optimizer]:
    """The tiny model after ``steps`` real AdamW steps (so it has exp_avg, exp_avg_sq and step)."""
    model, tokenizer = load_model_and_tokenizer(str(folder), CPU, torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for seed in range(steps):
        ids = torch.randint(6, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(seed))
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, tokenizer, optimizer


def restored_optimizer(storage: Any, model: Any, into: Path) -> torch.optim.Optimizer:
    restored = load_latest(storage, LAYOUT, NODE, into)
    assert restored is not None
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restore_training_state(restored.folder, fresh)
    return fresh


def ckpt(root: Path, round_: int) -> Path:
    return root / LAYOUT.checkpoint_dir(NODE, round_)


# --- CHECKPOINT_OPTIMIZER -------------------------------------------------------------------------------------------


def test_bf16_moments_halve_the_optimizer_file_and_load_back_as_fp32_with_exact_steps(
    tmp_path: Path, tiny_folder: Path
) -> None:
    model, tokenizer, optimizer = trained(tiny_folder)
    sizes = {}
    for round_, how in ((1, "fp32"), (2, "bf16")):
        storage = LocalStorage(tmp_path / how)
        checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, optimizer_state=how)
        sizes[how] = (ckpt(tmp_path / how, round_) / OPTIMIZER_FILE).stat().st_size
    stored = load_file(str(ckpt(tmp_path / "bf16", 2) / OPTIMIZER_FILE))
    moments = {k: v for k, v in stored.items() if k.endswith((".exp_avg", ".exp_avg_sq"))}
    assert moments and all(v.dtype == torch.bfloat16 for v in moments.values())
    assert all(v.dtype == torch.float32 for k, v in stored.items() if k.endswith(".step"))
    assert json.loads((ckpt(tmp_path / "bf16", 2) / STATE_FILE).read_text())["optimizer_state"] == "bf16"
    assert sizes["bf16"] < 0.55 * sizes["fp32"]  # the moments are nearly all of it

    loaded = restored_optimizer(LocalStorage(tmp_path / "bf16"), model, tmp_path / "restore").state_dict()["state"]
    for index, values in optimizer.state_dict()["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            got = loaded[index][name]
            assert got.dtype == torch.float32
            assert torch.equal(got, values[name].to(torch.bfloat16).float()), (index, name)
            assert torch.allclose(got, values[name], rtol=2**-8, atol=0)  # within bf16's rounding
        assert torch.equal(loaded[index]["step"], values["step"]) and float(loaded[index]["step"]) == 2.0


def test_an_fp32_checkpoint_of_an_earlier_version_still_loads_exactly(tmp_path: Path, tiny_folder: Path) -> None:
    """Earlier versions wrote fp32 moments and no ``optimizer_state`` in trainer_state.json."""
    model, tokenizer, optimizer = trained(tiny_folder)
    storage = LocalStorage(tmp_path / "shared")
    checkpoint.save(storage, LAYOUT, NODE, 3, model, tokenizer, optimizer, optimizer_state="fp32")
    folder = ckpt(tmp_path / "shared", 3)
    state = json.loads((folder / STATE_FILE).read_text())
    del state["optimizer_state"]
    data = json.dumps(state).encode()
    (folder / STATE_FILE).write_bytes(data)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][STATE_FILE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(manifest))

    loaded = restored_optimizer(storage, model, tmp_path / "restore").state_dict()["state"]
    for index, values in optimizer.state_dict()["state"].items():
        for name, value in values.items():
            assert torch.equal(loaded[index][name], value), (index, name)


def test_none_keeps_the_weights_alone_and_a_resume_starts_adamw_afresh(tmp_path: Path, tiny_folder: Path) -> None:
    model, tokenizer, optimizer = trained(tiny_folder)
    storage = LocalStorage(tmp_path / "shared")
    checkpoint.save(storage, LAYOUT, NODE, 4, model, tokenizer, optimizer, optimizer_state="none")
    stored = load_file(str(ckpt(tmp_path / "shared", 4) / OPTIMIZER_FILE))
    assert not [k for k in stored if k.startswith("optim.")] and "rng.torch" in stored
    fresh = restored_optimizer(storage, model, tmp_path / "restore")
    assert fresh.state_dict()["state"] == {}
    before = [p.detach().clone() for p in model.parameters()]
    model(input_ids=torch.tensor([[7, 8, 9]]), labels=torch.tensor([[7, 8, 9]])).loss.backward()
    fresh.step()  # AdamW starts its moments at this step
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_auto_is_bf16_for_a_full_fine_tune_the_weights_alone_for_a_large_one_and_exact_for_lora() -> None:
    smollm2_135m, smollm2_360m, qwen25_05b = 134_515_008, 361_821_120, 494_032_768
    assert resolve_optimizer_state("auto", lora=False, trained_parameters=smollm2_135m) == "bf16"
    assert resolve_optimizer_state("auto", lora=False, trained_parameters=smollm2_360m) == "bf16"
    assert resolve_optimizer_state("auto", lora=False, trained_parameters=qwen25_05b) == "none"
    assert resolve_optimizer_state("bf16", lora=False, trained_parameters=qwen25_05b) == "bf16"
    assert resolve_optimizer_state("auto", lora=True, trained_parameters=qwen25_05b) == "fp32"
    assert resolve_optimizer_state("none", lora=True) == "none"
    with pytest.raises(ValueError, match="CHECKPOINT_OPTIMIZER"):
        checkpoint.optimizer_to_files(torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))]), "fp16")


def test_the_setting_defaults_to_auto_and_names_its_choices(tmp_path: Path) -> None:
    from swarm_gdrive.config import ConfigError, from_env

    env = {"GDRIVE_PATH": str(tmp_path), "NODE_ROLE": "worker"}
    assert from_env(env).checkpoint_optimizer == "auto"
    assert from_env({**env, "CHECKPOINT_OPTIMIZER": " None "}).checkpoint_optimizer == "none"
    with pytest.raises(ConfigError, match="CHECKPOINT_OPTIMIZER.*fp16"):
        from_env({**env, "CHECKPOINT_OPTIMIZER": "fp16"})


# --- the free-space check -------------------------------------------------------------------------------------------


class RoomyStorage(LocalStorage):
    """A local folder whose file system reports ``free`` bytes (a test double for a nearly full disk)."""

    def __init__(self, root: Path, free: int) -> None:
        super().__init__(root)
        self.free = free

    def free_space(self) -> Space:
        return Space(self.free, 10 * 10**9, f"the file system of {self.root}")


def test_a_local_folder_reports_its_file_system_and_whether_it_is_on_drive(tmp_path: Path) -> None:
    space = free_space(LocalStorage(tmp_path))
    assert space is not None and space.total == shutil.disk_usage(tmp_path).total
    assert space.free is not None and 0 < space.free <= space.total and not space.deletes_to_trash
    assert on_google_drive("/content/drive/MyDrive/rl-swarm") and on_google_drive("/Users/a/My Drive/x")
    assert not on_google_drive(tmp_path) and not on_google_drive("/content/rl-swarm")
    mounted = tmp_path / "drive" / "MyDrive" / "rl-swarm"
    mounted.mkdir(parents=True)
    assert LocalStorage(mounted).on_google_drive and free_space(LocalStorage(mounted)).deletes_to_trash
    shared = tmp_path / "drive" / "Shareddrives" / "team" / "rl-swarm"  # a shared drive's room is not the account's
    shared.mkdir(parents=True)
    assert free_space(LocalStorage(shared)).free is None


def test_a_checkpoint_is_warned_about_then_refused_before_anything_is_written(
    tmp_path: Path, tiny_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer, optimizer = trained(tiny_folder, steps=1)
    storage = RoomyStorage(tmp_path / "shared", free=10 * 10**9)
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        checkpoint.save(storage, LAYOUT, NODE, 0, model, tokenizer, optimizer)
    assert not [r for r in caplog.records if "nearly full" in r.message]
    size = sum(p.stat().st_size for p in ckpt(tmp_path / "shared", 0).iterdir() if p.name != MANIFEST)

    storage.free = 3 * size + SPACE_RESERVE_BYTES  # room for 3: a warning, and the save goes on
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        checkpoint.save(storage, LAYOUT, NODE, 1, model, tokenizer, optimizer)
    (warning,) = [r.getMessage() for r in caplog.records if "nearly full" in r.message]
    assert "room for 3 checkpoint(s)" in warning and str(storage.root) in warning
    assert (ckpt(tmp_path / "shared", 1) / MANIFEST).exists()

    storage.free = size + SPACE_RESERVE_BYTES // 2  # less than the checkpoint and the reserve
    with pytest.raises(StorageFullError) as refused:
        checkpoint.save(storage, LAYOUT, NODE, 2, model, tokenizer, optimizer)
    message = str(refused.value)
    assert isinstance(refused.value, GiveUpError)  # the worker stops with this message (exit code 3)
    assert "checkpoint of round 2 not written" in message and str(storage.root) in message
    assert "CHECKPOINT_OPTIMIZER=none" in message and "KEEP_CHECKPOINTS=1" in message
    assert not ckpt(tmp_path / "shared", 2).exists()  # nothing written: no half checkpoint to clean up
    assert (ckpt(tmp_path / "shared", 1) / MANIFEST).exists()  # and nothing pruned


def test_a_pruned_checkpoint_on_a_mounted_drive_is_said_to_fill_the_trash(
    tmp_path: Path, tiny_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer, optimizer = trained(tiny_folder, steps=1)
    checkpoint._trash_explained.clear()
    for root, expected in ((tmp_path / "local", 0), (tmp_path / "drive" / "MyDrive" / "swarm", 1)):
        storage = LocalStorage(root)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="swarm_gdrive.training.checkpoint"):
            for round_ in range(3):
                checkpoint.save(storage, LAYOUT, NODE, round_, model, tokenizer, optimizer, keep_last=1)
        said = [r for r in caplog.records if "Drive's trash" in r.message]
        assert len(said) == 2 * expected  # rounds 0 and 1 pruned
        if expected:
            assert said[0].levelno == logging.WARNING and "drive.google.com/drive/trash" in said[0].getMessage()
            assert said[1].levelno == logging.INFO
    checkpoint._trash_explained.clear()


# --- Drive: about.get storageQuota on the emulator ------------------------------------------------------------------


@pytest.fixture
def emu():
    with DriveEmulator() as emulator:
        yield emulator


def drive(emu: DriveEmulator) -> DriveStorage:
    return DriveStorage(emu.root_id, "swarm", service=emu.service(), retry_max_wait=0.02, account="a@example.com")


def test_drive_reports_the_account_quota_and_its_trash(emu: DriveEmulator) -> None:
    storage = drive(emu)
    assert free_space(storage) == Space(None, None, "the Google Drive of a@example.com", trash=0)  # no limit
    emu.set_storage_quota(15 * 10**9, used_elsewhere=4 * 10**9)
    storage.write_bytes("a/b.bin", b"x" * 1000)
    space = free_space(storage)
    assert (space.total, space.free, space.trash) == (15 * 10**9, 11 * 10**9 - 1000, 0)
    emu_file = next(f for f in emu.files() if f["name"] == "b.bin")
    storage.service.files().update(fileId=emu_file["id"], body={"trashed": True}).execute()
    assert free_space(storage).trash == 1000 and free_space(storage).free == 11 * 10**9 - 1000  # trash still counts


def test_drive_past_its_quota_refuses_content_as_drive_does(emu: DriveEmulator) -> None:
    from swarm_gdrive.storage.drive import DriveQuotaError

    storage = drive(emu)
    emu.set_storage_quota(10_000)
    storage.write_bytes("a.bin", b"x" * 6000)
    with pytest.raises(DriveQuotaError, match="storageQuotaExceeded"):
        storage.write_bytes("b.bin", b"y" * 6000)
    storage.write_bytes("a.bin", b"z" * 9000)  # a replacement needs only the difference


def test_a_checkpoint_into_a_nearly_full_drive_is_warned_about_then_refused(
    emu: DriveEmulator, tiny_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer, optimizer = trained(tiny_folder, steps=1)
    storage = drive(emu)
    checkpoint.save(storage, LAYOUT, NODE, 0, model, tokenizer, optimizer)
    used, _ = emu.storage_usage()
    size = sum(int(f["size"]) for f in emu.files() if f.get("size") and f["name"] != MANIFEST)

    emu.set_storage_quota(used + 2 * size + SPACE_RESERVE_BYTES - 1)  # room for round 1, not for round 2 too
    with caplog.at_level(logging.WARNING, logger="swarm_gdrive.training.checkpoint"):
        checkpoint.save(storage, LAYOUT, NODE, 1, model, tokenizer, optimizer, keep_last=5)
    (warning,) = [r.getMessage() for r in caplog.records if "nearly full" in r.message]
    assert "the Google Drive of a@example.com" in warning and "room for 1 checkpoint(s)" in warning

    uploads = len(emu.requests)
    with pytest.raises(StorageFullError, match=r"checkpoint of round 2 not written.*Google Drive of a@example.com"):
        checkpoint.save(storage, LAYOUT, NODE, 2, model, tokenizer, optimizer, keep_last=5)
    assert not [p for m, p in emu.requests[uploads:] if m != "GET"]  # nothing written, nothing deleted
    assert sorted(f["name"] for f in emu.files() if f["name"].startswith("round_")) == ["round_0", "round_1"]


def test_a_folder_in_a_shared_drive_is_not_checked_against_the_account(emu: DriveEmulator) -> None:
    storage = drive(emu)
    storage._shared_drive = True  # what files.get(root, fields=driveId) says of a shared drive's folder
    emu.set_storage_quota(1)
    assert free_space(storage) is None
