"""``swarm-gdrive report``: an experiment folder into CSVs, PNG plots and an HTML page. Reads only.

The full monitor (live dashboard, health findings) is a separate piece; this module gives the
tables and figures a researcher looks at after a run: reward per worker per round and held-out
accuracy per worker and task over rounds.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path

from swarm_gdrive.observe import monitor, plots
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)

FIGURE_TITLES = {
    "reward_per_round": "Training reward per worker per round, with its rolling mean",
    "cumulative_reward": "Cumulative training reward",
    "swarm_reward_spread": "Swarm mean and spread of reward",
    "live_workers": "Live workers per round",
    "rollouts_exchanged": "Rollouts published and external groups used per round",
    "reward_histogram": "Reward histogram",
    "completion_lengths": "Completion lengths",
    "eval_pass1": "Held-out pass@1 per worker and task",
    "time_split": "Time split of a worker's round: generate, gather, train, the rest",
    "training": "Training: loss, grad norm, KL, clip ratio, zero-variance fraction, own against external reward",
}


def write_report(storage: Storage, experiment: str, out: Path) -> list[Path]:
    """Write rewards.csv, evals.csv, one PNG per monitor plot and index.html into ``out``; returns the files."""
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
    parts += _latest_evals(evals)
    for name, title in figures:
        label = html.escape(title)
        parts.append(f"<h2>{label}</h2><img src='{name}' alt='{label}' style='max-width:100%'>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _latest_evals(evals) -> list[str]:
    """The latest held-out result of each node and task (lowest level) as an HTML table, pass@1 ± its SE."""
    if evals.empty:
        return []
    base = evals[evals["level"] == evals.groupby("task")["level"].transform("min")]
    latest = base.sort_values("round").groupby(["node", "task"]).tail(1).sort_values(["task", "node"])
    rows = [
        f"<tr><td>{html.escape(str(r.node))}</td><td>{html.escape(str(r.task))}</td><td>{r.round}</td>"
        f"<td>{r.n}</td><td>{r.pass1:.3f} ± {r.pass1_se:.3f}</td></tr>"
        for r in latest.itertuples()
    ]
    return [
        "<h2>Latest held-out pass@1 (± 1 standard error)</h2><table>",
        "<tr><th>node</th><th>task</th><th>before round</th><th>questions</th><th>pass@1</th></tr>",
        *rows,
        "</table>",
    ]
