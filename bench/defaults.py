"""Defaults from measurement (issue 15, part 3): held-out gain of one worker per training setting.

Each cell trains a fresh copy of the model for ``--rounds`` rounds with the package's own GRPO workload
(``GRPOWorkload.generate`` / ``train`` / ``evaluate``, in this process, no swarm: one worker, J = 0) on
the demo's easy tasks (the small-model preset), with one setting changed from the baseline. Every cell
uses the same SEED and node name, so it draws the same questions and sampling seeds each round: the
cells differ only in the setting. Held-out greedy pass@1 is measured before training (once: the model
is the same) and after the last round, on the same questions for every cell.

    python -m bench defaults --rounds 12 --eval-samples 32          # SmolLM2-135M on the CPU
    python -m bench defaults --tiny --rounds 2 --cells base,wd0      # seconds: a smoke test

Writes ``bench/results/defaults_<tag>.{json,md}``. A cell already in the result file with the same
settings is kept (``--force`` reruns), so a stopped sweep resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

#: The baseline: the demo's settings (the small-model preset: lr 5e-6) with the package's other defaults.
BASELINE = {
    "LEARNING_RATE": "5e-6",
    "WARMUP_STEPS": "0",
    "LOSS_TYPE": "grpo",
    "SCALE_REWARDS": "group",
    "WEIGHT_DECAY": "0.01",
}
#: One setting (or a learning rate with its warmup) changed from the baseline per cell.
CELLS: dict[str, dict[str, str]] = {
    "base": {},
    "lr1e-6": {"LEARNING_RATE": "1e-6"},
    "lr2e-5-warmup4": {"LEARNING_RATE": "2e-5", "WARMUP_STEPS": "4"},
    "warmup4": {"WARMUP_STEPS": "4"},
    "dr_grpo": {"LOSS_TYPE": "dr_grpo"},
    "dapo": {"LOSS_TYPE": "dapo"},
    "scale-none": {"SCALE_REWARDS": "none"},
    "wd0": {"WEIGHT_DECAY": "0"},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench defaults", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="smollm2", help="names the result files: defaults_<tag>.{json,md}")
    p.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated cells of: {', '.join(CELLS)}")
    p.add_argument("--rounds", type=int, default=12, help="training rounds per cell")
    p.add_argument("--groups", type=int, default=4, help="NUM_TRAIN_SAMPLES: groups per round")
    p.add_argument("--generations", type=int, default=8, help="NUM_GENERATIONS: completions per group")
    p.add_argument("--eval-samples", type=int, default=32, help="EVAL_SAMPLES: held-out questions per task")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="MODEL_NAME")
    p.add_argument("--tiny", action="store_true", help="a tiny model built on the spot (smoke test)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--force", action="store_true", help="rerun cells already in the result file")
    args = p.parse_args(argv)
    args.cell_names = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in args.cell_names if c not in CELLS]
    if unknown:
        p.error(f"--cells: unknown {unknown}; choose from {', '.join(CELLS)}")
    return args


def cell_env(args: argparse.Namespace, folder: Path, cell: str) -> dict[str, str]:
    from swarm_gdrive import presets
    from swarm_gdrive.config import swarm_env

    return swarm_env(
        folder,
        "defaults",
        presets.load("small-model"),
        BASELINE,
        CELLS[cell],
        NODE_ROLE="worker",
        NODE_ID="worker-1",
        WORKLOAD="grpo",
        MODEL_NAME=args.model,
        DEVICE=args.device,
        SEED=args.seed,
        NUM_TRAIN_SAMPLES=args.groups,
        NUM_GENERATIONS=args.generations,
        EVAL_SAMPLES=args.eval_samples,
        SWARM_LOCAL_DIR=str(folder.parent / f"{folder.name}-local"),  # never inside GDRIVE_PATH
    )


def run_cell(args: argparse.Namespace, folder: Path, cell: str, evaluate_before: bool) -> dict:
    """Train one fresh model for ``args.rounds`` rounds with the cell's settings; held-out before/after."""
    from swarm_gdrive.config import from_env
    from swarm_gdrive.protocol.sapo import ScoredGroup
    from swarm_gdrive.protocol.workload import StageContext
    from swarm_gdrive.storage import LocalStorage
    from swarm_gdrive.training.grpo_workload import GRPOWorkload

    env = cell_env(args, folder, cell)
    config = from_env(env)
    started = time.monotonic()
    workload = GRPOWorkload(config, LocalStorage(folder), "worker-1", threading.Event())
    before = [e.model_dump() for e in workload.evaluate(0)] if evaluate_before else None
    if before is not None:
        seconds = time.monotonic() - started
        print(f"[{cell} {seconds:5.0f}s] held-out before training: {pass1(before)[0]:.3f}", flush=True)
    rewards, zero_variance, lrs = [], [], []
    for round_ in range(args.rounds):
        ctx = StageContext(node_id="worker-1", round=round_, stage=0, seed=config.seed)
        groups = [ScoredGroup("worker-1", g, tuple(g.rewards)) for g in workload.generate(ctx)]
        metrics = workload.train(ctx, groups, [])
        rewards.append(metrics.get("reward/local_mean", math.nan))
        zero_variance.append(metrics.get("reward/local_zero_variance_fraction", math.nan))
        lrs.append(metrics.get("train/lr"))
        print(
            f"[{cell} {time.monotonic() - started:5.0f}s] round {round_}: reward {rewards[-1]:.3f}, "
            f"zero-variance groups {zero_variance[-1]:.2f}, lr {lrs[-1]}",
            flush=True,
        )
    after = [e.model_dump() for e in workload.evaluate(args.rounds)]
    return {
        "settings": {k: env[k] for k in BASELINE},
        "env": env,
        "rewards": rewards,
        "zero_variance": zero_variance,
        "lrs": lrs,
        "eval_before": before,
        "eval_after": after,
        "wall_s": round(time.monotonic() - started, 1),
    }


def pass1(evals: list[dict]) -> tuple[float, int]:
    """Pass@1 over every held-out question of every task (level 0), and how many questions."""
    base = [e for e in evals if e["level"] == 0]
    n = sum(e["n"] for e in base)
    return sum(e["pass1"] * e["n"] for e in base) / n, n


def summarise(study: dict) -> list[dict]:
    """Per cell: held-out gain over the untrained model with its binomial SE, training reward with its SE."""
    before, n = pass1(study["eval_before"])
    base = study["cells"].get("base")
    base_after = pass1(base["eval_after"])[0] if base else math.nan
    rows = []
    for name, cell in study["cells"].items():
        after, _ = pass1(cell["eval_after"])
        se = math.sqrt(max(after * (1 - after), 1e-12) / n)
        se_before = math.sqrt(max(before * (1 - before), 1e-12) / n)
        rewards = [r for r in cell["rewards"] if not math.isnan(r)]
        rows.append(
            {
                "cell": name,
                **cell["settings"],
                "held_out_after": after,
                "held_out_se": se,
                "gain": after - before,
                # Unpaired: an upper bound on the SE of a difference measured on the same questions.
                "gain_se": math.sqrt(se**2 + se_before**2),
                "vs_base": after - base_after,
                "vs_base_se": math.sqrt(2) * se,
                "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
                "reward_se": statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else math.nan,
                "reward_last_half": statistics.fmean(rewards[len(rewards) // 2 :]) if rewards else math.nan,
                "zero_variance": statistics.fmean(cell["zero_variance"]),
                "wall_s": cell["wall_s"],
            }
        )
    return rows


def markdown(study: dict) -> str:
    before, n = pass1(study["eval_before"])
    rows = summarise(study)
    lines = [
        f"# Defaults sweep `{study['tag']}`",
        "",
        f"One worker (J = 0) per cell, {study['rounds']} rounds of {study['groups']} groups x "
        f"{study['generations']} completions, the demo's easy chain_sum + basic_arithmetic (SMALL_MODEL_PRESET), "
        f"SEED {study['seed']}: every cell saw the same questions and sampling seeds. Baseline: "
        + ", ".join(f"{k}={v}" for k, v in BASELINE.items())
        + ". Each other cell changes what its name says.",
        "",
        f"Held-out greedy pass@1 before training: {before:.3f} on {n} questions. SE: binomial, "
        f"sqrt(p(1-p)/{n}); the SE of a difference is taken unpaired (an upper bound: the questions are the same). "
        "Reward: mean training reward per round, SE over rounds.",
        "",
        "| cell | LR | warmup | loss | scale | WD | held-out after (SE) | gain (SE) | vs base (SE) "
        "| train reward (SE) | reward, 2nd half | zero-var groups | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['LEARNING_RATE']} | {r['WARMUP_STEPS']} | {r['LOSS_TYPE']} | {r['SCALE_REWARDS']} "
            f"| {r['WEIGHT_DECAY']} | {r['held_out_after']:.3f} ({r['held_out_se']:.3f}) | {r['gain']:+.3f} "
            f"({r['gain_se']:.3f}) | {r['vs_base']:+.3f} ({r['vs_base_se']:.3f}) | {r['reward_mean']:.3f} "
            f"({r['reward_se']:.3f}) | {r['reward_last_half']:.3f} | {r['zero_variance']:.2f} | {r['wall_s']:.0f} |"
        )
    resolved = [r["cell"] for r in rows if r["cell"] != "base" and abs(r["vs_base"]) > 2 * r["vs_base_se"]]
    lines += [
        "",
        "Cells whose held-out pass@1 differs from the baseline's by more than 2 SE: "
        + (", ".join(resolved) if resolved else "none")
        + ".",
        "",
        f"Machine: {study['machine']}. Command: `{study['command']}`. Written {study['written_at']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from bench.common import cpu_model, source_version

    folder = Path(tempfile.mkdtemp(prefix="swarm-gdrive-defaults-"))
    if args.tiny:
        from swarm_gdrive.training.tiny_model import build_tiny_model, teach_answer_format

        args.model = str(teach_answer_format(build_tiny_model(folder / "tiny-model")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"defaults_{args.tag}.json"
    old = json.loads(path.read_text()) if path.exists() and not args.force else {}
    design = {k: getattr(args, k) for k in ("rounds", "groups", "generations", "eval_samples", "seed", "model")}
    if old.get("design") != design:
        old = {}
    study = {
        "tag": args.tag,
        **design,
        "design": design,
        "command": "python -m bench defaults " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{cpu_model()}, torch {torch.__version__}, threads {torch.get_num_threads()}, {args.device}",
        "source": source_version(),
        "eval_before": old.get("eval_before"),
        "cells": dict(old.get("cells", {})),
    }
    for cell in args.cell_names:
        if cell in study["cells"] and study["cells"][cell]["settings"] == {
            k: cell_env(args, folder, cell)[k] for k in BASELINE
        }:
            print(f"[{cell}] kept from {path.name}", flush=True)
            continue
        result = run_cell(args, folder, cell, evaluate_before=study["eval_before"] is None)
        if result["eval_before"] is not None:
            study["eval_before"] = result["eval_before"]
        study["cells"][cell] = result
        study["written_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        path.write_text(json.dumps(study, indent=1) + "\n")
        path.with_suffix(".md").write_text(markdown(study))
        print(f"[{cell}] done in {result['wall_s']:.0f} s: held-out {pass1(result['eval_after'])[0]:.3f}", flush=True)
    print(path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
