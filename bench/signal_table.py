"""How much learning signal each option gives SmolLM2-135M-Instruct on the demo's tasks (CPU).

For each option (strict, format reward, lenient extraction, answer prefix, prefix + lenient):
Q questions x G completions per task, sampled as the demo samples; reports the fraction of
groups with non-zero reward variance (the groups GRPO can learn from), the mean reward and
the fraction of completions with a closed <answer> tag. Writes JSON and a Markdown table.

    python bench/signal_table.py --out bench/results/signal_table
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from swarm_gdrive.config import Config
from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
from swarm_gdrive.training.policy import PolicyTrainer, TrainSettings
from swarm_gdrive.training.rewards import ANSWER_OPEN, extract_answer
from swarm_gdrive.training.tasks import TaskBank, build_messages, parse_task_mix

OPTIONS = {  # name: (answer prefix, extraction, format weight)
    "strict": (False, "strict", 0.0),
    "strict + format reward 0.5": (False, "strict", 0.5),
    "lenient": (False, "lenient", 0.0),
    "prefix + strict": (True, "strict", 0.0),
    "prefix + lenient (demo)": (True, "lenient", 0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="chain_sum,basic_arithmetic")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", required=True, help="path without suffix; .json and .md are written")
    args = parser.parse_args()

    torch.set_num_threads(2)
    source = resolve_model("SmolLM2-135M-Instruct", Path(Config.model_cache_dir).expanduser()).source
    model, tokenizer = load_model_and_tokenizer(source, torch.device("cpu"), torch.float32)
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


if __name__ == "__main__":
    main()
