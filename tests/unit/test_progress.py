"""PROGRESS: bars on a terminal, lines elsewhere, and the worker's round line."""

from __future__ import annotations

import io
import logging

import pytest

from swarm_gdrive import progress
from swarm_gdrive.config import ConfigError, from_env


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def mode():
    yield
    progress.configure("auto")


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarm_gdrive.progress"]


def test_auto_draws_a_bar_on_a_terminal_and_writes_no_line(caplog):
    caplog.set_level(logging.INFO)
    out = Terminal()
    with progress.task("generate", 8, "completion", stream=out) as work:
        for _ in range(8):
            work.advance()
    assert "generate:" in out.getvalue() and "/8 [" in out.getvalue()  # tqdm's bar (erased at the end)
    assert lines(caplog) == []


def test_auto_writes_lines_where_output_is_not_a_terminal(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(progress, "SUMMARY_AFTER_S", 0.0)
    out = io.StringIO()  # a pipe, a log file, a notebook's captured output
    with progress.task("train", 3, "micro-batch", stream=out) as work:
        for _ in range(3):
            work.advance()
    assert out.getvalue() == ""  # no bar, no carriage returns
    said = lines(caplog)
    assert said[0].startswith("train: 1 micro-batch of 3 micro-batches, ") and "s left" in said[0]
    assert said[1].startswith("train: 2 micro-batches of 3 micro-batches")
    assert said[-1].startswith("train: 3 micro-batches in ") and "a second" in said[-1]
    assert len(said) == 3  # no "3 of 3" line: the summary says it


def test_bytes_read_as_megabytes_and_short_work_says_nothing(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "SUMMARY_AFTER_S", 0.0)
    with progress.task("checkpoint upload (round 3)", 5_000_000, "B", stream=io.StringIO()) as work:
        work.advance(5_000_000)
    assert lines(caplog)[-1].startswith("checkpoint upload (round 3): 5.0 MB in ")
    monkeypatch.setattr(progress, "SUMMARY_AFTER_S", 60.0)
    caplog.clear()
    with progress.task("generate", 1, "completion", stream=io.StringIO()) as work:
        work.advance()
    assert lines(caplog) == []


@pytest.mark.parametrize("setting", ["off", "lines", "bars"])
def test_the_mode_overrides_the_terminal_test(caplog, monkeypatch, setting):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "SUMMARY_AFTER_S", 0.0)
    progress.configure(setting)
    out = Terminal() if setting == "lines" else io.StringIO()
    with progress.task("evaluate leg_counting (greedy)", 2, "completion", stream=out) as work:
        work.advance(2)
    assert ("/2 [" in out.getvalue()) == (setting == "bars")
    assert bool(lines(caplog)) == (setting == "lines")


def test_progress_setting_errors_name_the_choices(tmp_path):
    assert from_env({"GDRIVE_PATH": str(tmp_path)}).progress == "auto"
    with pytest.raises(ConfigError, match="PROGRESS='loud': use one of auto, bars, lines, off"):
        from_env({"GDRIVE_PATH": str(tmp_path), "PROGRESS": "loud"})


def test_round_line_counts_rounds_and_the_time_left():
    assert progress.round_line(0, 20, 0.4123, 12.34, [12.34]) == (
        "round 0 done (1 of 20, reward 0.412, 12.3 s); 19 to go, about 4 min left"
    )
    assert progress.round_line(2, 3, None, 5.0, [4.0, 6.0]) == "round 2 done (3 of 3, no reward, 5.0 s)"
    assert progress.round_line(1, 100, 1.0, 80.0, [80.0, 100.0]).endswith("98 to go, about 2.5 h left")
    assert progress.round_line(3, 5, 0.5, 30.0, [30.0]).endswith("1 to go, about 30 s left")


def test_hugging_face_bars_are_turned_off_where_the_node_writes_lines():
    env: dict[str, str] = {}
    assert progress.quiet_libraries(env, io.StringIO()) and env == {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env = {}
    assert not progress.quiet_libraries(env, Terminal()) and env == {}  # bars on a terminal: theirs too
    env = {"HF_HUB_DISABLE_PROGRESS_BARS": "0"}
    assert not progress.quiet_libraries(env, io.StringIO()) and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
    progress.configure("off")
    env = {}
    assert progress.quiet_libraries(env, Terminal()) and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
