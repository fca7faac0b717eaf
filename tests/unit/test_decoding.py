"""Faster CPU decoding (swarm_gdrive.training.decoding): the same draws as torch.multinomial, the same products as
nn.Linear, the same tokens as transformers' own sampling."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from swarm_gdrive.training import decoding  # noqa: E402
from swarm_gdrive.training.decoding import (  # noqa: E402
    SameDrawSampler,
    TopKSampler,
    cpu_generate_kwargs,
    decoding_linears,
    same_draw,
    transposed_linears,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def two_threads() -> Any:
    """The transposed linears apply only where torch runs more than one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def _probs(rows: int, vocab: int, keep: int | None, seed: int) -> Any:
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    if keep is not None:  # what a top-k warper leaves: `keep` entries a row
        cut = torch.topk(logits, keep).values[:, -1:]
        logits = logits.masked_fill(logits < cut, float("-inf"))
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("keep", [None, 50, 1])
def test_same_draw_gives_torch_multinomials_tokens_and_generator_state(keep: int | None) -> None:
    for seed in range(40):
        probs = _probs(8, 3000, keep, seed)
        torch.manual_seed(seed)
        expected, after = torch.multinomial(probs, 1), torch.rand(4)
        torch.manual_seed(seed)
        got, got_after = same_draw(probs), torch.rand(4)
        assert torch.equal(got, expected)
        assert torch.equal(got_after, after)


def _multinomial_steps(steps: list[Any], seed: int) -> tuple[list[Any], Any]:
    torch.manual_seed(seed)
    return [torch.multinomial(p, 1) for p in steps], torch.rand(4)


def test_uniforms_drawn_ahead_give_the_same_tokens_and_generator_state() -> None:
    """A helper thread draws each next step's uniforms from a copy of the generator; one drawn for another shape is
    dropped and drawn anew, and the one no step took leaves the generator where it was: tokens and the generator
    after are torch's."""
    steps = [_probs(6, 500, keep, seed) for seed, keep in enumerate([50, None, 50, 1, 50])]
    steps.insert(3, _probs(2, 300, 50, 9))  # another shape between steps
    expected, after = _multinomial_steps(steps, 7)
    torch.manual_seed(7)
    taken = []
    with decoding.prefetched_uniforms():
        for probs in steps:
            ahead = decoding._PREFETCH.get().pending is not None
            got = same_draw(probs)
            taken.append(ahead)
            assert torch.equal(got, expected[len(taken) - 1])
    assert decoding._PREFETCH.get() is None
    assert taken == [False, True, True, True, True, True]
    assert torch.equal(torch.rand(4), after)


def test_a_draw_between_steps_gets_its_own_numbers_and_the_next_step_its_own() -> None:
    """Something else drawing from the generator between two steps takes the numbers it would have taken without
    the draw ahead, which is dropped, and the next step draws after it."""
    steps = [_probs(4, 200, 50, 1), _probs(4, 200, 50, 2), _probs(4, 200, None, 3)]
    torch.manual_seed(5)
    expected = [torch.multinomial(steps[0], 1), torch.rand(3), torch.multinomial(steps[1], 1)]
    expected += [torch.multinomial(steps[2], 1), torch.rand(4)]
    torch.manual_seed(5)
    with decoding.prefetched_uniforms():
        got = [same_draw(steps[0]), torch.rand(3), same_draw(steps[1]), same_draw(steps[2])]
    got.append(torch.rand(4))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_uniforms_drawn_ahead_leave_the_generator_in_order_after_an_error() -> None:
    probs = _probs(4, 200, 50, 2)
    expected, after = _multinomial_steps([probs], 3)
    torch.manual_seed(3)
    with pytest.raises(KeyError), decoding.prefetched_uniforms():
        assert torch.equal(same_draw(probs), expected[0])
        raise KeyError("stop")
    assert torch.equal(torch.rand(4), after)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_helper_thread_runs_at_the_lowest_priority() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # on Linux, the calling thread's
    with decoding.prefetched_uniforms():
        same_draw(_probs(2, 100, None, 0))
        native = [t.native_id for t in decoding._PREFETCH.get().pool._threads]
        assert native and all(os.getpriority(os.PRIO_PROCESS, n) == 19 for n in native)
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the caller keeps its own


@pytest.mark.parametrize(
    ("row", "message"),
    [([0.5, float("nan")], "inf"), ([0.5, -0.1], "element < 0"), ([0.0, 0.0], "sum of probabilities")],
)
def test_same_draw_refuses_what_torch_multinomial_refuses(row: list[float], message: str) -> None:
    probs = torch.tensor([[0.3, 0.7], row])
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(probs, 1)
    with pytest.raises(RuntimeError, match=message):
        same_draw(probs)


def test_a_zero_uniform_on_an_impossible_token_picks_it_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """exponential_ can return 0 (probability 2^-53 an entry); torch's p / q is then 0 / 0 = NaN, which its argmax
    picks. The sparse path would skip that entry, so a zero uniform takes the full division."""
    probs = torch.zeros(1, 12)
    probs[0, 1], probs[0, 2] = 0.6, 0.4  # sparse: 2 of 12 entries possible
    uniforms = torch.full((1, 12), 0.5, dtype=torch.float64)
    uniforms[0, 7] = 0.0
    monkeypatch.setattr(decoding.torch, "rand", lambda *a, **k: uniforms.clone())
    assert same_draw(probs).item() == 7


@pytest.mark.parametrize(
    ("row", "uniform", "token"),
    [
        ({2: 0.5, 5: 0.5}, 0.5, 2),  # a tie: argmax's first
        ({3: 1e-45, 6: 1e-45}, 0.999999, 0),  # every p / q underflows to 0: argmax's first 0, an impossible token
    ],
)
def test_the_sparse_draw_picks_what_the_full_division_picks(
    monkeypatch: pytest.MonkeyPatch, row: dict[int, float], uniform: float, token: int
) -> None:
    probs = torch.zeros(2, 16)
    probs[0, 9] = 1.0
    for column, p in row.items():
        probs[1, column] = p
    uniforms = torch.full((2, 16), uniform, dtype=torch.float64)
    monkeypatch.setattr(decoding.torch, "rand", lambda *a, **k: uniforms.clone())
    full = torch.argmax(probs / (-torch.log1p(-uniforms)).to(probs.dtype), dim=-1)
    assert same_draw(probs).squeeze(1).tolist() == full.tolist() == [9, token]


def test_greedy_and_unreproduced_settings_keep_generates_own_sampling(loaded_tiny: Any) -> None:
    model, _ = loaded_tiny
    assert cpu_generate_kwargs(model, {"do_sample": False}) == {"do_sample": False}
    typical = {"do_sample": True, "typical_p": 0.9}
    assert cpu_generate_kwargs(model, typical) == typical


def test_sampling_becomes_transformers_warpers_in_its_order_then_the_sampler(loaded_tiny: Any) -> None:
    model, _ = loaded_tiny
    kwargs = cpu_generate_kwargs(model, {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 5})
    assert kwargs["do_sample"] is False and kwargs["max_new_tokens"] == 5 and "temperature" not in kwargs
    # top_k is transformers' default of 50 where neither the model nor the call sets it: one processor for them all,
    # which falls back to the warpers, in transformers' order, then the sampler.
    [sampler] = kwargs["logits_processor"]
    assert isinstance(sampler, TopKSampler) and (sampler.top_k, sampler.temperature, sampler.top_p) == (50, 0.7, 0.9)
    names = [type(p).__name__ for p in sampler.reference]
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "SameDrawSampler"]
    assert "min_new_tokens" not in kwargs and sampler.eos == []  # no minimum length: nothing taken over
    for other in ({"top_k": 0}, {"min_p": 0.05}):  # no top-k to start from: the warpers, then the sampler
        kwargs = cpu_generate_kwargs(model, {"do_sample": True, "temperature": 0.7, **other})
        names = [type(p).__name__ for p in kwargs["logits_processor"]]
        assert names[-1] == "SameDrawSampler" and "TopKSampler" not in names


def test_the_sampler_takes_over_the_minimum_lengths_only_where_they_are_the_only_other_processors(
    loaded_tiny: Any,
) -> None:
    model, tokenizer = loaded_tiny
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    kwargs = cpu_generate_kwargs(model, {"do_sample": True, "min_new_tokens": 4, "max_new_tokens": 6})
    [sampler] = kwargs["logits_processor"]
    assert (kwargs["min_new_tokens"], kwargs["min_length"]) == (None, 0)  # generate adds neither processor
    assert (sampler.eos, sampler.min_new_tokens, sampler.min_length) == (sorted(eos), 4, 0)
    # Both given: generate counts min_new_tokens from the prompt and drops min_length.
    [sampler] = cpu_generate_kwargs(model, {"do_sample": True, "min_length": 50, "min_new_tokens": 2})[
        "logits_processor"
    ]
    assert (sampler.min_length, sampler.min_new_tokens) == (0, 2)
    [sampler] = cpu_generate_kwargs(model, {"do_sample": True, "min_length": 9})["logits_processor"]
    assert (sampler.min_length, sampler.min_new_tokens) == (9, 0)
    # A repetition penalty comes between them and the warpers in transformers' order: generate keeps them.
    call = {"do_sample": True, "min_new_tokens": 4, "repetition_penalty": 1.3}
    kwargs = cpu_generate_kwargs(model, call)
    assert kwargs["min_new_tokens"] == 4 and kwargs["logits_processor"][0].eos == []
    # A call's own logits processors: generate's own sampling, untouched.
    own = {"do_sample": True, "logits_processor": ["given"]}
    assert cpu_generate_kwargs(model, own) is own


def _reference(sampler: TopKSampler, prompt_length: int) -> Any:
    """transformers' processors that ``sampler`` stands for, in generate's order, then SameDrawSampler."""
    from transformers import LogitsProcessorList, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    first: list[Any] = []
    if sampler.eos and sampler.min_length:
        first.append(MinLengthLogitsProcessor(sampler.min_length, sampler.eos))
    if sampler.eos and sampler.min_new_tokens:
        first.append(MinNewTokensLengthLogitsProcessor(prompt_length, sampler.min_new_tokens, sampler.eos))
    return LogitsProcessorList([*first, *sampler.reference])


def _fell_back(sampler: TopKSampler) -> list[int]:
    """Counts the steps ``sampler`` hands to the processors themselves."""
    calls = [0]
    reference = sampler.reference

    def counted(input_ids: Any, scores: Any) -> Any:
        calls[0] += 1
        return reference(input_ids, scores)

    sampler.reference = counted
    return calls


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": 50},
        {"top_k": 50, "temperature": 0.7},
        {"top_k": 20, "temperature": 1.3, "top_p": 0.9},
        {"top_k": 50, "top_p": 0.5},
        {"top_k": 1},
        {"top_k": 5, "top_p": 1e-9},  # top-p keeps the one largest, even where the row sums to just under 1
        {"top_k": 50, "eos": [3, 7], "min_new_tokens": 3},
        {"top_k": 8, "temperature": 0.5, "eos": [0], "min_length": 6, "top_p": 0.8},
    ],
)
def test_the_top_k_sampler_draws_the_tokens_and_generator_state_of_the_processors(settings: dict[str, Any]) -> None:
    """Step by step on random scores (a growing sequence, so minimum lengths end part-way): the same one-hot rows as
    transformers' processors then SameDrawSampler, and the same generator state after, without falling back."""
    for seed in range(12):
        sampler = TopKSampler(**settings, reuse_output=True)
        reference = _reference(sampler, prompt_length=4)
        fell_back = _fell_back(sampler)
        generator = torch.Generator().manual_seed(seed)
        for step in range(5):
            input_ids = torch.zeros(6, 4 + step, dtype=torch.long)
            scores = torch.randn(6, 400, generator=generator) * 3
            scores[:, 3] += 8  # an end-of-sequence id the likeliest: the minimum lengths matter
            torch.manual_seed(seed * 10 + step)
            expected, after = reference(input_ids, scores.clone()), torch.rand(4)
            torch.manual_seed(seed * 10 + step)
            got = sampler(input_ids, scores)
            assert torch.equal(got, expected)
            assert torch.equal(torch.rand(4), after)
        assert fell_back == [0]


@pytest.mark.parametrize("case", ["tie at the k-th", "tie within top-p", "infinite", "nan"])
def test_the_top_k_sampler_hands_what_it_cannot_decide_to_the_processors(case: str) -> None:
    settings = {"top_k": 4, "top_p": 0.9 if case == "tie within top-p" else None}
    generator = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 50, generator=generator)
    if case == "tie at the k-th":  # the 4th and 5th largest equal: top-k keeps both
        top = torch.topk(scores[1], 4).values
        scores[1, scores[1] < top[-1]] = scores[1, scores[1] < top[-1]].clamp(max=float(top[-1]) - 1)
        scores[1, 40] = top[-1]
    elif case == "tie within top-p":
        scores[0, :3] = 9.0
    elif case == "infinite":
        scores[2, 5] = float("inf")
    else:
        scores[0, 5] = float("nan")
    sampler = TopKSampler(**settings)
    reference = _reference(sampler, prompt_length=1)
    fell_back = _fell_back(sampler)
    input_ids = torch.zeros(3, 1, dtype=torch.long)
    if case in ("infinite", "nan"):  # torch.multinomial's refusal, as the processors give it
        with pytest.raises(RuntimeError, match="inf"):
            reference(input_ids, scores.clone())
        with pytest.raises(RuntimeError, match="inf"):
            sampler(input_ids, scores)
    else:
        torch.manual_seed(1)
        expected, after = reference(input_ids, scores.clone()), torch.rand(4)
        torch.manual_seed(1)
        assert torch.equal(sampler(input_ids, scores), expected)
        assert torch.equal(torch.rand(4), after)
    assert fell_back == [1]


def test_the_top_k_sampler_breaks_equal_ratios_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal logits among the top k and equal uniforms give equal p / q: argmax over the row takes the first in
    vocabulary order, whatever order topk lists them in."""
    scores = -torch.arange(60.0).repeat(4, 1) / 100  # no ties but the equal ones set here
    for row, columns in enumerate([(3, 10), (10, 3, 40), (59, 0), (7, 8, 9)]):
        scores[row, list(columns)] = 5.0
    uniforms = torch.full((4, 60), 0.5, dtype=torch.float64)
    monkeypatch.setattr(decoding, "_uniforms", lambda shape, device: uniforms.clone())
    sampler = TopKSampler(5)
    fell_back = _fell_back(sampler)
    got = sampler(torch.zeros(4, 1, dtype=torch.long), scores).argmax(-1)
    probs = torch.softmax(scores.masked_fill(scores < torch.topk(scores, 5).values[:, -1:], float("-inf")), -1)
    full = torch.argmax(probs / (-torch.log1p(-uniforms)).to(probs.dtype), dim=-1)
    assert got.tolist() == full.tolist() == [3, 3, 0, 7]
    assert fell_back == [0]


def test_the_top_k_sampler_takes_its_uniforms_drawn_ahead() -> None:
    sampler = TopKSampler(50)
    steps = [torch.randn(4, 300, generator=torch.Generator().manual_seed(s)) for s in range(4)]
    torch.manual_seed(8)
    expected = [_reference(sampler, 1)(torch.zeros(4, 1, dtype=torch.long), s.clone()) for s in steps]
    after = torch.rand(4)
    torch.manual_seed(8)
    with decoding.prefetched_uniforms():
        got = [sampler(torch.zeros(4, 1, dtype=torch.long), s) for s in steps]
        assert decoding._PREFETCH.get().pending is not None
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert torch.equal(torch.rand(4), after)


@pytest.fixture(scope="module")
def loaded_tiny(tiny_folder: Path) -> tuple[Any, Any]:
    from swarm_gdrive.training.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_folder), torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "top_k": 0},  # every token possible: the dense division
        {"temperature": 0.9, "top_k": 5, "min_p": 0.05},
    ],
)
def test_generation_samples_the_tokens_generate_samples(
    loaded_tiny: Any, sampling: dict[str, Any], two_threads: None
) -> None:
    model, tokenizer = loaded_tiny
    prompts = tokenizer(["1 2 3", "4 5 6 7 8"], padding=True, return_tensors="pt")
    common = {**prompts, "pad_token_id": tokenizer.pad_token_id}
    plain = {"do_sample": True, "max_new_tokens": 10, "min_new_tokens": 10, **sampling}
    with torch.no_grad():
        torch.manual_seed(3)
        expected = model.generate(**common, **plain, num_return_sequences=3)
        for linears in (transposed_linears(model), decoding_linears(model, 6)):
            torch.manual_seed(3)
            with linears:
                rows = {k: v.repeat_interleave(3, dim=0) for k, v in prompts.items()}
                got = model.generate(**{**common, **rows}, **cpu_generate_kwargs(model, plain))
            assert torch.equal(got, expected)
    assert len({tuple(r) for r in got[:, -10:].tolist()}) > 2  # sampled: not one sequence repeated


@pytest.mark.parametrize("rows", [1, 2, 7, 32, 256, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_linears_compute_what_nn_linear_computes(rows: int, bias: bool, two_threads: None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(24, 40, bias=bias), torch.nn.ReLU(), torch.nn.Linear(40, 8))
    x = torch.randn(rows, 1, 24)
    with torch.no_grad():
        expected = model(x)
        with transposed_linears(model):
            assert all("forward" in vars(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
            got = model(x)
    torch.testing.assert_close(got, expected)
    assert got.shape == (rows, 1, 8)
    assert all("forward" not in vars(m) for m in model.modules())


needs_packing = pytest.mark.skipif(not decoding.packing_available(), reason="this torch has no oneDNN packed linear")


@needs_packing
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 7, 32, 256, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linears_compute_what_nn_linear_computes_on_any_thread_count(
    rows: int, bias: bool, threads: int
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(24, 40, bias=bias), torch.nn.ReLU(), torch.nn.Linear(40, 8))
    x = torch.randn(rows, 1, 24)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            expected = model(x)
            with decoding_linears(model, 32):
                forwards = [vars(m).get("forward") for m in model.modules() if isinstance(m, torch.nn.Linear)]
                assert all(f is not None and "_packed_forward" in f.__func__.__qualname__ for f in forwards)
                got = model(x)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, expected)
    assert got.shape == (rows, 1, 8)
    assert all("forward" not in vars(m) for m in model.modules())


@needs_packing
def test_packed_linears_leave_training_and_restore_the_layers_after_an_error() -> None:
    layer = torch.nn.Linear(6, 5)
    x = torch.randn(4, 6, requires_grad=True)
    with pytest.raises(ValueError), decoding_linears(layer, 4):
        assert "forward" in vars(layer)
        out = layer(x)  # an input that needs gradients takes nn.Linear's own product
        out.sum().backward()
        assert x.grad is not None and out.grad_fn is not None
        raise ValueError("stop")
    assert "forward" not in vars(layer)


@needs_packing
def test_packing_is_probed_without_the_global_generator() -> None:
    decoding.packing_available.cache_clear()  # probed anew here
    torch.manual_seed(5)
    assert decoding.packing_available()
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), drawn)  # the probe drew nothing: a seeded generate call samples the same


@pytest.mark.parametrize("why", ["no packing", "short of memory", "bf16 weights"])
def test_without_packing_the_linears_are_transposed(
    monkeypatch: pytest.MonkeyPatch, two_threads: None, why: str
) -> None:
    layer = torch.nn.Linear(24, 40)
    if why == "no packing":
        monkeypatch.setattr(decoding, "packing_available", lambda: False)
    elif why == "short of memory":
        monkeypatch.setattr(decoding, "_spare_memory", lambda needed: needed < 40 * 24 * 4)
    else:
        layer = layer.to(torch.bfloat16)
    with torch.no_grad(), decoding_linears(layer, 8):
        assert vars(layer)["forward"].__func__.__qualname__.startswith("_transposed_forward")
        got = layer(torch.ones(8, 24, dtype=layer.weight.dtype))
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if why == "bf16 weights" else {}  # bf16 sums in another order
    torch.testing.assert_close(got, layer(torch.ones(8, 24, dtype=layer.weight.dtype)), **tolerance)
    assert "forward" not in vars(layer)


def test_one_thread_keeps_nn_linear() -> None:
    layer = torch.nn.Linear(6, 5)
    with transposed_linears(layer):
        assert "forward" not in vars(layer)


def test_transposed_linears_leave_training_and_restore_the_layers_after_an_error(two_threads: None) -> None:
    layer = torch.nn.Linear(6, 5)
    x = torch.randn(4, 6, requires_grad=True)
    with pytest.raises(ValueError), transposed_linears(layer):
        assert "forward" in vars(layer)
        layer(x).sum().backward()  # an input that needs gradients takes nn.Linear's own product
        assert x.grad is not None
        raise ValueError("stop")
    assert "forward" not in vars(layer)


def test_the_sampler_returns_a_one_hot_row_of_the_drawn_token() -> None:
    scores = torch.log(_probs(3, 100, 10, seed=1))
    torch.manual_seed(0)
    token = same_draw(torch.softmax(scores, dim=-1))
    torch.manual_seed(0)
    out = SameDrawSampler()(torch.zeros(3, 1, dtype=torch.long), scores)
    assert torch.equal(out.argmax(-1, keepdim=True), token)
    assert torch.equal((out == 0).sum(-1), torch.ones(3, dtype=torch.long))


# -- attention over a shared prompt cache ---------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    """What transformers' attention functions read from the module calling them."""

    def __init__(self, layer_idx: int, groups: int) -> None:
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal, self.training = layer_idx, groups, True, False


def _shared_cache(
    prompts: int, copies: int, kv_heads: int, prefix: int, capacity: int, seed: int, shared: int = 0
) -> Any:
    """A shared-prefix cache of two layers from random prompt keys and values, their first ``shared`` positions alike
    in every prompt."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for index in range(2):
        states = [torch.randn(prompts, kv_heads, prefix, 8, generator=gen) for _ in range(2)]
        for state in states:
            state[:, :, :shared] = state[:1, :, :shared]
        cache.update(*states, index)
    return decoding.shared_prefix_cache(cache, copies, prefix + capacity, shared)


@pytest.mark.parametrize(("prompts", "copies", "groups"), [(3, 4, 3), (2, 1, 1), (1, 5, 2), (4, 1, 3)])
@pytest.mark.parametrize("shared", [0, 2])
@pytest.mark.parametrize("mask", ["bool", "float", "none"])
def test_shared_prefix_attention_computes_what_sdpa_computes_on_the_repeated_cache(
    prompts: int, copies: int, groups: int, shared: int, mask: str
) -> None:
    """One-token queries over the prefix every prompt shares held once and each prompt's rest held once equal SDPA
    over every row's copy of them, padding in the prompt part masked (boolean or additive mask, or none), after
    several decoded positions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(7)
    kv_heads, prefix, rows = 2, 9, prompts * copies
    cache = _shared_cache(prompts, copies, kv_heads, prefix, 6, seed=1, shared=shared)
    if shared:
        assert [k.shape[0] for k, _ in cache.layers[0].parts] == [1, prompts]  # the shared prefix once for all
    layer, module = cache.layers[1], _Attention(1, groups)
    allowed = torch.ones(rows, 1, 1, prefix + 6, dtype=torch.bool)
    allowed[:, :, :, 2:4] = False  # padding after a shared prefix, as generation lays prompts out
    allowed[-copies:, :, :, 5] = False  # the last prompt padded more: its rows all masked alike
    masks = {"bool": allowed, "float": torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")), "none": None}
    token = decoding._ACTIVE_CACHE.set(cache)
    try:
        for _ in range(3):
            new = [torch.randn(rows, kv_heads, 1, 8, generator=gen) for _ in range(2)]
            keys, values = layer.update(*new)
            query = torch.randn(rows, kv_heads * groups, 1, 8, generator=gen)
            got, _ = decoding._shared_prefix_attention(module, query, keys, values, masks[mask], scaling=0.3)
            full_keys, full_values = layer.materialized()
            cut = None if masks[mask] is None else masks[mask][..., : full_keys.shape[2]]
            expected, _ = sdpa_attention_forward(module, query, full_keys, full_values, cut, scaling=0.3)
            assert got.shape == expected.shape == (rows, 1, kv_heads * groups, 8)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    finally:
        decoding._ACTIVE_CACHE.reset(token)
    assert layer.written == 3 and int(layer.get_seq_length()) == prefix + 3


def test_shared_prefix_attention_runs_sdpa_on_the_materialised_cache_for_longer_queries() -> None:
    """A query of several positions (not a decoding step) attends over every row's whole cache, as SDPA would."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _shared_cache(2, 3, 2, 5, 4, seed=2)
    layer, module = cache.layers[0], _Attention(0, 2)
    gen = torch.Generator().manual_seed(3)
    keys, values = layer.update(*(torch.randn(6, 2, 2, 8, generator=gen) for _ in range(2)))
    query = torch.randn(6, 4, 2, 8, generator=gen)
    mask = torch.ones(6, 1, 2, 9, dtype=torch.bool).tril(diagonal=5)
    token = decoding._ACTIVE_CACHE.set(cache)
    try:
        got, _ = decoding._shared_prefix_attention(module, query, keys, values, mask)
    finally:
        decoding._ACTIVE_CACHE.reset(token)
    expected, _ = sdpa_attention_forward(module, query, *layer.materialized(), mask[..., :7])
    torch.testing.assert_close(got, expected)


def _dynamic_cache(states: Any) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(states.clone(), states.clone(), 0)
    return cache


def test_a_shared_prefix_cache_is_forward_only_and_bounded() -> None:
    cache = _shared_cache(2, 2, 1, 4, 2, seed=4)
    layer = cache.layers[0]
    assert layer.keys.shape == (4, 1, 2, 8) and [k.shape for k, _ in layer.parts] == [(2, 1, 4, 8)]
    with pytest.raises(ValueError, match="first 2 positions differ between its rows"):
        decoding.shared_prefix_cache(_dynamic_cache(torch.arange(16.0).view(2, 1, 1, 8).expand(2, 1, 3, 8)), 2, 6, 2)
    for refused in (lambda: layer.crop(-1), lambda: layer.reorder_cache(torch.arange(4)), lambda: cache.crop(-1)):
        with pytest.raises(NotImplementedError, match="forward only"):
            refused()
    layer.update(torch.zeros(4, 1, 2, 8), torch.zeros(4, 1, 2, 8))
    with pytest.raises(ValueError, match="holds 6 positions; 7 needed"):
        layer.update(torch.zeros(4, 1, 1, 8), torch.zeros(4, 1, 1, 8))


def test_shared_prefix_attention_restores_the_models_attention_after_an_error(loaded_tiny: Any) -> None:
    model, _ = loaded_tiny
    assert model.config._attn_implementation == "sdpa" and decoding.shared_prefix_supported(model)
    with pytest.raises(KeyError), decoding.shared_prefix_attention(model, object()):
        assert model.config._attn_implementation == decoding.SHARED_PREFIX_ATTENTION
        raise KeyError
    assert model.config._attn_implementation == "sdpa" and decoding._ACTIVE_CACHE.get() is None


def test_models_the_shared_prefix_attention_does_not_apply_to(loaded_tiny: Any) -> None:
    """Not fp32, not SDPA, or sliding-window layers: the static cache of G copies stays."""
    model, _ = loaded_tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    sliding = copy.deepcopy(model)
    sliding.config.sliding_window = 4
    assert decoding.shared_prefix_supported(model)
    assert not any(decoding.shared_prefix_supported(m) for m in (half, eager, sliding))


def test_shared_prefix_attention_refuses_keys_that_are_not_the_caches() -> None:
    """Keys from elsewhere while a shared-prefix cache is active would be attended without their prompt part."""
    cache = _shared_cache(1, 2, 1, 3, 2, seed=5)
    keys, values = cache.layers[0].update(torch.zeros(2, 1, 1, 8), torch.zeros(2, 1, 1, 8))
    query = torch.zeros(2, 1, 1, 8)
    token = decoding._ACTIVE_CACHE.set(cache)
    try:
        for module, k in ((_Attention(0, 1), keys.clone()), (_Attention(5, 1), keys)):
            with pytest.raises(RuntimeError, match="not from the shared-prefix cache"):
                decoding._shared_prefix_attention(module, query, k, values, None)
    finally:
        decoding._ACTIVE_CACHE.reset(token)
    got, _ = decoding._shared_prefix_attention(_Attention(0, 1), query, keys, values, None)  # no cache: plain SDPA
    assert got.shape == (2, 1, 1, 8)
