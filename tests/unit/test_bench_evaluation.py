"""The evaluation benchmark (bench/evaluation.py): one run of a tree measures the evaluation a worker runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import evaluation  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_run_evaluates_every_tasks_held_out_prompts_greedily(tiny_folder: Path) -> None:
    settings = [("TASKS", "basic_arithmetic,chain_sum"), ("EVAL_SAMPLES", "3"), ("MAX_NEW_TOKENS", "4")]
    args = argparse.Namespace(model=str(tiny_folder), threads=1, set=settings, round=False)

    run = evaluation.side(args)

    assert run["tasks"] == ["basic_arithmetic", "chain_sum"]
    assert run["prompts"] == 6 == len(run["completions"])  # EVAL_SAMPLES of each task
    assert run["max_new_tokens"] == 4 and run["gen_batch_size"] == 64 and run["threads"] == 1
    assert all(1 <= len(c) <= 4 for c in run["completions"])
    assert run["new_tokens"] == sum(len(c) for c in run["completions"])
    assert run["prompt_tokens"] > 6 * 10 and run["seconds"] > 0 and run["cpu_s"] > 0
    assert evaluation.side(args)["completions"] == run["completions"]  # greedy: the same again
    result = {"runs": [{"tree": "this tree", **run}], "settings": {"model": "tiny"}, "machine": {"cpu": "test"}}
    text = evaluation.render(result)
    assert "| this tree |" in text and "6 prompts (basic_arithmetic, chain_sum;" in text


def test_a_round_run_samples_g_completions_of_the_rounds_questions(tiny_folder: Path) -> None:
    settings = [("TASKS", "basic_arithmetic"), ("NUM_TRAIN_SAMPLES", "3"), ("NUM_GENERATIONS", "2")]
    args = argparse.Namespace(model=str(tiny_folder), threads=1, set=[*settings, ("MAX_NEW_TOKENS", "5")], round=True)

    run = evaluation.side(args)

    assert run["prompts"] == 3 and run["completions_per_prompt"] == 2 and len(run["completions"]) == 6
    assert all(1 <= len(c) <= 5 for c in run["completions"])
    assert run["new_tokens"] == sum(len(c) for c in run["completions"])
    assert evaluation.side(args)["completions"] == run["completions"]  # one seed: the same draws again
    result = {"runs": [{"tree": "this tree", **run}], "settings": {"model": "tiny"}, "machine": {"cpu": "test"}}
    result["identical_completions"] = 6
    text = evaluation.render(result)
    assert text.startswith("# A round's generation") and "2 sampled completions each" in text and "6 of 6" in text
