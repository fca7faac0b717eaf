"""PRECISION against fp32: how far bf16 and fp16 (loss-scaled) autocast move what the trainer computes, and their speed.

For each precision the same model (float32 weights, copied) gets:

- **log-probs**: the per-token log-probabilities of P x G fixed completions (the GRPO loss's input),
  compared with fp32's: largest and mean absolute difference;
- **greedy generation**: the share of P greedy completions identical, token for token, to fp32's;
- **the gradient** of one GRPO update (alternating 0/1 rewards, every sequence active): cosine with
  fp32's gradient over all parameters, and the ratio of norms (fp16's is read after unscaling);
- **speed**: sampled generation (P x G, up to the new-token cap) and the update, median of ``--steps``
  after a warm-up, plus fp16's loss scale and skipped steps.

On a GPU without native bfloat16 (a T4), bf16 is left out, as the trainer refuses it there. On the
CPU, bf16 and fp16 autocast run, very slowly (SmolLM2-135M: more than 15 minutes for bf16 at 4 x 4 x 32
where fp32 took 2), so the speed figures are taken only on a GPU unless ``--timing on``; the
agreement figures hold anywhere. The result files are rewritten after each precision, so a run cut
short keeps what it measured. ``python -m bench precision [--device cuda]``.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result
from bench.models import add_model_options, load, timed
from bench.training import batch_of
from swarm_gdrive.training import grpo
from swarm_gdrive.training.policy import (
    DeviceError,
    PolicyTrainer,
    TrainGroup,
    TrainSettings,
    pick_device,
    pick_precision,
)

PRECISIONS = ("fp32", "bf16", "fp16")


def log_probs(trainer: PolicyTrainer, groups: list[TrainGroup]) -> list[torch.Tensor]:
    """Per-token log-probs of every completion (masked to its length), under the trainer's autocast."""
    seqs = [(g.prompt_ids, c, 0.0) for g in groups for c in g.completion_ids]
    out = []
    for i in range(0, len(seqs), trainer.settings.micro_batch_size):
        batch = trainer._collate(seqs[i : i + trainer.settings.micro_batch_size])
        with torch.no_grad(), trainer._autocast():
            lp = grpo.per_token_logps(
                trainer.model, batch["input_ids"], batch["attention_mask"], batch["logits_to_keep"], 1.0
            ).float()
        out += [row[mask.bool()] for row, mask in zip(lp, batch["completion_mask"], strict=True)]
    return out


def gradient(trainer: PolicyTrainer) -> torch.Tensor:
    return torch.cat([p.grad.detach().double().flatten() for p in trainer.model.parameters() if p.grad is not None])


def measure(base: Any, tokenizer: Any, device: torch.device, precision: str, args: argparse.Namespace) -> dict:
    settings = TrainSettings(
        max_new_tokens=args.new_tokens,
        temperature=0.7,
        learning_rate=1e-6,
        max_grad_norm=math.inf,  # unclipped: the gradients are compared as computed
        micro_batch_size=args.micro_batch,
        gen_batch_size=args.prompts * args.generations,
        precision=precision,
        loss=grpo.LossConfig(loss_type="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0),
    )
    trainer = PolicyTrainer(copy.deepcopy(base), tokenizer, settings, device)
    groups = batch_of(args, trainer)
    prompts = [g.prompt_ids for g in groups]
    greedy = trainer.generate(prompts, 1, seed=0, greedy=True).token_ids
    lps = log_probs(trainer, groups)
    skipped = 0
    for _ in range(40):  # fp16: the scaler starts at 2^16 and halves on each overflow until a step is taken
        metrics = trainer.step(groups)
        if not metrics.get("train/overflow_skipped"):
            break
        skipped += 1
    grad = gradient(trainer)
    sampled = update = new_tokens_per_s = None  # not measured
    if args.timing == "on" or (args.timing == "auto" and device.type == "cuda"):
        sampled = statistics.median(
            timed(args.steps, device, lambda: trainer.generate(prompts, args.generations, seed=1))
        )
        new_tokens_per_s = trainer.generate(prompts, args.generations, seed=1).new_tokens / sampled
        fresh = PolicyTrainer(copy.deepcopy(base), tokenizer, settings, device)
        update = statistics.median(timed(args.steps, device, lambda: fresh.step(groups)))
    return {
        "precision": precision,
        "greedy": greedy,
        "logps": lps,
        "grad": grad,
        "generate_s": sampled,
        "new_tokens_per_s": new_tokens_per_s,
        "step_s": update,
        "loss": metrics["train/loss"],
        "loss_scale": metrics.get("train/loss_scale"),
        "overflow_skipped": float(skipped) if trainer.scaler.is_enabled() else None,
    }


def compare(runs: list[dict], reference: dict) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        diffs = torch.cat([(a - b).abs() for a, b in zip(run["logps"], reference["logps"], strict=True)])
        finite = torch.isfinite(diffs)  # a forward pass that overflowed float16 gives inf or NaN log-probs
        diffs = diffs[finite] if finite.any() else torch.tensor([math.nan])
        same = sum(a == b for a, b in zip(run["greedy"], reference["greedy"], strict=True))
        cosine = torch.nn.functional.cosine_similarity(run["grad"], reference["grad"], dim=0)
        rows.append(
            {
                "precision": run["precision"],
                "logp_max_abs_diff": float(diffs.max()),
                "logp_mean_abs_diff": float(diffs.mean()),
                "logp_nonfinite": int((~finite).sum()),
                "greedy_identical": same / len(run["greedy"]),
                "grad_cosine": float(cosine),
                "grad_norm_ratio": float(run["grad"].norm() / reference["grad"].norm()),
                "loss": run["loss"],
                "generate_s": run["generate_s"],
                "new_tokens_per_s": run["new_tokens_per_s"],
                "step_s": run["step_s"],
                "loss_scale": run["loss_scale"],
                "overflow_skipped": run["overflow_skipped"],
            }
        )
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench precision", description=__doc__.splitlines()[0])
    add_model_options(parser, prompts=8, generations=8, new_tokens=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed repetitions (median) after one warm-up")
    parser.add_argument(
        "--timing", choices=("auto", "on", "off"), default="auto", help="speed figures (auto: on a GPU only)"
    )
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="among fp32, bf16, fp16; fp32 first")
    args = parser.parse_args(argv)
    source = source_version()
    device = pick_device(args.device, cpu_only=False)
    base, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    runs, skipped = [], {}
    for precision in dict.fromkeys(["fp32", *args.precisions.split(",")]):
        try:
            pick_precision(precision, device)
        except DeviceError as exc:
            skipped[precision] = str(exc)
            print(f"precision {precision}: skipped ({exc})", flush=True)
            continue
        started = time.monotonic()
        runs.append(measure(base, tokenizer, device, precision, args))
        print(f"precision {precision}: measured in {time.monotonic() - started:.0f} s", flush=True)
        path, markdown = report(args, source, runs, skipped)
    print(markdown)
    print(f"wrote {path}")
    return 0


def report(args: argparse.Namespace, source: dict, runs: list[dict], skipped: dict[str, str]) -> tuple[Path, str]:
    """Write the result files for the precisions measured so far; their path and the Markdown."""
    rows = compare(runs, runs[0])
    machine = machine_info(args.device, source)
    result = {
        "machine": machine,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out_dir",)},
        "skipped": skipped,
        "rows": rows,
    }
    columns = {
        "precision": "precision", "logp_max_abs_diff": "logp max |Δ|", "logp_mean_abs_diff": "logp mean |Δ|",
        "logp_nonfinite": "logp not finite", "greedy_identical": "greedy same", "grad_cosine": "grad cosine",
        "grad_norm_ratio": "grad norm ratio", "generate_s": "gen s", "new_tokens_per_s": "new tok/s",
        "step_s": "update s", "loss_scale": "loss scale", "overflow_skipped": "overflow skips",
    }  # fmt: skip
    table = markdown_table(list(columns.values()), [[r[k] for k in columns] for r in rows])
    shape = f"{args.prompts} prompts x {args.generations} completions, up to {args.new_tokens} new tokens"
    notes = "".join(f"\n- {p} skipped: {why}" for p, why in skipped.items())
    markdown = f"# PRECISION against fp32\n\n{machine_line(machine)}\n\n{args.model}, {shape}.\n\n{table}\n{notes}\n"
    return write_result("precision", args.tag or machine_tag(args.device), result, markdown, args.out_dir), markdown
