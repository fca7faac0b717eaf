"""The issue #28 benchmark's figures (bench/rounds.py) on hand-made metrics and events lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import rounds


def stage(round_: int, ts: float, generate: float, gather: float, train: float, used: int, asked: int) -> dict:
    values = {
        "stage": 0,
        "swarm/external_requested": asked,
        "swarm/external_used": used,
        "time/generate_s": generate,
        "time/gather_s": gather,
        "time/train_s": train,
    }
    return {"kind": "metric", "node_id": "fast", "round": round_, "ts": ts, "values": values}


def round_line(round_: int, ts: float, seconds: float) -> dict:
    return {"kind": "metric", "node_id": "fast", "round": round_, "ts": ts, "values": {"round/seconds": seconds}}


# Three rounds: 100-102 (1.5 s busy), 105-108 (2.5 s busy), 110-111 (1 s busy); a stage of an unfinished round 3.
METRICS = [
    stage(0, 101.9, 0.5, 0.4, 1.0, 1, 2),
    round_line(0, 102.0, 2.0),
    stage(1, 107.9, 0.5, 0.5, 2.0, 2, 2),
    round_line(1, 108.0, 3.0),
    stage(2, 110.9, 0.0, 0.0, 1.0, 0, 2),
    round_line(2, 111.0, 1.0),
    stage(3, 112.0, 0.1, 0.0, 0.1, 2, 2),
]


def taken_event(round_: int, sources: list[str], source_rounds: list[int], ages: list[float]) -> dict:
    data = {
        "sources": sources,
        "source_rounds": source_rounds,
        "stages": [0] * len(sources),
        "group_ids": [f"g{i}" for i in range(len(sources))],
        "age_s": ages,
        "staleness_rounds": [int(a // 10) for a in ages],
    }
    return {"kind": "event", "node_id": "fast", "round": round_, "ts": 0.0, "event": "externals_taken", "data": data}


def test_busy_fraction_is_generate_plus_train_of_whole_rounds_over_first_start_to_last_end():
    got = rounds.busy(METRICS)
    assert got["rounds"] == 3
    assert got["busy_s"] == pytest.approx(1.5 + 2.5 + 1.0)  # gather is waiting, round 3 is not whole
    assert got["span_s"] == pytest.approx(111.0 - 100.0)
    assert got["busy_fraction"] == pytest.approx(5.0 / 11.0)
    assert got["rounds_per_min"] == pytest.approx(3 * 60 / 11.0)


def test_busy_of_a_worker_without_rounds_is_empty():
    assert rounds.busy([stage(0, 1.0, 1, 1, 1, 1, 1)])["busy_fraction"] is None


def test_external_received_over_asked_whole_rounds_and_after_a_time():
    assert rounds.external_fill(METRICS) == {"received": 3, "asked": 6, "fraction": 0.5}
    # Rounds that started at or after 104 s: rounds 1 (105) and 2 (110).
    assert rounds.external_fill(METRICS, started_after=104.0) == {"received": 2, "asked": 4, "fraction": 0.5}
    assert rounds.external_fill(METRICS, started_after=200.0) == {"received": 0, "asked": 0, "fraction": None}


def test_start_to_start_is_the_mean_gap_between_round_starts():
    assert rounds.start_to_start(METRICS) == pytest.approx(((105 - 100) + (110 - 105)) / 2)
    assert rounds.start_to_start(METRICS[:2]) is None


def test_taken_groups_staleness_median_and_groups_per_source_round():
    events = [
        taken_event(4, ["slow", "other"], [0, 3], [12.0, 1.0]),
        {"kind": "event", "node_id": "fast", "round": 5, "ts": 0.0, "event": "external_shortfall", "data": {}},
        taken_event(6, ["slow"], [0], [30.0]),
        taken_event(9, ["slow", "slow"], [2, 2], [4.0, 5.0]),
    ]
    groups = rounds.taken(events)
    assert [(g["round"], g["source"], g["source_round"]) for g in groups] == [
        (4, "slow", 0),
        (4, "other", 3),
        (6, "slow", 0),
        (9, "slow", 2),
        (9, "slow", 2),
    ]
    st = rounds.staleness(groups)
    assert st["groups"] == 5
    assert st["age_s_median"] == 5.0  # of 1, 4, 5, 12, 30
    assert st["age_s_max"] == 30.0
    assert st["age_s_p90"] == 30.0
    assert st["rounds_median"] == 0 and st["rounds_max"] == 3
    assert rounds.groups_per_source_round(groups, "slow", range(4)) == {0: 2, 1: 0, 2: 2, 3: 0}
    assert rounds.staleness([])["age_s_median"] is None


def test_an_even_count_of_ages_has_the_middle_mean_as_median():
    groups = rounds.taken([taken_event(1, ["a"] * 4, [0] * 4, [1.0, 2.0, 10.0, 50.0])])
    assert rounds.staleness(groups)["age_s_median"] == 6.0


def test_log_files_are_read_back_skipping_a_partial_last_line(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in METRICS) + '{"kind": "metric", "ro')
    assert rounds.read_jsonl(path) == METRICS
    assert rounds.read_jsonl(tmp_path / "absent.jsonl") == []


def test_a_target_is_judged_on_the_async_value():
    runs = {"sync": {"x": 0.04}, "async": {"x": 0.9}}
    row = rounds._target("busy", runs, lambda r: r["x"], ">=", 0.8)
    assert row["met"] is True and row["values"] == {"sync": 0.04, "async": 0.9}
    assert rounds._target("busy", runs, lambda r: r["x"], "<=", 0.5)["met"] is False
    assert rounds._target("busy", {"sync": {"x": 1.0}}, lambda r: r["x"], "<=", 3)["met"] is None


def test_drive_requests_are_told_apart_by_kind():
    folder = "application/vnd.google-apps.folder"
    log = [
        ("POST", "/upload/drive/v3/files?uploadType=multipart"),
        ("PATCH", "/upload/drive/v3/files/abc?uploadType=multipart"),
        ("POST", "/drive/v3/files?fields=id"),
        ("GET", f"/drive/v3/files?q=%27p%27+in+parents+and+name+%3D+%27round_3%27+and+mimeType+%3D+%27{folder}%27"),
        ("GET", f"/drive/v3/files?q=%27p%27+in+parents+and+name+%3D+%27stage_0%27+and+mimeType+%3D+%27{folder}%27"),
        ("GET", f"/drive/v3/files?q=%27p%27+in+parents+and+name+%3D+%27rewards%27+and+mimeType+%3D+%27{folder}%27"),
        ("GET", "/drive/v3/files?q=%27p%27+in+parents+and+trashed+%3D+false&pageSize=1000"),
        ("GET", "/drive/v3/files/abc?alt=media"),
        ("GET", "/drive/v3/files?q=%27p%27+in+parents+and+trashed+%3D+false&pageSize=1000"),
        ("DELETE", "/drive/v3/files/abc"),
    ]

    assert rounds.request_kinds(log) == {
        "listing": 2,
        "file create": 1,
        "file update": 1,
        "folder create": 1,
        "folder lookup round": 1,
        "folder lookup stage": 1,
        "folder lookup other": 1,
        "download": 1,
        "delete": 1,
    }
