"""PolicyTrainer on a tiny Llama: devices, prompts, batched generation and the GRPO update."""

from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from swarm_gdrive.protocol.layout import Layout  # noqa: E402
from swarm_gdrive.protocol.metrics import NodeLog  # noqa: E402
from swarm_gdrive.protocol.records import MetricRecord, decode_lines  # noqa: E402
from swarm_gdrive.storage import LocalStorage  # noqa: E402
from swarm_gdrive.training import grpo  # noqa: E402
from swarm_gdrive.training.decoding import SameDrawSampler, TopKSampler  # noqa: E402
from swarm_gdrive.training.models import load_model_and_tokenizer  # noqa: E402
from swarm_gdrive.training.policy import (  # noqa: E402
    DeviceError,
    PolicyTrainer,
    TrainGroup,
    TrainSettings,
    optimizer_steps,
    pick_device,
    pick_precision,
    ragged_advantages,
    warmup_lr,
)
from swarm_gdrive.training.tiny_model import build_tiny_model  # noqa: E402

CPU = torch.device("cpu")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}]
VARIED_REWARDS = [[1.0, 0.0, 0.25], [0.0, 0.0, 1.0, 1.0], [0.25, 0.75]]  # no reward equals its group's mean


pytestmark = pytest.mark.usefixtures("one_thread")


# --- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tiny_folder: Path) -> tuple[Any, Any]:
    return load_model_and_tokenizer(str(tiny_folder), CPU, torch.float32)


@pytest.fixture
def model(loaded: tuple[Any, Any]) -> Any:
    """A fresh copy of the tiny model for each test (steps change its weights)."""
    return copy.deepcopy(loaded[0])


@pytest.fixture
def tokenizer(loaded: tuple[Any, Any]) -> Any:
    return loaded[1]


def trainer_for(model: Any, tokenizer: Any, reference: Any = None, **settings: Any) -> PolicyTrainer:
    loss = settings.pop("loss", grpo.LossConfig())
    defaults: dict[str, Any] = {"max_new_tokens": 8, "learning_rate": 1e-2, "max_grad_norm": 1e9}
    return PolicyTrainer(model, tokenizer, TrainSettings(**{**defaults, **settings}, loss=loss), CPU, reference)


def make_groups(trainer: PolicyTrainer, rewards: list[list[float]], seed: int = 0) -> list[TrainGroup]:
    """Groups of random completions of different lengths (some ending in eos) with the given rewards."""
    gen = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    eos = trainer.tokenizer.eos_token_id
    groups = []
    for i, group_rewards in enumerate(rewards):
        prompt = trainer.prompt_ids([{"role": "user", "content": f"What is {i} + {2 * i + 1}?"}])
        completions = []
        for j in range(len(group_rewards)):
            length = 2 + (3 * i + j) % 6
            ids = torch.randint(6, vocab, (length,), generator=gen).tolist()
            completions.append(ids + [eos] if j % 2 == 0 else ids)
        groups.append(TrainGroup(prompt, completions, list(group_rewards)))
    return groups


def trainable(model: Any) -> dict[str, Any]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def snapshot(model: Any) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in trainable(model).items()}


def with_eos_bias(model: Any, eos_id: int, bias: float = 1.5) -> Any:
    """Give the LM head a bias towards eos so that sampled completions often stop before max_new_tokens."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[eos_id] = bias
    model.lm_head = head
    return model


# --- ragged_advantages --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_ragged_advantages_equal_group_group_advantages_for_equal_sizes(scale_rewards: str) -> None:
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 3.0], [2.0, 2.0, 2.0, 2.0]]
    expected = grpo.group_advantages(torch.tensor(rewards), scale_rewards).tolist()
    got = ragged_advantages(rewards, scale_rewards)
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=1e-6, abs=1e-7)


RAGGED = [[1.0, 0.0, 0.0, 1.0], [0.0, 3.0], [5.0]]


def test_ragged_advantages_group_scaling_uses_each_groups_own_std() -> None:
    eps = grpo.STD_EPSILON
    s1 = (1 / 3) ** 0.5  # Bessel std of [1, 0, 0, 1]
    s2 = 4.5**0.5  # Bessel std of [0, 3]
    expected = [
        [0.5 / (s1 + eps), -0.5 / (s1 + eps), -0.5 / (s1 + eps), 0.5 / (s1 + eps)],
        [-1.5 / (s2 + eps), 1.5 / (s2 + eps)],
        [0.0],  # a group of one has no spread: advantage 0
    ]
    got = ragged_advantages(RAGGED, "group")
    assert [len(r) for r in got] == [4, 2, 1]
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_ragged_advantages_batch_scaling_uses_group_mean_and_batch_std() -> None:
    flat = [r for row in RAGGED for r in row]
    std = statistics.stdev(flat)  # Bessel-corrected over all 7 rewards
    assert std == pytest.approx(1.902379462, rel=1e-8)  # by hand: mean 10/7, sum of squares 21.714.../6
    expected = [[(r - statistics.mean(row)) / (std + grpo.STD_EPSILON) for r in row] for row in RAGGED]
    got = ragged_advantages(RAGGED, "batch")
    assert [len(r) for r in got] == [4, 2, 1]
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert got[0][0] == pytest.approx(0.5 / (1.902379462 + 1e-4), rel=1e-5)


def test_ragged_advantages_none_scaling_only_subtracts_each_group_mean() -> None:
    got = ragged_advantages(RAGGED, "none")
    assert got == [pytest.approx([0.5, -0.5, -0.5, 0.5]), pytest.approx([-1.5, 1.5]), pytest.approx([0.0])]


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_ragged_advantages_give_an_unscorable_nan_reward_zero_advantage(scale_rewards: str) -> None:
    nan = float("nan")
    got = ragged_advantages([[1.0, nan, 0.0], [1.0, 0.0]], scale_rewards)
    expected = [
        grpo.group_advantages(torch.tensor([r]), scale_rewards)[0].tolist() for r in ([1.0, nan, 0.0], [1.0, 0.0])
    ]
    assert got == [pytest.approx(e) for e in expected]
    assert got[0][1] == 0.0


def test_ragged_batch_advantages_treat_a_nan_reward_like_group_advantages() -> None:
    nan = float("nan")
    rewards = [[1.0, nan, 0.0], [1.0, 0.0]]
    got = ragged_advantages(rewards, "batch")
    finite = [1.0, 0.0, 1.0, 0.0]  # the batch std leaves the NaN out, as _nanstd does
    std = statistics.stdev(finite) + grpo.STD_EPSILON
    assert got == [pytest.approx([0.5 / std, 0.0, -0.5 / std]), pytest.approx([0.5 / std, -0.5 / std])]
    # Same as the equal-size path gives for a NaN reward:
    equal = ragged_advantages([[1.0, nan, 0.0], [1.0, 0.0, 1.0]], "batch")
    assert all(x == x for row in equal for x in row)


def test_ragged_advantages_of_no_groups_is_empty() -> None:
    assert ragged_advantages([], "group") == []
    assert ragged_advantages([], "batch") == []


# --- pick_device --------------------------------------------------------------------------------------------------


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("requested", ["auto", "cuda", "cuda:0", "cpu"])
def test_cpu_only_always_gives_the_cpu(requested: str) -> None:
    assert pick_device(requested, cpu_only=True) == CPU


def test_cpu_gives_the_cpu() -> None:
    assert pick_device("cpu", cpu_only=False) == CPU


@pytest.mark.usefixtures("no_cuda")
def test_auto_without_cuda_gives_the_cpu() -> None:
    assert pick_device("auto", cpu_only=False) == CPU


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize("requested", ["cuda:0", "cuda"])
def test_cuda_without_cuda_raises_naming_device(requested: str) -> None:
    with pytest.raises(DeviceError, match="DEVICE") as info:
        pick_device(requested, cpu_only=False)
    assert repr(requested) in str(info.value)
    assert "CPU_ONLY" in str(info.value) or "DEVICE=cpu" in str(info.value)


# --- precision ----------------------------------------------------------------------------------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend CUDA device 0 is a given GPU: (name, compute capability). Only the questions asked are answered."""

    def be(name: str, capability: tuple[int, int]) -> torch.device:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # a T4 says so
        return torch.device("cuda:0")

    return be


def test_auto_precision_is_fp32_on_the_cpu() -> None:
    assert pick_precision("auto", CPU) == "fp32"


@pytest.mark.parametrize(
    ("name", "capability", "expected"),
    [("Tesla T4", (7, 5), "fp32"), ("Tesla V100", (7, 0), "fp32"), ("A100", (8, 0), "bf16"), ("H200", (9, 0), "bf16")],
)
def test_auto_precision_is_bf16_only_where_the_gpu_runs_it_natively_else_fp32(gpu, name, capability, expected) -> None:
    assert pick_precision("auto", gpu(name, capability)) == expected


def test_bf16_on_a_t4_is_refused_naming_the_gpu_and_the_fix(gpu) -> None:
    with pytest.raises(DeviceError, match="PRECISION=bf16") as info:
        pick_precision("bf16", gpu("Tesla T4", (7, 5)))
    assert "Tesla T4" in str(info.value) and "7.5" in str(info.value) and "fp16" in str(info.value)


@pytest.mark.parametrize("asked", ["bf16", "fp16", "fp32"])
def test_an_explicit_precision_is_kept_where_it_runs(gpu, asked: str) -> None:
    assert pick_precision(asked, gpu("A100", (8, 0))) == asked
    assert pick_precision(asked, CPU) == asked


def test_fp32_takes_no_loss_scale(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer)
    assert trainer.precision == "fp32" and not trainer.scaler.is_enabled()
    assert "train/loss_scale" not in trainer.step(make_groups(trainer, VARIED_REWARDS))


def test_fp16_with_loss_scaling_takes_the_fp32_step(model: Any, tokenizer: Any) -> None:
    """The loss scale is taken out again before clipping and the step: fp16 autocast (on the CPU here) moves the
    weights as fp32 does, to float16's precision, and reports the loss unscaled."""
    reference = copy.deepcopy(model)
    fp32 = trainer_for(reference, tokenizer, learning_rate=1e-3)
    fp16 = trainer_for(model, tokenizer, learning_rate=1e-3, precision="fp16")
    assert fp16.precision == "fp16" and fp16.scaler.is_enabled()
    groups = make_groups(fp32, VARIED_REWARDS)
    before = snapshot(model)
    want, got = fp32.step(groups), fp16.step(groups)
    assert got["train/loss_scale"] == 2.0**16 and got["train/overflow_skipped"] == 0.0
    assert got["train/loss"] == pytest.approx(want["train/loss"], rel=1e-2, abs=1e-3)
    assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=2e-2)
    for name, p in trainable(model).items():  # the gradients the steps took, unscaled: fp32's to fp16 precision
        assert not torch.equal(p.detach(), before[name]), f"{name} did not change"
        wanted = trainable(reference)[name].grad.flatten()
        cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), wanted, dim=0)
        assert cosine > 0.999 and float(p.grad.norm()) == pytest.approx(float(wanted.norm()), rel=1e-2), name


def test_an_fp16_step_whose_gradients_overflow_is_skipped_and_the_scale_halved(
    model: Any, tokenizer: Any, tmp_path: Path
) -> None:
    trainer = trainer_for(model, tokenizer, precision="fp16")
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # float16 gradients overflow at this scale
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = trainer.step(make_groups(trainer, VARIED_REWARDS))
    assert metrics["train/overflow_skipped"] == 1.0 and metrics["train/loss_scale"] == 2.0**99
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing moved
    assert optimizer_steps(trainer.optimizer) == 0  # and the warmup did not advance
    assert metrics["train/loss"] == pytest.approx(
        trainer_for(copy.deepcopy(model), tokenizer).step(make_groups(trainer, VARIED_REWARDS))["train/loss"],
        rel=1e-2,
        abs=1e-3,
    )
    # Its gradient norm is not finite; the node's metrics line takes it as null instead of stopping the worker.
    assert not math.isfinite(metrics["train/grad_norm"])
    log = NodeLog(LocalStorage(tmp_path), Layout("fp16"), "w1")
    log.metric(metrics, round_=0)
    assert log.flush()
    (line,), problems = decode_lines((tmp_path / Layout("fp16").metrics_file("w1")).read_bytes(), MetricRecord)
    assert not problems and line.values["train/grad_norm"] is None and line.values["train/loss_scale"] == 2.0**99


# --- prompts and completions --------------------------------------------------------------------------------------


def test_prompt_ids_use_the_chat_template(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>")
    assert trainer.prompt_ids(MESSAGES) == tokenizer(text, add_special_tokens=False)["input_ids"]
    with_prefix = trainer.prompt_ids(MESSAGES, assistant_prefix="<answer>")
    assert with_prefix == tokenizer(text + "<answer>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(with_prefix) == text + "<answer>"


def test_prompt_ids_fall_back_to_a_plain_template(tmp_path: Path, model: Any) -> None:
    from transformers import AutoTokenizer

    folder = build_tiny_model(tmp_path / "plain", chat_template=False)
    plain = AutoTokenizer.from_pretrained(folder)
    assert not getattr(plain, "chat_template", None)
    trainer = trainer_for(model, plain)
    expected = "System: Be brief.\n\nUser: What is 3 + 4?\n\nAssistant:"
    assert trainer.prompt_ids(MESSAGES) == plain(expected, add_special_tokens=False)["input_ids"]
    assert plain.decode(trainer.prompt_ids(MESSAGES, assistant_prefix=" <answer>")) == expected + " <answer>"


# --- generation ---------------------------------------------------------------------------------------------------


def wrap_generate(monkeypatch: pytest.MonkeyPatch, model: Any) -> list[dict[str, Any]]:
    """Record every ``model.generate`` call: its batch size, arguments and raw output."""
    calls: list[dict[str, Any]] = []
    real = model.generate

    def recording(**kwargs: Any) -> Any:
        out = real(**kwargs)
        calls.append({"batch": kwargs["input_ids"].shape[0], "prompt_len": kwargs["input_ids"].shape[1]} | kwargs)
        calls[-1]["out"] = out
        return out

    monkeypatch.setattr(model, "generate", recording)
    return calls


@pytest.fixture
def eos_model(model: Any, tokenizer: Any) -> Any:
    return with_eos_bias(model, tokenizer.eos_token_id)


def test_generate_batches_prompts_and_returns_i_by_g(
    monkeypatch: pytest.MonkeyPatch, eos_model: Any, tokenizer: Any
) -> None:
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=6)
    prompts = [trainer.prompt_ids([{"role": "user", "content": "x" * (i + 1)}]) for i in range(5)]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    calls = wrap_generate(monkeypatch, eos_model)

    gen = trainer.generate(prompts, num_generations=3, seed=1)

    # 5 prompts x 3 completions, at most 6 sequences (2 prompts) per call: 3 calls of 2, 2 and 1 prompts, each prompt
    # repeated once per completion (its prefill shared through the cache).
    assert [c["batch"] for c in calls] == [6, 6, 3]
    # Every call samples: transformers' own sampling, or on the CPU the processor that draws the same tokens faster.
    samplers = (SameDrawSampler, TopKSampler)
    assert all(c["do_sample"] or isinstance(c["logits_processor"][-1], samplers) for c in calls)
    assert all(c["max_new_tokens"] == 8 for c in calls)
    assert len(gen.token_ids) == len(gen.texts) == 5
    assert all(len(ids) == 3 for ids in gen.token_ids)
    assert all(len(texts) == 3 for texts in gen.texts)
    assert gen.new_tokens == sum(len(c) for group in gen.token_ids for c in group)
    assert gen.seconds >= 0
    # Completion g of prompt p is the g-th row sampled for that prompt, in order, across the calls.
    eos = tokenizer.eos_token_id
    rows = [(row[: c["prompt_len"]], row[c["prompt_len"] :]) for c in calls for row in c["out"].tolist()]
    for p, prompt in enumerate(prompts):
        for g in range(3):
            head, tail = rows[p * 3 + g]
            assert [t for t in head if t != tokenizer.pad_token_id] == prompt
            assert gen.token_ids[p][g] == (tail[: tail.index(eos) + 1] if eos in tail else tail)


def test_generate_trims_each_completion_at_its_first_eos(
    monkeypatch: pytest.MonkeyPatch, eos_model: Any, tokenizer: Any
) -> None:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=64)
    prompts = [trainer.prompt_ids([{"role": "user", "content": f"What is {i} + 1?"}]) for i in range(4)]
    calls = wrap_generate(monkeypatch, eos_model)

    gen = trainer.generate(prompts, num_generations=4, seed=3)

    assert len(calls) == 1
    raw = calls[0]["out"][:, calls[0]["prompt_len"] :].tolist()
    flat = [c for group in gen.token_ids for c in group]
    assert any(c[-1] == eos and len(c) < 8 for c in flat), "the eos bias should make some completions stop early"
    assert any(eos not in c for c in flat), "some completions should run to max_new_tokens"
    padded = [r for r in raw if eos in r and r.index(eos) < len(r) - 1]
    assert padded, "some raw rows should carry padding after their eos"
    for row, completion in zip(raw, flat, strict=True):
        if eos in row:
            cut = row.index(eos) + 1
            assert completion == row[:cut]  # eos kept, everything after dropped
            assert all(t == pad for t in row[cut:])
        else:
            assert completion == row and len(completion) == 8
        assert eos not in completion[:-1]
    for group_ids, group_texts in zip(gen.token_ids, gen.texts, strict=True):
        for ids, text in zip(group_ids, group_texts, strict=True):
            assert text == tokenizer.decode(ids, skip_special_tokens=True)


def test_generate_is_reproducible_for_a_seed(eos_model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=4)
    prompts = [trainer.prompt_ids([{"role": "user", "content": f"What is {i} + 2?"}]) for i in range(3)]
    first = trainer.generate(prompts, num_generations=2, seed=11)
    torch.rand(5)  # the global RNG moved on in between
    second = trainer.generate(prompts, num_generations=2, seed=11)
    other = trainer.generate(prompts, num_generations=2, seed=12)
    assert first.token_ids == second.token_ids
    assert first.texts == second.texts
    assert first.new_tokens == second.new_tokens
    assert other.token_ids != first.token_ids


def reference_generate(trainer: PolicyTrainer, prompts: list[list[int]], g: int, seed: int, **sampling: Any) -> Any:
    """What ``generate`` did before prompts shared their prefill: one transformers ``generate`` call per chunk with
    ``num_return_sequences=G`` (every copy prefilled again), the same seeding and trimming."""
    torch.manual_seed(seed)
    per_call = max(1, trainer.settings.gen_batch_size // g)
    rows = []
    for start in range(0, len(prompts), per_call):
        batch = trainer.tokenizer.pad(
            {"input_ids": prompts[start : start + per_call]}, padding=True, return_tensors="pt"
        )
        with torch.no_grad():
            out = trainer.model.generate(
                **batch, **sampling, max_new_tokens=trainer.settings.max_new_tokens, num_return_sequences=g,
                pad_token_id=trainer.tokenizer.pad_token_id,
            )  # fmt: skip
        rows += [trainer._trim(r) for r in out[:, batch["input_ids"].shape[1] :].tolist()]
    return [rows[p * g : (p + 1) * g] for p in range(len(prompts))]


SYSTEM = {"role": "system", "content": "Answer the question in a few words, then give the answer in tags."}


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("system", [False, True])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_shared_prefill_generates_what_num_return_sequences_generated(
    eos_model: Any, tokenizer: Any, lora: bool, system: bool, temperature: float, top_p: float
) -> None:
    """A prompt's prefill is computed once for its G completions, and a system turn that every prompt shares once
    for all; for a seed the completions are the tokens that G whole prefills gave (ragged prompts, several calls,
    completions that stop early and run to the cap)."""
    from swarm_gdrive.training.adapters import LoraSettings, apply_lora

    model = apply_lora(eos_model, LoraSettings(r=4)) if lora else eos_model
    trainer = trainer_for(model, tokenizer, gen_batch_size=8, max_new_tokens=12, temperature=temperature, top_p=top_p)
    head = [SYSTEM] if system else []
    prompts = [trainer.prompt_ids([*head, {"role": "user", "content": "7 +" * (i + 1)}]) for i in range(5)]
    assert len({len(p) for p in prompts}) == 5
    assert (trainer._layout(prompts[:2])[2] > 8) == system  # the system turn is the shared prefix

    gen = trainer.generate(prompts, num_generations=4, seed=5)

    expected = reference_generate(trainer, prompts, 4, 5, do_sample=True, temperature=temperature, top_p=top_p)
    assert gen.token_ids == expected
    flat = [c for group in expected for c in group]
    assert any(len(c) < 12 for c in flat) and any(len(c) == 12 for c in flat)
    assert len({tuple(c) for c in flat}) > len(prompts)  # sampled: a prompt's completions differ


def test_the_growing_cache_of_a_gpu_generates_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch, eos_model: Any, tokenizer: Any
) -> None:
    """Off the CPU generation continues from transformers' growing cache, not a static one: the same tokens."""
    from swarm_gdrive.training import policy

    monkeypatch.setattr(policy, "STATIC_CACHE_ON_CPU", False)
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=8, max_new_tokens=12, temperature=0.7)
    prompts = [trainer.prompt_ids([SYSTEM, {"role": "user", "content": "2 *" * (i + 1)}]) for i in range(4)]
    gen = trainer.generate(prompts, num_generations=4, seed=9)
    assert gen.token_ids == reference_generate(trainer, prompts, 4, 9, do_sample=True, temperature=0.7, top_p=1.0)


@pytest.mark.parametrize("shared_prompts", [False, True])
def test_the_shared_prefix_cache_holds_each_prompts_own_keys_and_values(
    monkeypatch: pytest.MonkeyPatch, model: Any, tokenizer: Any, shared_prompts: bool
) -> None:
    """The cache that generation continues from (the system turn computed once, padding between it and each prompt's
    rest, every row continuing its prompt G times: G copies, or the prompt held once) holds, at each prompt's real
    tokens, the keys and values of that prompt run alone through the model."""
    from swarm_gdrive.training import decoding, policy

    monkeypatch.setattr(policy, "SHARED_PROMPT_CACHE_ON_CPU", shared_prompts)
    trainer = trainer_for(model, tokenizer)
    prompts = [trainer.prompt_ids([SYSTEM, {"role": "user", "content": "5 *" * (i + 2)}]) for i in range(3)]
    ids, mask, shared = trainer._layout(prompts)
    assert shared > 8 and (mask[:, shared] == 0).any()  # padding sits after the shared prefix
    cache, shares = trainer._prefill(ids, mask, shared, 2, ids.shape[1] + 4)
    assert decoding.shared_prefix_supported(model) and shares == shared_prompts
    if shares:  # the system turn once for all rows, each prompt's rest once for its copies
        expected = [(1, shared), (len(prompts), ids.shape[1] - shared)]
        assert all([(k.shape[0], k.shape[2]) for k, _ in layer.parts] == expected for layer in cache.layers)
    layers = [layer.materialized() if shares else (layer.keys, layer.values) for layer in cache.layers]
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            alone = trainer.model(input_ids=torch.tensor([prompt]), use_cache=True)
            alone_cache = getattr(alone, "cache", None) or alone.past_key_values
            real = mask[row].nonzero().squeeze(1)
            for (keys, values), expected in zip(layers, alone_cache.layers, strict=True):
                for copy_ in (2 * row, 2 * row + 1):
                    torch.testing.assert_close(keys[copy_][:, real], expected.keys[0], atol=1e-5, rtol=1e-4)
                    torch.testing.assert_close(values[copy_][:, real], expected.values[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("greedy", [False, True])
def test_cpu_generation_attends_to_each_prompt_once_and_generates_what_g_copies_generate(
    monkeypatch: pytest.MonkeyPatch, eos_model: Any, tokenizer: Any, greedy: bool
) -> None:
    """Every decoding step of a CPU generation attends through the shared-prefix attention (one-token queries over
    each prompt's keys held once), the model's attention setting is SDPA again after the call, and the completions
    are those of the cache holding G copies and of the reference generate."""
    from swarm_gdrive.training import decoding, policy

    assert decoding.shared_prefix_supported(eos_model)
    queries: list[int] = []
    attend = decoding._shared_prefix_attention
    monkeypatch.setattr(
        decoding, "_shared_prefix_attention", lambda m, q, *a, **k: queries.append(q.shape[2]) or attend(m, q, *a, **k)
    )
    decoding._register_attention.cache_clear()  # registers the counting wrapper
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=8, max_new_tokens=12, temperature=0.8, top_p=0.9)
    prompts = [trainer.prompt_ids([SYSTEM, {"role": "user", "content": "3 -" * (i + 1)}]) for i in range(5)]
    g = 1 if greedy else 4
    try:
        gen = trainer.generate(prompts, g, seed=2, greedy=greedy)
    finally:
        decoding._register_attention.cache_clear()
    layers = eos_model.config.num_hidden_layers
    assert queries and set(queries) == {1} and len(queries) % layers == 0
    assert eos_model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(policy, "SHARED_PROMPT_CACHE_ON_CPU", False)
    assert trainer.generate(prompts, g, seed=2, greedy=greedy).token_ids == gen.token_ids
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 0.8, "top_p": 0.9}
    alone = trainer_for(eos_model, tokenizer, gen_batch_size=1, max_new_tokens=12) if greedy else trainer
    assert gen.token_ids == reference_generate(alone, prompts, g, 2, **sampling)
    flat = [c for group in gen.token_ids for c in group]
    assert any(len(c) < 12 for c in flat) and (greedy or any(len(c) == 12 for c in flat))  # rows stop at eos early


def test_cpu_generation_decodes_through_packed_linears_and_samples_what_generate_samples(
    model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fp32 linear layer of the model packed once for the call's rows (prefills stay nn.Linear), and the
    completions those of the reference generate."""
    from swarm_gdrive.training import decoding

    if not decoding.packing_available():
        pytest.skip("this torch has no oneDNN packed linear")
    packed: list[tuple[Any, int]] = []
    pack = decoding._packed_forward
    monkeypatch.setattr(
        decoding, "_packed_forward", lambda layer, rows: packed.append((layer, rows)) or pack(layer, rows)
    )
    trainer = trainer_for(model, tokenizer, gen_batch_size=6, max_new_tokens=6, temperature=0.7, top_p=1.0)
    prompts = [trainer.prompt_ids([{"role": "user", "content": f"What is {i} + 3?"}]) for i in range(3)]
    got = trainer.generate(prompts, 2, seed=4).token_ids
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert sorted(map(id, (layer for layer, _ in packed))) == sorted(map(id, linears)) and {r for _, r in packed} == {6}
    assert all("forward" not in vars(m) for m in linears)
    assert got == reference_generate(trainer, prompts, 2, 4, do_sample=True, temperature=0.7, top_p=1.0)


def test_sampled_cpu_generation_draws_ahead_and_leaves_the_generator_where_generate_does(
    eos_model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step's uniforms come drawn ahead on the helper thread, in every call of a generation (several calls,
    completions that end early); the tokens and the generator's state after are the reference generate's."""
    from swarm_gdrive.training import decoding

    taken: list[bool] = []
    draw = decoding._Prefetch.draw
    monkeypatch.setattr(
        decoding._Prefetch, "draw", lambda self, shape: taken.append(self.pending is not None) or draw(self, shape)
    )
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=4, max_new_tokens=9, temperature=0.8, top_p=1.0)
    prompts = [trainer.prompt_ids([SYSTEM, {"role": "user", "content": "5 *" * (i + 1)}]) for i in range(5)]
    got, after = trainer.generate(prompts, 2, seed=6).token_ids, torch.rand(4)
    expected = reference_generate(trainer, prompts, 2, 6, do_sample=True, temperature=0.8, top_p=1.0)
    assert got == expected
    assert torch.equal(after, torch.rand(4))  # drawn after the reference generate
    # 3 calls: the first step of each drawn then, the rest ahead
    assert taken.count(False) == 3 and taken.count(True) > 3
    assert any(len(c) < 9 for group in got for c in group)


@pytest.mark.parametrize("system", [False, True])
def test_greedy_single_completions_are_unchanged(eos_model: Any, tokenizer: Any, system: bool) -> None:
    trainer = trainer_for(eos_model, tokenizer, gen_batch_size=2, max_new_tokens=10)
    head = [SYSTEM] if system else []
    prompts = [trainer.prompt_ids([*head, {"role": "user", "content": "9 -" * (i + 1)}]) for i in range(3)]
    greedy = trainer.generate(prompts, 1, seed=0, greedy=True).token_ids
    assert greedy == reference_generate(trainer, prompts, 1, 0, do_sample=False)


def test_greedy_prompts_are_batched_shortest_first_and_returned_in_their_order(
    monkeypatch: pytest.MonkeyPatch, model: Any, tokenizer: Any
) -> None:
    """A held-out evaluation mixes tasks whose prompts differ several-fold in length, and a call pads every prompt to
    its longest: greedy prompts go to the calls shortest first, and each completion comes back at its prompt's place,
    the one that prompt gets alone."""
    trainer = trainer_for(model, tokenizer, gen_batch_size=2, max_new_tokens=10)
    sizes = [6, 1, 5, 2, 4, 3]
    prompts = [trainer.prompt_ids([SYSTEM, {"role": "user", "content": "8 +" * n}]) for n in sizes]
    calls = wrap_generate(monkeypatch, model)

    gen = trainer.generate(prompts, 1, seed=0, greedy=True)

    # Each call's prompts, by length (its own pads removed): the two shortest, then the next two, then the longest.
    lengths = sorted(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    widths = [sorted(sum(t != pad for t in row[: c["prompt_len"]]) for row in c["input_ids"].tolist()) for c in calls]
    assert widths == [lengths[0:2], lengths[2:4], lengths[4:6]]
    alone = trainer_for(model, tokenizer, gen_batch_size=1, max_new_tokens=10)
    assert gen.token_ids == reference_generate(alone, prompts, 1, 0, do_sample=False)
    assert gen.texts == [[tokenizer.decode(ids[0], skip_special_tokens=True)] for ids in gen.token_ids]
    assert len({tuple(ids[0]) for ids in gen.token_ids}) > 1  # the completions differ: their order is checked


# --- the update ---------------------------------------------------------------------------------------------------


def test_step_with_reward_signal_changes_every_trainable_parameter(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer)
    before = snapshot(model)
    metrics = trainer.step(make_groups(trainer, VARIED_REWARDS))
    for name, p in trainable(model).items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} got no gradient"
        assert not torch.equal(p.detach(), before[name]), f"{name} did not change"
    for key in ("train/loss", "train/grad_norm", "train/tokens_per_s", "train/peak_memory_mb", "train/step_s"):
        assert key in metrics, key
    assert metrics["train/grad_norm"] > 0
    assert metrics["train/tokens_per_s"] > 0
    assert metrics["train/peak_memory_mb"] > 0
    assert metrics["train/sequences"] == 9.0
    assert metrics["train/active_sequences"] == 9.0
    assert "train/skipped_no_signal" not in metrics


def test_step_without_reward_signal_changes_nothing(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = trainer.step(make_groups(trainer, [[1.0, 1.0, 1.0], [0.0, 0.0], [0.5, 0.5, 0.5, 0.5]]))
    assert metrics["train/skipped_no_signal"] == 1.0
    assert metrics["train/sequences"] == 9.0
    assert metrics["train/active_sequences"] == 0.0
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not trainer.optimizer.state  # no optimizer step was taken


def test_step_counts_only_sequences_with_signal_as_active(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer)
    metrics = trainer.step(make_groups(trainer, [[1.0, 0.0, 1.0], [0.5, 0.5]]))
    assert metrics["train/sequences"] == 5.0
    assert metrics["train/active_sequences"] == 3.0


LOSSES = {
    "grpo": grpo.LossConfig(loss_type="grpo"),
    "dapo": grpo.LossConfig(loss_type="dapo"),
    "bnpo": grpo.LossConfig(loss_type="bnpo"),
    "dr_grpo": grpo.LossConfig(loss_type="dr_grpo", max_completion_length=8),
}


def reference_gradients(model: Any, pad: int, groups: list[TrainGroup], loss: grpo.LossConfig) -> dict[str, Any]:
    """The gradient of the GRPO loss over all sequences at once (zero-advantage ones included), built by hand."""
    advantages = grpo.group_advantages(torch.tensor([g.rewards for g in groups]), "group").reshape(-1)
    seqs = [(g.prompt_ids, c) for g in groups for c in g.completion_ids]
    p_len, c_len = max(len(p) for p, _ in seqs), max(len(c) for _, c in seqs)
    ids = [[pad] * (p_len - len(p)) + p + c + [pad] * (c_len - len(c)) for p, c in seqs]
    attention = [[0] * (p_len - len(p)) + [1] * (len(p) + len(c)) + [0] * (c_len - len(c)) for p, c in seqs]
    mask = torch.tensor([[1] * len(c) + [0] * (c_len - len(c)) for _, c in seqs])
    model.zero_grad(set_to_none=True)
    logps = grpo.per_token_logps(model, torch.tensor(ids), torch.tensor(attention), c_len)
    grpo.grpo_loss(logps, advantages, mask, loss, num_items_in_batch=int(mask.sum())).loss.backward()
    grads = {name: p.grad.clone() for name, p in trainable(model).items()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_type", list(LOSSES))
def test_micro_batching_gives_the_full_batch_gradient(model: Any, tokenizer: Any, loss_type: str) -> None:
    # Rewards with an all-equal group, so that inactive sequences still count in the weights.
    rewards = [*VARIED_REWARDS, [1.0, 1.0]]
    results = {}
    for micro in (1, 4, 64):
        copy_ = copy.deepcopy(model)
        trainer = trainer_for(copy_, tokenizer, micro_batch_size=micro, learning_rate=1e-4, loss=LOSSES[loss_type])
        metrics = trainer.step(make_groups(trainer, rewards))
        grads = {name: p.grad.clone() for name, p in trainable(copy_).items()}
        results[micro] = (metrics, grads, snapshot(copy_))
    full_metrics, full_grads, full_params = results[64]
    # Same-size groups here, so that one [B, G] batch through grpo alone gives the expected gradient.
    equal = [[1.0, 0.0, 0.25], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    trainer = trainer_for(copy.deepcopy(model), tokenizer, micro_batch_size=2, loss=LOSSES[loss_type])
    groups = make_groups(trainer, equal)
    expected = reference_gradients(copy.deepcopy(model), tokenizer.pad_token_id, groups, LOSSES[loss_type])
    trainer.step(groups)
    for name, p in trainable(trainer.model).items():
        scale = expected[name].abs().max().item()
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5 * scale, msg=name)
    for micro in (1, 4):
        metrics, grads, params = results[micro]
        assert metrics["train/loss"] == pytest.approx(full_metrics["train/loss"], rel=1e-4, abs=1e-7)
        assert metrics["train/grad_norm"] == pytest.approx(full_metrics["train/grad_norm"], rel=1e-4)
        for name in full_grads:
            scale = full_grads[name].abs().max().item()
            torch.testing.assert_close(grads[name], full_grads[name], rtol=1e-4, atol=1e-5 * scale, msg=name)
            torch.testing.assert_close(params[name], full_params[name], rtol=0, atol=2e-4 + 1e-6, msg=name)


def test_two_iterations_take_two_steps_and_report_clipping(model: Any, tokenizer: Any) -> None:
    one = trainer_for(copy.deepcopy(model), tokenizer, num_iterations=1, learning_rate=3e-2)
    two = trainer_for(model, tokenizer, num_iterations=2, learning_rate=3e-2)
    m1 = one.step(make_groups(one, VARIED_REWARDS))
    m2 = two.step(make_groups(two, VARIED_REWARDS))
    keys = [f"train/clip_ratio_{k}" for k in ("low_mean", "high_mean", "region_mean", "low_min", "high_max")]
    for key in keys:
        assert key in m2, key
    assert m1["train/clip_ratio_region_mean"] == 0.0  # on-policy: the ratio is 1, nothing is clipped
    assert m2["train/clip_ratio_region_mean"] > 0.0  # the second pass sees the first step's change
    steps = {float(s["step"]) for s in two.optimizer.state.values()}
    assert steps == {2.0}


def test_beta_without_reference_model_is_refused(model: Any, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="reference"):
        trainer_for(model, tokenizer, loss=grpo.LossConfig(beta=0.1))


def test_beta_with_reference_model_reports_kl(model: Any, tokenizer: Any) -> None:
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    trainer = trainer_for(model, tokenizer, reference, loss=grpo.LossConfig(beta=0.1))
    before = snapshot(model)
    # All-equal rewards: only the KL term gives a gradient, so every sequence stays active.
    metrics = trainer.step(make_groups(trainer, [[1.0, 1.0, 1.0], [0.0, 0.0]]))
    assert "train/skipped_no_signal" not in metrics
    assert metrics["train/active_sequences"] == 5.0
    assert metrics["train/kl"] > 0.0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainable(model).items())


def test_kl_to_an_identical_reference_is_zero(model: Any, tokenizer: Any) -> None:
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    trainer = trainer_for(model, tokenizer, reference, loss=grpo.LossConfig(beta=0.1))
    metrics = trainer.step(make_groups(trainer, VARIED_REWARDS))
    assert metrics["train/kl"] == pytest.approx(0.0, abs=1e-6)


# --- checkpoint cadence -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", ["100", "0", None])
def test_a_checkpoint_is_due_after_checkpoint_minutes_whatever_the_round_interval(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch, interval: str | None
) -> None:
    """CHECKPOINT_MINUTES bounds what a disconnected runtime loses even when CHECKPOINT_INTERVAL is far off; with
    CHECKPOINT_INTERVAL 0 (the default) only the clock makes one due, however many rounds pass."""
    import threading

    from swarm_gdrive.config import from_env
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training import grpo_workload

    (tmp_path / "drive").mkdir()
    env = {
        "GDRIVE_PATH": str(tmp_path / "drive"),
        "EXPERIMENT_NAME": "cadence",
        "MODEL_NAME": str(tiny_folder),
        "TASKS": "basic_arithmetic",
        "DEVICE": "cpu",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "MODEL_CACHE_DIR": str(tmp_path / "models"),
        "CHECKPOINT_MINUTES": "5",
        "KEEP_CHECKPOINTS": "2",  # both checkpoints stay, so the listing shows when each was written
    } | ({"CHECKPOINT_INTERVAL": interval} if interval is not None else {})
    now = [1000.0]
    monkeypatch.setattr(grpo_workload.time, "monotonic", lambda: now[0])
    workload = grpo_workload.GRPOWorkload(from_env(env), LocalStorage(env["GDRIVE_PATH"]), "w1", threading.Event())
    saved = (tmp_path / "drive" / Layout("cadence").checkpoint_dir("w1", 0)).parent

    def rounds_saved() -> list[str]:
        return sorted(p.name for p in saved.glob("round_*")) if saved.exists() else []

    now[0] += 4 * 60
    workload.end_round(0, final=False)
    assert rounds_saved() == []  # 4 minutes: neither interval nor minutes due
    now[0] += 61
    assert "checkpoint/seconds" in workload.end_round(1, final=False)
    assert rounds_saved() == ["round_1"]  # 5 minutes since the model was loaded
    now[0] += 60
    workload.end_round(2, final=False)
    assert rounds_saved() == ["round_1"]  # the clock restarted at the last checkpoint
    now[0] += 4 * 60
    workload.end_round(3, final=False)
    assert rounds_saved() == ["round_1", "round_3"]
    for round_ in range(4, 40):  # many fast rounds: none due before the clock's 5 minutes
        workload.end_round(round_, final=False)
    assert rounds_saved() == ["round_1", "round_3"]  # the old default of 10 rounds would have saved round_9, ...


# --- learning-rate warmup and weight decay (WARMUP_STEPS, WEIGHT_DECAY) ---------------------------------------------


def test_warmup_lr_ramps_linearly_then_stays_constant() -> None:
    assert [warmup_lr(1.0, 4, k) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lr(3e-6, 0, 0) == 3e-6  # off
    assert warmup_lr(3e-6, 1, 0) == 3e-6


def test_warmup_ramps_the_rate_of_each_optimizer_step(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer, learning_rate=1e-3, warmup_steps=3)
    groups = make_groups(trainer, VARIED_REWARDS)
    rates = [trainer.step(groups)["train/lr"] for _ in range(4)]
    assert rates == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
    assert optimizer_steps(trainer.optimizer) == 4
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_a_step_without_signal_does_not_advance_the_warmup(model: Any, tokenizer: Any) -> None:
    trainer = trainer_for(model, tokenizer, learning_rate=1e-3, warmup_steps=2)
    trainer.step(make_groups(trainer, [[1.0, 1.0], [0.0, 0.0]]))  # no reward variance: no optimizer step
    assert optimizer_steps(trainer.optimizer) == 0
    assert trainer.step(make_groups(trainer, VARIED_REWARDS))["train/lr"] == pytest.approx(5e-4)


def test_weight_decay_is_decoupled_and_honoured(model: Any, tokenizer: Any) -> None:
    """AdamW: p <- p (1 - lr wd) - lr * adam(g); so the same step with and without decay differs by lr wd p."""
    lr, wd = 1e-2, 0.5
    before = snapshot(model)
    plain, decayed = copy.deepcopy(model), copy.deepcopy(model)
    a = trainer_for(plain, tokenizer, learning_rate=lr, weight_decay=0.0)
    b = trainer_for(decayed, tokenizer, learning_rate=lr, weight_decay=wd)
    assert a.optimizer.param_groups[0]["weight_decay"] == 0.0
    assert b.optimizer.param_groups[0]["weight_decay"] == wd
    a.step(make_groups(a, VARIED_REWARDS))
    b.step(make_groups(b, VARIED_REWARDS))
    for (name, p0), p1 in zip(trainable(plain).items(), trainable(decayed).values(), strict=True):
        torch.testing.assert_close(p1.detach() - p0.detach(), -lr * wd * before[name], atol=1e-6, rtol=1e-4)


def test_a_restored_optimizer_resumes_the_warmup(tmp_path: Path, model: Any, tokenizer: Any) -> None:
    """The schedule is a function of AdamW's saved step count: a checkpoint's optimizer files carry it."""
    import json
    import random

    from safetensors.torch import save_file

    from swarm_gdrive.training import checkpoint

    trainer = trainer_for(model, tokenizer, learning_rate=1e-3, warmup_steps=4)
    groups = make_groups(trainer, VARIED_REWARDS)
    trainer.step(groups)
    trainer.step(groups)
    tensors, meta = checkpoint.optimizer_to_files(trainer.optimizer)
    save_file(tensors, str(tmp_path / checkpoint.OPTIMIZER_FILE))
    version, state, gauss = random.getstate()
    meta.update({"round": 2, "python_rng": [version, list(state), gauss]})
    (tmp_path / checkpoint.STATE_FILE).write_text(json.dumps(meta))

    resumed = trainer_for(copy.deepcopy(model), tokenizer, learning_rate=1e-3, warmup_steps=4)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)  # a fresh trainer starts the ramp
    assert checkpoint.restore_training_state(tmp_path, resumed.optimizer) == 2
    assert optimizer_steps(resumed.optimizer) == 2
    assert [resumed.step(groups)["train/lr"] for _ in range(3)] == pytest.approx([7.5e-4, 1e-3, 1e-3])


# --- shared prompts in the update ----------------------------------------------------------------------------------


@pytest.mark.parametrize("system", [False, True])
def test_shared_prompt_logps_equal_the_whole_sequences_logps_and_gradients(
    model: Any, tokenizer: Any, system: bool
) -> None:
    """Each distinct prompt run once (and with a system turn, the prefix they share once for all), its cache
    gathered to its completions: the same log-probs and gradients as the prompt + completion sequences laid out
    whole (ragged prompts, ragged completions, a one-token one)."""
    trainer = trainer_for(model, tokenizer, temperature=0.7)
    groups = make_groups(trainer, [[1.0, 0.0, 0.5], [0.0, 1.0], [0.2, 0.9, 0.1, 0.4]], seed=4)
    groups[1].completion_ids[0] = groups[1].completion_ids[0][:1]
    if system:
        for i, group in enumerate(groups):
            group.prompt_ids[:] = trainer.prompt_ids([SYSTEM, {"role": "user", "content": "what is" + " 1 +" * i}])
    seqs = [(g.prompt_ids, c, 1.0) for g in groups for c in g.completion_ids]
    assert len({len(p) for p, _, _ in seqs}) > 1  # left padding is exercised
    whole, shared = trainer._collate(seqs), trainer._collate(seqs, shared=True)
    assert shared["prompt_ids"].shape[0] == 3 and shared["owner"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert (shared["shared_prefix"] > 8) == system

    grads = []
    for batch in (whole, shared):
        model.zero_grad(set_to_none=True)
        logps = trainer._batch_logps(model, batch)
        (logps * torch.linspace(-1, 1, logps.numel()).view_as(logps)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if batch is whole:
            expected = logps.detach()
    torch.testing.assert_close(logps.detach(), expected, atol=1e-5, rtol=1e-5)
    assert (expected != 0).sum() == shared["completion_mask"].sum()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_an_update_with_shared_prompts_takes_the_gradients_of_whole_sequences(
    model: Any, tokenizer: Any, beta: float
) -> None:
    """Two iterations (so the old policy's log-probs count), the KL term when beta > 0, micro-batches that split a
    group: the gradients and the loss's metrics equal those of the whole-sequence layout. (The learning rate is
    tiny so that the second iteration starts from the same weights: Adam's first steps are about lr * sign(grad),
    which turns rounding in a near-zero gradient into a full step.)"""
    loss = grpo.LossConfig(beta=beta)
    results = []
    for shared in (False, True):
        net = copy.deepcopy(model)
        reference = copy.deepcopy(model) if beta > 0 else None
        if reference is not None:  # a reference apart from the policy, so that the KL term is not 0
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for param in reference.parameters():
                    param.add_(torch.randn(param.shape, generator=gen) * 0.01)
        trainer = trainer_for(
            net, tokenizer, reference, loss=loss, micro_batch_size=3, num_iterations=2, learning_rate=1e-9
        )
        trainer._share_prompts = lambda shared=shared: shared  # type: ignore[method-assign]
        metrics = trainer.step(make_groups(trainer, VARIED_REWARDS, seed=2))
        results.append(({n: p.grad.clone() for n, p in net.named_parameters()}, metrics))
    (whole, whole_metrics), (shared_grads, shared_metrics) = results
    for name, grad in whole.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert shared_metrics.keys() == whole_metrics.keys()
    # The loss and the gradient's norm are sums over micro-batches; the other metrics are means of per-micro-batch
    # means, which depend on how the sequences were cut into micro-batches (the layouts order them differently).
    for key in ("train/loss", "train/grad_norm"):
        assert shared_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-4, abs=1e-6), key  # the loss is ~0
    if beta > 0:
        assert whole_metrics["train/kl"] > 0 and shared_metrics["train/kl"] > 0
