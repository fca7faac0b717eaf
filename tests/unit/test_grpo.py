"""GRPO math against hand computations: advantages, log-probs, loss per loss_type, clipping, KL, accumulation."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from swarm_gdrive.training.grpo import (  # noqa: E402
    LOSS_TYPES,
    STD_EPSILON,
    LossConfig,
    accumulation_weight,
    group_advantages,
    grpo_loss,
    per_token_logps,
)

# --- advantages -------------------------------------------------------------------------------------------------

REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 3.0]]


def test_group_scaling_divides_by_each_groups_sample_std() -> None:
    advantages = group_advantages(torch.tensor(REWARDS), "group")
    for row, got in zip(REWARDS, advantages.tolist(), strict=True):
        mean, std = statistics.mean(row), statistics.stdev(row)  # stdev: Bessel-corrected, like TRL's nanstd
        assert got == pytest.approx([(r - mean) / (std + STD_EPSILON) for r in row], rel=1e-6)


def test_batch_scaling_keeps_group_baseline_but_divides_by_batch_std() -> None:
    advantages = group_advantages(torch.tensor(REWARDS), "batch")
    std = statistics.stdev([r for row in REWARDS for r in row])
    for row, got in zip(REWARDS, advantages.tolist(), strict=True):
        mean = statistics.mean(row)
        assert got == pytest.approx([(r - mean) / (std + STD_EPSILON) for r in row], rel=1e-6)


def test_none_scaling_only_subtracts_the_group_mean() -> None:
    advantages = group_advantages(torch.tensor(REWARDS), "none")
    assert advantages.reshape(-1).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -0.875, -0.875, -0.375, 2.125])


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_zero_variance_group_gets_zero_advantages(scale_rewards: str) -> None:
    advantages = group_advantages(torch.tensor([[0.7, 0.7, 0.7], [0.0, 1.0, 0.0]]), scale_rewards)
    assert advantages[0].tolist() == [0.0, 0.0, 0.0]
    assert advantages[1].abs().sum() > 0


def test_nan_reward_is_left_out_of_the_baseline_and_gets_zero() -> None:
    advantages = group_advantages(torch.tensor([[1.0, float("nan"), 0.0, 2.0]]), "group")
    std = statistics.stdev([1.0, 0.0, 2.0])  # the baseline is mean(1, 0, 2) = 1
    assert advantages[0].tolist() == pytest.approx([0.0, 0.0, -1 / (std + STD_EPSILON), 1 / (std + STD_EPSILON)])


def test_single_generation_and_integer_rewards() -> None:
    assert group_advantages(torch.tensor([[3], [5]]), "group").tolist() == [[0.0], [0.0]]
    assert group_advantages(torch.tensor([[1, 0]]), "none").tolist() == [[0.5, -0.5]]


def test_advantage_input_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="scale_rewards='std'.*'group', 'batch', 'none'"):
        group_advantages(torch.zeros(2, 2), "std")
    with pytest.raises(ValueError, match=r"shape \[B, G\].*\(4,\)"):
        group_advantages(torch.zeros(4))


# --- per-token log-probabilities ----------------------------------------------------------------------------------


class BigramModel(torch.nn.Module):
    """Test double: the logits at a position depend only on the token there (a learnable table)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False, logits_to_keep: int = 0
    ) -> SimpleNamespace:
        logits = self.table[input_ids]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_per_token_logps_scores_each_completion_token_at_temperature(temperature: float) -> None:
    model = BigramModel(vocab=7)
    input_ids = torch.tensor([[0, 2, 3, 4, 5, 1], [0, 0, 6, 2, 1, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]])  # row 1: left pad, right pad
    logps = per_token_logps(model, input_ids, attention_mask, logits_to_keep=3, temperature=temperature)

    table = model.table.detach().tolist()
    expected = []
    for ids, am in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        row = []
        for pos in range(3, 6):  # completion positions; predicted from the token just before
            scaled = [z / temperature for z in table[ids[pos - 1]]]
            log_z = math.log(sum(math.exp(z) for z in scaled))
            row.append(scaled[ids[pos]] - log_z if am[pos] else 0.0)
        expected.append(row)
    assert logps.shape == (2, 3) and logps.dtype == torch.float32
    assert logps.tolist() == [pytest.approx(r, abs=1e-6) for r in expected]
    logps.sum().backward()
    assert model.table.grad is not None and model.table.grad.abs().sum() > 0


def test_per_token_logps_rejects_bad_arguments() -> None:
    model, ids = BigramModel(vocab=4), torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature=0"):
        per_token_logps(model, ids, torch.ones_like(ids), 1, temperature=0)
    with pytest.raises(ValueError, match="logits_to_keep=3"):
        per_token_logps(model, ids, torch.ones_like(ids), 3)


# --- the loss, by hand --------------------------------------------------------------------------------------------

LOGPS = [[-1.0, -0.5, -2.0, -0.3], [-0.7, -1.2, -0.1, -3.0], [-0.2, -0.9, -1.5, -0.4]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
ADV = [1.0, -0.5, 2.0]
OLD_SHIFT = [[0.0, 0.5, -0.4, 0.1], [0.3, -0.3, 0.0, 0.0], [0.05, -0.5, 0.6, 0.0]]  # old = logp + shift
REF_SHIFT = [[0.2, -0.1, 0.3, 0.0], [-0.4, 0.1, 0.0, 0.0], [0.0, 0.25, -0.2, 0.0]]  # ref = logp + shift
MAX_LEN = 5


def hand_loss(cfg: LossConfig, off_policy: bool, num_items: int | None) -> tuple[float, float]:
    """The GRPO loss and mean KL of the module-level batch, token by token in plain Python."""
    per_seq, total, kl_sum, tokens = [], 0.0, 0.0, sum(map(sum, MASK))
    for n, adv in enumerate(ADV):
        seq = 0.0
        for t in range(len(LOGPS[n])):
            if not MASK[n][t]:
                continue
            ratio = math.exp(-OLD_SHIFT[n][t]) if off_policy else 1.0
            clipped = min(max(ratio, 1 - cfg.epsilon), 1 + cfg.epsilon_high)
            loss = -min(ratio * adv, clipped * adv)
            kl = math.exp(REF_SHIFT[n][t]) - REF_SHIFT[n][t] - 1
            kl *= ratio if cfg.use_bias_correction_kl else 1.0
            loss += cfg.beta * kl
            kl_sum += kl
            seq += loss
        per_seq.append(seq / sum(MASK[n]))
        total += seq
    by_type = {
        "grpo": sum(per_seq) / len(per_seq),
        "bnpo": total / tokens,
        "dr_grpo": total / (len(ADV) * MAX_LEN),
        "dapo": total / (num_items or tokens),
    }
    return by_type[cfg.loss_type], kl_sum / tokens


def tensors(off_policy: bool) -> dict[str, torch.Tensor | None]:
    logps = torch.tensor(LOGPS)
    return {
        "per_token_logps": logps,
        "advantages": torch.tensor(ADV),
        "completion_mask": torch.tensor(MASK),
        "old_per_token_logps": logps + torch.tensor(OLD_SHIFT) if off_policy else None,
        "ref_per_token_logps": logps + torch.tensor(REF_SHIFT),
    }


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "off-policy"])
def test_loss_matches_hand_computation(loss_type: str, beta: float, off_policy: bool) -> None:
    cfg = LossConfig(loss_type=loss_type, beta=beta, max_completion_length=MAX_LEN)
    out = grpo_loss(**tensors(off_policy), config=cfg)
    expected, kl = hand_loss(cfg, off_policy, None)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    if beta:
        assert out.metrics["kl"] == pytest.approx(kl, rel=1e-6)
    else:
        assert "kl" not in out.metrics


def test_on_policy_loss_values_written_out() -> None:
    """Ratio 1 everywhere: per-token loss is -A; 4, 2 and 3 tokens with A = 1, -0.5, 2 sum to -9."""
    inputs = tensors(off_policy=False)
    expected = {"grpo": -(1.0 - 0.5 + 2.0) / 3, "bnpo": -9 / 9, "dr_grpo": -9 / (3 * MAX_LEN), "dapo": -9 / 9}
    for loss_type, value in expected.items():
        cfg = LossConfig(loss_type=loss_type, max_completion_length=MAX_LEN)
        assert grpo_loss(**inputs, config=cfg).loss.item() == pytest.approx(value)
    dapo = LossConfig(loss_type="dapo")
    assert grpo_loss(**inputs, config=dapo, num_items_in_batch=18).loss.item() == pytest.approx(-0.5)


def test_kl_bias_correction_changes_only_the_gradient_on_policy() -> None:
    ref_shift = torch.tensor([[0.3, -0.2]])
    grads, losses = {}, {}
    for corrected in (True, False):
        logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        cfg = LossConfig(beta=0.5, use_bias_correction_kl=corrected)
        out = grpo_loss(logps, torch.zeros(1), torch.ones(1, 2), cfg, ref_per_token_logps=logps.detach() + ref_shift)
        out.loss.backward()
        grads[corrected], losses[corrected] = logps.grad.tolist()[0], out.loss.item()
    assert losses[True] == pytest.approx(losses[False])
    for t, d in enumerate(ref_shift[0].tolist()):
        kl_grad = 1 - math.exp(d)  # d/dlogp of exp(ref - logp) - (ref - logp) - 1
        kl = math.exp(d) - d - 1  # the correction's ratio exp(logp - logp.detach()) adds kl * dlogp
        assert grads[False][t] == pytest.approx(0.5 * kl_grad / 2, rel=1e-6)
        assert grads[True][t] == pytest.approx(0.5 * (kl_grad + kl) / 2, rel=1e-6)


def test_beta_needs_reference_logps() -> None:
    with pytest.raises(ValueError, match="beta=0.04 needs ref_per_token_logps"):
        grpo_loss(torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), LossConfig(beta=0.04))


def test_mismatched_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="completion_mask has shape"):
        grpo_loss(torch.zeros(2, 3), torch.ones(2), torch.ones(2, 4), LossConfig())
    with pytest.raises(ValueError, match="advantages has shape"):
        grpo_loss(torch.zeros(2, 3), torch.ones(3), torch.ones(2, 3), LossConfig())


# --- clipping -----------------------------------------------------------------------------------------------------


def clipped_batch(epsilon_high: float) -> tuple[torch.Tensor, object]:
    """Sequence 0 has A = +1, sequence 1 has A = -1; ``old`` is chosen so that the ratios are RATIOS."""
    ratios = torch.tensor([[1.5, 0.5, 1.1, 1.25], [0.5, 1.5, 1.0, 0.85]])
    logps = torch.tensor([[-1.0, -2.0, -0.5, -1.5], [-0.3, -1.1, -2.2, -0.9]], requires_grad=True)
    old = logps.detach() - ratios.log()
    cfg = LossConfig(epsilon=0.2, epsilon_high=epsilon_high)
    out = grpo_loss(logps, torch.tensor([1.0, -1.0]), torch.ones(2, 4), cfg, old_per_token_logps=old)
    out.loss.backward()
    return logps.grad, out


def test_clipped_tokens_get_no_gradient_in_the_clipped_direction() -> None:
    grad, out = clipped_batch(epsilon_high=0.28)
    # A > 0: ratio 1.5 > 1.28 is clipped; 0.5 is below the range but the min keeps the unclipped term.
    # A < 0: ratio 0.5 < 0.8 is clipped; 1.5 is above the range but the min keeps the unclipped term.
    assert grad[0, 0] == 0.0 and grad[1, 0] == 0.0
    for n, t in [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]:
        assert grad[n, t] != 0.0, (n, t)
    # An unclipped token's loss is -w * A / (4 tokens * 2 sequences), and dw/dlogp = w.
    assert grad[0, 3].item() == pytest.approx(-1.25 / 8) and grad[1, 1].item() == pytest.approx(1.5 / 8)
    assert out.metrics == pytest.approx(
        {
            "clip_ratio/low_mean": 1 / 8,
            "clip_ratio/high_mean": 1 / 8,
            "clip_ratio/region_mean": 2 / 8,
            "clip_ratio/low_min": 0.0,
            "clip_ratio/high_max": 1 / 4,
        }
    )


def test_symmetric_epsilon_high_clips_a_ratio_that_dapo_range_keeps() -> None:
    grad, out = clipped_batch(epsilon_high=0.2)
    assert grad[0, 3] == 0.0  # 1.25 > 1.2
    assert out.metrics["clip_ratio/high_mean"] == 2 / 8


def test_without_old_logps_nothing_is_clipped() -> None:
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    out = grpo_loss(logps, torch.tensor([2.0, -1.0]), torch.ones(2, 2), LossConfig())
    out.loss.backward()
    assert logps.grad.tolist() == [[-2.0 / 4, -2.0 / 4], [1.0 / 4, 1.0 / 4]]  # -A / (tokens * sequences)
    assert out.metrics["clip_ratio/region_mean"] == 0.0


def test_sequence_level_ratio_clips_whole_sequences() -> None:
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    old = logps.detach() - torch.tensor([[0.5, 0.3], [0.01, -0.01]])  # mean log-ratio 0.4 and 0
    cfg = LossConfig(importance_sampling_level="sequence")
    out = grpo_loss(logps, torch.tensor([1.0, 1.0]), torch.ones(2, 2), cfg, old_per_token_logps=old)
    out.loss.backward()
    assert logps.grad[0].tolist() == [0.0, 0.0]  # exp(0.4) = 1.49 > 1.28 with A > 0
    assert logps.grad[1].abs().min() > 0
    assert out.metrics["clip_ratio/high_mean"] == 0.5  # one of two sequences


# --- gradient accumulation ----------------------------------------------------------------------------------------


def random_batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 5
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logps = -torch.rand(n, t, generator=g) * 3
    return {
        "logps": logps,
        "mask": mask,
        "advantages": torch.randn(n, generator=g),
        "old": logps + torch.randn(n, t, generator=g) * 0.4,
        "ref": logps + torch.randn(n, t, generator=g) * 0.3,
    }


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_weighted_micro_batches_give_the_full_batch_gradient(loss_type: str, beta: float, level: str) -> None:
    batch = random_batch(seed=0)
    cfg = LossConfig(loss_type=loss_type, beta=beta, max_completion_length=8, importance_sampling_level=level)
    total_tokens, total_seqs = int(batch["mask"].sum()), batch["mask"].size(0)

    def loss_of(logps: torch.Tensor, rows: slice) -> torch.Tensor:
        return grpo_loss(
            logps,
            batch["advantages"][rows],
            batch["mask"][rows],
            cfg,
            old_per_token_logps=batch["old"][rows],
            ref_per_token_logps=batch["ref"][rows],
            num_items_in_batch=total_tokens,
        ).loss

    full = batch["logps"].clone().requires_grad_(True)
    loss_of(full, slice(None)).backward()

    accumulated = batch["logps"].clone().requires_grad_(True)
    for rows in (slice(0, 2), slice(2, 6)):  # unequal micro-batches: 2 and 4 sequences
        part = accumulated[rows]
        weight = accumulation_weight(cfg, part.size(0), int(batch["mask"][rows].sum()), total_seqs, total_tokens)
        (loss_of(part, rows) * weight).backward()

    assert full.grad.abs().sum() > 0
    torch.testing.assert_close(accumulated.grad, full.grad, rtol=1e-6, atol=1e-7)


def test_accumulation_weights_per_loss_type() -> None:
    args = (2, 7, 6, 21)  # 2 of 6 sequences, 7 of 21 tokens
    assert accumulation_weight(LossConfig(loss_type="grpo"), *args) == pytest.approx(1 / 3)
    assert accumulation_weight(LossConfig(loss_type="dr_grpo", max_completion_length=8), *args) == pytest.approx(1 / 3)
    assert accumulation_weight(LossConfig(loss_type="bnpo"), 2, 5, 6, 21) == pytest.approx(5 / 21)
    assert accumulation_weight(LossConfig(loss_type="dapo"), *args) == 1.0


# --- configuration ------------------------------------------------------------------------------------------------


def test_loss_config_defaults_follow_sapo_setup() -> None:
    cfg = LossConfig()
    assert (cfg.loss_type, cfg.epsilon, cfg.epsilon_high, cfg.beta) == ("grpo", 0.2, 0.28, 0.0)
    assert cfg.importance_sampling_level == "token" and cfg.use_bias_correction_kl is True


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"loss_type": "ppo"}, "loss_type", "'ppo'"),
        ({"epsilon": -0.1}, "epsilon", "-0.1"),
        ({"epsilon": 1.0}, "epsilon", "1.0"),
        ({"epsilon_high": -0.5}, "epsilon_high", "-0.5"),
        ({"beta": -0.01}, "beta", "-0.01"),
        ({"max_completion_length": 0}, "max_completion_length", "0"),
        ({"loss_type": "dr_grpo"}, "max_completion_length", "None"),
        ({"importance_sampling_level": "seq"}, "importance_sampling_level", "'seq'"),
    ],
)
def test_loss_config_rejects_bad_values_naming_field_and_value(kwargs: dict, field: str, value: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        LossConfig(**kwargs)
    message = str(excinfo.value)
    assert f"LossConfig.{field}={value} is not allowed" in message
    assert message.split("is not allowed: ", 1)[1]  # says what is allowed
