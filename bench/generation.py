"""Generation speed: this project's batched generation against the way it generated before, one ``generate``
call per completion, and the limit of the machine it runs on.

Same model, same prompts, same sampling, on one device. Batched (``PolicyTrainer.generate``): all P prompts x G
completions in as few calls as GEN_BATCH_SIZE allows, the prefix the prompts share and each prompt's rest
prefilled once, decoding from a static KV cache on the CPU. Before (the code of issue #26's start): one
``generate`` call per chunk with ``num_return_sequences=G``, which prefills every copy of every prompt and grows a
dynamic cache. One call per completion: a generation batch of 1 and G = 1 per call, as the original project
generated; a sample of such calls is timed (the rate is compared, not the total). Every completion is forced to full
length (``min_new_tokens``) so every way produces the same number of tokens; batched and before sample the same
tokens for a seed (the share of identical completions is reported).

The limit: a decoding step of S sequences needs 2 x parameters x S floating-point operations and one read of the
weights, so it takes at least max(FLOPs / matmul rate, weight bytes / memory bandwidth), both measured here and now:
the rate of an S x hidden x intermediate fp32 matmul (the model's MLP shape) on the threads torch uses, and the
bandwidth of a 512 MiB copy (bytes read + written). Tokens per second at the limit are S / that time, measured
just before and just after the batched generation; the share is against their mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result
from bench.models import QUESTIONS, add_model_options, load, sync
from swarm_gdrive.training import policy
from swarm_gdrive.training.policy import PolicyTrainer, TrainSettings, peak_memory_mb, pick_device
from swarm_gdrive.training.tasks import build_messages


def generate_before(trainer: PolicyTrainer, prompts: list[list[int]], g: int, seed: int) -> tuple[list[Any], float]:
    """Completions as ``PolicyTrainer.generate`` made them before issue #26: left-padded chunks, one transformers
    ``generate`` call each with ``num_return_sequences=G``; the same seeding and trimming. Returns them and seconds."""
    started = time.monotonic()
    torch.manual_seed(seed)
    per_call = max(1, trainer.settings.gen_batch_size // g)
    rows: list[list[int]] = []
    for start in range(0, len(prompts), per_call):
        chunk = {"input_ids": prompts[start : start + per_call]}
        batch = trainer.tokenizer.pad(chunk, padding=True, return_tensors="pt").to(trainer.device)
        with torch.no_grad():
            out = trainer.model.generate(
                **batch, do_sample=True, temperature=trainer.settings.temperature, top_p=trainer.settings.top_p,
                max_new_tokens=trainer.settings.max_new_tokens, num_return_sequences=g,
                pad_token_id=trainer.tokenizer.pad_token_id,
            )  # fmt: skip
        rows += [trainer._trim(r) for r in out[:, batch["input_ids"].shape[1] :].tolist()]
    sync(trainer.device)
    return [rows[p * g : (p + 1) * g] for p in range(len(prompts))], time.monotonic() - started


def _median_seconds(work: Any, repeats: int) -> float:
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def machine_limit(model: Any, sequences: int) -> dict[str, Any]:
    """The decoding step's bound on this machine: matmul rate and memory bandwidth, measured now (CPU)."""
    config = model.config
    hidden, inner = config.hidden_size, getattr(config, "intermediate_size", 4 * config.hidden_size)
    a, b = torch.randn(sequences, hidden), torch.randn(hidden, inner)
    matmul_s = _median_seconds(lambda: a @ b, 50)
    gflops = 2 * sequences * hidden * inner / matmul_s / 1e9
    source, target = torch.empty(2**27), torch.empty(2**27)  # 512 MiB each
    copy_s = _median_seconds(lambda: target.copy_(source), 5)
    bandwidth = 2 * source.numel() * 4 / copy_s / 1e9
    params = sum(p.numel() for p in model.parameters())
    step_flops, step_bytes = 2 * params * sequences, params * 4
    compute_s, memory_s = step_flops / (gflops * 1e9), step_bytes / (bandwidth * 1e9)
    return {
        "matmul_shape": [sequences, hidden, inner], "matmul_gflops": gflops, "copy_gb_per_s": bandwidth,
        "step_gflop": step_flops / 1e9, "step_weight_mb": step_bytes / 1e6, "step_compute_ms": compute_s * 1e3,
        "step_memory_ms": memory_s * 1e3, "tokens_per_s": sequences / max(compute_s, memory_s),
        "threads": torch.get_num_threads(),
    }  # fmt: skip


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Tokens per second of every way of generating, and the machine's limit."""
    model, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    sequences = args.prompts * args.generations
    settings = TrainSettings(max_new_tokens=args.new_tokens, gen_batch_size=sequences)
    trainer = PolicyTrainer(model, tokenizer, settings, device)
    prompts = [trainer.prompt_ids(build_messages(q)) for q in (QUESTIONS * args.prompts)[: args.prompts]]
    model.generation_config.min_new_tokens = args.new_tokens
    trainer.generate(prompts[:1], 2, seed=0)  # warm-up
    limit = machine_limit(model, sequences) if device.type == "cpu" else None

    sync(device)
    batched = trainer.generate(prompts, args.generations, seed=1)
    sync(device)
    # Measured again right after: this host's speed moves from one minute to the next (the hot matmul at 97-141
    # GFLOP/s within an hour), so the share is taken against the two measurements' mean.
    limit_after = machine_limit(model, sequences) if device.type == "cpu" else None
    plain = None
    if device.type == "cpu":  # the same batching with transformers' own sampler and linear layers
        policy.FAST_CPU_DECODING = False
        try:
            plain = trainer.generate(prompts, args.generations, seed=1)
        finally:
            policy.FAST_CPU_DECODING = True
    before, before_s = generate_before(trainer, prompts, args.generations, seed=1)
    same = sum(a == b for x, y in zip(batched.token_ids, before, strict=True) for a, b in zip(x, y, strict=True))
    single = PolicyTrainer(model, tokenizer, dataclasses.replace(settings, gen_batch_size=1), device)
    tokens, started = 0, time.monotonic()
    for call in range(args.single_calls):
        tokens += single.generate([prompts[call % len(prompts)]], 1, seed=100 + call).new_tokens
    sync(device)
    single_s = time.monotonic() - started
    batched_rate, single_rate = batched.new_tokens / batched.seconds, tokens / single_s
    limit_rate = (limit["tokens_per_s"] + limit_after["tokens_per_s"]) / 2 if limit else None
    before_rate = sequences * args.new_tokens / before_s
    return {
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "threads": torch.get_num_threads(),
        "batched": {"sequences": sequences, "new_tokens": batched.new_tokens,
                    "seconds": batched.seconds, "tokens_per_s": batched_rate},
        "batched_plain_decoding": None if plain is None else {
            "sequences": sequences, "new_tokens": plain.new_tokens, "seconds": plain.seconds,
            "tokens_per_s": plain.new_tokens / plain.seconds,
            "identical_completions": sum(a == b for x, y in zip(batched.token_ids, plain.token_ids, strict=True)
                                         for a, b in zip(x, y, strict=True))},
        "before": {"sequences": sequences, "new_tokens": sequences * args.new_tokens, "seconds": before_s,
                   "tokens_per_s": before_rate, "identical_completions": same},
        "one_call_per_completion": {"calls_timed": args.single_calls, "new_tokens": tokens, "seconds": single_s,
                                    "tokens_per_s": single_rate},
        "ratio_batched_over_one_call": batched_rate / single_rate,
        "ratio_batched_over_before": batched_rate / before_rate,
        "limit": limit,
        "limit_after": limit_after,
        "limit_tokens_per_s": limit_rate,
        "share_of_limit": batched_rate / limit_rate if limit_rate else None,
        "peak_memory_mb": peak_memory_mb(device),
    }  # fmt: skip


def render(result: dict[str, Any]) -> str:
    m = result["measured"]
    s = result["settings"]
    rows = [
        ["batched (this project)", m["batched"]["sequences"], m["batched"]["new_tokens"], m["batched"]["seconds"],
         m["batched"]["tokens_per_s"]],
        *([["batched, transformers' sampler and linears (FAST_CPU_DECODING off)",
            m["batched_plain_decoding"]["sequences"], m["batched_plain_decoding"]["new_tokens"],
            m["batched_plain_decoding"]["seconds"], m["batched_plain_decoding"]["tokens_per_s"]]]
          if m.get("batched_plain_decoding") else []),
        ["before issue #26 (num_return_sequences)", m["before"]["sequences"], m["before"]["new_tokens"],
         m["before"]["seconds"], m["before"]["tokens_per_s"]],
        ["one generate call per completion", m["one_call_per_completion"]["calls_timed"],
         m["one_call_per_completion"]["new_tokens"], m["one_call_per_completion"]["seconds"],
         m["one_call_per_completion"]["tokens_per_s"]],
    ]  # fmt: skip
    parts = [
        "# Generation benchmark",
        machine_line(result["machine"]),
        f"Model {s['model']}{' (random weights)' if s['random_init'] else ''}, fp32, {s['prompts']} prompts x "
        f"{s['generations']} completions x {s['new_tokens']} new tokens (forced full length), device {s['device']}, "
        f"{m['threads']} torch threads.",
        markdown_table(["way", "sequences / calls", "new tokens", "seconds", "tokens/s"], rows),
        f"Batched over before: **{m['ratio_batched_over_before']:.2f}x** ({m['before']['identical_completions']} of "
        f"{m['before']['sequences']} completions identical for the seed); over one call per completion: "
        f"**{m['ratio_batched_over_one_call']:.2f}x**.",
    ]
    if m.get("batched_plain_decoding"):
        plain = m["batched_plain_decoding"]
        parts.append(
            f"The CPU decoding of `training/decoding.py` (same-draw sampler, packed or transposed linears): "
            f"**{m['batched']['tokens_per_s'] / plain['tokens_per_s']:.2f}x** the same batching without it "
            f"({plain['identical_completions']} of {plain['sequences']} completions identical)."
        )
    if m.get("limit"):
        lim = m["limit"]
        parts.append(
            f"Limit on this machine: a {' x '.join(map(str, lim['matmul_shape']))} matmul at "
            f"{lim['matmul_gflops']:.0f} GFLOP/s and a copy at {lim['copy_gb_per_s']:.1f} GB/s; a step of "
            f"{lim['step_gflop']:.1f} GFLOP ({lim['step_compute_ms']:.0f} ms) reading "
            f"{lim['step_weight_mb']:.0f} MB of weights ({lim['step_memory_ms']:.0f} ms): "
            f"**{lim['tokens_per_s']:.0f} tokens/s**."
        )
        mean = m.get("limit_tokens_per_s") or lim["tokens_per_s"]
        if m.get("limit_after"):
            after = m["limit_after"]
            parts.append(
                f"Measured again right after the batched generation: the matmul at {after['matmul_gflops']:.0f} "
                f"GFLOP/s, **{after['tokens_per_s']:.0f} tokens/s**; the two's mean {mean:.0f} tokens/s."
            )
        parts.append(
            f"Batched reaches **{m['share_of_limit']:.0%}** of the limit; before, "
            f"{m['before']['tokens_per_s'] / mean:.0%}."
        )
    return "\n\n".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench generation", description=__doc__.splitlines()[0])
    add_model_options(p, prompts=4, generations=8, new_tokens=64)
    p.add_argument("--single-calls", type=int, default=6, help="one-completion calls timed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = source_version()
    device = pick_device(args.device, cpu_only=False)
    measured = measure(args, device)
    settings = {k: getattr(args, k) for k in ("model", "random_init", "prompts", "generations", "new_tokens")}
    result = {
        "part": "generation",
        "machine": machine_info(str(device), source),
        "settings": {**settings, "device": str(device)},
        "measured": measured,
    }
    path = write_result("generation", args.tag or machine_tag(str(device)), result, render(result), args.out_dir)
    print(
        f"wrote {path}: {measured['batched']['tokens_per_s']:.1f} tokens/s, "
        f"{measured['ratio_batched_over_before']:.2f}x before",
        file=sys.stderr,
    )
    return 0
