"""LoRA (peft), gradient checkpointing, WEIGHT_DTYPE and DEVICE=mps on a tiny Llama (issue #18)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from swarm_gdrive.protocol.sapo import ScoredGroup  # noqa: E402
from swarm_gdrive.protocol.workload import StageContext  # noqa: E402
from swarm_gdrive.training import adapters, grpo  # noqa: E402
from swarm_gdrive.training import policy as policy_module  # noqa: E402
from swarm_gdrive.training.models import load_model_and_tokenizer  # noqa: E402
from swarm_gdrive.training.policy import (  # noqa: E402
    DeviceError,
    PolicyTrainer,
    TrainGroup,
    TrainSettings,
    pick_device,
    pick_precision,
    pick_weight_dtype,
)

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
CTX = StageContext("w1", 0, 0, 42)


def workload_for(tmp_path: Path, tiny_folder: Path, **env: str) -> Any:
    from swarm_gdrive.config import from_env
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    (tmp_path / "drive").mkdir(exist_ok=True)
    base = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "lora",
        "MODEL_NAME": str(tiny_folder),
        "TASKS": "basic_arithmetic",
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "NUM_TRAIN_SAMPLES": "3",
        "NUM_GENERATIONS": "4",
        "MAX_NEW_TOKENS": "8",
        "LEARNING_RATE": "1e-2",
        "MAX_GRAD_NORM": "1e9",
        "CHECKPOINT_INTERVAL": "1",
    }
    return GRPOWorkload(from_env({**base, **env}), LocalStorage(base["GDRIVE_PATH"]), "w1", threading.Event())


def scored_groups(workload: Any) -> list[ScoredGroup]:
    """The workload's own groups with varied rewards (so every group has a learning signal)."""
    groups = list(workload.generate(CTX))
    return [
        ScoredGroup("w1", g, tuple(float((i + k) % 2) for i in range(len(g.completions)))) for k, g in enumerate(groups)
    ]


def params(model: Any, lora: bool | None = None) -> dict[str, Any]:
    """Parameters by name, cloned: all, the adapters only (lora=True) or the base only (lora=False)."""
    return {
        name: p.detach().clone() for name, p in model.named_parameters() if lora is None or ("lora_" in name) == lora
    }


# --- LoRA ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["local", "external"])
def test_lora_trains_only_the_adapters_on_local_and_external_rollouts(
    tmp_path: Path, tiny_folder: Path, source: str
) -> None:
    workload = workload_for(tmp_path, tiny_folder, LORA_R="4", LORA_ALPHA="8")
    model = workload.trainer.model
    assert adapters.is_lora(model) and workload.trainer.reference_model is None
    base, lora = params(model, lora=False), params(model, lora=True)
    assert lora and all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    trained = {id(p) for g in workload.trainer.optimizer.param_groups for p in g["params"]}
    assert trained == {id(p) for n, p in model.named_parameters() if "lora_" in n}  # AdamW holds the adapters only

    scored = scored_groups(workload)
    local, external = (scored, []) if source == "local" else ([], scored)
    metrics = workload.train(CTX, local, external)

    assert metrics["train/active_sequences"] > 0
    for name, before in base.items():
        assert torch.equal(before, dict(model.named_parameters())[name].detach()), f"base weight {name} moved"
    after = params(model, lora=True)
    moved_b = [n for n in lora if "lora_B" in n and not torch.equal(lora[n], after[n])]
    assert moved_b == [n for n in lora if "lora_B" in n]  # every adapter learned (B starts at zero)
    state = workload.trainer.optimizer.state
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_lora_checkpoints_hold_the_adapters_alone_and_resume_exactly(tmp_path: Path, tiny_folder: Path) -> None:
    env = {"LORA_R": "4", "LORA_ALPHA": "8", "LORA_TARGET_MODULES": "q_proj,v_proj"}
    first = workload_for(tmp_path, tiny_folder, **env)
    scored = scored_groups(first)
    first.train(CTX, scored, [])
    first.train(CTX, scored, [])
    first.end_round(1, final=False)
    folder = tmp_path / "drive" / first.layout.checkpoint_dir("w1", 1)
    names = {p.name for p in folder.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors"} <= names
    assert "model.safetensors" not in names and "README.md" not in names  # no base weights, nothing unlisted
    saved = json.loads((folder / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(tiny_folder)  # MODEL_NAME as given, never a cache path

    second = workload_for(tmp_path, tiny_folder, **env)
    assert params(second.trainer.model, lora=True).keys() == params(first.trainer.model, lora=True).keys()
    assert second.resume() == 1
    for name, value in params(first.trainer.model).items():
        assert torch.equal(value, params(second.trainer.model)[name]), name
    for a, b in zip(first.trainer.optimizer.state.values(), second.trainer.optimizer.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    # One more identical step on each: a resumed node continues exactly where the saved one was.
    groups = [first._local_group(s) for s in scored]
    second._local_ids = dict(first._local_ids)
    first.trainer.step(groups)
    second.trainer.step([second._local_group(s) for s in scored])
    for name, value in params(first.trainer.model, lora=True).items():
        torch.testing.assert_close(value, params(second.trainer.model, lora=True)[name])


@pytest.mark.parametrize(
    ("now", "message"),
    [
        ({"LORA_R": "8", "LORA_ALPHA": "8"}, "rank 4 and alpha 8.0, but LORA_R=8"),
        (
            {"LORA_R": "4", "LORA_ALPHA": "8", "LORA_TARGET_MODULES": "q_proj"},
            "do not fit LORA_TARGET_MODULES='q_proj'",
        ),
        ({"LORA_R": "0"}, "holds LoRA adapters, but LORA_R=0 now"),
    ],
)
def test_resuming_with_other_lora_settings_stops_naming_the_variables(
    tmp_path: Path, tiny_folder: Path, now: dict[str, str], message: str
) -> None:
    first = workload_for(tmp_path, tiny_folder, LORA_R="4", LORA_ALPHA="8", LORA_TARGET_MODULES="q_proj,v_proj")
    first.train(CTX, scored_groups(first), [])
    first.end_round(0, final=False)
    with pytest.raises(adapters.SettingsMismatchError, match=message):
        workload_for(tmp_path, tiny_folder, **now).resume()


def test_a_full_checkpoint_does_not_resume_into_lora(tmp_path: Path, tiny_folder: Path) -> None:
    first = workload_for(tmp_path, tiny_folder)
    first.train(CTX, scored_groups(first), [])
    first.end_round(0, final=False)
    with pytest.raises(adapters.SettingsMismatchError, match="every weight .a full fine-tune., but LORA_R=4"):
        workload_for(tmp_path, tiny_folder, LORA_R="4").resume()


def test_target_modules_the_model_lacks_are_refused_naming_its_linear_layers(tmp_path: Path, tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="LORA_TARGET_MODULES='c_attn' does not fit this model .*q_proj"):
        workload_for(tmp_path, tiny_folder, LORA_R="4", LORA_TARGET_MODULES="c_attn")


def test_with_beta_lora_takes_its_reference_from_the_base_with_adapters_disabled(
    tmp_path: Path, tiny_folder: Path
) -> None:
    """No second copy; the KL is 0 while the adapters are 0 and grows once they learned. Were the reference the
    adapted model itself, the KL would stay 0; were it a stale copy, the reference log-probs would differ."""
    workload = workload_for(tmp_path, tiny_folder, LORA_R="4", LORA_ALPHA="8", BETA="0.1")
    trainer = workload.trainer
    assert trainer.reference_model is None
    scored = scored_groups(workload)
    assert workload.train(CTX, scored, [])["train/kl"] == pytest.approx(0.0, abs=1e-7)
    assert workload.train(CTX, scored, [])["train/kl"] > 1e-6

    base, _ = load_model_and_tokenizer(str(tiny_folder), CPU, torch.float32)
    batch = trainer._collate(
        [(g.prompt_ids, c, 1.0) for g in map(workload._local_group, scored) for c in g.completion_ids]
    )
    [ref] = trainer._ref_logps([batch])
    with torch.no_grad():
        expected = grpo.per_token_logps(base, batch["input_ids"], batch["attention_mask"], batch["logits_to_keep"])
        adapted = grpo.per_token_logps(
            trainer.model, batch["input_ids"], batch["attention_mask"], batch["logits_to_keep"]
        )
    torch.testing.assert_close(ref, expected)
    assert not torch.allclose(adapted, expected)  # the adapters did change the policy


# --- gradient checkpointing ------------------------------------------------------------------------------------------


def count_mlp_forwards(monkeypatch: pytest.MonkeyPatch, model: Any) -> list[int]:
    """Count the decoder MLPs' forward passes, recomputations included (torch runs no module hooks when it
    recomputes a checkpointed layer, so the class's forward is wrapped)."""
    cls = type(next(m for name, m in model.named_modules() if name.endswith("layers.0.mlp")))
    calls, forward = [0], cls.forward

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", counted)
    return calls


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients(
    tiny_folder: Path, lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = load_model_and_tokenizer(str(tiny_folder), CPU, torch.float32)
    plain, checkpointed = model, copy.deepcopy(model)
    adapters.enable_gradient_checkpointing(checkpointed)
    if lora:
        torch.manual_seed(0)
        plain = adapters.apply_lora(plain, adapters.LoraSettings(4, 8.0))
        torch.manual_seed(0)
        checkpointed = adapters.apply_lora(checkpointed, adapters.LoraSettings(4, 8.0))
        for p in (plain, checkpointed):  # B = 0 at init would give A no gradient: start from a learned adapter
            for name, param in p.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(len(name)))
    settings = TrainSettings(max_new_tokens=8, learning_rate=1e-3, micro_batch_size=2)
    trainers = [PolicyTrainer(m, tokenizer, settings, CPU) for m in (plain, checkpointed)]
    prompt = trainers[0].prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
    groups = [TrainGroup(prompt, [[7, 8, 9], [10, 11], [12, 13, 14, 15], [16]], [1.0, 0.0, 0.5, 0.0])]
    calls = count_mlp_forwards(monkeypatch, model)
    ran = []
    for trainer in trainers:
        calls[0] = 0
        trainer.step(groups)
        ran.append(calls[0])
    # 4 sequences with signal in micro-batches of 2: each micro-batch runs every layer once forward, and with
    # checkpointing once more in the backward pass. Without it, the prompt (shared by the group) and the completions
    # run apart: twice forward, never again.
    passes = 2 * model.config.num_hidden_layers
    assert trainers[0]._share_prompts() and not trainers[1]._share_prompts()
    assert ran == [2 * passes, 2 * passes]
    grads = [{n: p.grad for n, p in t.model.named_parameters() if p.requires_grad} for t in trainers]
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        assert grad is not None and grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5)


# --- WEIGHT_DTYPE ----------------------------------------------------------------------------------------------------


def test_bf16_weights_with_lora_keep_the_adapters_and_their_optimizer_state_in_fp32(
    tmp_path: Path, tiny_folder: Path
) -> None:
    workload = workload_for(tmp_path, tiny_folder, LORA_R="4", WEIGHT_DTYPE="bf16", PRECISION="fp32")
    model = workload.trainer.model
    dtypes = {("lora_" in n, p.dtype) for n, p in model.named_parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    workload.train(CTX, scored_groups(workload), [])
    assert {s["exp_avg"].dtype for s in workload.trainer.optimizer.state.values()} == {torch.float32}
    assert adapters.trainable_summary(model) | {"parameters": 0, "trainable": 0} == {
        "parameters": 0,
        "trainable": 0,
        "weights": "bf16",
        "trained_dtype": "fp32",
        "lora": True,
    }


def test_bf16_weights_of_a_full_fine_tune_train_with_a_bf16_optimizer_state(tmp_path: Path, tiny_folder: Path) -> None:
    workload = workload_for(tmp_path, tiny_folder, WEIGHT_DTYPE="bf16")
    assert {p.dtype for p in workload.trainer.model.parameters()} == {torch.bfloat16}
    workload.train(CTX, scored_groups(workload), [])
    assert {s["exp_avg"].dtype for s in workload.trainer.optimizer.state.values()} == {torch.bfloat16}
    assert workload.trainer.precision == "fp32"  # the CPU has no native bf16 autocast by PRECISION=auto


def test_auto_weights_are_fp32_on_the_cpu_with_or_without_lora(tmp_path: Path, tiny_folder: Path) -> None:
    assert {p.dtype for p in workload_for(tmp_path, tiny_folder, LORA_R="4").trainer.model.parameters()} == {
        torch.float32
    }


def test_fp16_weights_without_lora_are_refused_naming_the_fix(tmp_path: Path, tiny_folder: Path) -> None:
    with pytest.raises(DeviceError, match="WEIGHT_DTYPE=fp16 would train every weight in float16.*LORA_R > 0"):
        workload_for(tmp_path, tiny_folder, WEIGHT_DTYPE="fp16")


def test_fp16_weights_with_lora_autocast_fp16_with_loss_scaling(tmp_path: Path, tiny_folder: Path) -> None:
    workload = workload_for(tmp_path, tiny_folder, LORA_R="4", WEIGHT_DTYPE="fp16")
    assert workload.trainer.precision == "fp16" and workload.trainer.scaler.is_enabled()
    metrics = workload.train(CTX, scored_groups(workload), [])
    assert "train/loss_scale" in metrics


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    def use(name: str, capability: tuple[int, int]) -> torch.device:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return torch.device("cuda:0")

    return use


@pytest.mark.parametrize(
    ("name", "capability", "lora", "expected"),
    [
        ("Tesla T4", (7, 5), True, "fp16"),
        ("NVIDIA L4", (8, 9), True, "bf16"),
        ("NVIDIA A100-SXM4-40GB", (8, 0), True, "bf16"),
        ("Tesla T4", (7, 5), False, "fp32"),
        ("NVIDIA A100-SXM4-40GB", (8, 0), False, "fp32"),
    ],
)
def test_auto_weight_dtype_by_gpu(gpu, name: str, capability: tuple[int, int], lora: bool, expected: str) -> None:
    assert pick_weight_dtype("auto", gpu(name, capability), lora) == expected


def test_bf16_weights_on_a_t4_are_refused_naming_the_gpu(gpu) -> None:
    with pytest.raises(DeviceError, match="WEIGHT_DTYPE=bf16: Tesla T4 has no native bfloat16"):
        pick_weight_dtype("bf16", gpu("Tesla T4", (7, 5)), True)


def test_auto_precision_follows_fp16_weights_on_a_t4(gpu) -> None:
    t4 = gpu("Tesla T4", (7, 5))
    assert pick_precision("auto", t4, torch.float16) == "fp16"
    assert pick_precision("auto", t4, torch.float32) == "fp32"


# --- DEVICE=mps ------------------------------------------------------------------------------------------------------


@pytest.fixture
def apple(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(policy_module, "mps_available", lambda: True)


@pytest.mark.usefixtures("apple")
def test_auto_picks_apple_silicon_where_there_is_no_cuda_and_says_how_missing_operations_run(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    assert pick_device("auto", cpu_only=False) == torch.device("mps")
    assert "an operation Metal lacks runs on the CPU instead" in caplog.text
    caplog.clear()
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "0")
    assert pick_device("mps", cpu_only=False) == torch.device("mps")
    assert "raises NotImplementedError naming it: export PYTORCH_ENABLE_MPS_FALLBACK=1" in caplog.text
    assert pick_device("auto", cpu_only=True) == CPU


def test_mps_where_there_is_none_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "mps_available", lambda: False)
    with pytest.raises(DeviceError, match="DEVICE='mps': Apple silicon's GPU is not available here.*DEVICE=cpu"):
        pick_device("mps", cpu_only=False)


def test_mps_precisions(monkeypatch: pytest.MonkeyPatch) -> None:
    mps = torch.device("mps")
    assert pick_precision("auto", mps) == "fp32"
    assert pick_weight_dtype("auto", mps, lora=True) == "fp32"
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False)
    with pytest.raises(DeviceError, match="PRECISION=bf16 on mps needs macOS 14"):
        pick_precision("bf16", mps)
    assert pick_precision("fp16", mps) == "fp16"


PROBE = (
    "import sys; {before}sys.platform = 'darwin'; import swarm_gdrive, os; "
    "print(os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK'), swarm_gdrive.MPS_FALLBACK_SET_LATE)"
)


@pytest.mark.parametrize(
    ("before", "preset", "expected"),
    [("", None, "1 False"), ("import torch; ", None, "1 True"), ("", "0", "0 False")],
)
def test_importing_the_package_on_macos_turns_the_mps_fallback_on_unless_set(
    before: str, preset: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    if preset is not None:
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = preset
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected


# --- Hub pushes ------------------------------------------------------------------------------------------------------


class RecordingHub:
    """Stands in for huggingface_hub.HfApi (no network here): records what upload_folder would send."""

    uploads: list[dict[str, int]] = []

    def __init__(self, token: str) -> None:
        self.token = token

    def whoami(self) -> dict[str, str]:
        return {"name": "me"}

    def create_repo(self, repo_id: str, private: bool, exist_ok: bool) -> None:
        assert private and exist_ok

    def upload_folder(self, folder_path: str, repo_id: str, commit_message: str) -> None:
        RecordingHub.uploads.append({p.name: p.stat().st_size for p in Path(folder_path).iterdir()})


@pytest.mark.parametrize("lora", [False, True])
def test_a_hub_push_sends_the_adapters_alone_with_lora(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHub)
    monkeypatch.setattr(RecordingHub, "uploads", [])
    env = {"HUGGINGFACE_ACCESS_TOKEN": "hf_secret", "HUB_PUSH_INTERVAL": "1", **({"LORA_R": "4"} if lora else {})}
    workload = workload_for(tmp_path, tiny_folder, **env)
    assert workload.end_round(0, final=False)["hub/pushed"] == 1.0
    (sent,) = RecordingHub.uploads
    if lora:
        assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= sent.keys()
        assert "model.safetensors" not in sent
    else:
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= sent.keys()
        assert "adapter_model.safetensors" not in sent


def test_adapters_name_model_name_as_their_base_not_the_folder_they_were_loaded_from(
    tiny_folder: Path, tmp_path: Path
) -> None:
    model, _ = load_model_and_tokenizer(str(tiny_folder), CPU, torch.float32)
    wrapped = adapters.apply_lora(model, adapters.LoraSettings(4), base_name="SmolLM2-135M-Instruct")
    wrapped.save_pretrained(tmp_path / "out", safe_serialization=True)
    saved = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "SmolLM2-135M-Instruct"
    assert str(tiny_folder) not in (tmp_path / "out" / "README.md").read_text()
