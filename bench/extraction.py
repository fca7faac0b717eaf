"""Answer extraction on real rollouts: how often a rule zeroes a correct answer, before and after (CPU).

Generates completions of the packaged SmolLM2-135M-Instruct on a study preset's training questions (``--preset``:
the demo's ``small-model`` by default, or ``sparse``, ``swarm_gdrive/presets/sparse-signal.json``: the same sampling
on harder TASK_CONFIG), sampled as that preset samples (answer prefix, MAX_NEW_TOKENS, TEMPERATURE, its held-out
split of EVAL_SAMPLES questions excluded), and saves them with their questions and answers (``--generate``); then
scores the saved completions under each extraction rule of :mod:`swarm_gdrive.training.rewards` and under the rule
it replaced (the last number), so the comparison runs on the same texts.

    OMP_NUM_THREADS=1 nice -n 10 python bench/extraction.py --generate --questions 64 --out bench/results/extraction
    python bench/extraction.py --out bench/results/extraction      # re-score the saved completions
    OMP_NUM_THREADS=1 nice -n 10 python bench/extraction.py --preset sparse --generate --questions 64 \
        --out bench/results/extraction-sparse
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.learning import task_presets
from swarm_gdrive import presets
from swarm_gdrive.training import rewards
from swarm_gdrive.training.tasks import TaskBank, parse_task_mix, question_rng

#: The lenient rule before issue 31: the last number-like span of a completion without a closed tag.
_OLD_LAST_NUMBER = re.compile(r"[-+]?\d+(?:[./]\d+)?")


def old_lenient(completion: str) -> str | None:
    """``extract_answer(..., "lenient")`` as it was: the last closed pair, else the last number."""
    tagged = rewards.extract_answer(completion, "strict")
    if tagged is not None:
        return tagged
    numbers = _OLD_LAST_NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def preset_names() -> list[str]:
    """The presets ``--preset`` takes: those of swarm_gdrive/presets/ that set TASKS (bench.learning's)."""
    return [p.name for p in task_presets()]


def preset_label(name: str) -> str:
    """``small-model (demo)``: the preset's name and its first alias, as the saved results name it."""
    preset = presets.get(name)
    return f"{preset.name} ({preset.aliases[0]})" if preset.aliases else preset.name


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """Sample ``--questions`` x ``--generations`` completions per task with ``--preset``'s sampling."""
    import torch

    from swarm_gdrive.config import Config
    from swarm_gdrive.training.models import load_model_and_tokenizer, resolve_model
    from swarm_gdrive.training.policy import PolicyTrainer, TrainSettings
    from swarm_gdrive.training.tasks import build_messages

    torch.set_num_threads(args.threads)
    preset = presets.load(args.preset)
    source = resolve_model("SmolLM2-135M-Instruct", Path(Config.model_cache_dir).expanduser()).source
    model, tokenizer = load_model_and_tokenizer(source, torch.device("cpu"), torch.float32)
    settings = TrainSettings(
        max_new_tokens=int(preset["MAX_NEW_TOKENS"]), temperature=float(preset["TEMPERATURE"]), gen_batch_size=64
    )
    trainer = PolicyTrainer(model, tokenizer, settings, torch.device("cpu"))
    prefix = rewards.ANSWER_OPEN if preset["ANSWER_PREFIX"] == "true" else ""
    specs = parse_task_mix(preset["TASKS"], preset["TASK_CONFIG"])
    bank = TaskBank(specs, args.seed, held_out=int(preset["EVAL_SAMPLES"]))
    rows = []
    started = time.monotonic()
    for task in bank.tasks:
        one = TaskBank([s for s in bank.specs if s.name == task], args.seed, held_out=bank.held_out)
        questions = one.draw(args.questions, question_rng(args.seed, "extraction", 0, 0))
        prompts = [trainer.prompt_ids(build_messages(q.question), prefix) for q in questions]
        gen = trainer.generate(prompts, args.generations, seed=1)
        for q, texts in zip(questions, gen.texts, strict=True):
            rows.append(
                {
                    "task": task,
                    "index": q.provenance.index,
                    "question": q.question,
                    "answer": q.entry["answer"],
                    "completions": [prefix + t for t in texts],
                }
            )
    return {
        "model": "SmolLM2-135M-Instruct (packaged GGUF Q4_1, run in fp32), CPU",
        "preset": preset_label(args.preset),
        "seed": args.seed,
        "generate_s": round(time.monotonic() - started, 1),
        "rows": rows,
    }


def any_number(completion: str, answer: str) -> str | None:
    """Not a rule: "any number of the completion equals the answer", the gameable upper bound, for comparison."""
    numbers = _OLD_LAST_NUMBER.findall(completion)
    return answer if answer in numbers else (numbers[-1] if numbers else None)


RULES: dict[str, Callable[[str, str], str | None]] = {
    "last number (before)": lambda c, a: old_lenient(c),
    "answer cue, else the answer statement (after)": lambda c, a: rewards.extract_answer(c, "lenient"),
    "any number equals (gameable, for reference)": any_number,
}


def spray_mean(bank: TaskBank, datasets: dict[str, Any], rule: Callable[[str, str], str | None]) -> float:
    """Share of 10-number sprays holding the right answer at each position scored fully right (20 chain_sum
    questions)."""
    total, count = 0.0, 0
    for i in range(20):
        entry = bank.question("chain_sum", i).entry
        others = [n for n in range(200, 1000) if entry["answer"] not in str(n)][:9]
        for position in range(10):
            numbers = [*others[:position], entry["answer"], *others[position:]]
            completion = "<answer>" + " ".join(str(n) for n in numbers)
            value = rewards.verifier_score(datasets["chain_sum"], entry, rule(completion, entry["answer"]))
            total += value >= 1.0
            count += 1
    return round(total / count, 3)


def score_table(saved: dict[str, Any], out: Path, seed: int, preset_name: str = "small-model") -> None:
    """Score the saved completions under each rule, with and without partial credit; write .json and .md."""
    if saved.get("preset", preset_label(preset_name)) != preset_label(preset_name):
        raise SystemExit(f"--preset {preset_name}: the saved completions are of the preset {saved['preset']}")
    if saved.get("seed", seed) != seed:
        raise SystemExit(f"--seed {seed}: the saved completions were drawn with SEED {saved['seed']}")
    preset = presets.load(preset_name)
    bank = TaskBank(parse_task_mix(preset["TASKS"], preset["TASK_CONFIG"]), seed, held_out=int(preset["EVAL_SAMPLES"]))
    datasets = {task: bank._datasets[task] for task in bank.tasks}  # noqa: SLF001 - the verifiers, nothing else
    before_of: dict[tuple[int, int], float] = {}  # the old rule's score of a completion, computed once
    per_rule: dict[str, dict[str, Any]] = {}
    for name, rule in RULES.items():
        full, partial, partial_only, changed = [], [], 0, []
        for r, row in enumerate(saved["rows"]):
            entry = bank.question(row["task"], row["index"]).entry
            assert entry["question"] == row["question"], "saved questions must regenerate identically"
            for k, c in enumerate(row["completions"]):
                value = rewards.verifier_score(datasets[row["task"]], entry, rule(c, entry["answer"]))
                full.append(float(value >= 1.0))
                partial.append(value)
                partial_only += 0.0 < value < 1.0
                if (r, k) not in before_of:
                    before_of[r, k] = rewards.verifier_score(datasets[row["task"]], entry, old_lenient(c))
                before = before_of[r, k]
                if (value >= 1.0) != (before >= 1.0):
                    changed.append({"answer": entry["answer"], "completion": c, "now": value, "before": before})
        per_rule[name] = {
            "completions": len(full),
            "scored_correct": int(sum(full)),
            "mean_reward_partial_credit": round(statistics.fmean(partial), 4),
            "partial_credit_given": partial_only,
            "changed_vs_before": changed,
        }
    spray_scores = {name: spray_mean(bank, datasets, rule) for name, rule in RULES.items()}
    result = {**{k: v for k, v in saved.items() if k != "rows"}, "rules": per_rule, "spray_scores": spray_scores}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    n = next(iter(per_rule.values()))["completions"]
    closed = sum(rewards.extract_answer(c) is not None for row in saved["rows"] for c in row["completions"])
    lines = [
        f"{saved['model']}; {presets.get(preset_name).aliases[0]} preset sampling (SEED {seed}, training draws); "
        f"{n} completions of "
        f"{len(saved['rows'])} questions, opened with <answer>; {closed} close the tag (scored on the tag's "
        "content by every rule), the others are scored by the lenient rule.",
        "",
        "| rule | scored correct | mean reward with partial credit | completions given partial credit | "
        "changed vs before |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {r['scored_correct']} / {r['completions']} | {r['mean_reward_partial_credit']:.3f} | "
        f"{r['partial_credit_given']} | {len(r['changed_vs_before'])} |"
        for name, r in per_rule.items()
    ]
    lines += ["", "Changed by the new rule (answer, completion, before → after):", ""]
    lines += [
        f"- {c['answer']}: `{c['completion'][:90]!r}` {c['before']:.2f} → {c['now']:.2f}"
        for c in per_rule["answer cue, else the answer statement (after)"]["changed_vs_before"]
    ]
    lines += [
        "",
        "Share scored fully right of sprays of 10 numbers after `<answer>` (space-separated) with the right answer at "
        f"each of the 10 positions, over chain_sum's first 20 questions (one guess: 0.1): {json.dumps(spray_scores)}",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", action="store_true", help="sample new completions (else re-score the saved)")
    parser.add_argument("--questions", type=int, default=16, help="questions per task")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--preset",
        default="small-model",
        help=f"the study preset whose questions and sampling to use: {', '.join(preset_names())} (or an alias)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True, help="path without suffix; -rollouts.json, .json and .md")
    args = parser.parse_args()
    try:
        args.preset = presets.get(args.preset).name
    except presets.PresetError as e:
        parser.error(f"--preset: {e}")
    if args.preset not in preset_names():
        parser.error(f"--preset {args.preset}: choose from {', '.join(preset_names())}")
    out = Path(args.out)
    saved = out.with_name(out.name + "-rollouts.json")
    if args.generate:
        out.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(generate(args), indent=1))
    score_table(json.loads(saved.read_text()), out, args.seed, args.preset)


if __name__ == "__main__":
    main()
