"""The policy: batched generation and the GRPO update of one model on one device.

Generation puts all I prompts x G completions into as few ``generate`` calls as
GEN_BATCH_SIZE allows (``num_return_sequences=G``), never one call per completion. The
update is TRL's GRPO loss (:mod:`swarm_gdrive.training.grpo`) over micro-batches with exact
gradient accumulation, gradient clipping and AdamW. The model stays in float32, so that small
updates are not lost to half-precision weights; PRECISION picks the autocast of the forward
passes (:func:`pick_precision`): bfloat16 on a GPU that runs it natively, none elsewhere (a T4's
bfloat16 is emulated); float16 with a GradScaler where asked for.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from swarm_gdrive import progress
from swarm_gdrive.protocol.records import MAX_COMPLETION_CHARS
from swarm_gdrive.training import adapters, decoding, grpo

try:  # POSIX only: a native Windows process measures its memory through psutil (peak_memory_mb)
    import resource
except ImportError:  # pragma: no cover - exercised by tests/unit/test_portable_imports.py
    resource = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """Generation and optimisation settings; names follow TRL's GRPOConfig."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    gen_batch_size: int = 64
    num_iterations: int = 1
    scale_rewards: str = "group"
    precision: str = "auto"  # auto | bf16 | fp16 | fp32 (pick_precision)
    loss: grpo.LossConfig = grpo.LossConfig()


@dataclass(frozen=True)
class Generation:
    """G completions for each prompt, as text and token ids (eos included when the model stopped)."""

    texts: list[list[str]]
    token_ids: list[list[list[int]]]
    new_tokens: int
    seconds: float


@dataclass(frozen=True)
class TrainGroup:
    """One group for the update: a prompt and its completions with locally computed rewards."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    rewards: list[float]


class DeviceError(ValueError):
    """DEVICE names a device this machine does not have; the message says what to set."""


def mps_available() -> bool:
    """Apple silicon's GPU through Metal (macOS 12.3 or newer, a torch built with MPS)."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def pick_device(requested: str, cpu_only: bool) -> torch.device:
    """DEVICE (auto | cpu | cuda | cuda:N | mps) and CPU_ONLY to a torch device; explicit, never a device_map.

    auto is the first CUDA GPU, else Apple silicon's GPU (mps), else the CPU."""
    if cpu_only or requested == "cpu":
        return torch.device("cpu")
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda:0")
        return _mps() if mps_available() else torch.device("cpu")
    if requested == "mps":
        if not mps_available():
            raise DeviceError(
                "DEVICE='mps': Apple silicon's GPU is not available here (it needs a Mac with an M-series chip, "
                "macOS 12.3 or newer and torch built with MPS); use DEVICE=cpu or DEVICE=auto"
            )
        return _mps()
    if not torch.cuda.is_available():
        raise DeviceError(f"DEVICE={requested!r}: CUDA is not available here; use DEVICE=cpu or CPU_ONLY=true")
    device = torch.device(requested)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceError(f"DEVICE={requested!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def _mps() -> torch.device:
    """The mps device, saying how the operations that Metal lacks will run (:mod:`swarm_gdrive`'s import sets
    PYTORCH_ENABLE_MPS_FALLBACK=1 on macOS unless it is set, which torch reads once, at its own import)."""
    import swarm_gdrive

    fallback = os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK", "0").strip() not in ("", "0")
    if fallback and not swarm_gdrive.MPS_FALLBACK_SET_LATE:
        logger.warning(
            "DEVICE=mps: an operation Metal lacks runs on the CPU instead (PYTORCH_ENABLE_MPS_FALLBACK=1, slower); "
            "torch names each one once in a UserWarning ('... will fall back to run on the CPU')"
        )
    else:
        logger.warning(
            "DEVICE=mps: torch was imported before PYTORCH_ENABLE_MPS_FALLBACK=1 was set, so an operation Metal "
            "lacks raises NotImplementedError naming it: export PYTORCH_ENABLE_MPS_FALLBACK=1 before starting "
            "Python (or import swarm_gdrive before torch) to run such operations on the CPU"
        )
    return torch.device("mps")


def native_bf16(device: torch.device) -> bool:
    """bfloat16 in hardware: a CUDA GPU of compute capability 8.0 (Ampere) or newer.

    ``torch.cuda.is_bf16_supported()`` also answers yes on a T4 (7.5), where bfloat16 is emulated without the
    optimised kernels (pytorch/pytorch#148322), so it is not asked."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def pick_precision(requested: str, device: torch.device, weights: torch.dtype = torch.float32) -> str:
    """PRECISION (auto | bf16 | fp16 | fp32) on ``device`` to the autocast used: bf16, fp16 or fp32.

    auto is bf16 where it is native; fp16 (loss-scaled) where the weights are float16 (WEIGHT_DTYPE=fp16 with
    LoRA, on a T4); fp32 elsewhere: on an older GPU with float32 weights, fp16 is there to ask for, not the
    default (the scaler guards the gradients, not a forward pass that overflows float16's range). An explicit
    bf16 on a GPU without it is refused, naming the GPU, and so is a precision that Apple silicon's autocast
    lacks; fp16 and bf16 on the CPU run as asked (slowly: for tests and comparisons)."""
    if requested == "auto":
        if native_bf16(device):
            return "bf16"
        return "fp16" if weights == torch.float16 else "fp32"
    if requested == "bf16" and device.type == "cuda" and not native_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise DeviceError(
            f"PRECISION=bf16: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no "
            "native bfloat16, only a slow emulation; use PRECISION=auto (fp32 there), fp32, or fp16 (loss-scaled)"
        )
    if requested not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"PRECISION={requested!r}: use auto, bf16, fp16 or fp32")
    if device.type == "mps" and requested == "bf16" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise DeviceError("PRECISION=bf16 on mps needs macOS 14 or newer; use PRECISION=fp16 or fp32")
    return requested


def pick_weight_dtype(requested: str, device: torch.device, lora: bool) -> str:
    """WEIGHT_DTYPE (auto | fp32 | bf16 | fp16) to the dtype the model's weights are loaded in.

    auto: fp32 for a full fine-tune, whose AdamW state has the weights' dtype and whose small updates a
    half-precision weight would round away; with LoRA (adapters and their optimizer state stay fp32) the frozen
    base is bf16 on a GPU that runs it natively, fp16 on other CUDA GPUs (a T4), fp32 on the CPU and mps.
    fp16 weights are refused for a full fine-tune (AdamW in float16 underflows and loss scaling cannot unscale
    float16 gradients), and bf16 on a GPU without it."""
    if requested == "auto":
        if not lora or device.type != "cuda":
            return "fp32"
        return "bf16" if native_bf16(device) else "fp16"
    if requested == "fp16" and not lora:
        raise DeviceError(
            "WEIGHT_DTYPE=fp16 would train every weight in float16, which diverges: use it with LoRA (LORA_R > 0, "
            "the adapters stay float32), or WEIGHT_DTYPE=bf16 (a GPU of compute capability 8.0 or newer) or fp32"
        )
    if requested == "bf16" and device.type == "cuda" and not native_bf16(device):
        raise DeviceError(
            f"WEIGHT_DTYPE=bf16: {torch.cuda.get_device_name(device)} has no native bfloat16; use WEIGHT_DTYPE=fp16 "
            "with LoRA (LORA_R > 0) or fp32"
        )
    if requested not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"WEIGHT_DTYPE={requested!r}: use auto, fp32, bf16 or fp16")
    return requested


#: Prompts of a generation call that share at least this many leading tokens (a chat template's system turn) run
#: them through the model once (:meth:`PolicyTrainer._layout`).
_MIN_SHARED_PREFIX = 8
#: Generation on the CPU decodes from a static KV cache (:meth:`PolicyTrainer._prefill`).
STATIC_CACHE_ON_CPU = True
#: Generation on the CPU samples by :func:`decoding.same_draw` and runs its linears transposed (:mod:`.decoding`).
FAST_CPU_DECODING = True
#: With it, a CPU generation's static cache holds each prompt's keys and values once for its G completions
#: (:func:`decoding.shared_prefix_cache`); off, G copies of them, as before (benchmarks compare).
SHARED_PROMPT_CACHE_ON_CPU = True

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def ragged_advantages(rewards: list[list[float]], scale_rewards: str) -> list[list[float]]:
    """:func:`grpo.group_advantages` for groups that may differ in size (nodes may use different G).

    Short groups are padded with NaN, which group_advantages leaves out of every mean and std.
    """
    if not rewards:
        return []
    width = max(len(r) for r in rewards)
    padded = torch.tensor([r + [math.nan] * (width - len(r)) for r in rewards], dtype=torch.float32)
    advantages = grpo.group_advantages(padded, scale_rewards)
    return [advantages[i, : len(r)].tolist() for i, r in enumerate(rewards)]


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocations on a GPU; on Apple silicon what the MPS driver holds now
    (it keeps no peak); the resident set's peak on the CPU (its current size where ``resource`` is missing)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    if resource is None:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


def warmup_lr(base: float, warmup_steps: int, steps_done: int) -> float:
    """The learning rate of optimizer step ``steps_done + 1``: linear warmup, then constant.

    lr = base * min(1, (steps_done + 1) / warmup_steps), as transformers' ``get_constant_schedule_with_warmup``
    shifted by one so that the first step already moves the weights; ``warmup_steps`` 0 is the base rate
    throughout. There is no decay: a swarm's length is open-ended (MAX_ROUNDS can be extended).
    """
    if warmup_steps <= 0:
        return base
    return base * min(1.0, (steps_done + 1) / warmup_steps)


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer steps taken so far, from AdamW's own per-parameter ``step`` (saved and restored with checkpoints).

    The schedule is a function of this count, so it needs no scheduler state of its own: a restored
    optimizer resumes the warmup where it stopped.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if step is not None:
                return int(step)
    return 0


def cache_kwarg(model: Any) -> str:
    """The name under which the model takes a KV cache: ``cache`` from transformers 5.2x (which warns at the old
    name), ``past_key_values`` before (Colab's 4.57)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's own forward is **kw
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class PolicyTrainer:
    """A causal LM, its tokenizer and optimizer, on one explicit device."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        settings: TrainSettings,
        device: torch.device,
        reference_model: PreTrainedModel | None = None,
    ) -> None:
        if settings.loss.beta > 0 and reference_model is None and not adapters.is_lora(model):
            raise ValueError("BETA > 0 needs a frozen reference model (or LoRA adapters, disabled for it)")
        self.model = model
        self.reference_model = reference_model
        self.tokenizer = tokenizer
        self.settings = settings
        self.device = device
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=warmup_lr(settings.learning_rate, settings.warmup_steps, 0),
            weight_decay=settings.weight_decay,
        )
        self.precision = pick_precision(settings.precision, device, adapters.weight_dtype(model))
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        self._autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else nullcontext
        # float16's range is narrow: the loss is scaled up before backward and the gradients down before clipping;
        # a step whose gradients overflowed is skipped and the scale halved. Disabled, it changes nothing.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.eos_ids = self._eos_ids()
        self._cache_kwarg = cache_kwarg(model)

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = self.model.generation_config.eos_token_id
        ids.update(configured if isinstance(configured, list) else [configured])
        return {i for i in ids if i is not None}

    # -- prompts ---------------------------------------------------------------------------

    def prompt_ids(self, messages: list[dict[str, str]], assistant_prefix: str = "") -> list[int]:
        """The chat template's prompt (or a plain one for a model without a template)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
        return self.tokenizer(text + assistant_prefix, add_special_tokens=False)["input_ids"]

    # -- generation ------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        num_generations: int,
        seed: int,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        label: str = "generate",
    ) -> Generation:
        """G sampled completions per prompt (one greedy one if ``greedy``), in batches of at most GEN_BATCH_SIZE.

        ``max_new_tokens`` (default MAX_NEW_TOKENS) is less when a forced answer prefix takes part of the cap.
        ``label`` names the work in its progress (PROGRESS).

        Greedy prompts are batched shortest first (the completions returned in the order of ``prompts``): a call
        pads every prompt to its longest, and a greedy completion depends on its prompt alone. Sampled ones keep
        their order, which decides the random draws each prompt gets for the seed.
        """
        started = time.monotonic()
        work = progress.Task(label, len(prompts) * num_generations, "completion")
        self.model.eval()
        torch.manual_seed(seed)
        per_call = max(1, self.settings.gen_batch_size // num_generations)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i])) if greedy else list(range(len(prompts)))
        texts: list[list[str]] = [[] for _ in prompts]
        ids: list[list[list[int]]] = [[] for _ in prompts]
        new_tokens = 0
        sampling = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": self.settings.temperature, "top_p": self.settings.top_p}
        )
        # Every call of this generation decodes through the same weights: packed once for them (decoding.py).
        fast = self._fast_cpu_decoding()
        with decoding.decoding_linears(self.model, per_call * num_generations) if fast else nullcontext():
            for start in range(0, len(prompts), per_call):
                rows = order[start : start + per_call]
                chunk = [prompts[i] for i in rows]
                ids_, mask, shared = self._layout(chunk)
                with self._autocast():
                    out = self._generate_call(ids_, mask, shared, num_generations, sampling, max_new_tokens)
                completions = out[:, ids_.shape[1] :].tolist()
                for p, row in enumerate(rows):
                    group = [self._trim(c) for c in completions[p * num_generations : (p + 1) * num_generations]]
                    new_tokens += sum(len(c) for c in group)
                    ids[row] = group
                    # A completion never exceeds what a rollout file may carry (records.MAX_COMPLETION_CHARS).
                    texts[row] = [
                        self.tokenizer.decode(c, skip_special_tokens=True)[:MAX_COMPLETION_CHARS] for c in group
                    ]
                work.advance(len(chunk) * num_generations)
        work.close()
        return Generation(texts, ids, new_tokens, time.monotonic() - started)

    def _layout(self, prompts: list[list[int]]) -> tuple[Tensor, Tensor, int]:
        """Token ids and attention mask of a chunk of prompts, and the length of the prefix they all share.

        The shared prefix (the chat template's system turn, most of a short prompt) stays at the front and the
        padding goes between it and each prompt's own rest, so that the prefix takes the same positions in every
        row and is run through the model once (:meth:`_prefill`). Positions count real tokens only, so to the
        model this is the left padding it would otherwise get; with no shared prefix it is left padding."""
        # At most all but a token of the shortest prompt: every row keeps a rest of its own after the prefix.
        shared = min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)
        if len(prompts) == 1 or shared < _MIN_SHARED_PREFIX:
            shared = 0
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts) - shared
        rows = [p[:shared] + [pad] * (width - len(p) + shared) + p[shared:] for p in prompts]
        masks = [[1] * shared + [0] * (width - len(p) + shared) + [1] * (len(p) - shared) for p in prompts]
        to = {"device": self.device}
        return torch.tensor(rows, **to), torch.tensor(masks, **to), shared

    def _fast_cpu_decoding(self) -> bool:
        """Whether generation takes training/decoding.py's sampler and linear layers (on the CPU)."""
        return self.device.type == "cpu" and FAST_CPU_DECODING

    def _generate_call(
        self,
        ids: Tensor,
        mask: Tensor,
        shared: int,
        num_generations: int,
        sampling: dict[str, Any],
        max_new_tokens: int | None,
    ) -> Tensor:
        """One ``generate`` call for a chunk of prompts, their shared prefix prefilled once and each prompt's rest once
        for its G completions.

        ``num_return_sequences=G`` would run every prompt's prefill G times (a 120-token prompt costs as much as 120
        decoding steps of the whole batch). Instead, the prompts but their last token go through the model once (the
        prefix they share once for all), the KV cache is repeated G times along the batch (prompt 0's G rows first,
        as ``num_return_sequences`` orders them), and ``generate`` continues from it: the same sampling calls on the
        same logits, so the same tokens for a seed, up to floating-point noise."""
        kwargs = {
            **sampling,
            "max_new_tokens": max_new_tokens or self.settings.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "disable_compile": True,  # a compile costs more than a round's generation saves (and needs a compiler)
        }
        draws: Any = nullcontext()
        if self._fast_cpu_decoding():
            kwargs = decoding.cpu_generate_kwargs(self.model, kwargs)
            draws = decoding.prefetched_uniforms()  # the next step's uniforms drawn during each step
        if (num_generations == 1 and not shared) or ids.shape[1] < 2:
            # The rows repeated as num_return_sequences would repeat them (which a greedy call refuses).
            with draws:
                return self.model.generate(
                    input_ids=ids.repeat_interleave(num_generations, dim=0),
                    attention_mask=mask.repeat_interleave(num_generations, dim=0),
                    **kwargs,
                )
        cache, shares_prompts = self._prefill(
            ids[:, :-1], mask[:, :-1], shared, num_generations, ids.shape[1] + kwargs["max_new_tokens"]
        )
        with draws, decoding.shared_prefix_attention(self.model, cache) if shares_prompts else nullcontext():
            return self.model.generate(
                input_ids=ids.repeat_interleave(num_generations, dim=0),
                attention_mask=mask.repeat_interleave(num_generations, dim=0),
                **{self._cache_kwarg: cache},
                **kwargs,
            )

    def _prefill(self, ids: Tensor, mask: Tensor, shared: int, copies: int, length: int) -> tuple[Any, bool]:
        """The KV cache of ``ids`` (laid out by :meth:`_layout`, with the positions ``generate`` gives them: pads
        count from 1), its first ``shared`` columns computed once for every row, each row continued ``copies``
        times; and whether it is :func:`decoding.shared_prefix_cache`'s (decoded inside
        :func:`decoding.shared_prefix_attention`).

        On the CPU the cache is a static one of ``length`` positions: a growing cache concatenates every layer's
        keys and values at every step (for 32 sequences of 150 tokens, 220 MB copied a step beside 540 MB of
        weights read), a static one writes one position in place. With the fast CPU decoding it holds each prompt's
        keys and values once for its ``copies`` rows instead of ``copies`` times, and the ``shared`` prefix once for
        all rows (:mod:`.decoding`), where the model allows. Elsewhere it stays the growing one (a GPU's copies are
        cheap, and transformers compiles a static cache's model on a GPU unless told not to)."""
        from transformers import StaticCache

        cache, _ = grpo.prompt_cache(self.model, ids, mask, shared, self._cache_kwarg)
        static_cpu = self.device.type == "cpu" and STATIC_CACHE_ON_CPU
        shares = static_cpu and SHARED_PROMPT_CACHE_ON_CPU and self._fast_cpu_decoding()
        if shares and decoding.shared_prefix_supported(self.model):
            return decoding.shared_prefix_cache(cache, copies, length, shared), True
        cache.batch_repeat_interleave(copies)
        if not static_cpu:
            return cache, False
        static = StaticCache(config=self.model.config, max_cache_len=length)
        for index, layer in enumerate(cache.layers):
            static.update(layer.keys, layer.values, index)
        return static, False

    def _trim(self, tokens: list[int]) -> list[int]:
        """Cut at the first eos (kept); what follows is padding."""
        for i, token in enumerate(tokens):
            if token in self.eos_ids:
                return tokens[: i + 1]
        return tokens

    # -- update ----------------------------------------------------------------------------

    def step(self, groups: list[TrainGroup]) -> dict[str, float]:
        """One GRPO update (NUM_ITERATIONS optimizer steps) on ``groups``; returns ``train/…`` metrics."""
        started = time.monotonic()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        advantages = ragged_advantages([g.rewards for g in groups], self.settings.scale_rewards)
        seqs = [
            (g.prompt_ids, c, a)
            for g, adv in zip(groups, advantages, strict=True)
            for c, a in zip(g.completion_ids, adv, strict=True)
            if c
        ]
        beta = self.settings.loss.beta
        total_seqs = len(seqs)
        total_tokens = sum(len(c) for _, c, _ in seqs)
        # Sequences with zero advantage contribute nothing when beta = 0: skip their compute, keep them counted.
        active = [s for s in seqs if beta > 0 or abs(s[2]) > 0]
        metrics: dict[str, float] = {"train/sequences": float(total_seqs), "train/active_sequences": float(len(active))}
        if not active:
            metrics.update({"train/skipped_no_signal": 1.0, "train/step_s": time.monotonic() - started})
            return metrics
        shared = self._share_prompts()
        # Shared prompts: a group's sequences side by side, so that a micro-batch runs each prompt once.
        active.sort(key=(lambda s: (len(s[0]), s[0], len(s[1]))) if shared else (lambda s: len(s[0]) + len(s[1])))
        micro = [
            active[i : i + self.settings.micro_batch_size]
            for i in range(0, len(active), self.settings.micro_batch_size)
        ]
        batches = [self._collate(m, shared) for m in micro]
        old = self._old_logps(batches) if self.settings.num_iterations > 1 else [None] * len(batches)
        ref = self._ref_logps(batches) if beta > 0 else [None] * len(batches)
        self.model.train()
        sums: dict[str, float] = {}
        loss_total = grad_norm = lr = 0.0
        overflowed = 0
        work = progress.Task("train", len(batches) * self.settings.num_iterations, "micro-batch")
        for _ in range(self.settings.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            loss_total = 0.0
            for batch, old_lp, ref_lp in zip(batches, old, ref, strict=True):
                with self._autocast():
                    logps = self._batch_logps(self.model, batch)
                out = grpo.grpo_loss(
                    logps,
                    batch["advantages"],
                    batch["completion_mask"],
                    self.settings.loss,
                    old_per_token_logps=old_lp,
                    ref_per_token_logps=ref_lp,
                    num_items_in_batch=total_tokens,
                )
                weight = grpo.accumulation_weight(
                    self.settings.loss, batch["n"], batch["tokens"], total_seqs, total_tokens
                )
                self.scaler.scale(out.loss * weight).backward()
                work.advance()
                loss_total += float(out.loss.detach()) * weight
                for key, value in out.metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * batch["n"] / len(active)
            self.scaler.unscale_(self.optimizer)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm))
            lr = self.set_lr()
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # optimizer.step(), unless fp16 gradients overflowed
            self.scaler.update()
            if self.scaler.is_enabled():
                overflowed += self.scaler.get_scale() < scale
        work.close()
        seconds = time.monotonic() - started
        tokens = sum(b["tokens"] + b["prompt_tokens"] for b in batches) * self.settings.num_iterations
        metrics.update(
            {
                "train/loss": loss_total,
                "train/lr": lr,
                "train/grad_norm": grad_norm,
                "train/step_s": seconds,
                "train/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "train/peak_memory_mb": peak_memory_mb(self.device),
                **(
                    {"train/loss_scale": self.scaler.get_scale(), "train/overflow_skipped": float(overflowed)}
                    if self.scaler.is_enabled()
                    else {}
                ),
                **{f"train/{k.replace('/', '_')}": v / self.settings.num_iterations for k, v in sums.items()},
            }
        )
        return metrics

    def set_lr(self) -> float:
        """Set every parameter group's rate for the next optimizer step (:func:`warmup_lr`); returns it."""
        lr = warmup_lr(self.settings.learning_rate, self.settings.warmup_steps, optimizer_steps(self.optimizer))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _share_prompts(self) -> bool:
        """Whether the update runs each distinct prompt once (:func:`grpo.shared_prompt_logps`): not under gradient
        checkpointing (transformers then turns the KV cache off in training), nor with a dropout that would give a
        group's completions one mask on their shared prompt instead of one each."""
        if getattr(self.model, "is_gradient_checkpointing", False):
            return False
        config = self.model.config
        rates = [getattr(config, name, 0.0) or 0.0 for name in ("attention_dropout", "hidden_dropout", "dropout")]
        rates += [m.p for m in self.model.modules() if isinstance(m, torch.nn.Dropout)]
        return not any(float(r) > 0 for r in rates)

    def _collate(self, seqs: list[tuple[list[int], list[int], float]], shared: bool = False) -> dict[str, Any]:
        """Left-padded prompts followed by right-padded completions, as TRL lays them out; with ``shared`` the
        distinct prompts apart (each once) and each sequence's prompt row (``owner``)."""
        pad = self.tokenizer.pad_token_id
        to = {"device": self.device}
        c_len = max(len(c) for _, c, _ in seqs)
        completion_mask = [[1] * len(c) + [0] * (c_len - len(c)) for _, c, _ in seqs]
        common = {
            "completion_mask": torch.tensor(completion_mask, **to),
            "advantages": torch.tensor([a for _, _, a in seqs], dtype=torch.float32, **to),
            "logits_to_keep": c_len,
            "n": len(seqs),
            "tokens": sum(len(c) for _, c, _ in seqs),
            "prompt_tokens": sum(len(p) for p, _, _ in seqs),
        }
        if shared:
            rows = {tuple(p): None for p, _, _ in seqs}  # distinct prompts, in order
            index = {p: i for i, p in enumerate(rows)}
            prompt_ids, prompt_mask, prefix = self._layout([list(p) for p in rows])
            completions = [c + [pad] * (c_len - len(c)) for _, c, _ in seqs]
            return common | {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "shared_prefix": prefix,
                "owner": torch.tensor([index[tuple(p)] for p, _, _ in seqs], **to),
                "completion_ids": torch.tensor(completions, **to),
            }
        p_len = max(len(p) for p, _, _ in seqs)
        input_ids, attention = [], []
        for p, c, _ in seqs:
            input_ids.append([pad] * (p_len - len(p)) + p + c + [pad] * (c_len - len(c)))
            attention.append([0] * (p_len - len(p)) + [1] * (len(p) + len(c)) + [0] * (c_len - len(c)))
        return common | {"input_ids": torch.tensor(input_ids, **to), "attention_mask": torch.tensor(attention, **to)}

    def _batch_logps(self, model: Any, batch: dict[str, Any]) -> Tensor:
        """Per-token log-probs of a collated micro-batch's completions under ``model``."""
        if "owner" in batch:
            return grpo.shared_prompt_logps(
                model, batch["prompt_ids"], batch["prompt_mask"], batch["owner"], batch["completion_ids"],
                batch["completion_mask"], self.settings.temperature, self._cache_kwarg, batch["shared_prefix"],
            )  # fmt: skip
        return grpo.per_token_logps(
            model, batch["input_ids"], batch["attention_mask"], batch["logits_to_keep"], self.settings.temperature
        )

    @torch.no_grad()
    def _old_logps(self, batches: list[dict[str, Any]]) -> list[Tensor]:
        """Log-probs of the policy that generated (before any step), for NUM_ITERATIONS > 1."""
        self.model.eval()
        return self._logps_of(self.model, batches)

    @torch.no_grad()
    def _ref_logps(self, batches: list[dict[str, Any]]) -> list[Tensor]:
        """Log-probs of the frozen reference when BETA > 0: a second copy loaded for it, or with LoRA the model
        itself with its adapters disabled."""
        if self.reference_model is None:
            with self.model.disable_adapter():
                return self._logps_of(self.model, batches)
        return self._logps_of(self.reference_model, batches)

    def _logps_of(self, model: Any, batches: list[dict[str, Any]]) -> list[Tensor]:
        with self._autocast():
            return [self._batch_logps(model, b) for b in batches]
