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
from swarm_gdrive.layout import parse_round_dir, parse_stage_dir
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)


def reward_rows(exchange: Exchange) -> list[dict]:
    """One row per valid reward file: node, round, stage, reward, local and external groups, J asked."""
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
                        "external_requested": rec.external_requested,
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


FIGURE_TITLES = {
    "reward_per_round": "Training reward per worker per round, with its rolling mean",
    "cumulative_reward": "Cumulative training reward",
    "swarm_reward_spread": "Swarm mean and spread of reward",
    "live_workers": "Live workers per round",
    "rollouts_exchanged": "Rollouts published and external groups used per round",
    "reward_histogram": "Reward histogram",
    "completion_lengths": "Completion lengths",
    "eval_pass1": "Held-out pass@1 per worker and task",
}


def write_report(storage: Storage, experiment: str, out: Path) -> list[Path]:
    """Write rewards.csv, evals.csv, one PNG per monitor plot and index.html into ``out``; returns the files."""
    from swarm_gdrive import monitor, plots  # they import this module's row readers

    snapshot = monitor.load(storage, experiment)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "rewards.csv", out / "evals.csv"]
    snapshot.rewards.sort_values(["node", "round", "stage"]).to_csv(files[0], index=False)
    snapshot.evals.sort_values(["node", "task", "round", "level"]).to_csv(files[1], index=False)
    figures = []
    for name, figure in plots.all_figures(snapshot).items():
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110)
        files.append(path)
        figures.append((path.name, FIGURE_TITLES.get(name, name)))
    found = monitor.findings(snapshot)
    files.append(_html(out / "index.html", experiment, figures, snapshot.rewards, snapshot.evals, found))
    return files


def _html(path: Path, experiment: str, figures: list[tuple[str, str]], rewards, evals, found) -> Path:
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(experiment)}</title>",
        f"<h1>Experiment {html.escape(experiment)}</h1>",
        f"<p>{rewards['node'].nunique() if not rewards.empty else 0} workers, "
        f"{rewards['round'].nunique() if not rewards.empty else 0} rounds with rewards, "
        f"{len(evals)} held-out results. Data: <a href='rewards.csv'>rewards.csv</a>, "
        "<a href='evals.csv'>evals.csv</a>.</p>",
        "<h2>Findings</h2><ul>",
    ]
    parts += [f"<li><b>{html.escape(f.severity)}</b> {html.escape(f.message)}</li>" for f in found]
    parts.append("</ul>")
    for name, title in figures:
        label = html.escape(title)
        parts.append(f"<h2>{label}</h2><img src='{name}' alt='{label}' style='max-width:100%'>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
