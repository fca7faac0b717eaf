"""The monitor's figures: each function takes a :class:`~swarm_gdrive.observe.monitor.Snapshot` and returns a
:class:`matplotlib.figure.Figure`.

Figures are built with :class:`~matplotlib.figure.Figure` directly (no pyplot, no global figure
registry, no GUI backend), so they are safe under Agg, in threads and in notebooks, and are freed
when dropped. Every function draws a "no data yet" figure instead of raising when the experiment
has nothing to show. Nodes keep the same color in every figure of a snapshot.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterable

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from swarm_gdrive.observe.analysis import common_rounds
from swarm_gdrive.observe.figure_texts import FIGURE_TEXTS, figure_texts  # noqa: F401 (FIGURE_TEXTS: for readers)
from swarm_gdrive.observe.monitor import Snapshot, external_per_worker

NO_DATA = "no data yet"
FIGSIZE = (8.0, 4.5)
#: Rounds in the rolling mean of the reward figure.
ROLLING = 5
#: Task panels of the held-out figure at most (the most evaluated tasks; reasoning-gym mixes use about ten).
EVAL_TASKS_SHOWN = 12
#: Entries of a figure's legend at most (a folder may hold the files of hundreds of nodes, some planted).
LEGEND_ENTRIES = 24


def _title(name: str, is_async: bool = False) -> str:
    """The title a figure draws on itself (:data:`~swarm_gdrive.observe.figure_texts.FIGURE_TEXTS`)."""
    return figure_texts("title", is_async)[name]


# -- helpers ---------------------------------------------------------------------------------


def _no_data(title: str, detail: str = "") -> Figure:
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    text = NO_DATA + (f"\n{detail}" if detail else "")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=14, color="gray", transform=ax.transAxes)
    ax.set(title=title, xlabel="round", ylabel="")
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, legend_title: str | None = "node") -> None:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if xlabel.startswith("round") or xlabel.startswith("evaluated"):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > LEGEND_ENTRIES:  # drawing and laying out hundreds of entries takes seconds a figure
        more = len(handles) - LEGEND_ENTRIES
        title = f"{legend_title or ''} (first {LEGEND_ENTRIES}; {more} more not listed)".strip()
        # A fixed corner: "best" weighs every entry's box against every plotted point (seconds with hundreds).
        ax.legend(handles[:LEGEND_ENTRIES], labels[:LEGEND_ENTRIES], title=title, fontsize="x-small", loc="upper left")
    elif handles:
        ax.legend(title=legend_title, fontsize="small")


def _worker_nodes(snapshot: Snapshot) -> set[str]:
    """Nodes that are workers, or that submitted rewards or rollouts as one."""
    return set(snapshot.workers()) | set(snapshot.rewards["node"]) | set(snapshot.rollouts_per_round["node"])


def node_colors(snapshot: Snapshot) -> dict[str, str]:
    """A stable color per node (workers first, sorted), shared by every figure of the snapshot."""
    nodes = sorted(_worker_nodes(snapshot))
    nodes += sorted(set(snapshot.peers["node"]) - set(nodes))
    return {node: f"C{i % 10}" for i, node in enumerate(nodes)}


#: One marker per node (with its color), so that nodes whose lines coincide stay told apart.
MARKERS = "osD^v<>ph*"


def node_markers(snapshot: Snapshot) -> dict[str, str]:
    """A stable marker per node, in the order of :func:`node_colors`."""
    return {node: MARKERS[i % len(MARKERS)] for i, node in enumerate(node_colors(snapshot))}


def dodge(nodes: list[str], width: float = 0.3) -> dict[str, float]:
    """An x offset per node, spread over ``width`` rounds, so equal values of several nodes do not hide each
    other (every point stays within its round)."""
    n = len(nodes)
    if n < 2:
        return dict.fromkeys(nodes, 0.0)
    return {node: (i / (n - 1) - 0.5) * width for i, node in enumerate(nodes)}


def _round_axis(snapshot: Snapshot) -> str:
    """The x label of a per-round figure: asynchronous, round R is each worker's own R-th round (not one moment)."""
    return "round (each worker's own)" if snapshot.is_async else "round"


def _per_round_reward(snapshot: Snapshot) -> pd.DataFrame:
    """Mean reward (over stages) per round x node."""
    return snapshot.rewards.groupby(["round", "node"])["reward"].mean().unstack("node").sort_index()


def _reward_figure(snapshot: Snapshot) -> tuple[Figure, Axes, pd.DataFrame, dict[str, str]]:
    """A new figure and its axes, the reward per round x node, and the node colors (rewards not empty)."""
    fig = Figure(figsize=FIGSIZE)
    return fig, fig.subplots(), _per_round_reward(snapshot), node_colors(snapshot)


def _metric(snapshot: Snapshot, key: str) -> pd.DataFrame:
    """Rows of ``metrics`` that carry ``key``, with node, round and the value."""
    metrics = snapshot.metrics
    if metrics.empty or key not in metrics.columns:
        return pd.DataFrame(columns=["node", "round", key])
    column = metrics[key]
    if isinstance(column.dtype, pd.SparseDtype):  # a rarely filled column of a large table (observe.logs)
        column = column.sparse.to_dense()
    keep = (column.notna() & metrics["round"].notna()).to_numpy()
    rows = pd.DataFrame({"node": metrics["node"].to_numpy()[keep], "round": metrics["round"].to_numpy()[keep]})
    rows[key] = column.to_numpy()[keep]
    return rows.astype({"round": int})


# -- figures ---------------------------------------------------------------------------------


def reward_per_round(snapshot: Snapshot, window: int = ROLLING) -> Figure:
    """Reward per node per round (dots) with a ``window``-round rolling mean (line)."""
    title = _title("reward_per_round")
    if snapshot.rewards.empty:
        return _no_data(title)
    fig, ax, per_round, colors = _reward_figure(snapshot)
    markers, shift = node_markers(snapshot), dodge(list(per_round.columns))
    for node in per_round.columns:
        series = per_round[node].dropna()
        color = colors.get(node)
        ax.plot(series.index + shift[node], series.values, markers.get(node, "o"), color=color, alpha=0.5)
        rolling = series.rolling(window, min_periods=1).mean()
        ax.plot(rolling.index + shift[node], rolling.values, "-", color=color, linewidth=2, label=node)
    _finish(
        ax,
        f"{title} (dots) and {window}-round rolling mean (lines)",
        _round_axis(snapshot),
        "mean reward of local completions",
    )
    fig.tight_layout()
    return fig


def cumulative_reward(snapshot: Snapshot) -> Figure:
    """Each node's cumulative sum of its per-round mean reward."""
    title = _title("cumulative_reward")
    if snapshot.rewards.empty:
        return _no_data(title)
    fig, ax, per_round, colors = _reward_figure(snapshot)
    markers, shift = node_markers(snapshot), dodge(list(per_round.columns))
    for node in per_round.columns:
        series = per_round[node].dropna().cumsum()
        ax.plot(
            series.index + shift[node], series.values, marker=markers.get(node, "o"), color=colors.get(node), label=node
        )
    _finish(ax, title, _round_axis(snapshot), "cumulative reward")
    fig.tight_layout()
    return fig


def swarm_reward_spread(snapshot: Snapshot) -> Figure:
    """Swarm mean reward per round with a +-1 std band, min and max, and each node's value as a dot."""
    title = _title("swarm_reward_spread")
    if snapshot.rewards.empty:
        return _no_data(title)
    fig, ax, per_round, colors = _reward_figure(snapshot)
    mean, std = per_round.mean(axis=1), per_round.std(axis=1, ddof=0).fillna(0.0)
    x = per_round.index
    ax.fill_between(x, mean - std, mean + std, color="tab:blue", alpha=0.2, label="mean +- std")
    ax.plot(x, mean, color="tab:blue", linewidth=2, label="swarm mean")
    ax.plot(x, per_round.min(axis=1), "--", color="gray", linewidth=1, label="min")
    ax.plot(x, per_round.max(axis=1), ":", color="gray", linewidth=1, label="max")
    for node in per_round.columns:
        series = per_round[node].dropna()
        ax.scatter(series.index, series.values, s=14, color=colors.get(node), alpha=0.7, label=node, zorder=3)
    _finish(ax, title, _round_axis(snapshot), "mean reward", legend_title=None)
    fig.tight_layout()
    return fig


def _metric_times(snapshot: Snapshot, key: str) -> pd.DataFrame:
    """:func:`_metric` with each line's time: ``node, round, minutes, key``, minutes since the experiment's first
    metric line (the writers' clocks)."""
    rows = _metric(snapshot, key)
    if rows.empty:
        return rows.assign(minutes=pd.Series(dtype=float))
    metrics = snapshot.metrics
    column = metrics[key]
    if isinstance(column.dtype, pd.SparseDtype):
        column = column.sparse.to_dense()
    ts = metrics["ts"].to_numpy()[(column.notna() & metrics["round"].notna()).to_numpy()]
    return rows.assign(minutes=(ts - float(metrics["ts"].min())) / 60.0)


def reward_over_time(snapshot: Snapshot) -> Figure:
    """Asynchronous rounds: each worker's reward (``reward/local_mean`` of its stage lines) over wall-clock time,
    beside the same over its own rounds: a fast worker's rounds are not a slow one's, the clock is shared."""
    title = _title("reward_over_time")
    rows = _metric_times(snapshot, "reward/local_mean")
    if rows.empty:
        return _no_data(title, "(no reward/local_mean metrics)")
    colors, markers = node_colors(snapshot), node_markers(snapshot)
    fig = Figure(figsize=(12.0, 4.5))
    left, right = fig.subplots(1, 2)
    for node, own in rows.groupby("node"):
        own = own.sort_values("minutes")
        style = {"marker": markers.get(node, "o"), "markersize": 4, "color": colors.get(node), "label": node}
        left.plot(own["minutes"], own["reward/local_mean"], "-", alpha=0.8, **style)
        per_round = own.groupby("round")["reward/local_mean"].mean().sort_index()
        right.plot(per_round.index, per_round.values, "-", alpha=0.8, **style)
    _finish(left, "Reward over time", "minutes since the first metric line", "mean reward of local completions")
    _finish(right, "Reward over its own rounds", "round (each worker's own)", "mean reward of local completions")
    fig.tight_layout()
    return fig


def external_staleness(snapshot: Snapshot) -> Figure:
    """Asynchronous rounds, per worker: the fill rate of its external groups (received / asked, reward records),
    and the age (seconds, on the taker's clock) and staleness (the taker's own rounds) of each group it took
    (its ``externals_taken`` events), each a dot over a box."""
    title = _title("external_staleness")
    fill, taken = external_per_worker(snapshot), snapshot.externals
    if fill.empty and taken.empty:
        return _no_data(title, "(no worker asked for external groups)")
    colors = node_colors(snapshot)
    fig = Figure(figsize=(15.0, 4.5))
    axes = fig.subplots(1, 3)
    nodes = sorted(set(fill["node"]) | set(taken["node"]))
    x = {node: i for i, node in enumerate(nodes)}
    ax = axes[0]
    for row in fill.itertuples(index=False):
        ax.bar(x[row.node], row.fill, color=colors.get(row.node), label=f"{row.node} {int(row.got)}/{int(row.asked)}")
    ax.set_ylim(0, 1.05)
    _finish(ax, "Fill rate: received / asked (J)", "worker", "fill rate", legend_title=None)
    for ax, key, name in (
        (axes[1], "age_s", "Age of the groups taken (s)"),
        (axes[2], "staleness_rounds", "Staleness in the taker's own rounds"),
    ):
        if taken.empty:
            ax.text(0.5, 0.5, "no group taken", ha="center", va="center", color="gray", transform=ax.transAxes)
        for node, own in taken.groupby("node"):
            values = own[key].astype(float).to_numpy()
            ax.boxplot([values], positions=[x[node]], widths=0.5, showfliers=False)
            ax.scatter([x[node]] * len(values), values, s=12, color=colors.get(node), alpha=0.6, zorder=3)
        _finish(ax, name, "worker", key.replace("_", " "), legend_title=None)
    for ax in axes:
        ax.set_xticks(range(len(nodes)), nodes)
    fig.tight_layout()
    return fig


def _async_progress(snapshot: Snapshot) -> Figure:
    """Asynchronous rounds: each worker's own round over time (its end-of-round lines), and the coordinator's
    ``swarm/live_workers`` over time."""
    title = _title("live_workers", is_async=True)
    ends, coord = _metric_times(snapshot, "round/seconds"), _metric_times(snapshot, "swarm/live_workers")
    if ends.empty and coord.empty:
        return _no_data(title)
    colors, markers = node_colors(snapshot), node_markers(snapshot)
    fig = Figure(figsize=(12.0, 4.5))
    left, right = fig.subplots(1, 2)
    for node, own in ends.groupby("node"):
        own = own.sort_values("minutes")
        left.step(own["minutes"], own["round"], where="post", marker=markers.get(node, "o"), color=colors.get(node),
                  label=node)  # fmt: skip
    state = snapshot.state_record
    if state is not None:
        left.axhline(int(state["max_rounds"]) - 1, color="gray", linestyle=":", label="last round (MAX_ROUNDS - 1)")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(left, "Round each worker ended", "minutes since the first metric line", "own round", legend_title=None)
    for node, rows in coord.groupby("node"):
        rows = rows.sort_values("minutes")
        right.step(rows["minutes"], rows["swarm/live_workers"], where="post", color="black",
                   label=f"live workers ({node}'s view)")  # fmt: skip
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    if coord.empty:
        right.text(0.5, 0.5, "not logged yet", ha="center", va="center", color="gray", transform=right.transAxes)
    _finish(right, "Live workers", "minutes since the first metric line", "workers", legend_title=None)
    fig.tight_layout()
    return fig


def live_workers(snapshot: Snapshot) -> Figure:
    """Workers with a reward in each round, and the coordinator's ``swarm/live_workers`` when logged.
    Asynchronous, where rounds are no common clock: each worker's own round and the live workers over time."""
    if snapshot.is_async:
        return _async_progress(snapshot)
    title = _title("live_workers")
    coord = _metric(snapshot, "swarm/live_workers")
    if snapshot.rewards.empty and coord.empty:
        return _no_data(title)
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    if not snapshot.rewards.empty:
        rewarded = snapshot.rewards.groupby("round")["node"].nunique().sort_index()
        ax.bar(rewarded.index, rewarded.values, color="tab:green", alpha=0.5, label="workers with a reward")
    if not coord.empty:
        for node, rows in coord.groupby("node"):
            last = rows.groupby("round")["swarm/live_workers"].last().sort_index()
            ax.plot(last.index, last.values, "o-", color="black", label=f"live workers ({node}'s view)")
    state = snapshot.state_record
    if state is not None and state.get("live_workers") is not None and state.get("status") in ("waiting", "running"):
        ax.axhline(len(state["live_workers"]), color="tab:red", linestyle=":", label="live now (state file)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(ax, title, _round_axis(snapshot), "workers", legend_title=None)
    fig.tight_layout()
    return fig


def rollouts_exchanged(snapshot: Snapshot) -> Figure:
    """Groups published per round (stacked by node) and external groups each node trained on."""
    title = _title("rollouts_exchanged")
    rollouts, rewards = snapshot.rollouts_per_round, snapshot.rewards
    used_metric = _metric(snapshot, "swarm/external_used")
    if rollouts.empty and rewards.empty and used_metric.empty:
        return _no_data(title)
    colors = node_colors(snapshot)
    fig = Figure(figsize=(12.0, 4.5))
    left, right = fig.subplots(1, 2)
    if not rollouts.empty:
        published = rollouts.groupby(["round", "node"])["groups"].sum().unstack("node").fillna(0).sort_index()
        bottom = pd.Series(0.0, index=published.index)
        for node in published.columns:
            left.bar(published.index, published[node], bottom=bottom, color=colors.get(node), label=node)
            bottom += published[node]
    else:
        left.text(0.5, 0.5, "no rollout files", ha="center", va="center", color="gray", transform=left.transAxes)
    _finish(left, "Groups published per round", _round_axis(snapshot), "groups in rollout files")
    if not rewards.empty:
        used = rewards.groupby(["round", "node"])["external_groups"].sum().unstack("node").sort_index()
        markers, shift = node_markers(snapshot), dodge(list(used.columns))
        for node in used.columns:
            series = used[node].dropna()
            right.plot(
                series.index + shift[node], series.values, "-", marker=markers.get(node, "o"), color=colors.get(node),
                label=node, alpha=0.8,
            )  # fmt: skip
    if not used_metric.empty:
        total = used_metric.groupby("round")["swarm/external_used"].sum().sort_index()
        right.plot(total.index, total.values, "k--", label="total of shown nodes (swarm/external_used)")
    right.set_ylim(bottom=0)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(right, "External groups used per round", _round_axis(snapshot), "external groups trained on")
    fig.tight_layout()
    return fig


def reward_histogram(snapshot: Snapshot, bins: int = 20) -> Figure:
    """Distribution of reward-file rewards, one step histogram per node."""
    title = _title("reward_histogram")
    rewards = snapshot.rewards
    if rewards.empty:
        return _no_data(title)
    colors = node_colors(snapshot)
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    lo, hi = float(rewards["reward"].min()), float(rewards["reward"].max())
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)] if hi > lo else [lo - 0.5, lo + 0.5]
    for node, rows in rewards.groupby("node"):
        ax.hist(rows["reward"], bins=edges, histtype="step", linewidth=2, color=colors.get(node), label=node)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(ax, f"{title} (per node, round and stage)", "reward", "count")
    fig.tight_layout()
    return fig


def completion_lengths(snapshot: Snapshot) -> Figure:
    """Mean completion length per node per round (metric ``completion/length_mean``)."""
    title = _title("completion_lengths")
    lengths = _metric(snapshot, "completion/length_mean")
    if lengths.empty:
        return _no_data(title, "(no completion/length_mean metrics)")
    colors, markers, shift = node_colors(snapshot), node_markers(snapshot), dodge(sorted(lengths["node"].unique()))
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    for node, rows in lengths.groupby("node"):
        series = rows.groupby("round")["completion/length_mean"].mean().sort_index()
        ax.plot(series.index + shift[node], series.values, "-", marker=markers.get(node, "o"), color=colors.get(node),
                label=node)  # fmt: skip
    _finish(ax, f"{title}: mean per round", _round_axis(snapshot), "tokens per completion")
    fig.tight_layout()
    return fig


def eval_pass1(snapshot: Snapshot) -> Figure:
    """Held-out pass@1 per node with ± 1 standard error bars, one panel per task, over rounds (lowest level)."""
    title = _title("eval_pass1")
    evals = snapshot.evals
    if evals.empty:
        return _no_data(title, "(no evaluations)")
    colors = node_colors(snapshot)
    counts = evals["task"].value_counts()
    tasks = sorted(counts.index[:EVAL_TASKS_SHOWN])  # the most evaluated: a figure stays a readable width
    fig = Figure(figsize=(max(6.0, 4.5 * len(tasks)), 4.5))
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        rows = evals[evals["task"] == task]
        rows = rows[rows["level"] == rows["level"].min()]
        markers, shift = node_markers(snapshot), dodge(sorted(rows["node"].unique()))
        for node, own in rows.groupby("node"):
            by_round = own.assign(pass1_se=own.get("pass1_se", 0.0)).groupby("round")  # tables built by hand lack it
            series = by_round["pass1"].mean().sort_index()
            se = by_round["pass1_se"].mean().reindex(series.index).fillna(0.0)  # one record a round as a rule
            ax.errorbar(series.index + shift[node], series.values, yerr=se.values, fmt="-",
                        marker=markers.get(node, "o"), capsize=3, color=colors.get(node), label=node)  # fmt: skip
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, f"{title}: {task}", "evaluated before round", "greedy pass@1 (± 1 SE)")
    fig.tight_layout()
    return fig


#: The panels of :func:`training`: the metric key, and its name in TRL (and in the trackers, REPORT_TO).
TRAINING_PANELS = {
    "train/loss": "loss",
    "train/grad_norm": "grad_norm",
    "train/kl": "kl (BETA > 0)",
    "train/clip_ratio_region_mean": "clip_ratio/region_mean",
    "reward/local_zero_variance_fraction": "frac_reward_zero_std",
}


def training(snapshot: Snapshot) -> Figure:
    """What TRL users judge a GRPO run by, per node per round: loss, gradient norm, KL, clip ratio, the fraction of
    groups without reward variance, and the reward of the node's own completions against the external ones it
    trained on (the SAPO mix). A panel whose metric no node logged says so."""
    title = _title("training")
    logged = {key: _metric(snapshot, key) for key in TRAINING_PANELS}
    local, external = _metric(snapshot, "reward/local_mean"), _metric(snapshot, "reward/external_mean")
    if all(rows.empty for rows in logged.values()) and local.empty:
        return _no_data(title, "(no train/* metrics: the grpo workload logs them)")
    colors, markers = node_colors(snapshot), node_markers(snapshot)
    fig = Figure(figsize=(15.0, 8.0))
    axes = fig.subplots(2, 3).ravel()
    for ax, (key, name) in zip(axes, TRAINING_PANELS.items(), strict=False):
        rows = logged[key]
        if rows.empty:
            ax.text(0.5, 0.5, f"not logged ({key})", ha="center", va="center", color="gray", transform=ax.transAxes)
        shift = dodge(sorted(rows["node"].unique())) if not rows.empty else {}
        for node, own in rows.groupby("node"):
            series = own.groupby("round")[key].mean().sort_index()
            ax.plot(series.index + shift[node], series.values, "-", marker=markers.get(node, "o"), markersize=4,
                    color=colors.get(node), label=node, alpha=0.8)  # fmt: skip
        _finish(ax, name, _round_axis(snapshot), name.split(" ")[0], legend_title=None)
    ax = axes[-1]
    for rows, key, style, what in (
        (local, "reward/local_mean", "-", "own"),
        (external, "reward/external_mean", "--", "external"),
    ):
        for node, own in rows.groupby("node"):
            series = own.groupby("round")[key].mean().sort_index()
            ax.plot(series.index, series.values, style, marker=markers.get(node, "o"), markersize=4,
                    color=colors.get(node), label=f"{node} {what}")  # fmt: skip
    _finish(ax, "reward: own (solid), external groups (dashed)", _round_axis(snapshot), "reward", legend_title=None)
    fig.suptitle(f"{title}: TRL's metrics per node per round")
    fig.tight_layout()
    return fig


#: The parts of a worker's round (its stage lines' ``time/*`` keys), and what the rest of ``round/seconds`` is.
TIME_PARTS = {"time/generate_s": "generate", "time/gather_s": "gather", "time/train_s": "train"}


def time_split(snapshot: Snapshot) -> Figure:
    """Where a worker's round goes: generation, the gather of other nodes' rollouts, training, and the rest of the
    round (a held-out evaluation, a checkpoint, its writes), mean over workers, stacked per round. The wait for
    the next round falls between rounds and is not in it."""
    title = _title("time_split")
    totals = _metric(snapshot, "round/seconds")
    if totals.empty:
        return _no_data(title)
    per_round = pd.DataFrame({"round": totals.groupby(["node", "round"])["round/seconds"].sum()})
    for key, part in TIME_PARTS.items():
        rows = _metric(snapshot, key)
        per_round[part] = rows.groupby(["node", "round"])[key].sum() if not rows.empty else 0.0
    per_round = per_round.fillna(0.0)
    busy = per_round[list(TIME_PARTS.values())].sum(axis=1)
    per_round["other (evaluation, checkpoint, writes)"] = (per_round["round"] - busy).clip(lower=0.0)
    means = per_round.drop(columns="round").groupby(level="round").mean().sort_index()
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    bottom = pd.Series(0.0, index=means.index)
    for i, part in enumerate(means.columns):
        ax.bar(means.index, means[part], bottom=bottom, color=f"C{i}", label=part, width=0.8)
        bottom = bottom + means[part]
    _finish(ax, f"{title} (mean over workers)", _round_axis(snapshot), "seconds", legend_title="part")
    fig.tight_layout()
    return fig


def experiments_overlay(snapshots: dict[str, Snapshot]) -> Figure:
    """Several experiments on one figure (``swarm-gdrive compare --plot``): the swarm's mean reward per round,
    its cumulative sum, and held-out pass@1 (mean over workers and tasks) where evaluated; one color and
    marker per experiment. An asynchronous experiment's curves stop at the rounds every worker has played (each its
    own, as ``compare`` counts them): beyond, the mean would be the fast workers' alone."""
    title = _title("experiments_overlay")
    if all(s.rewards.empty for s in snapshots.values()):
        return _no_data(title, "(no rewards in any of them)")
    fig = Figure(figsize=(15.0, 4.5))
    reward_ax, cumulative_ax, eval_ax = fig.subplots(1, 3)
    shift = dodge(list(snapshots))  # equal curves (two runs of one seed) stay visible side by side
    for i, (name, snapshot) in enumerate(snapshots.items()):
        style = {"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)], "markersize": 4, "label": name}
        if not snapshot.rewards.empty:
            rewards = snapshot.rewards
            if snapshot.is_async:
                rewards = rewards[rewards["round"] < common_rounds(rewards.to_dict("records"), "async")]
            mean = rewards.groupby(["round", "node"])["reward"].mean().groupby(level="round").mean()
            reward_ax.plot(mean.index + shift[name], mean.values, "-", **style)
            cumulative_ax.plot(mean.index + shift[name], mean.cumsum().values, "-", **style)
        if not snapshot.evals.empty:
            base = snapshot.evals[snapshot.evals["level"] == 0]
            accuracy = base.groupby("round")["pass1"].mean().sort_index()
            eval_ax.plot(accuracy.index + shift[name], accuracy.values, "-", **style)
    if not eval_ax.get_lines():
        eval_ax.text(0.5, 0.5, "no evaluations", ha="center", va="center", color="gray", transform=eval_ax.transAxes)
    _finish(reward_ax, "Mean reward per round (over workers)", "round", "reward", legend_title="experiment")
    _finish(cumulative_ax, "Cumulative mean reward", "round", "cumulative reward", legend_title="experiment")
    _finish(eval_ax, "Held-out pass@1 (mean over workers, tasks)", "evaluated before round", "pass@1", "experiment")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[Snapshot], Figure]] = {
    "reward_per_round": reward_per_round,
    "cumulative_reward": cumulative_reward,
    "swarm_reward_spread": swarm_reward_spread,
    "live_workers": live_workers,
    "rollouts_exchanged": rollouts_exchanged,
    "reward_histogram": reward_histogram,
    "completion_lengths": completion_lengths,
    "eval_pass1": eval_pass1,
    "time_split": time_split,
    "training": training,
}


#: The figures only an asynchronous experiment gets (GDRIVE_IMPLEMENTATION.md §5.10).
ASYNC_FIGURES: dict[str, Callable[[Snapshot], Figure]] = {
    "reward_over_time": reward_over_time,
    "external_staleness": external_staleness,
}


def figures_for(snapshot: Snapshot) -> dict[str, Callable[[Snapshot], Figure]]:
    """The figure functions of ``snapshot``'s mode by name: :data:`FIGURES`, then :data:`ASYNC_FIGURES` when it
    plays asynchronous rounds."""
    return {**FIGURES, **ASYNC_FIGURES} if snapshot.is_async else dict(FIGURES)


def all_figures(snapshot: Snapshot, nodes: Iterable[str] | None = None) -> dict[str, Figure]:
    """Every figure of the snapshot's mode by name (:func:`figures_for`); with ``nodes``, only those workers (see
    :func:`filter_nodes`)."""
    if nodes is not None:
        snapshot = filter_nodes(snapshot, nodes)
    return {name: fn(snapshot) for name, fn in figures_for(snapshot).items()}


def filter_nodes(snapshot: Snapshot, nodes: Iterable[str]) -> Snapshot:
    """A copy of ``snapshot`` whose per-worker rows are those of ``nodes``; rows of nodes that are not
    workers (the coordinator's metrics, e.g. ``swarm/live_workers``) are kept, and so are the peers (node
    colors stay the same whatever the filter)."""
    keep = set(nodes)
    drop = _worker_nodes(snapshot) - keep

    def keep_rows(df: pd.DataFrame) -> pd.DataFrame:
        if df.empty or "node" not in df.columns:
            return df
        return df[~df["node"].isin(drop)].reset_index(drop=True)

    return dataclasses.replace(
        snapshot,
        rewards=keep_rows(snapshot.rewards),
        rollouts_per_round=keep_rows(snapshot.rollouts_per_round),
        evals=keep_rows(snapshot.evals),
        events=keep_rows(snapshot.events),
        metrics=keep_rows(snapshot.metrics),
        externals=keep_rows(snapshot.externals),
    )


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (works without pyplot and without a display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def legend_labels(fig: Figure) -> set[str]:
    """Every legend entry of the figure's axes (for tests and the dashboard's node filter)."""
    return {text.get_text() for ax in fig.axes if (legend := ax.get_legend()) for text in legend.get_texts()}
