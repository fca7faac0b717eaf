"""Near-twins across the held-out split, before and after normalisation (issue 31 part 5), for the study presets.

For each preset (the demo's small-model, sparse-signal) and task: the held-out set of EVAL_SAMPLES questions as
the split picks it, and the training questions of the first ``--scan`` training indices that the split lets
training draw. A held-out question has a *twin* in training when a trainable question equals it after
normalisation (:func:`swarm_gdrive.training.twins.normalise_question`: case, spacing, operand order of ``+`` and
``*``, parentheses). "before" is the split with the old identity (exact text up to NFC and spacing), "after" the
split with the normalised identity; also the question space estimated from the scan.

    python bench/twins.py --out bench/results/twins
"""

from __future__ import annotations

import argparse
import json
import math
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from bench.learning import task_presets
from swarm_gdrive import presets
from swarm_gdrive.training import tasks
from swarm_gdrive.training.twins import estimate_space, normalise_question, twins_across


def old_identity(text: str, task: str | None = None) -> str:
    """The held-out identity before issue 31: NFC, whitespace collapsed, nothing else."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def count(preset: str, seed: int, scan: int, identity: Callable[..., str]) -> dict[str, dict[str, float]]:
    """Per task: held-out questions with a trainable twin among the first ``scan`` training indices."""
    settings = presets.load(preset)
    held_out = int(settings["EVAL_SAMPLES"])
    out = {}
    with mock.patch.object(tasks, "normalise_question", identity):
        bank = tasks.TaskBank(tasks.parse_task_mix(settings["TASKS"], settings["TASK_CONFIG"]), seed, held_out=held_out)
        for task in bank.tasks:
            held = [q.question for q in bank.eval_questions(task, held_out)]
            texts = [bank.question(task, i).question for i in range(scan)]
            trainable = [t for t in texts if not bank.is_held_out(task, t)]
            distinct = len({normalise_question(t, task) for t in texts})
            out[task] = {
                "held_out": held_out,
                "with_twin_in_training": twins_across(held, trainable, task),
                "scan": scan,
                "distinct_normalised": distinct,
                "distinct_texts": len(set(texts)),
                "space_estimate": estimate_space(scan, distinct),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets",
        default=",".join(p.name for p in task_presets()),
        help="comma-separated presets of swarm_gdrive/presets/ (default: every one that sets TASKS)",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--scan", type=int, default=3000, help="training indices read per task")
    parser.add_argument("--out", required=True, help="path without suffix; .json and .md are written")
    args = parser.parse_args()
    started = time.monotonic()
    result = {
        name: {
            "before": count(name, args.seed, args.scan, old_identity),
            "after": count(name, args.seed, args.scan, normalise_question),
        }
        for name in args.presets.split(",")
    }
    lines = [
        f"SEED {args.seed}; the first {args.scan} training indices of each task; a held-out question has a twin when a "
        "question training may draw equals it after normalisation.",
        "",
        "| preset | task | held out | with a twin in training, before | after | distinct texts / normalised "
        "in the scan | space (estimate) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, both in result.items():
        for task, before in both["before"].items():
            after = both["after"][task]
            space = "large" if math.isinf(after["space_estimate"]) else f"{after['space_estimate']:,.0f}"
            lines.append(
                f"| {name} | {task} | {before['held_out']} | {before['with_twin_in_training']} | "
                f"{after['with_twin_in_training']} | {after['distinct_texts']} / {after['distinct_normalised']} | "
                f"{space} |"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    seconds = round(time.monotonic() - started, 1)
    summary = {"seed": args.seed, "scan": args.scan, "seconds": seconds, "presets": result}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=2, default=str))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
