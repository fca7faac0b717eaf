"""The precision benchmark (bench/precision.py) on a tiny model: fp32 against itself is exact, fp16 and bf16 are not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import precision  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_precision_is_measured_against_fp32(tiny_folder: Path, tmp_path: Path) -> None:
    argv = ["--model", str(tiny_folder), "--prompts", "2", "--generations", "2", "--new-tokens", "6", "--steps", "1",
            "--micro-batch", "2", "--timing", "on", "--tag", "tiny", "--out-dir", str(tmp_path)]  # fmt: skip
    assert precision.main(argv) == 0
    result = json.loads((tmp_path / "precision_tiny.json").read_text())
    rows = {r["precision"]: r for r in result["rows"]}
    assert list(rows) == ["fp32", "bf16", "fp16"] and not result["skipped"]
    fp32 = rows["fp32"]  # a copy of the same weights, the same computation: the instrument reads zero
    assert fp32["logp_max_abs_diff"] == 0.0 and fp32["greedy_identical"] == 1.0
    assert fp32["grad_cosine"] == pytest.approx(1.0) and fp32["loss_scale"] is None and fp32["overflow_skipped"] is None
    assert all(r["logp_nonfinite"] == 0 for r in rows.values())
    for name in ("bf16", "fp16"):  # and reads more than zero where the arithmetic differs
        row = rows[name]
        assert 0.0 < row["logp_max_abs_diff"] < 1.0, row
        assert 0.9 < row["grad_cosine"] < 1.0 and 0.5 < row["grad_norm_ratio"] < 2.0, row
        assert row["step_s"] > 0 and row["new_tokens_per_s"] > 0
    assert rows["fp16"]["loss_scale"] == 2.0**16 and rows["fp16"]["overflow_skipped"] == 0.0
    assert "| fp16 |" in (tmp_path / "precision_tiny.md").read_text()
