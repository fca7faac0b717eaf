"""``swarm-gdrive report``: an experiment folder into CSVs, PNG plots and an HTML page. Reads only.

The full monitor (live dashboard, health findings) is a separate piece; this module gives the
tables and figures a researcher looks at after a run: reward per worker per round and held-out
accuracy per worker and task over rounds.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path

from swarm_gdrive.exchange import Exchange
from swarm_gdrive.layout import Layout, parse_round_dir, parse_stage_dir
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)


def reward_rows(exchange: Exchange) -> list[dict]:
    """One row per valid reward file: node, round, stage, reward, local and external groups."""
    layout, rows = exchange.layout, []
    for round_info in exchange.storage.list(layout.rewards_dir):
        round_ = parse_round_dir(round_info.name)
        if round_ is None:
            continue
        for stage_info in exchange.storage.list(f"{layout.rewards_dir}/{round_info.name}"):
            stage = parse_stage_dir(stage_info.name)
            if stage is None:
                continue
            for node, rec in exchange.read_rewards(round_, stage).items():
                rows.append(
                    {
                        "node": node,
                        "round": round_,
                        "stage": stage,
                        "reward": rec.reward,
                        "local_groups": rec.num_local_groups,
                        "external_groups": rec.num_external_groups,
                    }
                )
    return rows


def eval_rows(exchange: Exchange) -> list[dict]:
    """One row per (eval record, task, level): node, round, task, level, n, pass1, mean_score, pass_k."""
    return [
        {
            "node": rec.node_id,
            "round": rec.round,
            "task": r.task,
            "level": r.level,
            "n": r.n,
            "pass1": r.pass1,
            "mean_score": r.mean_score,
            "k": r.k,
            "pass_k": r.pass_k,
        }
        for rec in exchange.read_evals()
        for r in rec.results
    ]


def write_report(storage: Storage, experiment: str, out: Path) -> list[Path]:
    """Write rewards.csv, evals.csv, the plots and index.html into ``out``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    exchange = Exchange(storage, Layout(experiment), "report")
    out.mkdir(parents=True, exist_ok=True)
    rewards = pd.DataFrame(
        reward_rows(exchange), columns=["node", "round", "stage", "reward", "local_groups", "external_groups"]
    )
    evals = pd.DataFrame(
        eval_rows(exchange), columns=["node", "round", "task", "level", "n", "pass1", "mean_score", "k", "pass_k"]
    )
    files = [out / "rewards.csv", out / "evals.csv"]
    rewards.sort_values(["node", "round", "stage"]).to_csv(files[0], index=False)
    evals.sort_values(["node", "task", "round", "level"]).to_csv(files[1], index=False)
    figures: list[tuple[str, str]] = []

    if not rewards.empty:
        per_round = rewards.groupby(["node", "round"])["reward"].mean().unstack("node").sort_index()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for node in per_round.columns:
            series = per_round[node].dropna()
            line = ax1.plot(series.index, series.values, marker="o", alpha=0.5, label=node)[0]
            ax1.plot(series.index, series.rolling(5, min_periods=1).mean(), color=line.get_color(), linewidth=2)
            ax2.plot(series.index, series.cumsum(), marker=".", label=node)
        ax1.set(
            title="Training reward per round (dots) and 5-round rolling mean",
            xlabel="round",
            ylabel="mean reward of local completions",
        )
        ax2.set(title="Cumulative training reward", xlabel="round", ylabel="cumulative reward")
        for ax in (ax1, ax2):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(title="worker", fontsize="small")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        files.append(_save(fig, out / "reward_per_round.png"))
        figures.append(("reward_per_round.png", "Training reward per worker"))

    base = evals[evals["level"] == 0] if not evals.empty else evals
    if not base.empty:
        tasks = sorted(base["task"].unique())
        fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.5), squeeze=False)
        for ax, task in zip(axes[0], tasks, strict=True):
            for node, rows in base[base["task"] == task].groupby("node"):
                rows = rows.sort_values("round")
                ax.plot(rows["round"], rows["pass1"], marker="o", label=node)
            ax.set(
                title=f"Held-out pass@1: {task}",
                xlabel="evaluated before round",
                ylabel="greedy pass@1",
                ylim=(-0.02, 1.02),
            )
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(title="worker", fontsize="small")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        files.append(_save(fig, out / "eval_pass1.png"))
        figures.append(("eval_pass1.png", "Held-out accuracy per worker and task"))

    files.append(_html(out / "index.html", experiment, figures, rewards, evals))
    return files


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _html(path: Path, experiment: str, figures: list[tuple[str, str]], rewards, evals) -> Path:
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(experiment)}</title>",
        f"<h1>Experiment {html.escape(experiment)}</h1>",
        f"<p>{rewards['node'].nunique() if not rewards.empty else 0} workers, "
        f"{rewards['round'].nunique() if not rewards.empty else 0} rounds with rewards, "
        f"{len(evals)} held-out results. Data: <a href='rewards.csv'>rewards.csv</a>, "
        "<a href='evals.csv'>evals.csv</a>.</p>",
    ]
    for name, title in figures:
        parts.append(
            f"<h2>{html.escape(title)}</h2><img src='{name}' alt='{html.escape(title)}' style='max-width:100%'>"
        )
    if not figures:
        parts.append("<p>No rewards or evaluations in this experiment yet.</p>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
