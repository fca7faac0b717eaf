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
from swarm_gdrive.observe.figure_texts import figure_texts
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)


def write_report(storage: Storage, experiment: str, out: Path) -> list[Path]:
    """Write rewards.csv, evals.csv, one PNG per monitor plot and index.html into ``out``; returns the files.
    Asynchronous (ROUND_MODE=async), also workers.csv: each worker's rounds played, done, and the fill rate and
    staleness of its external groups (:func:`worker_table`), shown on the page."""
    snapshot = monitor.load(storage, experiment)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "rewards.csv", out / "evals.csv"]
    snapshot.rewards.sort_values(["node", "round", "stage"]).to_csv(files[0], index=False)
    snapshot.evals.sort_values(["node", "task", "round", "level"]).to_csv(files[1], index=False)
    workers = worker_table(snapshot) if snapshot.is_async else None
    if workers is not None:
        files.append(out / "workers.csv")
        workers.to_csv(files[-1], index=False)
    titles = figure_texts("report", snapshot.is_async)
    figures = []
    for name, figure in plots.all_figures(snapshot).items():
        path = out / f"{name}.png"
        figure.savefig(path, dpi=110)
        files.append(path)
        figures.append((path.name, titles.get(name, name)))
    found = monitor.findings(snapshot)
    files.append(_html(out / "index.html", experiment, figures, snapshot.rewards, snapshot.evals, found, workers))
    return files


def worker_table(snapshot: monitor.Snapshot):
    """One row per worker: its own progress (:func:`monitor.worker_progress`: ``round``, ``rounds_played``,
    ``done``) and its external groups (:func:`monitor.external_per_worker`: rounds that asked, asked, got, fill,
    age and staleness of those taken)."""
    progress = monitor.worker_progress(snapshot)
    external = monitor.external_per_worker(snapshot).rename(columns={"rounds": "rounds_asking"})
    return progress.merge(external, on="node", how="left")


def _html(path: Path, experiment: str, figures: list[tuple[str, str]], rewards, evals, found, workers=None) -> Path:
    if workers is None:
        rounds = f"{rewards['round'].nunique() if not rewards.empty else 0} rounds with rewards"
    else:
        played = workers["rounds_played"]
        rounds = (
            "asynchronous rounds (each worker its own: "
            f"{int(played.min()) if len(played) else 0} to {int(played.max()) if len(played) else 0} played, "
            f"{int(workers['done'].sum())} worker(s) done)"
        )
    data = "<a href='rewards.csv'>rewards.csv</a>, <a href='evals.csv'>evals.csv</a>"
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(experiment)}</title>",
        f"<h1>Experiment {html.escape(experiment)}</h1>",
        f"<p>{rewards['node'].nunique() if not rewards.empty else 0} workers, {rounds}, "
        f"{len(evals)} held-out results. Data: {data}"
        + (", <a href='workers.csv'>workers.csv</a>" if workers is not None else "")
        + ".</p>",
        "<h2>Findings</h2><ul>",
    ]
    parts += [f"<li><b>{html.escape(f.severity)}</b> {html.escape(f.message)}</li>" for f in found]
    parts.append("</ul>")
    parts += _workers_html(workers) if workers is not None else []
    parts += _latest_evals(evals)
    for name, title in figures:
        label = html.escape(title)
        parts.append(f"<h2>{label}</h2><img src='{name}' alt='{label}' style='max-width:100%'>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _workers_html(workers) -> list[str]:
    """:func:`worker_table` as an HTML table: each worker's own progress, fill rate and staleness."""

    def num(value, fmt: str) -> str:
        return "-" if value is None or value != value else fmt.format(value)  # NaN != NaN

    rows = [
        f"<tr><td>{html.escape(str(r.node))}</td><td>{num(r.round, '{:.0f}')}</td><td>{r.rounds_played}</td>"
        f"<td>{'yes' if r.done else 'no'}</td>"
        f"<td>{num(r.got, '{:.0f}')}/{num(r.asked, '{:.0f}')} ({num(r.fill, '{:.0%}')})</td>"
        f"<td>{num(r.age_s_median, '{:.1f}')}</td><td>{num(r.age_s_max, '{:.1f}')}</td>"
        f"<td>{num(r.staleness_rounds_median, '{:g}')}</td><td>{num(r.staleness_rounds_max, '{:g}')}</td></tr>"
        for r in workers.itertuples()
    ]
    return [
        "<h2>Workers (asynchronous: each plays its own rounds)</h2><table>",
        "<tr><th>node</th><th>own round</th><th>rounds played</th><th>done</th><th>external received/asked (fill)"
        "</th><th>age s, median</th><th>age s, max</th><th>staleness rounds, median</th><th>staleness rounds, max"
        "</th></tr>",
        *rows,
        "</table>",
    ]


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
