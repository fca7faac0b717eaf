"""The held-out evaluation's speed with the package's default settings, this tree against an older one.

What a worker runs before round 0 and every EVAL_INTERVAL rounds (``GRPOWorkload.evaluate``): EVAL_SAMPLES held-out
questions of each task of the mix (by default 16 of each of the SAPO paper's nine tasks at reasoning-gym's own
difficulty), every prompt completed greedily, up to MAX_NEW_TOKENS (256), in calls of GEN_BATCH_SIZE (64). The model
is MODEL_NAME (default: the packaged SmolLM2-135M-Instruct, since the package's default model needs the Hub) on the
CPU, fp32. Each tree runs in its own process (``--before DIR``: a checkout of older code, for example ``git worktree
add /tmp/before <commit>``, first on PYTHONPATH, the same interpreter and packages), the trees alternating; every
run reports its wall and CPU seconds, and the completions of the trees are compared prompt by prompt.

With ``--round``, a training round's generation instead (``GRPOWorkload.generate``): NUM_TRAIN_SAMPLES questions of
the training stream (8), NUM_GENERATIONS sampled completions of each (8), up to MAX_NEW_TOKENS, for one seed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def side(args: argparse.Namespace) -> dict[str, Any]:
    """One evaluation in this process, with whatever ``swarm_gdrive`` is first on the path (no ``bench`` import)."""
    import torch

    from swarm_gdrive.config import from_env
    from swarm_gdrive.training.grpo_workload import build_task, settings_from
    from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
    from swarm_gdrive.training.policy import PolicyTrainer
    from swarm_gdrive.training.rewards import ANSWER_OPEN
    from swarm_gdrive.training.tasks import question_rng

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        env = {"NODE_ROLE": "worker", "GDRIVE_PATH": folder, "MODEL_NAME": args.model, **dict(args.set or [])}
        config = from_env(env)
    bank = build_task(config)
    cpu = torch.device("cpu")
    model, tokenizer = load_model_and_tokenizer(
        resolve_model(config.model_name, config.model_cache_dir).source, cpu, torch.float32
    )
    trainer = PolicyTrainer(model, tokenizer, settings_from(config), cpu)
    prefix = ANSWER_OPEN if config.answer_prefix else ""  # as GRPOWorkload builds its prompts
    if args.round:  # GRPOWorkload.generate: a round's questions, G sampled completions each
        questions = bank.draw(config.num_train_samples, question_rng(config.seed, "worker-1", 0, 0))
        prompts = [trainer.prompt_ids(bank.messages(q.question), prefix) for q in questions]
        prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        budget = config.max_new_tokens - len(prefix_ids)
        before = resource.getrusage(resource.RUSAGE_SELF)
        generation = trainer.generate(prompts, config.num_generations, seed=1, max_new_tokens=budget)
    else:
        prompts = [
            trainer.prompt_ids(bank.messages(q.question), prefix)
            for task in bank.tasks
            for q in bank.eval_questions(task, config.eval_samples, 0)
        ]
        before = resource.getrusage(resource.RUSAGE_SELF)
        generation = trainer.generate(prompts, 1, seed=0, greedy=True, label="evaluate (greedy)")
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "tasks": list(bank.tasks),
        "prompts": len(prompts),
        "completions_per_prompt": config.num_generations if args.round else 1,
        "prompt_tokens": sum(len(p) for p in prompts),
        "max_new_tokens": config.max_new_tokens,
        "gen_batch_size": config.gen_batch_size,
        "threads": torch.get_num_threads(),
        "seconds": generation.seconds,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "new_tokens": generation.new_tokens,
        "completions": [ids for group in generation.token_ids for ids in group],
    }


def run_side(source: Path, args: argparse.Namespace) -> dict[str, Any]:
    """:func:`side` in a new process with ``source`` first on PYTHONPATH."""
    settings = [f"--set={key}={value}" for key, value in args.set or []]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "side.json"
        command = [sys.executable, "-P", str(Path(__file__).resolve()), "--side-out", str(out),
                   "--model", args.model, "--threads", str(args.threads), *settings,
                   *(["--round"] if args.round else [])]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(source)}
        proc = subprocess.run(command, env=env, timeout=args.timeout, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the evaluation from {source} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def render(result: dict[str, Any]) -> str:
    from bench.common import machine_line, markdown_table

    runs = result["runs"]
    first = runs[0]
    rows = [[r["tree"], r["seconds"], r["cpu_s"], r["new_tokens"]] for r in runs]
    per_prompt = first.get("completions_per_prompt", 1)
    how = f"{per_prompt} sampled completions each (a round's generation)" if per_prompt > 1 else "greedy"
    parts = [
        "# A round's generation, default settings" if per_prompt > 1 else "# Held-out evaluation, default settings",
        machine_line(result["machine"]),
        f"Model {result['settings']['model']}, fp32, {first['threads']} torch threads; {first['prompts']} prompts "
        f"({', '.join(first['tasks'])}; {first['prompt_tokens']} prompt tokens), {how}, up to "
        f"{first['max_new_tokens']} new tokens, GEN_BATCH_SIZE {first['gen_batch_size']}; the trees alternating, "
        "each run in its own process.",
        markdown_table(["tree", "seconds", "CPU seconds", "new tokens"], rows),
    ]
    if result.get("identical_completions") is not None:
        total = first["prompts"] * per_prompt
        parts.append(f"Completions identical between the trees: **{result['identical_completions']} of {total}**.")
    return "\n\n".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench evaluation", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="MODEL_NAME")
    p.add_argument("--before", help="a checkout of older code to run beside this tree")
    p.add_argument("--runs", type=int, default=1, help="runs of each tree (alternating)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one per core)")
    p.add_argument(
        "--set",
        action="append",
        type=lambda item: tuple(item.split("=", 1)),
        metavar="VARIABLE=value",
        help="a setting other than its default, e.g. --set EVAL_SAMPLES=4 (repeatable)",
    )
    p.add_argument(
        "--round",
        action="store_true",
        help="a training round's generation instead (NUM_TRAIN_SAMPLES questions x NUM_GENERATIONS, sampled)",
    )
    p.add_argument("--timeout", type=float, default=3600, help="per run, seconds")
    p.add_argument("--tag")
    p.add_argument("--out-dir", type=Path)
    p.add_argument("--side-out", help=argparse.SUPPRESS)  # internal: run one evaluation here, write its JSON there
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side_out:
        Path(args.side_out).write_text(json.dumps(side(args)))
        return 0
    from bench.common import machine_info, machine_tag, source_version, write_result

    source = source_version()
    trees = [("this tree", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
    runs = []
    for number in range(args.runs):
        for name, tree in trees:
            run = {"tree": name, **run_side(tree, args)}
            print(f"{name} #{number + 1}: {run['seconds']:.1f} s, {run['cpu_s']:.1f} CPU s", file=sys.stderr)
            runs.append(run)
    identical = None
    if args.before:
        ours, theirs = runs[0]["completions"], runs[1]["completions"]
        identical = sum(a == b for a, b in zip(ours, theirs, strict=True))
    for run in runs:
        del run["completions"]
    result = {
        "part": "evaluation",
        "machine": machine_info("cpu", source),
        "settings": {
            "model": args.model,
            "before": args.before,
            "runs": args.runs,
            "round": args.round,
            "set": dict(args.set or []),
        },
        "runs": runs,
        "identical_completions": identical,
    }
    part = "round_generation" if args.round else "evaluation"
    path = write_result(part, args.tag or machine_tag("cpu"), result, render(result), args.out_dir)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
