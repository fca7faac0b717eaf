"""Every reader of an experiment on a real asynchronous one (ROUND_MODE=async, GDRIVE_IMPLEMENTATION.md §5.10): the
real coordinator and three workers as threads, synthetic workload, 4 rounds, J=1. Two quick workers play their rounds
while a slow one is still in its first: the folder is copied then (``running``: the state says round 0, the workers
are at different rounds of their own) and once the experiment is finished. The expected values are read from the
folder's own files, independently of the readers."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from swarm_gdrive import cli  # noqa: E402
from swarm_gdrive.observe import analysis, monitor, plots, report, web  # noqa: E402
from swarm_gdrive.observe.dashboard import Dashboard  # noqa: E402
from swarm_gdrive.protocol.exchange import Exchange  # noqa: E402
from swarm_gdrive.protocol.layout import Layout  # noqa: E402
from swarm_gdrive.protocol.records import RewardRecord  # noqa: E402
from swarm_gdrive.protocol.tracking import tracker_key  # noqa: E402
from swarm_gdrive.storage import LocalStorage  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from built_once import built_once  # noqa: E402
from swarm_threads import Node, fast_env  # noqa: E402

EXPERIMENT = "async"
LAYOUT = Layout(EXPERIMENT)
ROUNDS = 4
QUICK = ("a", "b")
SLOW = "slow"


def _copy_live(folder: Path, target: Path) -> None:
    """A copy of a folder the swarm is still writing: a file replaced or removed while copied is skipped."""

    def copy(src: str, dst: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(src, dst)

    shutil.copytree(folder, target, copy_function=copy)


def _run_swarm(base: Path) -> Path:
    """``base/finished``: the experiment once finished; ``base/running``: a copy of it taken once the quick workers
    were done and the slow one had played a round."""
    shared = base / "finished"
    shared.mkdir(parents=True)
    # Beats every 0.1 s: the quick workers' peer records say their round soon enough for a pickup to find them
    # within their 0.4 s of rounds (at 0.2 s they often did not: no group exchanged, nothing to measure).
    env = fast_env(shared, EXPERIMENT, MAX_ROUNDS=ROUNDS, MIN_WORKERS=3, NUM_TRANSPLANT_TREES=1, HEARTBEAT_INTERVAL=0.1)
    nodes = [Node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coord", "ROUND_MODE": "async"})]
    steps = {"a": "0.05", "b": "0.05", SLOW: "0.4"}
    nodes += [Node({**env, "NODE_ROLE": "worker", "NODE_ID": w, "SYNTHETIC_STEP_SECONDS": s}) for w, s in steps.items()]
    for n in nodes:
        n.start()
    for n in nodes:
        if n.config.node_id in QUICK:
            n.join(60)
    first = shared / LAYOUT.reward_file(0, 0, SLOW)
    deadline = time.monotonic() + 30
    while not first.exists() and time.monotonic() < deadline:  # its first round played: a round of its own to read
        time.sleep(0.02)
    _copy_live(shared, base / "running")
    for n in nodes:
        n.join(60)
    assert [n.code for n in nodes] == [0, 0, 0, 0]
    assert first.exists()
    return base


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The two folders of :func:`_run_swarm`, run once per test session (every xdist worker reads the same ones;
    a test that changes a folder changes a copy)."""
    base = built_once(tmp_path_factory, "async-readers", lambda folder: _run_swarm(folder))
    return {"running": base / "running", "finished": base / "finished"}


#: What a reader showed for an asynchronous experiment before issue #28: the state's round, 0 while it runs.
STATE_ROUND = f"round 0 of {ROUNDS} ("


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def raw_rewards(folder: Path) -> dict[str, dict[int, float]]:
    """node -> own round -> reward, from the reward files (one stage a round here)."""
    out: dict[str, dict[int, float]] = {}
    for path in (folder / LAYOUT.rewards_dir).glob("round_*/stage_0/*.json"):
        rec = read_json(path)
        out.setdefault(rec["node_id"], {})[rec["round"]] = rec["reward"]
    return out


def raw_externals(folder: Path) -> dict[str, list[dict]]:
    """node -> the data of its externals_taken events, from its log."""
    out: dict[str, list[dict]] = {}
    for node in (*QUICK, SLOW):
        events = read_lines(folder / LAYOUT.events_file(node))
        out[node] = [e["data"] for e in events if e["event"] == "externals_taken"]
    return out


def snapshot_of(folder: Path) -> monitor.Snapshot:
    return monitor.load(LocalStorage(folder), EXPERIMENT)


def test_the_running_experiment_is_asynchronous_with_workers_at_different_rounds(folders):
    """The premise of the tests below, from the raw files: a running async state at round 0, quick workers done."""
    state = read_json(folders["running"] / LAYOUT.state_file)
    assert (state["mode"], state["status"], state["round"]) == ("async", "running", 0)
    rewards = raw_rewards(folders["running"])
    assert all(sorted(rewards[w]) == list(range(ROUNDS)) for w in QUICK)
    assert 1 <= len(rewards[SLOW]) < ROUNDS
    finished = read_json(folders["finished"] / LAYOUT.state_file)
    assert (finished["mode"], finished["status"], finished["round"]) == ("async", "finished", ROUNDS)


def test_status_shows_each_workers_own_round_and_whether_it_is_done(folders, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--folder", str(folders["running"]), "--experiment", EXPERIMENT])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert STATE_ROUND not in out and "asynchronous rounds (ROUND_MODE=async" in out
    slow_round = read_json(folders["running"] / LAYOUT.peer_file(SLOW))["round"]
    played = len(raw_rewards(folders["running"])[SLOW])
    summary = out.splitlines()[0]
    assert f"2 of 3 worker(s) done: a (done, {ROUNDS} of {ROUNDS} rounds played)" in summary
    assert f"slow (round {slow_round} of {ROUNDS}, {played} played)" in summary
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("worker  status"))
    table = [line.split() for line in lines[start : lines.index("", start)]]
    assert table[0][4:7] == ["own", "round", "done"]
    rows = {row[0]: row[6:10] for row in table[1:]}  # after "N s ago": own round "R of N", done
    assert rows == {
        "a": [str(ROUNDS - 1), "of", str(ROUNDS), "yes"],
        "b": [str(ROUNDS - 1), "of", str(ROUNDS), "yes"],
        SLOW: [str(slow_round), "of", str(ROUNDS), "no"],
    }


def test_findings_judge_each_worker_on_its_own_rounds(folders, tmp_path):
    snap = snapshot_of(folders["running"])
    deadline = float(snap.state_record["round_deadline"])
    late = dataclasses.replace(snap, now=deadline + 10_000)  # a sync round this late means the coordinator stopped
    codes = {f.code for f in monitor.findings(late)}
    assert "coordinator_not_advancing" not in codes and "missing_reward" not in codes
    # A reward lost in the middle of a done worker's rounds is found, as its own.
    gap = tmp_path / "gap"
    shutil.copytree(folders["finished"], gap)
    (gap / LAYOUT.reward_file(1, 0, "a")).unlink()
    missing = [f.message for f in monitor.findings(snapshot_of(gap)) if f.code == "missing_reward"]
    assert missing == ["worker a: no reward for round(s) 1"]


def test_fill_and_staleness_per_worker_are_those_of_its_reward_files_and_events(folders):
    table = monitor.external_per_worker(snapshot_of(folders["finished"])).set_index("node")
    taken = raw_externals(folders["finished"])
    assert sum(len(d["sources"]) for data in taken.values() for d in data) > 0  # the swarm exchanged groups
    for node in (*QUICK, SLOW):
        files = [read_json(p) for p in (folders["finished"] / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{node}.json")]
        asked, got = sum(r["external_requested"] for r in files), sum(r["num_external_groups"] for r in files)
        row = table.loc[node]
        assert (row["asked"], row["got"], row["rounds"]) == (asked, got, ROUNDS)
        assert row["fill"] == pytest.approx(got / asked)
        ages = [a for d in taken[node] for a in d["age_s"]]
        stale = [s for d in taken[node] for s in d["staleness_rounds"]]
        assert got == len(ages)  # every group trained on is in an externals_taken event
        if ages:
            assert row["age_s_median"] == pytest.approx(statistics.median(ages))
            assert row["staleness_rounds_median"] == statistics.median(stale)
            assert row["staleness_rounds_max"] == max(stale)
        else:
            assert math.isnan(row["age_s_median"])


def test_compare_sums_the_same_number_of_own_rounds_for_every_worker(folders):
    """Running, the quick workers played 4 rounds and the slow one fewer: each worker's cumulative reward is over
    the slow one's count of its own rounds, not over the quick ones' 4."""
    rewards = raw_rewards(folders["running"])
    common = len(rewards[SLOW])
    [row] = analysis.compare(LocalStorage(folders["running"]), [EXPERIMENT], EXPERIMENT)
    assert (row.rounds, row.mode, row.nodes) == (common, "async", 3)
    expected = statistics.fmean(sum(by_round[r] for r in range(common)) for by_round in rewards.values())
    assert row.cumulative_mean == pytest.approx(expected)
    assert analysis.completed_rounds(LocalStorage(folders["running"]), EXPERIMENT) == common
    table = analysis.format_table([row])
    assert f"| {common} (own, async) |" in table and f"its own rounds 0..{common - 1}" in table


def test_a_synchronous_baseline_is_compared_over_the_async_experiments_common_rounds(folders, tmp_path):
    shutil.copytree(folders["running"], tmp_path / "shared")
    storage = LocalStorage(tmp_path / "shared")
    sync = {"x": [0.1, 0.2, 0.3, 0.4], "y": [0.5, 0.5, 0.5, 0.5]}  # a finished synchronous run of 4 rounds
    exchange = Exchange(storage, Layout("base"), "writer", "0123456789abcdef")
    for node, rewards in sync.items():
        for round_, reward in enumerate(rewards):
            exchange.write_reward(
                RewardRecord(node_id=node, run_id="0123456789abcdef", round=round_, stage=0, reward=reward,
                             num_local_groups=3, num_external_groups=0, external_requested=0, submitted_at=1.0)
            )  # fmt: skip
    common = len(raw_rewards(folders["running"])[SLOW])
    base, other = analysis.compare(storage, [EXPERIMENT], "base")
    assert [(r.experiment, r.mode, r.rounds) for r in (base, other)] == [
        ("base", "sync", common),
        (EXPERIMENT, "async", common),
    ]
    assert base.cumulative_mean == pytest.approx(statistics.fmean(sum(v[:common]) for v in sync.values()))
    table = analysis.format_table([base, other]).splitlines()
    assert table[2].startswith(f"| base | 2 | {common} |") and table[3].startswith(f"| async | 3 | {common} (own")


def test_report_has_each_workers_progress_and_the_async_figures(folders, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "FIGURES", {})  # only the asynchronous figures (all are drawn in the plots test)
    files = report.write_report(LocalStorage(folders["running"]), EXPERIMENT, tmp_path)
    names = {f.name for f in files}
    assert {"workers.csv", "reward_over_time.png", "external_staleness.png", "index.html"} <= names
    workers = {line.split(",")[0]: line.split(",") for line in (tmp_path / "workers.csv").read_text().splitlines()}
    header = workers.pop("node")
    assert header[:5] == ["node", "round", "rounds_played", "done", "rounds_asking"]
    assert [workers[w][header.index("done")] for w in ("a", "b", SLOW)] == ["True", "True", "False"]
    played = len(raw_rewards(folders["running"])[SLOW])
    assert workers[SLOW][header.index("rounds_played")] == str(played)
    page = (tmp_path / "index.html").read_text()
    assert STATE_ROUND not in page and "Workers (asynchronous" in page
    assert f"asynchronous rounds (each worker its own: {played} to {ROUNDS} played, 2 worker(s) done)" in page


def test_plots_show_rewards_over_own_rounds_and_wall_clock_and_staleness_per_worker(folders):
    snap = snapshot_of(folders["finished"])
    figures = plots.all_figures(snap)
    assert {"reward_over_time", "external_staleness"} <= set(figures)
    over_time = figures["reward_over_time"]
    time_ax, round_ax = over_time.axes
    assert time_ax.get_xlabel() == "minutes since the first metric line"
    assert round_ax.get_xlabel() == "round (each worker's own)"
    metrics = {w: read_lines(folders["finished"] / LAYOUT.metrics_file(w)) for w in (*QUICK, SLOW)}
    for line in round_ax.get_lines():
        node = line.get_label()
        values = [m["values"]["reward/local_mean"] for m in metrics[node] if "reward/local_mean" in m["values"]]
        assert list(line.get_xdata()) == list(range(ROUNDS)) and list(line.get_ydata()) == pytest.approx(values)
    assert {line.get_label() for line in time_ax.get_lines()} == {*QUICK, SLOW}
    assert figures["reward_per_round"].axes[0].get_xlabel() == "round (each worker's own)"
    progress = figures["live_workers"].axes[0]
    assert progress.get_xlabel() == "minutes since the first metric line"
    fill_ax = figures["external_staleness"].axes[0]
    assert [t.get_text() for t in fill_ax.get_xticklabels()] == ["a", "b", SLOW]
    table = monitor.external_per_worker(snap)
    bars = {f"{r.node} {r.got}/{r.asked}": r.fill for r in table.itertuples()}
    assert plots.legend_labels(figures["external_staleness"]) == set(bars)
    assert sorted(p.get_height() for p in fill_ax.patches) == pytest.approx(sorted(bars.values()))


def test_the_dashboards_show_progress_per_worker_not_the_states_round(folders, monkeypatch):
    storage = LocalStorage(folders["running"])
    monkeypatch.setattr(web, "FIGURES", {})  # the page's own asynchronous figures and captions only
    section = web.Pages(storage, EXPERIMENT, refresh_s=10, liveness_timeout=120).part(EXPERIMENT)
    assert 'data-round="" data-mode="async"' in section and STATE_ROUND not in section
    assert "own round" in section and 'data-figure="reward_over_time"' in section
    monkeypatch.setattr(plots, "FIGURES", {})  # its figures are all_figures' (the plots test): none drawn here
    monkeypatch.setattr(plots, "ASYNC_FIGURES", {})
    dashboard = Dashboard(storage, selected=EXPERIMENT)
    dashboard.refresh()
    texts = [o["data"].get("text/html", "") for o in dashboard.output.outputs]
    assert any("own round" in t and "slow" in t for t in texts)
    assert not any(STATE_ROUND in t for t in texts)


def test_trackers_get_each_workers_own_round_and_the_staleness_keys_under_swarm(folders):
    """What a tracker is given (REPORT_TO): a worker's metric lines with their own round as the step; the
    asynchronous pickup's keys keep their ``swarm/`` names, distinct from every other key."""
    lines = read_lines(folders["finished"] / LAYOUT.metrics_file("a"))
    assert sorted({m["round"] for m in lines}) == list(range(ROUNDS))
    keys = {k for m in lines for k in m["values"]}
    assert "swarm/external_stale_skipped" in keys
    took = bool(raw_externals(folders["finished"])["a"])
    assert ({"swarm/external_age_s_max", "swarm/external_staleness_rounds_mean"} <= keys) == took
    mapped = {k: tracker_key(k) for k in keys}
    assert all(mapped[k] == k for k in keys if k.startswith("swarm/"))
    assert all(v.split("/")[0] in ("train", "swarm", "time", "gen", "eval") for v in mapped.values()), mapped
    assert len(set(mapped.values())) == len(mapped)


def test_the_summary_table_heads_each_column_with_a_workers_own_round(folders):
    """show_summary's table (the demo's and the notebooks'): one column per own round, each worker's reward there."""
    from swarm_gdrive.observe.monitor import summary_table

    table = summary_table(LocalStorage(folders["running"]), EXPERIMENT).splitlines()
    assert table[0].split()[:3] == ["node", "own", "round"] and " round 0 " in table[0]
    rewards = raw_rewards(folders["running"])
    for line in table[1:]:
        node, *cells = (c.strip() for c in line.split("  ") if c.strip())
        played = _externals_per_round(folders["running"], node)
        assert [c for c in cells if c != "-"] == [f"{rewards[node][r]:.3f} ({e} ext)" for r, e in played]


def _externals_per_round(folder: Path, node: str) -> list[tuple[int, int]]:
    out = []
    for path in sorted((folder / LAYOUT.rewards_dir).glob(f"round_*/stage_0/{node}.json")):
        rec = read_json(path)
        out.append((rec["round"], rec["num_external_groups"]))
    return sorted(out)
