"""MODEL_CACHE_ON_DRIVE end to end: two Colab runtimes, each a fresh process with an empty home folder, share one
mounted My Drive (a local folder standing in for it). The first converts the packaged SmolLM2 into
MyDrive/swarm-gdrive-model-cache; the second finds it there, converts nothing, and loads the same weights.

Each runtime runs what the worker notebook runs: ``notebook.node_env(..., model_cache_on_drive=True)`` for the
environment, then the node's own calls, ``resolve_model(MODEL_NAME, MODEL_CACHE_DIR)`` and
``load_model_and_tokenizer`` (grpo_workload.py). Nothing is stubbed: the first runtime's conversion is the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: One runtime: the notebook's environment, then the node's model resolution and loading; prints a JSON line.
RUNTIME = r"""
import hashlib, json, logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
import torch
from swarm_gdrive import notebook
from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model

drive, shared = sys.argv[1], sys.argv[2]
env = notebook.node_env(
    shared, "cache-test", storage="mount", drive_mount=drive, model_cache_on_drive=True,
    WORKLOAD="grpo", MODEL_NAME="SmolLM2-135M-Instruct", NODE_ID="worker-1", NODE_ROLE="worker",
)
config = notebook.effective_config(env)
start = time.perf_counter()
resolved = resolve_model(config.model_name, config.model_cache_dir)
resolved_s = time.perf_counter() - start
model, tokenizer = load_model_and_tokenizer(resolved.source, torch.device("cpu"), torch.float32)
loaded_s = time.perf_counter() - start
digest = hashlib.sha256()
for name, tensor in sorted(model.state_dict().items()):
    digest.update(name.encode())
    digest.update(tensor.detach().contiguous().numpy().tobytes())
print(json.dumps({
    "model_cache_dir": config.model_cache_dir, "source": resolved.source, "kind": resolved.kind,
    "weights": digest.hexdigest(), "tokens": tokenizer("What is 7 + 5?")["input_ids"],
    "resolve_s": resolved_s, "resolve_and_load_s": loaded_s,
}))
"""


def run_runtime(home: Path, drive: Path, shared: Path) -> tuple[dict, str]:
    """A new runtime: a fresh process whose home folder is ``home`` (empty, as Colab's is)."""
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_CACHE_DIR", "SWARM_LOCAL_DIR")}
    env.update(HOME=str(home), HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="2")
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME, str(drive), str(shared)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def test_a_second_runtime_loads_the_model_the_first_converted_on_drive(tmp_path: Path) -> None:
    drive = tmp_path / "drive"  # the mount point; My Drive is drive/MyDrive, as Colab mounts it
    shared = drive / "MyDrive" / "rl-swarm"
    shared.mkdir(parents=True)
    cache = drive / "MyDrive" / "swarm-gdrive-model-cache"
    converted = cache / "SmolLM2-135M-Instruct"

    first, said = run_runtime(tmp_path / "home-1", drive, shared)
    assert "dequantizing the packaged SmolLM2-135M-Instruct" in said  # the first runtime converts
    assert "model cache: " + str(cache) in said
    assert first["model_cache_dir"] == str(cache) and first["source"] == str(converted)
    assert (converted / "model.safetensors").stat().st_size > 500e6
    assert not (tmp_path / "home-1" / ".cache" / "swarm-gdrive" / "models").exists()  # nothing in the runtime
    assert list(shared.iterdir()) == []  # nothing in the shared folder
    assert [p.name for p in cache.iterdir() if p.name.startswith(".smollm2-")] == []  # no staging left
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [converted, *converted.iterdir()]}

    second, said = run_runtime(tmp_path / "home-2", drive, shared)
    assert "dequantizing" not in said  # found on "Drive": not converted again
    assert second["source"] == first["source"]
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in [converted, *converted.iterdir()]} == before
    assert second["weights"] == first["weights"] and second["tokens"] == first["tokens"]
    assert not (tmp_path / "home-2" / ".cache" / "swarm-gdrive" / "models").exists()
    print(
        f"\nMEASURED first runtime (converts): resolve {first['resolve_s']:.1f} s, resolve + load "
        f"{first['resolve_and_load_s']:.1f} s; second runtime (finds it): resolve {second['resolve_s']:.2f} s, "
        f"resolve + load {second['resolve_and_load_s']:.1f} s (local disk standing in for the Drive mount)"
    )
