"""The GRPO update: this project's ``PolicyTrainer.step`` against TRL's GRPOTrainer, time and peak memory.

Both sides get the same model, the same P prompts x G completions (fixed token ids with ragged
lengths up to L; the cost depends on lengths, not on which tokens), the same micro-batch and
gradient accumulation (one optimizer step over all sequences), the same loss (grpo, beta 0, clip
0.2 / 0.28), fp32 weights (bf16 autocast on a GPU on both sides), no activation checkpointing
(TRL's default turns it on; this trainer has none), AdamW, gradient clipping at 1.0.

Only the update is timed, generation is not: ours is ``PolicyTrainer.step(groups)``; TRL's is,
for each micro-batch, ``GRPOTrainer.compute_loss`` on inputs laid out as TRL's own
``_generate_and_score_completions`` lays them out (prompts and completions padded to the longest
of the batch), ``backward``, then clipping and its optimizer's step. Rewards alternate 0/1 in
every group, so every sequence has a non-zero advantage (this trainer skips zero-advantage ones).

Each side runs in its own subprocess: peak memory is that process's high-water mark
(``ru_maxrss`` on the CPU, ``torch.cuda.max_memory_allocated`` on a GPU), reported whole and
above the baseline taken once the model (and TRL's trainer) was loaded. One warm-up step, then
``--steps`` timed steps; the median is reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result
from bench.models import QUESTIONS, add_model_options, fixed_completions, load, timed
from swarm_gdrive.training.grpo import LossConfig
from swarm_gdrive.training.policy import PolicyTrainer, TrainGroup, TrainSettings, peak_memory_mb, pick_device
from swarm_gdrive.training.tasks import build_messages

#: ours: PolicyTrainer.step; whole: the same with every sequence laid out whole (the update before issue #26, and
#: still under gradient checkpointing); trl: TRL's GRPOTrainer.
SIDES = ("ours", "whole", "trl")
LOSS = LossConfig(loss_type="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
LEARNING_RATE = 1e-6


def memory_now_mb(device: torch.device) -> float:
    """Memory in use now (GPU allocations), or the process's high-water mark so far (CPU)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return peak_memory_mb(device)


def batch_of(args: argparse.Namespace, trainer: PolicyTrainer) -> list[TrainGroup]:
    """The P x G sequences both sides train on, with alternating 0/1 rewards in each group."""
    prompts = [trainer.prompt_ids(build_messages(q)) for q in (QUESTIONS * args.prompts)[: args.prompts]]
    vocab = len(trainer.tokenizer)
    completions = fixed_completions(
        args.prompts, args.generations, args.new_tokens, vocab, trainer.tokenizer.eos_token_id
    )
    rewards = [float(i % 2) for i in range(args.generations)]
    return [TrainGroup(p, c, rewards) for p, c in zip(prompts, completions, strict=True)]


def run_ours(args: argparse.Namespace, device: torch.device, whole: bool = False) -> dict[str, Any]:
    model, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    settings = TrainSettings(
        max_new_tokens=args.new_tokens, micro_batch_size=args.micro_batch, learning_rate=LEARNING_RATE, loss=LOSS
    )
    trainer = PolicyTrainer(model, tokenizer, settings, device)
    if whole:
        trainer._share_prompts = lambda: False  # type: ignore[method-assign]
    groups = batch_of(args, trainer)
    baseline = memory_now_mb(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    metrics: dict[str, float] = {}

    def step() -> None:
        metrics.update(trainer.step(groups))

    seconds = timed(args.steps, device, step)
    assert metrics.get("train/active_sequences") == args.prompts * args.generations, metrics
    return {"step_s": seconds, "baseline_mb": baseline, "peak_mb": peak_memory_mb(device),
            "loss": metrics["train/loss"], "grad_norm": metrics["train/grad_norm"]}  # fmt: skip


def trl_inputs(groups: list[TrainGroup], pad: int, device: torch.device) -> list[dict[str, Any]]:
    """All sequences as TRL lays out a generation batch: left-padded prompts, right-padded completions."""
    from swarm_gdrive.training.grpo import group_advantages

    rows = [(g.prompt_ids, c) for g in groups for c in g.completion_ids]
    p_len, c_len = max(len(p) for p, _ in rows), max(len(c) for _, c in rows)
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p, _ in rows], device=device)
    prompt_mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) for p, _ in rows], device=device)
    completion_ids = torch.tensor([c + [pad] * (c_len - len(c)) for _, c in rows], device=device)
    completion_mask = torch.tensor([[1] * len(c) + [0] * (c_len - len(c)) for _, c in rows], device=device)
    advantages = group_advantages(torch.tensor([g.rewards for g in groups])).reshape(-1).to(device)
    return [
        {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
         "completion_mask": completion_mask, "advantages": advantages, "num_items_in_batch": completion_mask.sum()}
    ]  # fmt: skip


def run_trl(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import datasets
    import trl

    model, tokenizer = load(args.model, device, args.random_init, Path(args.cache))
    total = args.prompts * args.generations
    accumulation = total // args.micro_batch
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        use_cpu=device.type == "cpu",
        bf16=device.type == "cuda" and torch.cuda.is_bf16_supported(),
        report_to=[],
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=accumulation,
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        activation_checkpointing=False,
        learning_rate=LEARNING_RATE,
        max_grad_norm=1.0,
        loss_type=LOSS.loss_type,
        beta=LOSS.beta,
        epsilon=LOSS.epsilon,
        epsilon_high=LOSS.epsilon_high,
        save_strategy="no",
    )
    dataset = datasets.Dataset.from_dict({"prompt": QUESTIONS[: args.prompts]})
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
        train_dataset=dataset, processing_class=tokenizer,
    )  # fmt: skip
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = accumulation  # set by Trainer's loop, which is not run here
    ours_view = PolicyTrainer(model, tokenizer, TrainSettings(max_new_tokens=args.new_tokens), device)
    (whole,) = trl_inputs(batch_of(args, ours_view), tokenizer.pad_token_id, device)
    del ours_view
    micro = [
        {k: (v[i : i + args.micro_batch] if k != "num_items_in_batch" else v) for k, v in whole.items()}
        for i in range(0, total, args.micro_batch)
    ]
    baseline = memory_now_mb(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seen: dict[str, float] = {}
    net = trainer.model

    def step() -> None:
        net.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for inputs in micro:
            loss = trainer.compute_loss(net, inputs)  # TRL divides by the accumulation steps itself
            loss.backward()
            loss_total += float(loss.detach())
        seen["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0))
        trainer.optimizer.step()
        seen["loss"] = loss_total

    seconds = timed(args.steps, device, step)
    return {"step_s": seconds, "baseline_mb": baseline, "peak_mb": peak_memory_mb(device), **seen,
            "optimizer": type(trainer.optimizer).__name__}  # fmt: skip


def run_side_subprocess(side: str, argv: list[str], timeout: float) -> dict[str, Any]:
    """One side in a fresh interpreter, so that its peak memory is its own."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{side}.json"
        cmd = [sys.executable, "-m", "bench", "training", *argv, "--side", side, "--side-out", str(out)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                            os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the {side} side failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def summarise(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    for s in sides.values():
        s["step_s_median"] = statistics.median(s["step_s"])
        s["peak_above_baseline_mb"] = s["peak_mb"] - s["baseline_mb"]
    ours, trl = sides["ours"], sides["trl"]
    return {
        "ours_over_whole_step_s": ours["step_s_median"] / sides["whole"]["step_s_median"],
        "ours_over_trl_step_s": ours["step_s_median"] / trl["step_s_median"],
        "trl_over_ours_speedup": trl["step_s_median"] / ours["step_s_median"],
        "ours_over_trl_peak_mb": ours["peak_mb"] / trl["peak_mb"],
        "ours_over_trl_peak_above_baseline_mb": ours["peak_above_baseline_mb"] / trl["peak_above_baseline_mb"],
        "target_at_least_as_fast": ours["step_s_median"] <= trl["step_s_median"],
        "target_no_more_memory": ours["peak_mb"] <= trl["peak_mb"],
    }


HEADER = ["side", "step s (each)", "step s (median)", "peak above baseline (MB)", "last loss", "last grad norm"]


def render(result: dict[str, Any]) -> str:
    s, sides, r = result["settings"], result["sides"], result["ratios"]
    rows = [
        [name, ", ".join(f"{x:.2f}" for x in v["step_s"]), v["step_s_median"], v["baseline_mb"], v["peak_mb"],
         v["peak_above_baseline_mb"], v["loss"], v["grad_norm"]]
        for name, v in (("this project (PolicyTrainer.step)", sides["ours"]),
                        ("this project, sequences whole (before issue #26)", sides["whole"]),
                        ("TRL GRPOTrainer", sides["trl"]))
    ]  # fmt: skip
    memory = "GPU allocated (MB)" if s["device"].startswith("cuda") else "RSS high-water (MB)"
    met = lambda ok: "met" if ok else "missed"  # noqa: E731
    return "\n\n".join(
        [
            "# Training-round benchmark",
            machine_line(result["machine"]),
            f"Model {s['model']}{' (random weights)' if s['random_init'] else ''}; {s['prompts']} prompts x "
            f"{s['generations']} completions = {s['prompts'] * s['generations']} sequences, completions of "
            f"{s['new_tokens'] // 2}-{s['new_tokens']} tokens, micro-batch {s['micro_batch']} x "
            f"{s['prompts'] * s['generations'] // s['micro_batch']} accumulation steps, one optimizer step, fp32 "
            f"weights, device {s['device']}; only the update is timed (no generation); {s['steps']} timed steps "
            "after a warm-up, each side in its own process.",
            markdown_table(HEADER[:3] + [f"baseline {memory}", f"peak {memory}"] + HEADER[3:], rows),
            "Loss and gradient norm of the last step: the same update on both sides gives the same values "
            "(up to float rounding and the tiny learning rate's drift).",
            f"Shared prompts over whole sequences: time per step **{r['ours_over_whole_step_s']:.2f}x**. "
            f"Ratios, this project over TRL: time per step **{r['ours_over_trl_step_s']:.2f}x** "
            f"({r['trl_over_ours_speedup']:.2f}x as fast), peak memory **{r['ours_over_trl_peak_mb']:.2f}x**, "
            f"peak above baseline **{r['ours_over_trl_peak_above_baseline_mb']:.2f}x**.",
            f"Targets: at least as fast as TRL: {met(r['target_at_least_as_fast'])}; no more memory: "
            f"{met(r['target_no_more_memory'])}.",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench training", description=__doc__.splitlines()[0])
    add_model_options(p, prompts=4, generations=4, new_tokens=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    p.add_argument("--timeout", type=float, default=900, help="per side, seconds")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # internal: run one side in this process
    p.add_argument("--side-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if (args.prompts * args.generations) % args.micro_batch:
        p.error("--micro-batch must divide prompts x generations (both sides accumulate whole micro-batches)")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    source = source_version()
    device = pick_device(args.device, cpu_only=False)
    if args.side is not None:
        sides_run = {"ours": run_ours, "whole": lambda a, d: run_ours(a, d, whole=True), "trl": run_trl}
        measured = sides_run[args.side](args, device)
        Path(args.side_out).write_text(json.dumps(measured))
        return 0
    sides = {}
    for side in SIDES:
        print(f"training: running the {side} side", file=sys.stderr, flush=True)
        sides[side] = run_side_subprocess(side, argv, args.timeout)
    keys = ("model", "random_init", "prompts", "generations", "new_tokens", "micro_batch", "steps")
    result = {
        "part": "training",
        "machine": machine_info(str(device), source),
        "settings": {**{k: getattr(args, k) for k in keys}, "device": str(device), "loss": dataclasses.asdict(LOSS)},
        "sides": sides,
        "ratios": summarise(sides),
    }
    path = write_result("training", args.tag or machine_tag(str(device)), result, render(result), args.out_dir)
    print(f"wrote {path}: ours/TRL step time {result['ratios']['ours_over_trl_step_s']:.2f}x", file=sys.stderr)
    return 0
