"""Faster CPU decoding that generates the same tokens: sampling without a vocabulary-wide exponential draw, and
linear layers in the orientation the CPU's BLAS runs fastest for a decoding step's few rows.

Both are measured in bench/README.md §10 (issue #26). On the 2-core CI machine, a decoding step of 32 sequences of
SmolLM2-135M spent 35 ms of its 245 in ``torch.multinomial`` and 140 ms in matrix products running at 65 of the
machine's 108 GFLOP/s.

- **Sampling.** ``torch.multinomial(p, 1)`` draws ``q ~ Exp(1)`` for every entry of ``p`` (one generator call and one
  ``log1p`` each, serially: 1.6 M per step) and returns ``argmax(p / q)``. :func:`same_draw` takes the same uniforms
  from the same generator (``torch.rand`` in float64 consumes it exactly as ``exponential_`` does) and computes
  ``q = -log1p(-u)`` only where ``p > 0``: after top-k, 50 entries a row. The token and the generator's state after
  it are those of ``torch.multinomial``; tests compare. Within :func:`prefetched_uniforms` (every sampled CPU
  generation) a helper thread draws the next step's uniforms while the model computes that step, on a core its
  small one-thread operations leave idle, from a copy of the generator's state: the same numbers in the same order,
  taken only if nothing else drew in between.
- **Linears.** For 2 to 256 rows on 2 threads, ``W @ x.T`` runs 1.3-1.7x faster than ``x @ W.T`` through MKL on
  these CPUs (the 30 layers of SmolLM2 at 32 rows: 76 ms against 101; its 49,152-row output layer 22 ms against
  37): MKL splits the second over its few rows, the first over the weight's many. On one thread the two are within
  3 % (the first slower), so a process on one thread keeps ``nn.Linear``. The product is the same up to the order
  of additions.
- **Packed linears** (:func:`decoding_linears`, what a generation uses). Faster still: each fp32 weight packed once
  per generation by oneDNN for the call's row count (``torch.ops.mkldnn``, the packed linear torch's own CPU
  compiler emits), on any thread count: SmolLM2's layers at 32 rows on 2 threads 61 ms against 92 transposed; a
  whole batched generation 1.2-1.45x (on 1 thread 1.2-1.35x); the packed copies held for the call. Where packing is
  missing, memory is short or the weights are not fp32, the transposed linears above.
- **Attention over a shared prompt cache** (:func:`shared_prefix_cache`, :func:`shared_prefix_attention`). A
  generation continues each prompt G times; a static cache of G copies of the prompt's keys and values made every
  decoding step read them G times (for 32 SmolLM2 sequences of 113-token prompts, 8.7 MB a layer and 20 % of the
  step). The cache holds them once per prompt, and the prefix every prompt shares (the chat template's system turn)
  once for all; a one-token query's attention multiplies the rows of each by them in one product per key-value head,
  then the rows' own decoded positions, up to those written (SDPA read the static cache's unwritten tail too). The
  same result up to the order of additions.

:func:`cpu_generate_kwargs` turns a sampled ``generate`` call into a greedy one whose last logits processor does the
sampling (``argmax`` of a one-hot row is the sampled token): with top-k (transformers' default of 50),
:class:`TopKSampler`, which does the work of the warpers (and of the minimum-length processors, where no other
processor comes between) from one ``topk`` of each row instead of five to seven passes over its vocabulary, with the
same tokens; otherwise the warpers transformers would add for the sampling settings, in its order, then
:class:`SameDrawSampler`. Settings it does not reproduce (beams, typical-p, epsilon and eta cutoffs, top-h,
watermarking, renormalised logits, a call's own logits processors) keep ``generate``'s own sampling.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

#: Row counts for which a linear layer computes ``(W @ x.T).T`` on the CPU (see the module's docstring).
TRANSPOSED_ROWS = (2, 256)
#: Sampled entries at most this share of the row count use the sparse ``q`` (the rest of the row needs no ``log1p``).
_SPARSE_SHARE = 0.25


def same_draw(probs: Tensor) -> Tensor:
    """``torch.multinomial(probs, 1)`` on the CPU's default generator, faster: the same token ids ``[N, 1]`` and the
    same generator state after, for a float ``[N, V]`` of non-negative rows with a positive sum."""
    if probs.dim() != 2:
        raise ValueError(f"probabilities of shape {tuple(probs.shape)}: expected [rows, vocabulary]")
    # torch.multinomial's own checks, with its messages.
    low, high = torch.aminmax(probs)
    if not bool((high < float("inf")) & (low >= 0)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probs.sum(1) == 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    # exponential_ draws one float64 uniform per entry, in memory order, and returns -log1p(-u) cast to the dtype.
    uniforms = _uniforms(probs.shape, probs.device)
    flat = torch.nonzero((probs > 0).view(-1)).squeeze(1)
    # A zero uniform gives q = 0, and 0 / 0 (NaN) is what torch's argmax then picks: the full division keeps that.
    if flat.numel() > _SPARSE_SHARE * probs.numel() or bool(uniforms.min() == 0):
        return _dense_draw(probs, uniforms)
    q = (-torch.log1p(-uniforms.view(-1).index_select(0, flat))).to(probs.dtype)
    ratio = probs.reshape(-1).index_select(0, flat) / q
    # argmax over a row of p / q, which is 0 wherever p is: the first largest of the row's positive entries.
    rows, vocab = probs.shape
    row = torch.div(flat, vocab, rounding_mode="floor")
    best = ratio.new_zeros(rows).scatter_reduce_(0, row, ratio, "amax")
    if not bool((best > 0).all()):  # every ratio of a row underflowed to 0: the row's first 0 is argmax's
        return _dense_draw(probs, uniforms)
    column = torch.where(ratio == best.index_select(0, row), flat - row * vocab, vocab)
    return torch.full_like(best, vocab, dtype=flat.dtype).scatter_reduce_(0, row, column, "amin").unsqueeze(1)


def _uniforms(shape: torch.Size, device: torch.device) -> Tensor:
    """``torch.rand(shape, dtype=torch.float64)`` from the default generator: drawn ahead where
    :func:`prefetched_uniforms` is on (the CPU), else now."""
    prefetch = _PREFETCH.get()
    if prefetch is not None and device.type == "cpu":
        return prefetch.draw(shape)
    return torch.rand(shape, dtype=torch.float64, device=device)


def _dense_draw(probs: Tensor, uniforms: Tensor) -> Tensor:
    """``torch.multinomial``'s token: the argmax of ``probs / -log1p(-uniforms)`` over every entry."""
    return torch.argmax(probs / (-torch.log1p(-uniforms)).to(probs.dtype), dim=-1, keepdim=True)


def _lowest_priority() -> None:
    """This thread at the lowest scheduling priority (nice 19) on Linux, where a thread has a nice value of its own:
    it takes the cores that the model's threads leave idle, and yields them whenever those run."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class _Prefetch:
    """The float64 uniforms of :func:`same_draw`'s next call, drawn on a helper thread as soon as this call's are taken,
    from a copy of the default generator's state (:func:`prefetched_uniforms`)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="swarm-gdrive-uniforms", initializer=_lowest_priority)
        self.pending: Future[tuple[Tensor, Tensor]] | None = None
        self.before: Tensor | None = None  # the default generator's state the pending draw started from

    @staticmethod
    def _draw(shape: torch.Size, state: Tensor) -> tuple[Tensor, Tensor]:
        generator = torch.Generator()
        generator.set_state(state)
        return torch.rand(shape, dtype=torch.float64, generator=generator), generator.get_state()

    def draw(self, shape: torch.Size) -> Tensor:
        """``torch.rand(shape, dtype=torch.float64)``: the pending draw's numbers if it was of this shape and the
        default generator has not moved since it started (it is then moved past them), else drawn now."""
        pending, self.pending = self.pending, None
        state = torch.get_rng_state()
        uniforms = None
        if pending is not None:
            drawn, after = pending.result()
            if drawn.shape == shape and torch.equal(state, self.before):
                uniforms, state = drawn, after
                torch.set_rng_state(after)
        if uniforms is None:
            uniforms = torch.rand(shape, dtype=torch.float64)
            state = torch.get_rng_state()
        self.before = state
        self.pending = self.pool.submit(self._draw, shape, state)
        return uniforms

    def close(self) -> None:
        """Drops the pending draw (the default generator never moved for it)."""
        self.pending = None
        self.pool.shutdown(wait=False, cancel_futures=True)


_PREFETCH: ContextVar[_Prefetch | None] = ContextVar("swarm_gdrive_prefetched_uniforms", default=None)


@contextmanager
def prefetched_uniforms() -> Iterator[None]:
    """Within the block, :func:`same_draw` on the CPU takes its uniforms drawn ahead: as it takes a step's, a helper
    thread at the lowest priority draws the next step's while the model computes that step (the step's small
    one-thread operations leave a core idle; the draw is 1.6 M float64 a step for 32 rows of SmolLM2, about 7-9 ms
    on one core). It draws from a copy of the default generator's state, and the next step takes those numbers only
    if the default generator is still in that state (nothing else drew from it in between), moving it past them as
    its own draw would: the numbers, their order and the generator's state after are those drawn without it. Each
    generation has its own block."""
    prefetch = _Prefetch()
    token = _PREFETCH.set(prefetch)
    try:
        yield
    finally:
        _PREFETCH.reset(token)
        prefetch.close()


def _one_hot(scores: Tensor, token: Tensor) -> Tensor:
    """Scores of 0 at each row's ``token`` and -inf elsewhere: ``generate``'s greedy argmax is the token."""
    return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


class SameDrawSampler:
    """The last logits processor of a greedy ``generate`` that samples: the row's token by :func:`same_draw` from
    ``softmax(scores)`` (what ``generate`` samples from), returned as scores of 0 there and -inf elsewhere."""

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return _one_hot(scores, same_draw(nn.functional.softmax(scores, dim=-1)))


class TopKSampler:
    """A sampled ``generate`` call's sampling with top-k (transformers' default of 50) as one logits processor: the
    tokens, and the generator's state after them, of the processors it stands for, in transformers' order: the
    minimum-length ones where given (``eos``: the end-of-sequence ids they keep out until ``min_length`` tokens in
    all or ``min_new_tokens`` new ones), :class:`~transformers.TemperatureLogitsWarper`,
    :class:`~transformers.TopKLogitsWarper`, :class:`~transformers.TopPLogitsWarper` where ``top_p`` < 1, then
    :class:`SameDrawSampler`.

    Those make five to seven passes over every row's vocabulary a step (a copy and a mask for each minimum length, a
    mask for top-k, a full sort for top-p, the sampler's softmax, comparison and gathers): for 32 rows of SmolLM2's
    49,152 entries, 8-12 ms of a 130 ms step (bench/README.md §10). This takes ``topk(k + 1)`` of the row, finds
    top-k's survivors and top-p's among those k, and writes them into a row of ``-inf`` for the sampler's softmax:
    the same processed row, bit for bit, so the same probabilities; the draw then divides only the k entries. Where
    the k-th and (k+1)-th values tie, a value is not finite, or top-p meets equal values (whose order a sort leaves
    open), the step runs the processors themselves. The output is :class:`SameDrawSampler`'s one-hot row (with
    ``reuse_output``, one tensor rewritten in place each step: only where no step's scores are kept)."""

    def __init__(
        self,
        top_k: int,
        temperature: float | None = None,
        top_p: float | None = None,
        eos: list[int] | None = None,
        min_length: int = 0,
        min_new_tokens: int = 0,
        reuse_output: bool = False,
    ) -> None:
        from transformers import LogitsProcessorList

        if not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"top_k {top_k!r}: expected a positive integer")
        self.top_k = top_k
        self.temperature = temperature if temperature is not None and temperature != 1.0 else None
        self.top_p = top_p if top_p is not None and top_p < 1.0 else None
        self.eos = sorted({int(i) for i in eos or [] if int(i) >= 0})
        self.min_length, self.min_new_tokens = min_length or 0, min_new_tokens or 0
        self.reuse_output = reuse_output
        self.prompt_length: int | None = None  # the first call's length: what generate was given
        warpers = _warpers(temperature, top_k, top_p, None)
        self.reference = LogitsProcessorList([*warpers, SameDrawSampler()])  # what a step falls back to
        self._processed: Tensor | None = None  # a row of -inf per sequence, the survivors written in for a step
        self._out: Tensor | None = None
        self._last: Tensor | None = None  # the tokens marked in _out

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        length = input_ids.shape[-1]
        if self.prompt_length is None:
            self.prompt_length = length
        vocab = scores.shape[-1]
        eos = [i for i in self.eos if i < vocab]
        if eos and (length < self.min_length or length - self.prompt_length < self.min_new_tokens):
            scores = scores.index_fill(-1, torch.tensor(eos, device=scores.device), float("-inf"))
        token = self._draw(scores)
        if token is None:
            return self.reference(input_ids, scores)
        return self._one_hot(scores, token)

    def _draw(self, scores: Tensor) -> Tensor | None:
        """The token ids ``[rows, 1]`` the processors would sample from ``scores``; None where this cannot say."""
        k = self.top_k
        if scores.dim() != 2 or scores.device.type != "cpu" or k >= scores.shape[1]:
            return None
        values, index = torch.topk(scores, k + 1)
        if self.temperature is not None:  # the division is monotonic: the order and the survivors stay
            values = values / self.temperature
        top, index = values[:, :k], index[:, :k]
        if not bool(torch.isfinite(top).all()) or not bool((values[:, k - 1] > values[:, k]).all()):
            return None
        rows, vocab = scores.shape
        if self.top_p is not None:
            if bool((top[:, :-1] == top[:, 1:]).any()):
                return None
            # TopPLogitsWarper's ascending sort of the processed row: its -inf entries, then these k ascending.
            row = scores.new_full((rows, vocab), float("-inf"))
            row[:, vocab - k :] = top.flip(1)
            remove = row.softmax(dim=-1).cumsum(dim=-1) <= (1 - self.top_p)
            remove[:, -1:] = False  # min_tokens_to_keep
            top = top.masked_fill(remove[:, vocab - k :].flip(1), float("-inf"))
        processed = self._processed
        if processed is None or processed.shape != scores.shape or processed.dtype != scores.dtype:
            processed = self._processed = torch.full_like(scores, float("-inf"))
        probs = torch.softmax(processed.scatter_(1, index, top), dim=-1)
        processed.scatter_(1, index, float("-inf"))
        # same_draw on those probabilities, its division over the k entries where every other is 0.
        uniforms = _uniforms(probs.shape, probs.device)
        if bool(uniforms.min() == 0):
            return _dense_draw(probs, uniforms)
        q = (-torch.log1p(-uniforms.gather(1, index))).to(probs.dtype)
        ratio = probs.gather(1, index) / q
        best = ratio.amax(dim=1, keepdim=True)
        if not bool((best > 0).all()):
            return _dense_draw(probs, uniforms)
        return torch.where(ratio == best, index, vocab).amin(dim=1, keepdim=True)

    def _one_hot(self, scores: Tensor, token: Tensor) -> Tensor:
        """:func:`_one_hot`, in the one tensor of the call where ``reuse_output``."""
        if not self.reuse_output:
            return _one_hot(scores, token)
        out = self._out
        if out is None or out.shape != scores.shape or out.dtype != scores.dtype:
            out = self._out = torch.full_like(scores, float("-inf"))
        elif self._last is not None:
            out.scatter_(1, self._last, float("-inf"))
        self._last = token
        return out.scatter_(1, token, 0.0)


def _effective_config(model: Any, overrides: dict[str, Any]) -> Any:
    """The generation config ``generate`` would use: the model's, transformers' defaults where unset, the call's."""
    config = copy.deepcopy(model.generation_config)
    defaults = getattr(config, "_get_default_generation_params", None)  # transformers 5; 4.x has them on the class
    if defaults is not None:
        config.update(**defaults(), defaults_only=True)
    config.update(**overrides)
    return config


def _warpers(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None) -> list[Any]:
    """The warpers transformers' ``_get_logits_processor`` adds for these sampling settings, in its order (after
    every other processor), for a batch without beams."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    if temperature is not None and temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k is not None and top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    if min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=min_p, min_tokens_to_keep=1))
    return warpers


def _other_processors(model: Any, config: Any, sampling: dict[str, Any]) -> bool:
    """Whether ``generate`` adds logits processors for ``config`` besides the minimum-length ones and the warpers:
    transformers' own ``_get_logits_processor`` asked, so the answer follows its version. True where it cannot say."""
    import warnings

    from transformers import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    plain = copy.deepcopy(config)
    plain.do_sample = False  # no warpers
    try:
        with warnings.catch_warnings():  # its notes on arguments a real call would have (encoder ids and the like)
            warnings.simplefilter("ignore")
            processors = model._get_logits_processor(
                generation_config=plain,
                input_ids_seq_length=1,
                prefix_allowed_tokens_fn=sampling.get("prefix_allowed_tokens_fn"),
                device="cpu",
            )
    except Exception:  # another transformers, or settings it refuses (generate will then say why)
        return True
    length = (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)
    return any(not isinstance(p, length) for p in processors)


def cpu_generate_kwargs(model: Any, sampling: dict[str, Any]) -> dict[str, Any]:
    """``generate`` keyword arguments that sample the tokens ``sampling`` would, by :class:`TopKSampler` (top-k set,
    as transformers' default is) or the warpers then :class:`SameDrawSampler`; or ``sampling`` unchanged where it
    is greedy, brings its own logits processors or uses what this module does not reproduce. Where the call would
    add no logits processors but the minimum-length ones, :class:`TopKSampler` does their work too."""
    if not sampling.get("do_sample") or sampling.get("logits_processor") is not None:
        return sampling
    from transformers import LogitsProcessorList

    config = _effective_config(model, sampling)
    unsupported = (
        (config.num_beams or 1) > 1
        or getattr(config, "top_h", None) is not None
        or (config.typical_p is not None and config.typical_p < 1.0)
        or 0.0 < (config.epsilon_cutoff or 0.0) < 1.0
        or 0.0 < (config.eta_cutoff or 0.0) < 1.0
        or getattr(config, "watermarking_config", None) is not None
        or config.renormalize_logits
    )
    if unsupported:
        return sampling
    rest = {k: v for k, v in sampling.items() if k not in ("do_sample", "temperature", "top_k", "top_p", "min_p")}
    if isinstance(config.top_k, int) and config.top_k > 0 and config.min_p is None:
        length: dict[str, Any] = {}
        # generate replaces min_length by the prompt's length plus min_new_tokens where that is given.
        min_length = 0 if config.min_new_tokens is not None else config.min_length or 0
        if (min_length > 0 or (config.min_new_tokens or 0) > 0) and not _other_processors(model, config, sampling):
            eos = config.eos_token_id  # the minimum lengths are the only processors before it: its to do
            eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
            length = {"eos": eos, "min_length": min_length, "min_new_tokens": config.min_new_tokens}
            rest.update(min_length=0, min_new_tokens=None)
        sampler = TopKSampler(
            config.top_k, config.temperature, config.top_p, **length, reuse_output=not config.output_scores
        )
        return {**rest, "do_sample": False, "logits_processor": LogitsProcessorList([sampler])}
    warpers = _warpers(config.temperature, config.top_k, config.top_p, config.min_p)
    return {**rest, "do_sample": False, "logits_processor": LogitsProcessorList([*warpers, SameDrawSampler()])}


def _step_rows(layer: nn.Linear, x: Tensor) -> int | None:
    """The rows of ``x`` when a decoding step's product applies to it (:data:`TRANSPOSED_ROWS` of them, no gradient,
    the weight's dtype); None when ``nn.Linear``'s own product does."""
    low, high = TRANSPOSED_ROWS
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    if not (low <= rows <= high) or x.requires_grad or x.dtype != layer.weight.dtype:
        return None
    return rows


def _transposed_forward(layer: nn.Linear, contiguous: bool) -> Any:
    def forward(self: nn.Linear, x: Tensor) -> Tensor:
        rows = _step_rows(self, x)
        if rows is None:
            return nn.functional.linear(x, self.weight, self.bias)
        out = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
        if contiguous:
            out = out.contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.weight.shape[0])

    return types.MethodType(forward, layer)


def _packed_forward(layer: nn.Linear, rows_hint: int) -> Any:
    """``layer``'s forward for decoding through its weight packed by oneDNN for ``rows_hint`` rows (packed once, when
    the block starts: the weights change between generations, never within one)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), rows_hint)

    def forward(self: nn.Linear, x: Tensor) -> Tensor:
        rows = _step_rows(self, x)
        if rows is None:
            return nn.functional.linear(x, self.weight, self.bias)
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.weight.shape[0])

    return types.MethodType(forward, layer)


@functools.cache
def packing_available() -> bool:
    """Whether this torch has oneDNN's packed linear (``torch.ops.mkldnn``, as its CPU compiler uses) and it computes
    ``nn.functional.linear``'s product: probed once on a small layer."""
    try:
        # Never the global generator: the probe runs inside a seeded generate call.
        w, x = torch.linspace(-1, 1, 128).view(8, 16), torch.linspace(1, -2, 64).view(4, 16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except Exception:  # an operator missing or refusing on this build (another CPU, another torch): no packing
        return False
    return bool(torch.backends.mkldnn.is_available()) and torch.allclose(got, x @ w.t(), atol=1e-5)


def _spare_memory(needed: int) -> bool:
    """Whether the machine's available memory holds ``needed`` bytes four times over."""
    import psutil  # imported when used, as in training/threads.py

    return psutil.virtual_memory().available >= 4 * needed


@contextmanager
def decoding_linears(model: nn.Module, rows_hint: int) -> Iterator[None]:
    """Within the block, the model's plain fp32 ``nn.Linear`` layers on the CPU multiply 2-256 rows of input (a
    decoding step's) through their weights packed by oneDNN for ``rows_hint`` rows, on any thread count: on the
    2-core CI machine 1.5x faster than :func:`transposed_linears` (SmolLM2's layers at 32 rows, 2 threads: 61 ms
    against 92; bench/README.md §10). The packed copies take the layers' size again in memory, for the block; where
    oneDNN's packing is missing, the weights are not fp32 or memory is short (less than four times the copies
    available), :func:`transposed_linears` instead. The product is the same up to the order of additions."""
    layers = [
        m
        for m in model.modules()
        if type(m) is nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32
    ]
    size = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    if not layers or not packing_available() or not _spare_memory(size):
        with transposed_linears(model):
            yield
        return
    patched = []
    try:
        for module in layers:
            if "forward" not in vars(module):
                module.forward = _packed_forward(module, max(1, rows_hint))
                patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward


@contextmanager
def transposed_linears(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's plain ``nn.Linear`` layers on the CPU compute ``(W @ x.T).T`` for 2-256 rows
    of input when torch runs more than one thread (see the module's docstring); the output layer's result stays a
    transposed view (``generate`` copies the last position's logits anyway), the others are made contiguous for the
    reshapes that follow them."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    patched = []
    if torch.get_num_threads() < 2:  # no faster on one thread (see the module's docstring)
        yield
        return
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.device.type == "cpu" and "forward" not in vars(module):
            module.forward = _transposed_forward(module, contiguous=module is not output)
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


# -- attention over a shared prompt cache ------------------------------------------------------------------------

#: The name under which :func:`_shared_prefix_attention` is registered with transformers' attention (and mask)
#: interfaces; a model runs it only inside :func:`shared_prefix_attention`.
SHARED_PREFIX_ATTENTION = "swarm_gdrive_shared_prefix"
#: The :class:`SharedPrefixLayer` cache that the generation running in this context decodes from.
_ACTIVE_CACHE: ContextVar[Any] = ContextVar("swarm_gdrive_shared_prefix_cache", default=None)


def shared_prefix_supported(model: nn.Module) -> bool:
    """Whether ``model`` can decode from :func:`shared_prefix_cache`: transformers 5 (whose cache layers and attention
    interface this module builds on; 4.x keeps the static cache), fp32 weights, SDPA attention (the kernel this one
    replaces for one-token queries and falls back to otherwise) and only full-attention layers."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return False
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if config is not None else None
    if text is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    parameter = next(model.parameters(), None)
    return (
        not getattr(config, "is_encoder_decoder", False)
        and all(kind == "full_attention" for kind in layer_types)
        and getattr(text, "sliding_window", None) is None
        and parameter is not None
        and parameter.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


def _shared_prefix_layer_class() -> type:
    from transformers.cache_utils import StaticLayer

    class SharedPrefixLayer(StaticLayer):
        """A static cache layer whose prompt part is held in ``parts`` (keys, values) of ``[E, heads, L, D]``, each of
        its E entries standing for ``rows / E`` consecutive rows (the prefix every prompt shares: one entry for all
        rows; each prompt's rest: one entry for its ``copies`` rows), and whose decoded part, ``[rows, heads,
        max_cache_len - prompt, D]``, is written in place. ``update`` returns the decoded part written so far; the
        attention reads the prompt's parts through :func:`_shared_prefix_attention`."""

        def __init__(self, parts: list[tuple[Tensor, Tensor]], rows: int, max_cache_len: int) -> None:
            super().__init__(max_cache_len=max_cache_len)
            parts = [(k, v) for k, v in parts if k.shape[2]]
            if not parts or any(rows % k.shape[0] for k, _ in parts):
                raise ValueError(f"prompt parts of {[k.shape[0] for k, _ in parts]} entries for {rows} rows")
            keys, values = parts[0]
            length = sum(k.shape[2] for k, _ in parts)
            if max_cache_len <= length:
                raise ValueError(f"a cache of {max_cache_len} positions for a prompt part of {length}")
            self.parts, self.prefix_length = parts, length
            self.device, self.batch_size, self.num_heads = keys.device, rows, keys.shape[1]
            self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
            rest = max_cache_len - length
            self.keys = keys.new_zeros(rows, self.num_heads, rest, self.k_head_dim)
            self.values = values.new_zeros(rows, self.num_heads, rest, self.v_head_dim)
            self.written = 0
            self.cumulative_length = torch.tensor(length, dtype=int, device=self.device)
            self.is_initialized = True

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            raise RuntimeError("a shared-prefix cache layer is initialised when it is made")

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
            end = self.written + key_states.shape[-2]
            if end > self.keys.shape[2]:
                needed = self.prefix_length + end
                raise ValueError(f"the shared-prefix cache holds {self.max_cache_len} positions; {needed} needed")
            self.keys[:, :, self.written : end] = key_states
            self.values[:, :, self.written : end] = value_states
            self.cumulative_length.add_(end - self.written)
            self.written = end
            return self.keys[:, :, :end], self.values[:, :, :end]

        def materialized(self) -> tuple[Tensor, Tensor]:
            """Every row's keys and values as a plain cache holds them: the prompt's parts repeated, then the rest."""
            rows = self.batch_size
            keys = [k.repeat_interleave(rows // k.shape[0], dim=0) for k, _ in self.parts]
            values = [v.repeat_interleave(rows // v.shape[0], dim=0) for _, v in self.parts]
            end = self.written
            return torch.cat([*keys, self.keys[:, :, :end]], dim=2), torch.cat(
                [*values, self.values[:, :, :end]], dim=2
            )

        def _unsupported(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("a shared-prefix cache is decoded forward only (no cropping, beams, reordering)")

        crop = reset = reorder_cache = batch_repeat_interleave = batch_select_indices = _unsupported

    return SharedPrefixLayer


@functools.cache
def _register_attention() -> type:
    """Registers :func:`_shared_prefix_attention` (with SDPA's mask) under :data:`SHARED_PREFIX_ATTENTION`, once;
    returns the cache layer class."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, _shared_prefix_attention)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    return _shared_prefix_layer_class()


def shared_prefix_cache(prompt_cache: Any, copies: int, max_cache_len: int, shared: int = 0) -> Any:
    """A static cache of ``max_cache_len`` positions that continues each of the ``P`` prompts of ``prompt_cache``
    (a prefilled transformers cache, one row a prompt) ``copies`` times, the prompts' keys and values held once
    instead of ``copies`` times, and their first ``shared`` positions (a prefix every row holds alike: the chat
    template's system turn) once for all: a decoding step reads them once (:func:`_shared_prefix_attention`)."""
    from transformers.cache_utils import Cache

    layer_class = _register_attention()
    layers = []
    for layer in prompt_cache.layers:
        keys, values = layer.keys, layer.values
        head = (keys[:1, :, :shared], values[:1, :, :shared])
        if shared and not (torch.equal(keys[:, :, :shared], head[0].expand_as(keys[:, :, :shared]))):
            raise ValueError(f"the cache's first {shared} positions differ between its rows: not a shared prefix")
        # Contiguous: a step's products would otherwise gather the strided slices again in every layer.
        parts = [(k.contiguous(), v.contiguous()) for k, v in (head, (keys[:, :, shared:], values[:, :, shared:]))]
        layers.append(layer_class(parts, keys.shape[0] * copies, max_cache_len))
    return Cache(layers=layers)


@contextmanager
def shared_prefix_attention(model: nn.Module, cache: Any) -> Iterator[None]:
    """Within the block, ``model`` (an SDPA one, :func:`shared_prefix_supported`) attends through
    :func:`_shared_prefix_attention` and decodes from ``cache`` (:func:`shared_prefix_cache`)."""
    config = model.config
    before = config._attn_implementation
    token = _ACTIVE_CACHE.set(cache)
    config._attn_implementation = SHARED_PREFIX_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before
        _ACTIVE_CACHE.reset(token)


def _masked(scores: Tensor, mask: Tensor | None) -> Tensor:
    """``scores`` where a boolean ``mask`` allows (``-inf`` elsewhere), or plus an additive float ``mask``."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:  # where: no inverted mask made in every layer's call (25 against 40-60 µs)
        return torch.where(mask, scores, float("-inf"))
    return scores + mask


def _sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float,
    scaling: float | None,
    is_causal: bool | None,
    **kwargs: Any,
) -> tuple[Tensor, Any]:
    """transformers' own SDPA attention, what :func:`_shared_prefix_attention` falls back to."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def _by_entry(x: Tensor, entries: int) -> Tensor:
    """``[rows, kv_heads, rep, n]`` -> ``[entries, kv_heads, rows / entries * rep, n]``: the rows an entry of a
    prompt part stands for, side by side for each key-value head."""
    rows, kv_heads, rep, n = x.shape
    return x.reshape(entries, rows // entries, kv_heads, rep, n).transpose(1, 2).reshape(entries, kv_heads, -1, n)


def _by_row(x: Tensor, shape: torch.Size) -> Tensor:
    """The inverse of :func:`_by_entry`, to ``shape``'s rows, key-value heads and ``rep`` (the last size ``x``'s)."""
    rows, kv_heads, rep, _ = shape
    n = x.shape[-1]
    return x.view(x.shape[0], kv_heads, -1, rep, n).transpose(1, 2).reshape(rows, kv_heads, rep, n)


def _shared_prefix_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """SDPA attention for a one-token query over a :class:`SharedPrefixLayer`: for each part of the prompt, the rows
    an entry stands for (all rows for the shared prefix, a prompt's ``G`` copies for its rest; each row with ``H =
    kv_heads * rep`` query heads) multiply the entry's keys and values once, as one product per key-value head,
    instead of reading a copy for every row; the rows' own decoded positions are attended row by row; one softmax
    over all. A decoding step of 32 SmolLM2 sequences of 113-token prompts read 8.7 MB of keys and values a layer
    through SDPA, 2.4 MB this way (bench/README.md §10). The result is SDPA's up to the order of additions. Anything
    else (a longer query, dropout, extra terms) runs SDPA on the materialised cache."""
    cache = _ACTIVE_CACHE.get()
    if cache is None:  # not decoding from a shared-prefix cache: SDPA itself
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    index = getattr(module, "layer_idx", None)
    layer = cache.layers[index] if isinstance(index, int) and 0 <= index < len(cache.layers) else None
    if layer is None or key.data_ptr() != layer.keys.data_ptr() or key.shape[2] != layer.written:
        # Keys from elsewhere would be attended without their prompt part: refuse rather than compute that.
        raise RuntimeError(f"{type(module).__name__} (layer {index}) attends to keys not from the shared-prefix cache")
    extras = any(kwargs.get(name) is not None for name in ("softcap", "s_aux", "sliding_window", "position_bias"))
    if query.shape[2] != 1 or dropout or extras:
        key, value = layer.materialized()
        if attention_mask is not None:
            attention_mask = attention_mask[..., : key.shape[2]]
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    queries = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    part_scores = [
        _by_row(torch.matmul(_by_entry(queries, k.shape[0]), k.transpose(-1, -2)), queries.shape)
        for k, _ in layer.parts
    ]
    scores = torch.cat([*part_scores, torch.matmul(queries, key.transpose(-1, -2))], dim=-1).mul_(scale)
    mask = attention_mask[..., : scores.shape[-1]] if attention_mask is not None else None
    probs = torch.softmax(_masked(scores, mask), dim=-1)
    out = torch.matmul(probs[..., layer.prefix_length :], value)
    start = 0
    for keys, values in layer.parts:
        end = start + keys.shape[2]
        out += _by_row(torch.matmul(_by_entry(probs[..., start:end], keys.shape[0]), values), queries.shape)
        start = end
    return out.reshape(rows, 1, heads, -1), None
