"""The monitor's plots and the notebook dashboard on a real experiment folder (real coordinator and
workers as threads, synthetic workload: 2 workers, 3 rounds, J=1) and on an empty one."""

from __future__ import annotations

import _thread
import dataclasses
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from swarm_gdrive.observe import plots  # noqa: E402
from swarm_gdrive.observe.dashboard import Dashboard, findings_html, list_experiments  # noqa: E402
from swarm_gdrive.observe.monitor import Finding, load  # noqa: E402
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
    # GRPO's metrics, the same for both workers: their lines coincide unless the figure keeps them apart.
    training = pd.DataFrame(
        [
            {"node": n, "ts": 2.0 + r, "round": r, **{k: 0.1 * (r + 1) for k in TRAINING_KEYS}}
            for n in sorted(WORKERS)
            for r in range(3)
        ]
    )
    return dataclasses.replace(snapshot, evals=evals, metrics=pd.concat([snapshot.metrics, lengths, training]))


TRAINING_KEYS = [*plots.TRAINING_PANELS, "reward/external_mean"]


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


def _x_of(ax, label: str) -> list[float]:
    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    return list(line.get_xdata())


def test_training_panels_keep_coinciding_nodes_apart_and_a_finished_run_shows_no_live_line(rich_snapshot):
    figures = plots.all_figures(rich_snapshot)
    train = figures["training"]
    assert len(train.axes) == 6
    assert [ax.get_title() for ax in train.axes[:5]] == list(plots.TRAINING_PANELS.values())
    for ax in train.axes[:5]:  # equal values, yet each node's points sit apart within the round, with their marker
        assert {line.get_label() for line in ax.get_lines()} == WORKERS
        assert _x_of(ax, "w1") != _x_of(ax, "w2")
        assert all(abs(a - b) < 0.5 for a, b in zip(_x_of(ax, "w1"), _x_of(ax, "w2"), strict=True))
        markers = {line.get_marker() for line in ax.get_lines()}
        assert len(markers) == 2
    assert {"w1 own", "w2 own", "w1 external", "w2 external"} <= plots.legend_labels(train)
    right = figures["rollouts_exchanged"].axes[1]  # the external groups used: equal for both workers here
    assert _x_of(right, "w1") != _x_of(right, "w2")
    assert rich_snapshot.state_record["status"] == "finished"
    assert "live now (state file)" not in plots.legend_labels(figures["live_workers"])


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


def test_run_redraws_in_the_foreground_and_lists_experiments_that_appear(folder, tmp_path, capsys):
    """Dashboard.run (the monitoring notebook's auto-refresh): refreshes in the calling thread every period
    until the duration is over, and the dropdown gains an experiment created while it runs."""
    shared = tmp_path / "shared"
    shutil.copytree(folder, shared)
    dash = Dashboard(LocalStorage(shared), refresh_s=0.05, selected=EXPERIMENT)
    assert list(dash.experiment.options) == [EXPERIMENT] and dash.experiment.value == EXPERIMENT
    started = time.monotonic()
    dash.show()
    one = time.monotonic() - started  # a refresh draws every figure: about 1 s on 2 busy cores
    refreshed_in: set[str] = set()
    original = dash.refresh

    def refresh():
        refreshed_in.add(threading.current_thread().name)
        if dash.refresh_count == 2:  # after the first automatic refresh, another experiment starts
            (shared / "experiments" / "later").mkdir()
        return original()

    dash.refresh = refresh
    duration = 3.5 * one + 0.5
    started = time.monotonic()
    count = dash.run(duration_s=duration)
    elapsed = time.monotonic() - started
    assert count >= 2 and dash.refresh_count == count + 1  # show() drew once first
    assert duration - 0.5 < elapsed < duration + 2 * one + 1  # it ends once the duration is over
    assert refreshed_in == {threading.main_thread().name}
    assert list(dash.experiment.options) == [EXPERIMENT, "later"] and dash.experiment.value == EXPERIMENT
    assert f"dashboard: {count} refreshes" in capsys.readouterr().out


def test_run_ends_on_the_stop_button(folder, capsys):
    # A notebook kernel handles SIGINT with Python's default handler; pytest started as a background job of a shell
    # inherits SIGINT ignored, where interrupt_main() does nothing, so the kernel's handler is set here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _stop_button(folder, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_button(folder, capsys):
    dash = Dashboard(LocalStorage(folder), refresh_s=0.1)
    dash.show()
    timer = threading.Timer(0.5, _thread.interrupt_main)  # what Colab's stop button does to the kernel
    timer.start()
    started = time.monotonic()
    try:
        count = dash.run()  # no duration: until stopped
    finally:
        timer.cancel()
    # Ends on the interrupt instead of refreshing forever (a liveness bound, not a speed target: a loaded CI
    # machine once took longer than twice one refresh + 2 s).
    assert time.monotonic() - started < 60
    assert f"dashboard: {count} refreshes" in capsys.readouterr().out
    with pytest.raises(ValueError, match="refresh_s"):
        dash.run(0)


class _SwallowsAnInterrupt:
    """Dropped at once: Python delivers the stop button's interrupt inside its ``__del__``, where the
    KeyboardInterrupt is printed as "Exception ignored" and lost (what a garbage-collected matplotlib object did
    to the loop above on a loaded CI machine: it refreshed until the 300 s test timeout)."""

    def __del__(self):
        _thread.interrupt_main()
        for _ in range(10_000):  # the pending signal is handled on one of these jumps, inside __del__
            pass


def test_the_stop_button_ends_the_loop_even_when_python_loses_its_keyboardinterrupt(folder, capsys, monkeypatch):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        dash = Dashboard(LocalStorage(folder), refresh_s=0.05)
        dash.show()
        real, calls = dash.refresh, []

        def refresh():
            calls.append(1)
            if len(calls) == 3:  # run()'s third refresh (show() drew before the patch)
                _SwallowsAnInterrupt()
            return real()

        monkeypatch.setattr(dash, "refresh", refresh)
        # A bound, not what is tested: long enough for 3 refreshes even where one takes ~6 s (a loaded 2-core
        # machine, every figure redrawn); with 10 s the third refresh could end past the duration, and the loop
        # then ends "after the set duration" before it looks at the noted interrupt.
        count = dash.run(duration_s=120)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # run() put the handler back
    finally:
        signal.signal(signal.SIGINT, previous)
    out = capsys.readouterr().out
    # That refresh ends, then the loop: not two minutes of refreshes ending "after the set duration".
    assert "ended by the stop button" in out and count == 3


def test_findings_html_colors_by_severity():
    text = findings_html([Finding("error", "x", "a <b>"), Finding("info", "state", "ok")])
    assert "#c62828" in text and "#1565c0" in text and "a &lt;b&gt;" in text


def test_the_dashboard_shows_sapo_starvation_first_among_warnings(tmp_path):
    """A lone worker asking for J = 1 external group gets none, every round: the dashboard says so in red or
    orange at the top, never silently."""
    shared = tmp_path / "starved"
    shared.mkdir()
    run_swarm(shared, workers=1, rounds=2, transplants=1)
    dash = Dashboard(LocalStorage(shared), refresh_s=0)
    dash.refresh()
    (starved,) = [f for f in dash.last_findings if f.code == "sapo_starved"]
    assert starved.severity == "warning" and "w1" in starved.message
    html = dash.output.outputs[0]["data"]["text/html"]
    assert "sapo_starved" in html and html.index("sapo_starved") < html.index("</ul>")


def test_the_overlay_tells_experiments_apart(rich_snapshot, snapshot):
    better = dataclasses.replace(
        rich_snapshot, rewards=rich_snapshot.rewards.assign(reward=lambda d: d["reward"] + 0.5)
    )
    fig = plots.experiments_overlay({"baseline": snapshot, "better": better})
    reward_ax, cumulative_ax, eval_ax = fig.axes
    assert plots.legend_labels(fig) == {"baseline", "better"}
    lines = {line.get_label(): line for line in reward_ax.get_lines()}
    assert list(lines["better"].get_ydata()) == pytest.approx([y + 0.5 for y in lines["baseline"].get_ydata()])
    assert lines["better"].get_marker() != lines["baseline"].get_marker()
    assert list(lines["better"].get_xdata()) != list(lines["baseline"].get_xdata())  # dodged: equal curves show
    assert [line.get_label() for line in eval_ax.get_lines()] == ["better"]  # only it has evaluations
    empty = plots.experiments_overlay({"a": dataclasses.replace(snapshot, rewards=snapshot.rewards.iloc[0:0])})
    assert any(plots.NO_DATA in t.get_text() for ax in empty.axes for t in ax.texts)


def test_the_time_split_stacks_the_parts_and_the_rest_of_each_round(snapshot):
    rows = [
        {"node": n, "ts": 5.0 + r, "round": r, "time/generate_s": 1.0, "time/gather_s": 2.0, "time/train_s": 3.0}
        for n in sorted(WORKERS)
        for r in range(2)
    ]
    rows += [
        {"node": n, "ts": 6.0 + r, "round": r, "round/seconds": 10.0 + r} for n in sorted(WORKERS) for r in range(2)
    ]
    fig = plots.time_split(dataclasses.replace(snapshot, metrics=pd.DataFrame(rows)))
    (ax,) = fig.axes
    heights = {}
    for container in ax.containers:
        heights[container.get_label()] = [round(bar.get_height(), 6) for bar in container]
    assert heights == {
        "generate": [1.0, 1.0],
        "gather": [2.0, 2.0],
        "train": [3.0, 3.0],
        "other (evaluation, checkpoint, writes)": [4.0, 5.0],
    }
