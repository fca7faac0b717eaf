"""bench/extraction.py: re-scoring the saved real rollouts reproduces the committed tables (demo and sparse presets).

The saved completions are real SmolLM2-135M-Instruct samples; a change to the extraction rule or to the verifiers
changes these figures, and then the results and docs/training.md's extraction table must be measured again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import extraction  # noqa: E402

RESULTS = ROOT / "bench" / "results"


@pytest.mark.parametrize(
    ("name", "seed", "preset"),
    [
        ("extraction", 42, "small-model"),
        ("extraction-seed7", 7, "small-model"),
        ("extraction-sparse", 42, "sparse"),
        ("extraction-sparse-seed7", 7, "sparse"),
    ],
)
def test_rescoring_saved_rollouts_reproduces_the_committed_table(tmp_path: Path, name: str, seed: int, preset: str):
    saved = json.loads((RESULTS / f"{name}-rollouts.json").read_text())
    extraction.score_table(saved, tmp_path / name, seed, extraction.presets.get(preset).name)
    assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads((RESULTS / f"{name}.json").read_text())
    assert (tmp_path / f"{name}.md").read_text() == (RESULTS / f"{name}.md").read_text()


def test_rescoring_refuses_completions_of_another_preset_or_seed(tmp_path: Path):
    saved = json.loads((RESULTS / "extraction-rollouts.json").read_text())
    with pytest.raises(SystemExit, match="of the preset small-model"):
        extraction.score_table(saved, tmp_path / "x", 42, "sparse-signal")
    with pytest.raises(SystemExit, match="drawn with SEED 42"):
        extraction.score_table(saved, tmp_path / "x", 7, "small-model")
