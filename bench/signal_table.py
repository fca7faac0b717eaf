"""How much learning signal each option gives SmolLM2-135M-Instruct on the demo's tasks (CPU).

For each option (strict, format reward, lenient extraction, answer prefix, prefix + lenient):
Q questions x G completions per task, sampled as the demo samples; reports the fraction of
groups with non-zero reward variance (the groups GRPO can learn from), the mean reward and
the fraction of completions with a closed <answer> tag. Writes JSON and a Markdown table.

With ``--presets``, measures instead each named study preset (swarm_gdrive/presets/) as a swarm would run it (its
tasks, task config, answer prefix, extraction, temperature and MAX_NEW_TOKENS; questions drawn as training draws
them, held-out questions excluded): per task the solve rate (completions fully right) and the share of
groups with zero reward variance (the local groups GRPO cannot learn from).

    python bench/signal_table.py --out bench/results/signal_table
    python bench/signal_table.py --presets small-model,sparse-signal --questions 32 --out bench/results/signal_presets
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from bench.learning import task_presets
from swarm_gdrive import presets
from swarm_gdrive.config import Config
from swarm_gdrive.protocol.records import standard_error
from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
from swarm_gdrive.training.policy import PolicyTrainer, TrainSettings
from swarm_gdrive.training.rewards import ANSWER_OPEN, extract_answer
from swarm_gdrive.training.tasks import TaskBank, build_messages, parse_task_mix, question_rng

OPTIONS = {  # name: (answer prefix, extraction, format weight)
    "strict": (False, "strict", 0.0),
    "strict + format reward 0.5": (False, "strict", 0.5),
    "lenient": (False, "lenient", 0.0),
    "prefix + strict": (True, "strict", 0.0),
    "prefix + lenient (demo)": (True, "lenient", 0.0),
}

#: Study presets ``--presets`` can measure: those of swarm_gdrive/presets/ that set TASKS (the easy demo's
#: small-model, the sparse-signal regime), by name or alias.
PRESETS = task_presets()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="chain_sum,basic_arithmetic")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", required=True, help="path without suffix; .json and .md are written")
    parser.add_argument(
        "--presets",
        help=f"comma-separated study presets ({', '.join(p.name for p in PRESETS)}) to measure instead of the options",
    )
    parser.add_argument("--seed", type=int, default=42, help="SEED (dataset and draws) for --presets")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a busy machine: no spin-waits)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    source = resolve_model("SmolLM2-135M-Instruct", Path(Config.model_cache_dir).expanduser()).source
    model, tokenizer = load_model_and_tokenizer(source, torch.device("cpu"), torch.float32)
    if args.presets:
        names = [n.strip() for n in args.presets.split(",") if n.strip()]
        known = {n for p in PRESETS for n in (p.name, *p.aliases)}
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"--presets: unknown {', '.join(unknown)}; choose from {', '.join(p.name for p in PRESETS)}")
        measure_presets(model, tokenizer, names, args)
        return
    settings = TrainSettings(max_new_tokens=args.new_tokens, temperature=args.temperature, gen_batch_size=64)
    trainer = PolicyTrainer(model, tokenizer, settings, torch.device("cpu"))
    bank = TaskBank(parse_task_mix(args.tasks, None, "easy"), 42)
    rows = []
    started = time.monotonic()
    for task in bank.tasks:
        questions = [bank.question(task, random.Random(7).randrange(10**5) + i) for i in range(args.questions)]
        for name, (prefix_on, extraction, fmt) in OPTIONS.items():
            prefix = ANSWER_OPEN if prefix_on else ""
            prompts = [trainer.prompt_ids(build_messages(q.question), prefix) for q in questions]
            gen = trainer.generate(prompts, args.generations, seed=1)
            variance, rewards, tagged = 0, [], 0
            for q, texts in zip(questions, gen.texts, strict=True):
                full = [prefix + t for t in texts]
                scores = bank.score_group(q.entry, full, fmt, extraction)
                variance += max(scores) - min(scores) > 1e-9
                rewards += scores
                tagged += sum(extract_answer(t) is not None for t in full)
            rows.append(
                {
                    "task": task,
                    "option": name,
                    "groups_with_variance": variance / len(questions),
                    "mean_reward": statistics.fmean(rewards),
                    "tag_rate": tagged / len(rewards),
                }
            )
            print(rows[-1], flush=True)
    result = {
        "model": "SmolLM2-135M-Instruct (packaged GGUF Q4_1, run in fp32)",
        "device": "cpu",
        "questions_per_task": args.questions,
        "generations": args.generations,
        "new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "difficulty": "easy",
        "seconds": time.monotonic() - started,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    lines = [
        "| task | option | groups with reward variance | mean reward | closed <answer> tag |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['option']} | {r['groups_with_variance']:.2f} | {r['mean_reward']:.3f} | "
        f"{r['tag_rate']:.2f} |"
        for r in rows
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def measure_presets(model, tokenizer, names: list[str], args: argparse.Namespace) -> None:
    """Solve rate and zero-variance share per task of each preset, sampled as its swarm samples."""
    rows = []
    started = time.monotonic()
    for name in names:
        preset = presets.load(name)
        settings = TrainSettings(
            max_new_tokens=int(preset["MAX_NEW_TOKENS"]), temperature=float(preset["TEMPERATURE"]), gen_batch_size=64
        )
        trainer = PolicyTrainer(model, tokenizer, settings, torch.device("cpu"))
        bank = TaskBank(parse_task_mix(preset["TASKS"], preset["TASK_CONFIG"]), args.seed, held_out=100)
        prefix = ANSWER_OPEN if preset["ANSWER_PREFIX"] == "true" else ""
        for task in bank.tasks:
            one = TaskBank([s for s in bank.specs if s.name == task], args.seed, held_out=100)
            questions = one.draw(args.questions, question_rng(args.seed, "signal-table", 0, 0))
            prompts = [trainer.prompt_ids(build_messages(q.question), prefix) for q in questions]
            t0 = time.monotonic()
            gen = trainer.generate(prompts, args.generations, seed=1)
            seconds = time.monotonic() - t0
            groups = [
                bank.score_group(q.entry, [prefix + t for t in texts], 0.0, preset["ANSWER_EXTRACTION"])
                for q, texts in zip(questions, gen.texts, strict=True)
            ]
            solved = [float(r >= 1.0) for g in groups for r in g]
            zero_var = [max(g) - min(g) <= 1e-9 for g in groups]
            rows.append(
                {
                    "preset": name,
                    "task": task,
                    "config": bank.level_config(task),
                    "questions": len(questions),
                    "generations": args.generations,
                    "solve_rate": statistics.fmean(solved),
                    "solve_rate_se": standard_error(solved),
                    "zero_variance_fraction": statistics.fmean(zero_var),
                    "all_wrong_fraction": statistics.fmean(max(g) < 1.0 for g in groups),
                    "all_right_fraction": statistics.fmean(min(g) >= 1.0 for g in groups),
                    "questions_solved_once": statistics.fmean(max(g) >= 1.0 for g in groups),
                    "generate_s": round(seconds, 1),
                }
            )
            print(rows[-1], flush=True)
    result = {
        "model": "SmolLM2-135M-Instruct (packaged GGUF Q4_1, run in fp32)",
        "device": f"cpu, torch threads {torch.get_num_threads()}, nice 10 on a shared 2-core machine",
        "seed": args.seed,
        "questions_per_task": args.questions,
        "generations": args.generations,
        "sampling": "each preset's own: answer prefix, extraction, temperature, MAX_NEW_TOKENS",
        "draws": "training draws (question_rng(seed, 'signal-table', 0, 0)), 100 held-out questions excluded",
        "seconds": round(time.monotonic() - started, 1),
        "presets": {n: presets.load(n) for n in names},
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    lines = [
        f"SmolLM2-135M-Instruct, CPU; {args.questions} questions x {args.generations} completions per task, "
        "each preset's own sampling; solve rate ± 1 SE over completions (completions of one question are "
        "correlated, so the SE is a lower bound).",
        "",
        "| preset | task | config | solve rate | zero-variance groups | all wrong | all right | "
        "questions solved at least once |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['preset']} | {r['task']} | `{json.dumps(r['config'], sort_keys=True)}` | "
        f"{r['solve_rate']:.3f} ± {r['solve_rate_se']:.3f} | {r['zero_variance_fraction']:.2f} | "
        f"{r['all_wrong_fraction']:.2f} | {r['all_right_fraction']:.2f} | {r['questions_solved_once']:.2f} |"
        for r in rows
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
