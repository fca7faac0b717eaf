"""``swarm_gdrive.training.grpo`` against TRL's own GRPOTrainer on a tiny Llama: same advantages, loss and gradients.

TRL's side is a real ``trl.GRPOTrainer`` (its fused LM head, its ``_compute_loss``); ours is
``per_token_logps`` + ``grpo_loss`` on a deep copy of the same model, taken before TRL patches it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import datasets
import pytest
import torch
import transformers
import trl

from swarm_gdrive.training.grpo import LossConfig, group_advantages, grpo_loss, per_token_logps

pytestmark = pytest.mark.slow

NUM_GENERATIONS = 2
BATCH = 4  # sequences: 2 prompts x 2 generations
MAX_COMPLETION_LENGTH = 8
COMPLETION_LEN = 6  # < MAX_COMPLETION_LENGTH, so dr_grpo's constant differs from the batch's width
METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "kl")


class RecordingReward:
    """A deterministic reward (completion length mod 3) that remembers what it returned, in order."""

    __name__ = "length_mod_3"

    def __init__(self) -> None:
        self.returned: list[float] = []

    def __call__(self, completions: list, **kwargs: object) -> list[float]:
        rewards = [float(len(str(c)) % 3) for c in completions]
        self.returned.extend(rewards)
        return rewards


def make_trainer(folder: Path, output_dir: Path, reward: RecordingReward, **overrides: object):
    """A real GRPOTrainer on CPU, and a deep copy of its model taken before TRL patched the model's forward."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ours = copy.deepcopy(model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    options = {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28, **overrides}
    args = trl.GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=BATCH,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        activation_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        **options,
    )
    dataset = datasets.Dataset.from_dict({"prompt": ["What is 3 + 4?", "Convert 12 to base 2."] * 2})
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which is not run here
    trainer.model.train()
    ours.train()
    for (name, a), b in zip(trainer.model.named_parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b), name
    return trainer, ours


def fixed_batch(pad_id: int, vocab: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded completions of different lengths, as TRL lays them out."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(10, vocab, (BATCH, 5), generator=g)
    prompt_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    completion_ids = torch.randint(10, vocab, (BATCH, COMPLETION_LEN), generator=g)
    completion_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    prompt_ids = prompt_ids.masked_fill(prompt_mask == 0, pad_id)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    rewards = torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": group_advantages(rewards).reshape(-1),
        "num_items_in_batch": completion_mask.sum(),
    }


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


CASES = [
    pytest.param(loss_type, beta, False, {}, id=f"{loss_type}-beta{beta}")
    for loss_type in ("grpo", "dr_grpo", "dapo")
    for beta in (0.0, 0.04)
] + [
    pytest.param("bnpo", 0.04, False, {}, id="bnpo-beta0.04"),
    pytest.param("dapo", 0.04, False, {"use_bias_correction_kl": False}, id="dapo-beta0.04-no-kl-correction"),
    pytest.param("grpo", 0.04, True, {}, id="grpo-beta0.04-clipped"),
    pytest.param("dapo", 0.0, True, {}, id="dapo-clipped"),
    pytest.param("grpo", 0.04, True, {"importance_sampling_level": "sequence"}, id="grpo-beta0.04-sequence-clipped"),
]


@pytest.mark.parametrize(("loss_type", "beta", "off_policy", "extra"), CASES)
def test_loss_and_gradients_match_trl(
    tiny_folder: Path, tmp_path: Path, loss_type: str, beta: float, off_policy: bool, extra: dict
) -> None:
    trainer, ours = make_trainer(
        tiny_folder,
        tmp_path,
        RecordingReward(),
        loss_type=loss_type,
        beta=beta,
        **extra,
    )
    tokenizer = trainer.processing_class
    inputs = fixed_batch(tokenizer.pad_token_id, len(tokenizer))
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    mask = inputs["completion_mask"]

    with torch.no_grad():
        current = per_token_logps(ours, input_ids, attention_mask, COMPLETION_LEN)
    g = torch.Generator().manual_seed(2)
    old = ref = None
    if off_policy:  # a batch reused for a second step (num_iterations > 1): ratios far from 1 on some tokens
        # Rows 0 (A > 0) and 1 (A < 0) are shifted past the clip range, so even the sequence-level ratio clips;
        # rows 2 and 3 only get per-token noise.
        shift = torch.tensor([[-0.5], [0.5], [0.0], [0.0]])
        old = current + (shift + torch.randn(current.shape, generator=g) * 0.3).masked_fill(mask == 0, 0.0)
        inputs["old_per_token_logps"] = old
    if beta > 0:
        ref = current + (torch.randn(current.shape, generator=g) * 0.3).masked_fill(mask == 0, 0.0)
        inputs["ref_per_token_logps"] = ref

    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k in METRICS}

    config = LossConfig(
        loss_type=loss_type,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=beta,
        max_completion_length=MAX_COMPLETION_LENGTH,
        **extra,
    )
    logps = per_token_logps(ours, input_ids, attention_mask, COMPLETION_LEN, temperature=trainer.temperature)
    out = grpo_loss(
        logps,
        inputs["advantages"],
        mask,
        config,
        old_per_token_logps=old,
        ref_per_token_logps=ref,
        num_items_in_batch=int(inputs["num_items_in_batch"]),
    )
    out.loss.backward()

    torch.testing.assert_close(out.loss, trl_loss.detach(), rtol=1e-5, atol=1e-7)
    expected, actual = grads(trainer.model), grads(ours)
    assert expected.keys() == actual.keys() and len(expected) == len(list(ours.parameters()))
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    assert any(grad.abs().sum() > 0 for grad in actual.values())
    for key, value in trl_metrics.items():
        assert out.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert ("kl" in out.metrics) == (beta > 0)
    if off_policy:
        assert out.metrics["clip_ratio/region_mean"] > 0, "the off-policy case must actually clip some tokens"
    else:
        assert out.metrics["clip_ratio/region_mean"] == 0.0


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_match_trl(tiny_folder: Path, tmp_path: Path, scale_rewards: str) -> None:
    reward = RecordingReward()
    trainer, _ = make_trainer(tiny_folder, tmp_path, reward, scale_rewards=scale_rewards, temperature=1.5)
    prompts = [{"prompt": p} for p in ["What is 3 + 4?", "Convert 12 to base 2."] for _ in range(NUM_GENERATIONS)]
    torch.manual_seed(3)
    output = trainer._generate_and_score_completions(prompts)

    rewards = torch.tensor(reward.returned).view(-1, NUM_GENERATIONS)
    assert rewards.shape == (BATCH // NUM_GENERATIONS, NUM_GENERATIONS)
    expected = group_advantages(rewards, scale_rewards).reshape(-1)
    assert expected.abs().sum() > 0, "the sampled groups should not all have equal rewards"
    torch.testing.assert_close(output["advantages"], expected, rtol=1e-6, atol=1e-6)

    # The log-probs TRL would score these completions with, at its sampling temperature.
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    keep = output["completion_ids"].size(1)
    with torch.no_grad():
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, keep)
        ours = per_token_logps(trainer.model, ids, attention, keep, temperature=1.5)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
