"""GRPO math: group-relative advantages, per-token log-probabilities and the clipped policy loss.

Pure functions over tensors (no model loading, no I/O). Every formula follows TRL 1.16's
``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``) and uses the names of its ``GRPOConfig``
(``scale_rewards``, ``loss_type``, ``epsilon``, ``epsilon_high``, ``beta``,
``max_completion_length``, ``importance_sampling_level``, ``temperature``), so a number
computed here can be checked against TRL (``tests/integration/test_grpo_trl_agreement.py``).

Shapes: ``B`` prompts (groups) of ``G`` completions each; ``N = B * G`` sequences, laid out
group by group (row ``b * G + g``); ``T`` completion positions (``logits_to_keep``).

Gradient accumulation. A full batch split into micro-batches gives exactly the gradient of
the full batch when each micro-batch's ``loss`` is multiplied by ``accumulation_weight(...)``
before ``backward()``:

- ``grpo``, ``dr_grpo``: weight ``n_i / N`` (the micro-batch's share of sequences),
- ``bnpo``: weight ``m_i / M`` (its share of completion tokens),
- ``dapo``: weight ``1``, with ``num_items_in_batch = M`` (the completion tokens of the whole
  accumulated batch) passed to every micro-batch's ``grpo_loss``.

TRL divides ``grpo``/``bnpo``/``dr_grpo`` by ``gradient_accumulation_steps`` instead, which is the
same weight when micro-batches have equal sizes (TRL's always do); the weights above are exact
for unequal micro-batches too.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# One definition, which LOSS_TYPE/SCALE_REWARDS accept.
from swarm_gdrive.training.settings import LOSS_TYPES, SCALE_REWARDS

logger = logging.getLogger(__name__)

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
STD_EPSILON = 1e-4
"""Added to the reward std before dividing (TRL: ``advantages / (std_rewards + 1e-4)``)."""


def _nanstd(x: Tensor, dim: int | None = None) -> Tensor:
    """Bessel-corrected std ignoring NaNs (TRL ``trl.trainer.utils.nanstd``); NaN with fewer than 2 values."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim)
    count = (~torch.isnan(x)).sum(dim=dim)
    correction = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.full_like(variance, math.nan))
    return torch.sqrt(variance * correction)


def group_advantages(rewards: Tensor, scale_rewards: str = "group") -> Tensor:
    """Group-relative advantages of ``B`` groups of ``G`` completions.

    ``A[b, g] = (r[b, g] - mean_g r[b, :]) / (s + 1e-4)`` where ``s`` is, per ``scale_rewards``:

    - ``"group"``: the std of the group ``r[b, :]`` (Bessel-corrected, like ``torch.std``),
    - ``"batch"``: the std of all ``B * G`` rewards (the baseline is still the group mean),
    - ``"none"``: no division (Dr. GRPO), ``A = r - mean``.

    A group whose rewards are all equal gets zero advantages. A NaN reward marks an unscorable
    completion: it is left out of its group's mean and std and gets advantage 0. With ``G == 1``
    (or a single reward for "batch") the std is taken as 0, so ``A = r - mean = 0``.

    Args:
        rewards: ``[B, G]`` rewards, one row per prompt.
        scale_rewards: ``"group"`` | ``"batch"`` | ``"none"`` (TRL ``GRPOConfig.scale_rewards``).

    Returns:
        ``[B, G]`` float advantages; flatten with ``.reshape(-1)`` for the ``[N]`` that ``grpo_loss`` takes.

    Source: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` ("sum_then_normalize" branch).
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r} is not supported; use one of {SCALE_REWARDS}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [B, G] (groups x generations), got shape {tuple(rewards.shape)}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    num_generations = rewards.size(1)
    mean = torch.nanmean(rewards, dim=1, keepdim=True)
    advantages = rewards - mean
    if scale_rewards == "group":
        std = _nanstd(rewards, dim=1).unsqueeze(1) if num_generations > 1 else torch.zeros_like(mean)
        advantages = advantages / (std + STD_EPSILON)
    elif scale_rewards == "batch":
        std = _nanstd(rewards) if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
        advantages = advantages / (std + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


def per_token_logps(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    temperature: float = 1.0,
) -> Tensor:
    """Log-probability of each of the last ``logits_to_keep`` tokens under ``softmax(logits / temperature)``.

    ``logp[n, t] = log_softmax(z[n, P - 1 + t] / temperature)[x[n, P + t]]`` for ``P = L - logits_to_keep``,
    where ``z`` are the model's logits (the logits at position ``i`` predict token ``i + 1``), computed in
    float32; positions whose ``attention_mask`` is 0 (completion padding) are set to 0, as TRL does.

    Args:
        model: a causal LM whose forward accepts ``input_ids``, ``attention_mask``, ``use_cache`` and
            ``logits_to_keep`` and returns ``.logits`` (any ``transformers`` causal LM).
        input_ids: ``[N, L]`` prompt (left-padded) followed by completion (right-padded) token ids.
        attention_mask: ``[N, L]``, 1 for real tokens.
        logits_to_keep: ``T``, the number of completion positions, ``0 < T < L``.
        temperature: the sampling temperature; TRL scores with the same temperature it samples with.

    Returns:
        ``[N, T]`` float32 log-probabilities, differentiable with respect to the model's parameters.

    Source: TRL 1.16 ``GRPOTrainer._get_per_token_logps_and_entropies`` (labels ``-100`` where the mask is 0
    and before the completion) with the fused LM head of ``trl.trainer.utils.add_fused_lm_head``, which
    multiplies the float32 logits by ``1 / temperature``. Models with a logit scale or soft-capping apply it
    in their own forward, which TRL's fused head reproduces. In bfloat16, TRL projects the hidden states to
    float32 logits directly, while this function upcasts the model's bfloat16 logits, so the numbers agree
    only to bfloat16 precision; in float32 they agree to rounding.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (it divides the logits)")
    seq_len = input_ids.size(1)
    if not 0 < logits_to_keep < seq_len:
        raise ValueError(f"logits_to_keep={logits_to_keep} must be in [1, {seq_len - 1}] for sequences of {seq_len}")
    outputs = model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=logits_to_keep + 1
    )
    logits = outputs.logits[:, -(logits_to_keep + 1) : -1, :]
    logps = _target_logps(logits, input_ids[:, -logits_to_keep:], temperature)
    return logps.masked_fill(attention_mask[:, -logits_to_keep:] == 0, 0.0)


def _target_logps(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """``log_softmax(logits / temperature)`` at ``targets``, in float32: ``[N, T, V]``, ``[N, T]`` to ``[N, T]``."""
    inv_temperature = 1.0 / temperature
    rows = []
    for row_logits, row_targets in zip(logits, targets, strict=True):  # one row at a time bounds float32 memory
        row_logits = row_logits.float() * inv_temperature
        selected = row_logits.gather(-1, row_targets.unsqueeze(-1)).squeeze(-1)
        rows.append(selected - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def prompt_cache(
    model: torch.nn.Module, ids: Tensor, mask: Tensor, shared_prefix: int, cache_kwarg: str = "cache"
) -> tuple[Any, Tensor | None]:
    """The KV cache of prompts ``ids`` ``[U, P]`` (padding masked by ``mask``), their first ``shared_prefix`` columns
    (a prefix common to every row, padding after it) run once for all rows; and the logits of the last column.

    Positions are those ``generate`` gives: real tokens count from 0, pads get 1 (they are masked anyway). Returns
    the cache (a ``DynamicCache`` of U rows) and ``[U, 1, V]`` logits, or None when every column is the prefix.
    """
    from transformers import DynamicCache

    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    cache = DynamicCache(config=model.config)
    run = {"use_cache": True, "logits_to_keep": 1, cache_kwarg: cache}
    if shared_prefix:
        prefix = slice(0, shared_prefix)
        model(input_ids=ids[:1, prefix], attention_mask=mask[:1, prefix], position_ids=positions[:1, prefix], **run)
        cache.batch_repeat_interleave(ids.size(0))
    if ids.size(1) == shared_prefix:
        return cache, None
    rest = slice(shared_prefix, None)
    return cache, model(input_ids=ids[:, rest], attention_mask=mask, position_ids=positions[:, rest], **run).logits


def shared_prompt_logps(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    owner: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    cache_kwarg: str = "cache",
    shared_prefix: int = 0,
) -> Tensor:
    """:func:`per_token_logps` of sequences that share prompts, each distinct prompt run through the model once.

    A GRPO group is G completions of one prompt; laid out as whole sequences, the prompt's tokens (often most of
    each sequence) are computed G times, forward and backward. Here the ``U`` distinct prompts run once, their
    KV cache is gathered to the ``N`` sequences (``owner[n]`` is sequence n's prompt), and the completions run on
    it. The result is ``per_token_logps`` of the concatenated sequences, gradients included (the gather sums
    the prompt's gradient over its completions), up to floating-point rounding.

    Args:
        prompt_ids, prompt_mask: ``[U, P]`` left-padded prompts.
        owner: ``[N]`` long, the prompt row of each sequence.
        completion_ids, completion_mask: ``[N, T]`` right-padded completions, ``T >= 1``.
        cache_kwarg: the model's name for its KV cache argument (``cache``, or ``past_key_values`` before
            transformers 5.2x).
        shared_prefix: the prompts' first ``shared_prefix`` columns are one prefix common to all (a chat template's
            system turn), run once for all of them; their padding then sits after it, not before (positions count
            real tokens only, so to the model it is left padding). Less than ``P``.

    Returns:
        ``[N, T]`` float32 log-probabilities, 0 where ``completion_mask`` is 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (it divides the logits)")
    cache, last = prompt_cache(model, prompt_ids, prompt_mask, shared_prefix, cache_kwarg)
    logits = last.index_select(0, owner)  # [N, 1, V]: the prompt's last position predicts the first completion token
    if completion_ids.size(1) > 1:
        cache.batch_select_indices(owner)
        inputs = completion_ids[:, :-1]
        mask = torch.cat([prompt_mask.index_select(0, owner), completion_mask[:, :-1]], dim=1)
        start = prompt_mask.sum(-1).index_select(0, owner).unsqueeze(1)
        rest = model(
            input_ids=inputs, attention_mask=mask,
            position_ids=start + torch.arange(inputs.size(1), device=inputs.device), use_cache=True,
            **{cache_kwarg: cache},
        ).logits  # fmt: skip
        logits = torch.cat([logits, rest], dim=1)
    logps = _target_logps(logits, completion_ids, temperature)
    return logps.masked_fill(completion_mask == 0, 0.0)


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"LossConfig.{name}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class LossConfig:
    """Hyperparameters of the GRPO loss, named and defined as in TRL's ``GRPOConfig``.

    Attributes:
        loss_type: how per-token losses are averaged: ``"grpo"`` (mean per sequence, then mean over
            sequences), ``"bnpo"`` (mean over the micro-batch's tokens), ``"dr_grpo"`` (sum divided by
            ``N * max_completion_length``), ``"dapo"`` (sum divided by the completion tokens of the whole
            accumulated batch). TRL's default is ``"dapo"``; here ``"grpo"``.
        epsilon: lower clipping bound, the ratio is clipped below at ``1 - epsilon``.
        epsilon_high: upper clipping bound, the ratio is clipped above at ``1 + epsilon_high``. TRL's default
            is ``None`` (= ``epsilon``); here 0.28, DAPO's and SAPO's value. Set it to ``epsilon`` for symmetric
            clipping.
        beta: KL coefficient; 0 means no KL term and no reference model.
        max_completion_length: the constant of ``dr_grpo`` (TRL uses its ``max_completion_length``); required
            for ``dr_grpo``, unused otherwise.
        importance_sampling_level: ``"token"`` (one ratio per token, GRPO) or ``"sequence"`` (the ratio of the
            mean per-token log-ratio of each sequence, GSPO).
        use_bias_correction_kl: multiply the per-token KL by the importance ratio ``w`` (DeepSeek-V3.2), so its
            gradient is the unbiased reverse-KL gradient. ``w`` is differentiable, so this changes the KL
            gradient even on-policy where ``w == 1``. TRL's default (True); only matters when ``beta > 0``.
    """

    loss_type: str = "grpo"
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0
    max_completion_length: int | None = None
    importance_sampling_level: str = "token"
    use_bias_correction_kl: bool = True

    def __post_init__(self) -> None:
        _require(self.loss_type in LOSS_TYPES, "loss_type", self.loss_type, f"use one of {LOSS_TYPES}")
        _require(0.0 <= self.epsilon < 1.0, "epsilon", self.epsilon, "use a value in [0, 1), e.g. 0.2")
        _require(self.epsilon_high >= 0.0, "epsilon_high", self.epsilon_high, "use a value >= 0, e.g. 0.28")
        _require(self.beta >= 0.0, "beta", self.beta, "use a value >= 0 (0 disables the KL term)")
        mcl = self.max_completion_length
        _require(mcl is None or mcl > 0, "max_completion_length", mcl, "use a positive number of tokens")
        _require(
            self.loss_type != "dr_grpo" or mcl is not None,
            "max_completion_length",
            mcl,
            "loss_type='dr_grpo' divides by it; set it to the generation's max_completion_length",
        )
        _require(
            self.importance_sampling_level in IMPORTANCE_SAMPLING_LEVELS,
            "importance_sampling_level",
            self.importance_sampling_level,
            f"use one of {IMPORTANCE_SAMPLING_LEVELS}",
        )


@dataclass
class LossOutput:
    """The loss to call ``backward()`` on and its metrics, keyed with TRL's metric names.

    ``metrics`` holds ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (fractions
    of completion tokens whose ratio was clipped below with a negative advantage, above with a positive
    one, either), ``clip_ratio/low_min`` and ``clip_ratio/high_max`` (the extreme per-sequence fractions;
    NaN when no sequence has a token), and ``kl`` (mean per-token KL to the reference, times ``w`` with
    ``use_bias_correction_kl``, as TRL logs it) when ``beta > 0``.
    """

    loss: Tensor
    metrics: dict[str, float]


def _check_shapes(
    logps: Tensor, advantages: Tensor, completion_mask: Tensor, old: Tensor | None, ref: Tensor | None
) -> None:
    if logps.dim() != 2:
        raise ValueError(f"per_token_logps must have shape [N, T], got {tuple(logps.shape)}")
    others = (("completion_mask", completion_mask), ("old_per_token_logps", old), ("ref_per_token_logps", ref))
    for name, tensor in others:
        if tensor is not None and tensor.shape != logps.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}; it must match per_token_logps {logps.shape}")
    if advantages.shape not in (logps.shape[:1], logps.shape):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected [N] or [N, T] for {logps.shape}")


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    """Token-weighted mean over the mask; one value per sequence when ``x`` is ``[N, 1]`` (TRL global_masked_mean)."""
    if x.size(1) == 1:
        total, count = x.sum(), float(x.size(0))
    else:
        total, count = (x * mask).sum(), mask.sum().item()
    return (total / max(count, 1.0)).item()


def _seq_means(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over each sequence's tokens, NaN for an empty sequence (TRL masked_seq_mean)."""
    return x.squeeze(1) if x.size(1) == 1 else (x * mask).sum(-1) / mask.sum(-1)


def _nan_extreme(x: Tensor, pick_max: bool) -> float:
    values = x[~torch.isnan(x)]
    if values.numel() == 0:
        return math.nan
    return (values.max() if pick_max else values.min()).item()


def _clip_metrics(coef_1: Tensor, advantages: Tensor, mask: Tensor, config: LossConfig) -> dict[str, float]:
    is_low = ((coef_1 < 1 - config.epsilon) & (advantages < 0)).float()
    is_high = ((coef_1 > 1 + config.epsilon_high) & (advantages > 0)).float()
    is_region = ((is_low + is_high) > 0).float()
    return {
        "clip_ratio/low_mean": _masked_mean(is_low, mask),
        "clip_ratio/high_mean": _masked_mean(is_high, mask),
        "clip_ratio/region_mean": _masked_mean(is_region, mask),
        "clip_ratio/low_min": _nan_extreme(_seq_means(is_low, mask), pick_max=False),
        "clip_ratio/high_max": _nan_extreme(_seq_means(is_high, mask), pick_max=True),
    }


def _reduce(per_token_loss: Tensor, mask: Tensor, config: LossConfig, num_items_in_batch: float | None) -> Tensor:
    """Average the per-token losses as ``config.loss_type`` says (TRL ``_compute_loss``, before accumulation)."""
    masked = per_token_loss * mask
    if config.loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if config.loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if config.loss_type == "dr_grpo":
        return masked.sum() / (per_token_loss.size(0) * config.max_completion_length)
    total = mask.sum().item() if num_items_in_batch is None else float(num_items_in_batch)
    return masked.sum() / max(total, 1.0)


def grpo_loss(
    per_token_logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    config: LossConfig,
    old_per_token_logps: Tensor | None = None,
    ref_per_token_logps: Tensor | None = None,
    num_items_in_batch: int | None = None,
) -> LossOutput:
    """The clipped GRPO surrogate loss with an optional KL penalty.

    Per token ``(n, t)`` with ``m`` the completion mask, ``A_n`` the advantage and ``old`` the log-probs
    the completions were sampled with::

        w     = exp(logp - old)                       # "token"; "sequence": exp(sum_t m (logp - old) / sum_t m)
        l     = -min(w * A_n, clip(w, 1 - epsilon, 1 + epsilon_high) * A_n)
        kl    = exp(ref - logp) - (ref - logp) - 1              # k3 estimator of KL(pi || ref)
        l    += beta * kl * w                                  # beta > 0; "* w" only with use_bias_correction_kl

    then, per ``loss_type``::

        grpo:    mean_n (sum_t m l / max(sum_t m, 1))
        bnpo:    sum m l / max(sum m, 1)
        dr_grpo: sum m l / (N * max_completion_length)
        dapo:    sum m l / max(num_items_in_batch, 1)     # num_items_in_batch defaults to sum m

    Without ``old_per_token_logps`` (one optimisation step per generation, TRL's ``num_iterations == 1``)
    ``old = logp.detach()``: ``w == 1``, nothing is clipped, and the gradient is ``-A_n grad logp``.
    A clipped token has zero gradient in the direction the clip guards (``w > 1 + epsilon_high`` with
    ``A > 0``, ``w < 1 - epsilon`` with ``A < 0``) and the unclipped gradient otherwise.

    Args:
        per_token_logps: ``[N, T]`` current log-probs (``per_token_logps(...)``), with gradient.
        advantages: ``[N]`` (or ``[N, T]``) advantages, ``group_advantages(...).reshape(-1)``.
        completion_mask: ``[N, T]``, 1 on completion tokens that count (up to and including EOS).
        config: the loss hyperparameters.
        old_per_token_logps: ``[N, T]`` log-probs of the sampling policy, when the batch is reused for
            more than one optimisation step; ``None`` means on-policy.
        ref_per_token_logps: ``[N, T]`` log-probs of the reference model; required when ``beta > 0``.
        num_items_in_batch: the number of completion tokens in the whole accumulated batch; only ``dapo``
            uses it (see the module docstring for gradient accumulation).

    Returns:
        ``LossOutput`` with the scalar loss and TRL-named metrics (see ``LossOutput``).

    Source: TRL 1.16 ``GRPOTrainer._compute_loss`` (loss types grpo, bnpo, dr_grpo, dapo; ``delta``,
    ``top_entropy_quantile``, ``off_policy_mask_threshold`` and vLLM importance sampling left out), with
    ``gradient_accumulation_steps == 1`` and one process.
    """
    _check_shapes(per_token_logps, advantages, completion_mask, old_per_token_logps, ref_per_token_logps)
    if config.beta != 0.0 and ref_per_token_logps is None:
        raise ValueError(f"beta={config.beta} needs ref_per_token_logps (the reference model's log-probs)")
    mask = completion_mask.to(per_token_logps.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.to(per_token_logps.dtype)
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

    log_ratio = per_token_logps - old
    if config.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - config.epsilon, 1 + config.epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)

    metrics: dict[str, float] = {}
    if config.beta != 0.0:
        delta = ref_per_token_logps - per_token_logps
        per_token_kl = torch.exp(delta) - delta - 1
        if config.use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
        per_token_loss = per_token_loss + config.beta * per_token_kl
        metrics["kl"] = _masked_mean(per_token_kl.detach(), mask)

    loss = _reduce(per_token_loss, mask, config, num_items_in_batch)
    with torch.no_grad():
        metrics.update(_clip_metrics(coef_1, advantages, mask, config))
    return LossOutput(loss=loss, metrics=metrics)


def accumulation_weight(
    config: LossConfig, num_sequences: int, num_tokens: int, total_sequences: int, total_tokens: int
) -> float:
    """The factor for a micro-batch's ``grpo_loss`` that makes the micro-batches' gradients sum to the full batch's.

    ``grpo``/``dr_grpo``: ``num_sequences / total_sequences``; ``bnpo``: ``num_tokens / total_tokens``;
    ``dapo``: 1 (pass ``num_items_in_batch=total_tokens`` to ``grpo_loss`` instead). ``num_*`` count the
    micro-batch's sequences and completion-mask tokens, ``total_*`` those of the full batch.
    """
    if config.loss_type in ("grpo", "dr_grpo"):
        return num_sequences / max(total_sequences, 1)
    if config.loss_type == "bnpo":
        return num_tokens / max(total_tokens, 1)
    return 1.0
