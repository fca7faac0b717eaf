"""Generation speed: this project's batched generation against one ``generate`` call per completion.

Same model, same prompts, same sampling, on one device. Batched: all P prompts x G completions in
as few ``generate`` calls as GEN_BATCH_SIZE allows (``PolicyTrainer.generate``). One call per
completion: the same trainer with a generation batch of 1 and G = 1 per call, as the original
project generated; a sample of such calls is timed (the rate is compared, not the total). Every
completion is forced to full length (``min_new_tokens``) so both sides produce the same tokens.
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
from swarm_gdrive.training.policy import PolicyTrainer, TrainSettings, peak_memory_mb, pick_device
from swarm_gdrive.training.tasks import build_messages


def measure(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Tokens per second of both ways of generating."""
    model, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    settings = TrainSettings(max_new_tokens=args.new_tokens, gen_batch_size=args.prompts * args.generations)
    trainer = PolicyTrainer(model, tokenizer, settings, device)
    prompts = [trainer.prompt_ids(build_messages(q)) for q in (QUESTIONS * args.prompts)[: args.prompts]]
    model.generation_config.min_new_tokens = args.new_tokens
    trainer.generate(prompts[:1], 2, seed=0)  # warm-up

    sync(device)
    batched = trainer.generate(prompts, args.generations, seed=1)
    sync(device)
    single = PolicyTrainer(model, tokenizer, dataclasses.replace(settings, gen_batch_size=1), device)
    tokens, started = 0, time.monotonic()
    for call in range(args.single_calls):
        tokens += single.generate([prompts[call % len(prompts)]], 1, seed=100 + call).new_tokens
    sync(device)
    single_s = time.monotonic() - started
    batched_rate, single_rate = batched.new_tokens / batched.seconds, tokens / single_s
    return {
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "batched": {"sequences": args.prompts * args.generations, "new_tokens": batched.new_tokens,
                    "seconds": batched.seconds, "tokens_per_s": batched_rate},
        "one_call_per_completion": {"calls_timed": args.single_calls, "new_tokens": tokens, "seconds": single_s,
                                    "tokens_per_s": single_rate},
        "ratio_batched_over_one_call": batched_rate / single_rate,
        "peak_memory_mb": peak_memory_mb(device),
    }  # fmt: skip


def render(result: dict[str, Any]) -> str:
    m = result["measured"]
    s = result["settings"]
    rows = [
        ["batched (this project)", m["batched"]["sequences"], m["batched"]["new_tokens"], m["batched"]["seconds"],
         m["batched"]["tokens_per_s"]],
        ["one generate call per completion", m["one_call_per_completion"]["calls_timed"],
         m["one_call_per_completion"]["new_tokens"], m["one_call_per_completion"]["seconds"],
         m["one_call_per_completion"]["tokens_per_s"]],
    ]  # fmt: skip
    return "\n\n".join(
        [
            "# Generation benchmark",
            machine_line(result["machine"]),
            f"Model {s['model']}{' (random weights)' if s['random_init'] else ''}, fp32, {s['prompts']} prompts x "
            f"{s['generations']} completions x {s['new_tokens']} new tokens (forced full length), "
            f"device {s['device']}.",
            markdown_table(["way", "sequences / calls", "new tokens", "seconds", "tokens/s"], rows),
            f"Ratio, batched over one call per completion: **{m['ratio_batched_over_one_call']:.2f}x**.",
        ]
    )


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
    print(f"wrote {path}: ratio {measured['ratio_batched_over_one_call']:.2f}x", file=sys.stderr)
    return 0
