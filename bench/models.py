"""The model the generation and training benchmarks run on, and the prompts and completions they use."""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import torch

from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_CACHE = Path("~/.cache/swarm-gdrive/models").expanduser()

QUESTIONS = [
    f"What is {a} + {b}? Explain your steps, then answer."
    for a, b in [(3, 4), (12, 9), (7, 15), (21, 8), (5, 5), (30, 12), (9, 27), (14, 6)]
]


def model_source(model: str, cache: Path = DEFAULT_CACHE) -> str:
    """A folder holding the model: ``model`` itself if it is one, else the packaged model's converted cache."""
    return model if Path(model).is_dir() else resolve_model(model, cache).source


def load(model: str, device: torch.device, random_init: bool, cache: Path = DEFAULT_CACHE) -> tuple[Any, Any]:
    """The model in float32 on ``device`` and its left-padding tokenizer.

    With ``random_init`` the model is built from its config with random weights (for a machine the
    weights cannot reach): speed and memory are the architecture's, rewards are meaningless.
    """
    source = model_source(model, cache)
    if not random_init:
        return load_model_and_tokenizer(source, device, torch.float32)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32).to(device)
    net.generation_config.pad_token_id = tokenizer.pad_token_id
    return net, tokenizer


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that a wall-clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(steps: int, device: torch.device, step: Any) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step``, after one untimed warm-up call."""
    step()
    out = []
    for _ in range(steps):
        sync(device)
        started = time.perf_counter()
        step()
        sync(device)
        out.append(time.perf_counter() - started)
    return out


def completion_lengths(count: int, max_len: int, seed: int = 0) -> list[int]:
    """Ragged completion lengths between half of ``max_len`` and ``max_len``, as sampling gives."""
    rng = random.Random(seed)
    return [rng.randint(max(1, max_len // 2), max_len) for _ in range(count)]


def fixed_completions(
    prompts: int, generations: int, max_len: int, vocab: int, eos_id: int, seed: int = 0
) -> list[list[list[int]]]:
    """Token ids of ``prompts`` x ``generations`` completions with ragged lengths, ending in eos.

    The tokens are random: the cost of an update depends on the lengths, not on which tokens they are.
    """
    rng = random.Random(seed + 1)
    lengths = completion_lengths(prompts * generations, max_len, seed)
    flat = [[rng.randrange(vocab) for _ in range(n - 1)] + [eos_id] for n in lengths]
    return [flat[p * generations : (p + 1) * generations] for p in range(prompts)]


def add_model_options(parser: argparse.ArgumentParser, prompts: int, generations: int, new_tokens: int) -> None:
    """The options the generation and training parts share: model, device, batch shape, output."""
    parser.add_argument("--model", default=DEFAULT_MODEL, help="packaged model name or a model folder")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    parser.add_argument("--random-init", action="store_true", help="architecture from the config, random weights")
    parser.add_argument("--prompts", type=int, default=prompts, help="P")
    parser.add_argument("--generations", type=int, default=generations, help="G, completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=new_tokens, help="completion length (the longest)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="converted-model cache")
    parser.add_argument("--tag", default=None, help="result file tag (default: the machine's)")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
