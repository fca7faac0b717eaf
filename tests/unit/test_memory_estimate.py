"""The memory estimate (training/memory.py), the hardware guide's fit and speed model (training/hardware.py), and
``swarm-gdrive memory``: parameter counts against transformers, LoRA's against peft, the activation coefficients
against what autograd really keeps on a tiny model, and the estimate's structure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from swarm_gdrive import cli  # noqa: E402
from swarm_gdrive.training import grpo, hardware, memory  # noqa: E402
from swarm_gdrive.training.memory import KNOWN, Architecture, Settings, estimate  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _build(arch: Architecture, meta: bool = False, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    config = AutoConfig.for_model(arch.model_type, **arch.config_dict())
    if meta:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _tiny(model_type: str, **kw: int) -> Architecture:
    dims = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 256}  # fmt: skip
    dims.update(kw)
    return Architecture.from_config({"model_type": model_type, "tie_word_embeddings": True, **dims}, model_type)


TINY = [_tiny("llama"), _tiny("qwen2"), _tiny("qwen3", head_dim=32), _tiny("llama", num_key_value_heads=4)]


@pytest.mark.parametrize("name", list(KNOWN))
def test_the_tables_parameter_counts_are_transformers_own(name: str) -> None:
    arch = KNOWN[name]
    model = _build(arch, meta=True)
    assert arch.parameters() == sum(p.numel() for p in model.parameters())
    assert Architecture.from_config(model.config, name, arch.source) == arch  # config.json -> the same layout


@pytest.mark.parametrize(
    ("name", "billions", "non_embedding"),
    [("Qwen2.5-0.5B", 0.49, 0.36), ("Qwen2.5-1.5B", 1.54, 1.31), ("Qwen2.5-3B", 3.09, 2.77)],
)
def test_qwen_counts_are_their_model_cards(name: str, billions: float, non_embedding: float) -> None:
    """The cards' totals hold only with a tied head: the table's tie_word_embeddings, checked."""
    arch = KNOWN[name]
    assert round(arch.parameters() / 1e9, 2) == billions
    assert round((arch.parameters() - arch.vocab_size * arch.hidden_size) / 1e9, 2) == non_embedding


@pytest.mark.parametrize(
    "model_name",
    ["SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2", "packaged:smollm2-135m-instruct"],
)
def test_model_names_and_the_packaged_model_find_the_table(model_name: str) -> None:
    from swarm_gdrive.training.models import PACKAGED_SMOLLM2

    assert memory.known_architecture(model_name) is KNOWN["SmolLM2-135M"]
    assert all(memory.known_architecture(n) is KNOWN["SmolLM2-135M"] for n in PACKAGED_SMOLLM2)
    assert memory.known_architecture("Qwen/Qwen3-1.7B") is KNOWN["Qwen3-1.7B"]


def test_a_local_folder_is_read_from_its_config_json(tiny_folder: Path, tmp_path: Path) -> None:
    arch = memory.architecture_for(str(tiny_folder))
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert arch.parameters() == sum(p.numel() for p in model.parameters())
    with pytest.raises(memory.UnknownModelError, match="MODEL_NAME='.*': no config.json"):
        memory.architecture_for(str(tmp_path))


@pytest.mark.parametrize("arch", TINY, ids=lambda a: a.name)
@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj", "down_proj"])
def test_lora_trainable_parameters_are_pefts(arch: Architecture, targets: str) -> None:
    from swarm_gdrive.training import adapters

    model = adapters.apply_lora(_build(arch), adapters.LoraSettings(r=8, target_modules=targets))
    trainable, total = model.get_nb_trainable_parameters()
    assert trainable == arch.lora_parameters(8, targets)
    assert total - trainable == arch.parameters()


def test_target_modules_the_architecture_lacks_are_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="LORA_TARGET_MODULES='c_attn'.*q_proj"):
        KNOWN["SmolLM2-135M"].lora_parameters(16, "c_attn")


def _saved_bytes(arch: Architecture, layers: int, dtype: torch.dtype, autocast: bool) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of per_token_logps (parameters excluded)."""
    model = _build(dataclasses.replace(arch, num_hidden_layers=layers), dtype=dtype).train()
    ids = torch.randint(0, arch.vocab_size, (2, 40))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: the attention takes a mask, as in training
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    context = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        grpo.per_token_logps(model, ids, mask, 20, 1.0)
    return sum(seen.values())


@pytest.mark.parametrize("arch", TINY[:3], ids=lambda a: a.name)
@pytest.mark.parametrize(("dtype", "autocast"), [(torch.float32, False), (torch.bfloat16, False)])
def test_activation_coefficients_are_what_autograd_keeps(
    arch: Architecture, dtype: torch.dtype, autocast: bool
) -> None:
    """One more layer adds, per token, what layer_bytes_per_token says plus SDPA's mask copy (2 x 40 tokens)."""
    per_layer = _saved_bytes(arch, 3, dtype, autocast) - _saved_bytes(arch, 2, dtype, autocast)
    width = 4 if dtype == torch.float32 else 2
    predicted = 80 * memory.layer_bytes_per_token(arch, dtype != torch.float32, autocast) + 2 * 40 * 40 * width
    assert predicted == pytest.approx(per_layer, rel=0.15)


BASE = Settings(num_train_samples=4, num_generations=8, max_new_tokens=128, prompt_tokens=128)


def test_peak_is_resident_plus_the_largest_transient_plus_runtime_and_allocator() -> None:
    est = estimate(KNOWN["Qwen2.5-0.5B"], BASE)
    transient = max(est.activations, est.generation, est.optimizer_step)
    assert est.peak == est.weights + est.reference + est.gradients + est.optimizer + transient + est.overhead + (
        est.allocator
    )
    assert est.weights == est.gradients == est.optimizer // 2 == 4 * est.parameters  # fp32 full fine-tune
    assert est.dominant == "training" and est.logits > 0
    assert est.overhead == memory.CPU_PROCESS_BYTES  # glibc keeps a share of what a step frees:
    assert est.allocator == int(memory.CPU_HEAP_SHARE * (est.activations + est.gradients))
    assert estimate(KNOWN["Qwen2.5-0.5B"], dataclasses.replace(BASE, lora_r=16)).allocator == memory.CPU_HEAP_LORA
    gpu = estimate(KNOWN["Qwen2.5-0.5B"], dataclasses.replace(BASE, device_type="cuda"))
    assert gpu.overhead == memory.CUDA_CONTEXT_BYTES and gpu.allocator < 0.1 * gpu.peak
    assert est.fits(est.peak) and not est.fits(est.peak - 1)


def test_one_micro_batch_rebuilds_the_gradients_as_it_frees_activations() -> None:
    """zero_grad(set_to_none=True) frees them first: only gradient accumulation meets all of them in a forward pass."""
    arch = KNOWN["SmolLM2-135M"]
    one = estimate(arch, dataclasses.replace(BASE, num_train_samples=1))  # 8 sequences, micro-batches of 8
    two = estimate(arch, dataclasses.replace(BASE, num_train_samples=2))
    assert not one.accumulates and two.accumulates and one.activations == two.activations
    assert one.training == one.activations - one.gradients and two.training == two.activations


def test_checkpointing_lowers_activations_and_nothing_resident() -> None:
    arch = KNOWN["SmolLM2-360M"]
    plain, ckpt = estimate(arch, BASE), estimate(arch, dataclasses.replace(BASE, gradient_checkpointing=True))
    assert ckpt.activations < plain.activations / 3
    assert ckpt.resident == plain.resident and ckpt.generation == plain.generation


def test_lora_lowers_gradients_and_optimizer_state_and_keeps_them_fp32() -> None:
    arch = KNOWN["Qwen2.5-1.5B"]
    full = estimate(arch, dataclasses.replace(BASE, device_type="cuda", precision="bf16"))
    lora = estimate(
        arch, dataclasses.replace(BASE, device_type="cuda", precision="bf16", weight_dtype="bf16", lora_r=16)
    )
    assert lora.trainable == arch.lora_parameters(16, "all-linear") < full.trainable / 50
    assert lora.gradients == 4 * lora.trainable and lora.optimizer == 8 * lora.trainable
    assert lora.weights == 2 * arch.parameters() + 4 * lora.trainable  # a bf16 base, fp32 adapters
    assert lora.peak < full.peak / 3


def test_beta_adds_a_reference_only_to_a_full_fine_tune() -> None:
    arch = KNOWN["SmolLM2-135M"]
    assert estimate(arch, dataclasses.replace(BASE, beta=0.04)).reference == estimate(arch, BASE).weights
    assert estimate(arch, dataclasses.replace(BASE, beta=0.04, lora_r=8)).reference == 0


def test_bigger_batches_and_longer_completions_need_more() -> None:
    arch = KNOWN["Qwen3-0.6B"]
    est = estimate(arch, BASE)
    assert estimate(arch, dataclasses.replace(BASE, micro_batch_size=16)).activations > est.activations
    assert estimate(arch, dataclasses.replace(BASE, micro_batch_size=2)).activations < est.activations
    assert estimate(arch, dataclasses.replace(BASE, max_new_tokens=256)).peak > est.peak
    assert estimate(arch, dataclasses.replace(BASE, gen_batch_size=8)).generation < est.generation


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("requested", ["auto", "fp32", "bf16"])
def test_auto_dtypes_mirror_the_trainers_rules_on_the_cpu(requested: str, lora: bool) -> None:
    from swarm_gdrive.training.policy import pick_precision, pick_weight_dtype

    cpu = torch.device("cpu")
    weights = memory.auto_weight_dtype(requested, lora, "cpu", native_bf16=False)
    assert weights == pick_weight_dtype(requested, cpu, lora)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[weights]
    assert memory.auto_precision("auto", weights, "cpu", False) == pick_precision("auto", cpu, dtype)


def test_auto_dtypes_on_gpus_follow_the_documented_rule() -> None:
    assert memory.auto_weight_dtype("auto", True, "cuda", native_bf16=False) == "fp16"  # a T4
    assert memory.auto_weight_dtype("auto", True, "cuda", native_bf16=True) == "bf16"
    assert memory.auto_weight_dtype("auto", False, "cuda", native_bf16=True) == "fp32"
    assert memory.auto_precision("auto", "fp16", "cuda", False) == "fp16"
    assert memory.auto_precision("auto", "fp32", "cuda", False) == "fp32"
    assert memory.auto_precision("auto", "fp32", "cuda", True) == "bf16"


def test_a_t4_gets_lora_for_a_model_that_does_not_fit_in_full() -> None:
    arch, t4 = KNOWN["Qwen2.5-1.5B"], hardware.DEVICES["T4"]
    full = dataclasses.replace(BASE, device_type="cuda")
    assert hardware.recommend(arch, full, t4) is None
    fixes = hardware.suggestions(arch, full, t4.memory_bytes)
    assert fixes and all("LORA_R=16" in text and est.fits(t4.memory_bytes) for text, est in fixes)
    settings, est = hardware.recommend(arch, dataclasses.replace(full, lora_r=16, weight_dtype="fp16"), t4)
    assert est.fits(t4.memory_bytes) and settings.lora_r == 16


def test_round_time_is_estimated_for_gpus_only_and_grows_with_the_model() -> None:
    t4, a100 = hardware.DEVICES["T4"], hardware.DEVICES["A100-80GB"]
    assert hardware.round_time(KNOWN["SmolLM2-135M"], BASE, hardware.DEVICES["laptop-16GB"]) is None
    small = hardware.round_time(KNOWN["SmolLM2-135M"], dataclasses.replace(BASE, device_type="cuda"), t4)
    big = hardware.round_time(KNOWN["Qwen2.5-3B"], dataclasses.replace(BASE, device_type="cuda"), t4)
    fast = hardware.round_time(KNOWN["Qwen2.5-3B"], dataclasses.replace(BASE, device_type="cuda"), a100)
    assert 0 < small.total_s < big.total_s and fast.total_s < big.total_s


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment's training settings unset, so that each CLI test sets its own."""
    for var in ("MODEL_NAME", "LORA_R", "MICRO_BATCH_SIZE", "GRADIENT_CHECKPOINTING", "WEIGHT_DTYPE", "PRECISION"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _memory_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["memory", *argv])
    out = capsys.readouterr()
    return int(exit_.value.code), out.out + out.err


def test_the_cli_prints_the_breakdown_and_says_whether_it_fits(
    capsys: pytest.CaptureFixture[str], env: pytest.MonkeyPatch
) -> None:
    code, text = _memory_cli(capsys, "--model", "SmolLM2-135M-Instruct", "--device", "cpu",
                             "--device-memory", "64")  # fmt: skip
    assert code == 0 and "SmolLM2-135M: 134.5M parameters, full fine-tune" in text
    assert "optimizer" in text and "peak" in text and "fits in 64 GiB" in text
    env.setenv("MICRO_BATCH_SIZE", "16")
    code, text = _memory_cli(capsys, "--model", "SmolLM2-135M", "--device", "cpu", "--device-memory", "3")
    assert code == 1 and "does not fit in 3 GiB" in text and "MICRO_BATCH_SIZE=" in text


def test_the_cli_estimates_a_guide_gpu_with_its_round_time(
    capsys: pytest.CaptureFixture[str], env: pytest.MonkeyPatch
) -> None:
    code, text = _memory_cli(capsys, "--model", "Qwen2.5-1.5B-Instruct", "--gpu", "T4")
    assert code == 1 and "does not fit in 15 GiB" in text and "LORA_R=16 WEIGHT_DTYPE=fp16" in text
    env.setenv("LORA_R", "16")
    env.setenv("GRADIENT_CHECKPOINTING", "true")
    code, text = _memory_cli(capsys, "--model", "Qwen2.5-1.5B-Instruct", "--gpu", "T4")
    assert code == 0 and "LoRA r=16" in text and "WEIGHT_DTYPE fp16" in text and "round time (estimate" in text


def test_the_cli_names_the_variable_and_the_fix(
    capsys: pytest.CaptureFixture[str], env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, text = _memory_cli(capsys, "--model", str(tmp_path), "--device", "cpu")
    assert code == 2 and f"MODEL_NAME='{tmp_path}'" in text and "config.json" in text
    env.setenv("MICRO_BATCH_SIZE", "zero")
    code, text = _memory_cli(capsys, "--model", "SmolLM2-135M", "--device", "cpu")
    assert code == 2 and "MICRO_BATCH_SIZE='zero'" in text


def test_an_estimate_is_json_ready() -> None:
    data = memory.as_dict(estimate(KNOWN["Llama-3.2-1B"], BASE))
    assert json.loads(json.dumps(data))["peak"] == data["peak"] > 0 and data["architecture"] == "Llama-3.2-1B"


def test_the_notebooks_memory_check_estimates_a_worker_unless_told(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: pytest.MonkeyPatch
) -> None:
    from swarm_gdrive import notebook

    swarm = {"GDRIVE_PATH": str(tmp_path), "EXPERIMENT_NAME": "one-gpu", "MODEL_NAME": str(tiny_folder)}
    assert notebook.check_memory(2, 0, "cpu", swarm) > 0
    out = capsys.readouterr().out
    assert "one worker of" in out and "peak" in out and "cpu: " in out and "2 workers x" in out
    with pytest.raises(ValueError, match="per_worker_gb"):
        notebook.check_memory(1, 0, "cpu")


def test_the_guide_and_the_bench_render_from_the_estimate() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench import hardware_guide, memory_check

    table = hardware_guide.guide(hardware_guide.SMALL_WORKLOAD)
    assert "| SmolLM2-135M (135M) | yes: mb 8;" in table and "refused (no native bf16)" in table
    measured = {"case": "135m-t64", "settings": memory_check.CASES["135m-t64"], "prompt_tokens": 114,
                "baseline_bytes": 400 * 2**20, "peak_bytes": 6000 * 2**20, "threads": 2,
                "rounds": [{"generate_s": 1.0, "step_s": 2.0}]}  # fmt: skip
    row = memory_check.compare(measured, {})
    live = memory_check.compare(measured, {"MALLOC_MMAP_THRESHOLD_": "65536"})
    allocator = row["estimate"]["allocator"]
    assert row["estimated_above_baseline_bytes"] - live["estimated_above_baseline_bytes"] == allocator > 0
    assert row["round_s"] == 3.0
    assert "| 135m-t64 |" in memory_check.render({"machine": {}, "threads": 2, "rows": [row]})


def test_a_hub_model_out_of_reach_names_a_table_model_of_the_same_name(
    capsys: pytest.CaptureFixture[str], env: pytest.MonkeyPatch
) -> None:
    import transformers

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("no network")

    env.setattr(transformers.AutoConfig, "from_pretrained", offline)
    code, text = _memory_cli(capsys, "--model", "some-org/Qwen3-0.6B-Instruct", "--device", "cpu")
    assert code == 2 and "MODEL_NAME='some-org/Qwen3-0.6B-Instruct'" in text and "--model Qwen3-0.6B" in text
