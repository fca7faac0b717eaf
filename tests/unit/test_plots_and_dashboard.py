"""The monitor's plots and the notebook dashboard on a real experiment folder (real coordinator and
workers as threads, synthetic workload: 2 workers, 3 rounds, J=1) and on an empty one."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from swarm_gdrive import plots  # noqa: E402
from swarm_gdrive.dashboard import Dashboard, findings_html, list_experiments  # noqa: E402
from swarm_gdrive.monitor import Finding, load  # noqa: E402
from swarm_gdrive.storage import LocalStorage  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swarm_threads import fast_env, run_threads  # noqa: E402

EXPERIMENT = "dash"
WORKERS = {"w1", "w2"}
#: Figures with one curve (or bar, or histogram) per worker.
PER_NODE = {"reward_per_round", "cumulative_reward", "swarm_reward_spread", "rollouts_exchanged", "reward_histogram"}


def run_swarm(folder: Path, workers: int = 2, rounds: int = 3, transplants: int = 1) -> None:
    env = fast_env(folder, EXPERIMENT, MIN_WORKERS=workers, MAX_ROUNDS=rounds, NUM_TRANSPLANT_TREES=transplants)
    run_threads(env, workers)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    shared = tmp_path_factory.mktemp("shared")
    run_swarm(shared)
    return shared


@pytest.fixture(scope="module")
def snapshot(folder):
    return load(LocalStorage(folder), EXPERIMENT)


@pytest.fixture(scope="module")
def rich_snapshot(snapshot):
    """The real snapshot plus what the synthetic workload does not produce: evals and completion lengths."""
    evals = pd.DataFrame(
        [
            {"node": n, "round": r, "task": t, "level": 0, "n": 8, "pass1": p, "mean_score": p, "k": 1, "pass_k": p}
            for n in sorted(WORKERS)
            for r, p in ((0, 0.1), (3, 0.4))
            for t in ("arith", "copy")
        ]
    )
    lengths = pd.DataFrame(
        [{"node": n, "ts": 1.0 + r, "round": r, "completion/length_mean": 10.0 + r} for n in WORKERS for r in range(3)]
    )
    return dataclasses.replace(snapshot, evals=evals, metrics=pd.concat([snapshot.metrics, lengths]))


def _axes_labelled(fig: Figure) -> bool:
    return all(ax.get_xlabel() and ax.get_title() for ax in fig.axes)


def test_the_folder_is_a_real_finished_run(snapshot):
    assert snapshot.state_record["status"] == "finished"
    assert set(snapshot.rewards["node"]) == WORKERS
    assert set(snapshot.rewards["round"]) == {0, 1, 2}


def test_every_plot_is_a_labelled_figure_with_the_workers_in_its_legend(rich_snapshot, tmp_path):
    figures = plots.all_figures(rich_snapshot)
    assert set(figures) == set(plots.FIGURES)
    for name, fig in figures.items():
        assert isinstance(fig, Figure), name
        assert _axes_labelled(fig), name
        assert all(ax.get_ylabel() for ax in fig.axes), name
        if name in PER_NODE | {"completion_lengths", "eval_pass1"}:
            assert plots.legend_labels(fig) >= WORKERS, name
        path = tmp_path / f"{name}.png"
        fig.savefig(path, dpi=100)
        assert path.stat().st_size > 5_000, name
    assert len(figures["eval_pass1"].axes) == 2  # one panel per task
    assert {"workers with a reward", "live workers (coord's view)"} <= plots.legend_labels(figures["live_workers"])


def test_plots_of_the_real_snapshot_say_no_data_where_the_workload_logs_none(snapshot):
    figures = plots.all_figures(snapshot)
    for name in PER_NODE:
        assert plots.legend_labels(figures[name]) >= WORKERS, name
    for name in ("completion_lengths", "eval_pass1"):
        texts = [t.get_text() for ax in figures[name].axes for t in ax.texts]
        assert any(plots.NO_DATA in t for t in texts), name


def test_an_empty_experiment_gives_no_data_figures(tmp_path):
    empty = load(LocalStorage(tmp_path), "nothing")
    for name, fig in plots.all_figures(empty).items():
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert any(plots.NO_DATA in t for t in texts), name
        assert _axes_labelled(fig), name
        path = tmp_path / f"{name}.png"
        fig.savefig(path)
        assert path.stat().st_size > 5_000, name


def test_the_node_filter_keeps_the_coordinator_metrics(rich_snapshot):
    figures = plots.all_figures(rich_snapshot, ["w1"])
    for name in PER_NODE | {"completion_lengths", "eval_pass1"}:
        labels = plots.legend_labels(figures[name])
        assert "w1" in labels and "w2" not in labels, name
    assert "live workers (coord's view)" in plots.legend_labels(figures["live_workers"])


def test_dashboard_refresh_lists_the_experiment_and_filters_nodes(folder):
    dash = Dashboard(str(folder), refresh_s=0)
    assert list(dash.experiment.options) == [EXPERIMENT] == list_experiments(LocalStorage(folder))
    assert dash.widget is not None and dash.refresh_count == 0
    figures = dash.refresh()
    assert dash.refresh_count == 1 and dash.last_error is None
    assert set(figures) == set(plots.FIGURES) and figures is dash.last_figures
    assert set(dash.nodes.options) == WORKERS
    assert plots.legend_labels(figures["reward_per_round"]) >= WORKERS
    assert dash.last_findings[0].code == "state"
    assert len(dash.output.outputs) == 1 + len(plots.FIGURES)  # the findings and one image per figure

    dash.nodes.value = ("w2",)  # as a user would: the observer redraws
    for name in PER_NODE:
        labels = plots.legend_labels(dash.last_figures[name])
        assert "w2" in labels and "w1" not in labels, name
    dash.refresh()  # the filter survives a reload
    assert dash.nodes.value == ("w2",)
    assert "w1" not in plots.legend_labels(dash.last_figures["reward_per_round"])


def test_dashboard_on_an_empty_folder(tmp_path):
    dash = Dashboard(LocalStorage(tmp_path), refresh_s=0)
    assert list(dash.experiment.options) == []
    assert dash.refresh() == {} and dash.last_error is None
    named = Dashboard(LocalStorage(tmp_path), experiments=["later"], refresh_s=0)
    figures = named.refresh()
    assert set(figures) == set(plots.FIGURES)
    assert all(any(plots.NO_DATA in t.get_text() for ax in f.axes for t in ax.texts) for f in figures.values())


def test_auto_refresh_starts_and_stops_within_a_second(folder):
    dash = Dashboard(LocalStorage(folder), refresh_s=0)
    dash.refresh()
    before = dash.refresh_count
    dash.interval.value = 1  # the slider starts the background thread
    assert dash.auto_refreshing
    deadline = time.monotonic() + 10
    while dash.refresh_count == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dash.refresh_count > before
    started = time.monotonic()
    dash.interval.value = 0  # and stops it
    assert time.monotonic() - started < 1.0
    assert not dash.auto_refreshing
    count = dash.refresh_count
    time.sleep(1.2)
    assert dash.refresh_count == count


def test_findings_html_colors_by_severity():
    text = findings_html([Finding("error", "x", "a <b>"), Finding("info", "state", "ok")])
    assert "#c62828" in text and "#1565c0" in text and "a &lt;b&gt;" in text
