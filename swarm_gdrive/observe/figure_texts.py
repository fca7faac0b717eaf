"""Every text that names a figure, in one table: the title a figure draws on itself, the heading ``report`` gives
it and the caption of the web dashboard. ``plots.py``, ``report.py`` and ``web.py`` read it; none spells a title of
its own, so a figure renamed here is renamed everywhere. Kept apart from ``plots`` so that the dashboard's module
reads its captions without importing matplotlib."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FigureText:
    """The texts of one figure: ``title`` drawn on it, ``report`` its heading in ``report``'s page, ``page`` its
    caption on the web dashboard. ``None``: the figure has no such text (``page``: it is not on the dashboard's
    page); an ``async_`` text replaces the other for an asynchronous experiment (ROUND_MODE=async) where set."""

    title: str
    report: str | None = None
    page: str | None = None
    async_title: str | None = None
    async_report: str | None = None
    async_page: str | None = None


#: The texts of every figure by name (the names of ``plots.FIGURES``, ``plots.ASYNC_FIGURES`` and the overlay).
FIGURE_TEXTS: dict[str, FigureText] = {
    "reward_per_round": FigureText(
        title="Training reward per round",
        report="Training reward per worker per round, with its rolling mean",
        page="Reward per node per round",
        async_page="Reward per node per round (each worker's own rounds)",
    ),
    "cumulative_reward": FigureText(title="Cumulative training reward", report="Cumulative training reward"),
    "swarm_reward_spread": FigureText(
        title="Swarm reward: mean +- std, min/max", report="Swarm mean and spread of reward"
    ),
    "live_workers": FigureText(
        title="Live workers per round",
        report="Live workers per round",
        page="Live workers",
        async_title="Workers' own rounds over time",
        async_report="Each worker's own round and the live workers over time",
        async_page="Each worker's own round and the live workers over time",
    ),
    "rollouts_exchanged": FigureText(
        title="Rollouts exchanged",
        report="Rollouts published and external groups used per round",
        page="The SAPO mix: rollouts published and external groups used",
    ),
    "reward_histogram": FigureText(title="Reward distribution", report="Reward histogram"),
    "completion_lengths": FigureText(title="Completion length", report="Completion lengths"),
    "eval_pass1": FigureText(
        title="Held-out pass@1", report="Held-out pass@1 per worker and task", page="Held-out pass@1"
    ),
    "time_split": FigureText(
        title="Time split of a worker's round",
        report="Time split of a worker's round: generate, gather, train, the rest",
        page="Time split of a round",
    ),
    "training": FigureText(
        title="Training",
        report="Training: loss, grad norm, KL, clip ratio, zero-variance fraction, own against external reward",
        page="Training: loss, grad norm, KL, clip ratio, zero-variance fraction, own against external reward",
    ),
    "reward_over_time": FigureText(
        title="Training reward over time and over each worker's own rounds",
        report="Training reward over wall-clock time and over each worker's own rounds (asynchronous)",
        async_page="Reward over wall-clock time and over each worker's own rounds",
    ),
    "external_staleness": FigureText(
        title="External groups: fill and staleness per worker",
        report="External groups per worker: fill rate, age and staleness of those taken (asynchronous)",
        async_page="External groups per worker: fill rate, age and staleness of those taken",
    ),
    "experiments_overlay": FigureText(title="Experiments compared"),
}


def figure_texts(field: str, is_async: bool = False) -> dict[str, str]:
    """One text of every figure that has it, by name, in :data:`FIGURE_TEXTS`' order: ``field`` is ``"title"``,
    ``"report"`` or ``"page"``; with ``is_async`` the figure's ``async_`` text where it has one."""
    texts = {}
    for name, text in FIGURE_TEXTS.items():
        value = (getattr(text, f"async_{field}") if is_async else None) or getattr(text, field)
        if value is not None:
            texts[name] = value
    return texts
