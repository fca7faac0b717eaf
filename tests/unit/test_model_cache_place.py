"""Where the converted packaged model is kept: never inside the shared folder (config refuses it), on your own My
Drive when a notebook asks for it (MODEL_CACHE_ON_DRIVE, mount only), and a cache folder that a killed or still
syncing converter left half-written is never taken as the model and does not break the next conversion, nor does a
lock that cannot be had (held past the wait, or no flock on the mount)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from swarm_gdrive import notebook
from swarm_gdrive.config import ConfigError, from_env
from swarm_gdrive.training import models


@pytest.fixture
def drive(tmp_path: Path) -> Path:
    """A stand-in for Colab's mount point: {drive}/MyDrive with the shared folder rl-swarm in it."""
    (tmp_path / "drive" / "MyDrive" / "rl-swarm").mkdir(parents=True)
    return tmp_path / "drive"


# -- config: MODEL_CACHE_DIR outside GDRIVE_PATH --------------------------------------------------


@pytest.mark.parametrize("inside", [".", "models", "a/b/models", "../shared/models"])
def test_a_model_cache_inside_the_shared_folder_is_refused(tmp_path: Path, inside: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    with pytest.raises(ConfigError) as info:
        from_env({"GDRIVE_PATH": str(shared), "MODEL_CACHE_DIR": str(shared / inside), "WORKLOAD": "synthetic"})
    message = str(info.value)
    assert info.value.var == "MODEL_CACHE_DIR"
    assert f"GDRIVE_PATH={str(shared.resolve())!r}" in message and "outside GDRIVE_PATH" in message


def test_a_symlink_does_not_hide_a_model_cache_inside_the_shared_folder(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "models").mkdir(parents=True)
    (tmp_path / "link").symlink_to(shared / "models")
    with pytest.raises(ConfigError, match="MODEL_CACHE_DIR="):
        from_env({"GDRIVE_PATH": str(shared), "MODEL_CACHE_DIR": str(tmp_path / "link"), "WORKLOAD": "synthetic"})


def test_a_model_cache_beside_the_shared_folder_or_the_default_is_accepted(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    beside = str(tmp_path / "shared-models")  # a common prefix, not a parent
    base = {"GDRIVE_PATH": str(shared), "WORKLOAD": "synthetic"}
    assert from_env({**base, "MODEL_CACHE_DIR": beside}).model_cache_dir == beside
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert from_env(base).model_cache_dir == str(tmp_path / "home" / ".cache" / "swarm-gdrive" / "models")
    # A URL is no local folder: nothing can be inside it.
    url = {"GDRIVE_PATH": "memory://root", "WORKLOAD": "synthetic", "MODEL_CACHE_DIR": str(tmp_path / "m")}
    assert from_env(url).model_cache_dir == str(tmp_path / "m")


# -- notebooks: MODEL_CACHE_ON_DRIVE ---------------------------------------------------------------


def test_model_cache_on_drive_puts_the_cache_in_my_drive_beside_the_shared_folder(drive: Path, capsys) -> None:
    shared = str(drive / "MyDrive" / "rl-swarm")
    env = notebook.node_env(shared, "x", storage="mount", drive_mount=str(drive), model_cache_on_drive=True)
    assert env["MODEL_CACHE_DIR"] == str(drive / "MyDrive" / "swarm-gdrive-model-cache")
    assert "538 MB" in capsys.readouterr().out
    assert notebook.effective_config(env).model_cache_dir == env["MODEL_CACHE_DIR"]
    # Off (the default): the node's own home folder.
    assert "MODEL_CACHE_DIR" not in notebook.node_env(shared, "x", storage="mount", drive_mount=str(drive))


def test_model_cache_on_drive_needs_the_mount_and_says_so_in_api_mode(drive: Path, capsys) -> None:
    shared = drive.parent / "local"  # outside Colab and My Drive, an api-mode GDRIVE_PATH is used as it is
    shared.mkdir()
    env = notebook.node_env(str(shared), "x", storage="api", drive_mount=str(drive), model_cache_on_drive=True)
    assert "MODEL_CACHE_DIR" not in env
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("MODEL_CACHE_ON_DRIVE")]
    assert "needs STORAGE='mount'" in line and "converts it again" in line


def test_model_cache_dir_in_extra_env_wins_over_model_cache_on_drive(drive: Path, tmp_path: Path) -> None:
    shared = str(drive / "MyDrive" / "rl-swarm")
    mine = str(tmp_path / "my-cache")
    env = notebook.node_env(
        shared, "x", storage="mount", drive_mount=str(drive), extra={"MODEL_CACHE_DIR": mine}, model_cache_on_drive=True
    )
    assert env["MODEL_CACHE_DIR"] == mine


def test_model_cache_on_drive_refuses_an_unmounted_drive_and_a_shared_folder_holding_it(tmp_path, drive) -> None:
    unmounted = tmp_path / "no-drive"
    with pytest.raises(FileNotFoundError, match="not mounted .* untick MODEL_CACHE_ON_DRIVE"):
        notebook.model_cache_env("mount", {"GDRIVE_PATH": str(tmp_path)}, str(unmounted))
    assert not unmounted.exists()  # nothing written where the mount would be
    whole = str(drive / "MyDrive")  # the whole My Drive shared: the cache would be inside it
    with pytest.raises(ValueError, match="inside the shared folder .* untick MODEL_CACHE_ON_DRIVE"):
        notebook.node_env(whole, "x", storage="mount", drive_mount=str(drive), model_cache_on_drive=True)


# -- a half-written cache --------------------------------------------------------------------------


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """A fast stand-in for the 15 s dequantization (the staging and renaming around it are the code under test):
    it writes every file of a converted folder, each holding b"converted"."""
    calls: list[Path] = []

    def fake_convert(folder: Path, filename: str, out: Path) -> None:
        calls.append(out)
        for name in models._CONVERTED_FILES:
            (out / name).write_bytes(b"converted")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    return calls


def test_a_staging_folder_left_by_a_killed_converter_is_never_the_model_and_is_removed_once_stale(
    tmp_path: Path, conversions: list[Path]
) -> None:
    stale = tmp_path / ".smollm2-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")  # killed mid-copy
    old = time.time() - models.STALE_STAGING_SECONDS - 60
    os.utime(stale, (old, old))
    young = tmp_path / ".smollm2-running"  # another process's conversion in progress (no lock on the mount)
    young.mkdir()
    target = models.packaged_smollm2(tmp_path)
    assert len(conversions) == 1 and target == tmp_path / "SmolLM2-135M-Instruct"
    assert (target / "model.safetensors").read_bytes() == b"converted"
    assert not stale.exists() and young.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".smollm2-")) == [".smollm2-running"]
    assert models.packaged_smollm2(tmp_path) == target and len(conversions) == 1  # found, not converted again


@pytest.mark.parametrize("present", [(), ("config.json",), ("config.json", "model.safetensors")])
def test_a_final_folder_missing_a_file_is_converted_anew_and_replaced(
    tmp_path: Path, conversions: list[Path], present: tuple[str, ...]
) -> None:
    """A cache on a mounted Drive can show the final folder while its files are still syncing from the runtime
    that converted it (or a copy stopped half-way): it is not the model, and it must not block the rename."""
    target = tmp_path / "SmolLM2-135M-Instruct"
    target.mkdir()
    for name in present:
        (target / name).write_bytes(b"half")
    assert models.packaged_smollm2(tmp_path) == target
    assert len(conversions) == 1
    assert {p.name: p.read_bytes() for p in target.iterdir()} == dict.fromkeys(models._CONVERTED_FILES, b"converted")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".smollm2-")] == []


def test_the_notebooks_that_load_the_model_offer_model_cache_on_drive_off_by_default() -> None:
    """worker, sapo_experiments and multi_node_one_gpu load the packaged model: each has the parameter, documented,
    and passes it to node_env; the notebooks that load no model have none."""
    import json

    folder = Path(__file__).resolve().parents[2] / "notebooks"
    for path in sorted(folder.glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        params, text = "".join(cells[0]["source"]), "".join("".join(c["source"]) for c in cells)
        loads = path.name in ("worker.ipynb", "sapo_experiments.ipynb", "multi_node_one_gpu.ipynb")
        assert ('MODEL_CACHE_ON_DRIVE = False  #@param {type:"boolean"}' in params) == loads, path.name
        assert ("model_cache_on_drive=MODEL_CACHE_ON_DRIVE" in text) == loads, path.name
        if loads:
            comment = params.split("MODEL_CACHE_ON_DRIVE =")[0].rsplit("#@param", 1)[1]
            assert "538 MB" in comment and 'STORAGE = "mount" only' in comment, path.name


def test_a_lock_held_elsewhere_past_the_wait_does_not_stop_the_conversion(
    tmp_path: Path, conversions: list[Path], monkeypatch, caplog
) -> None:
    """A lock file on a mounted Drive, held by another process (or left by a runtime that died, where filelock fell
    back to a soft lock): after LOCK_WAIT_SECONDS the conversion goes on without it (the rename keeps it whole)."""
    import subprocess
    import sys

    monkeypatch.setattr(models, "LOCK_WAIT_SECONDS", 0.5)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
            "print('held', flush=True); time.sleep(60)",
            str(tmp_path / ".SmolLM2-135M-Instruct.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level("WARNING", logger=models.__name__):
            target = models.packaged_smollm2(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert len(conversions) == 1 and models._converted(target)
    assert "converting without it" in caplog.text


def test_a_file_system_without_flock_under_filelock_3_does_not_stop_the_conversion(
    tmp_path: Path, conversions: list[Path], monkeypatch
) -> None:
    """filelock 3.x raises NotImplementedError (not an OSError) where flock gives ENOSYS, as a FUSE mount may."""

    class NoFlock:  # filelock 3's UnixFileLock on such a mount, as far as acquire goes
        def __init__(self, path: object) -> None:
            self.path = path

        def acquire(self, timeout: float | None = None) -> None:
            raise NotImplementedError("FileSystem does not appear to support flock; use SoftFileLock instead")

    monkeypatch.setattr(models, "FileLock", NoFlock)
    assert models._converted(models.packaged_smollm2(tmp_path)) and len(conversions) == 1
