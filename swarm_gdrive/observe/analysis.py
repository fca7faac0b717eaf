"""Comparing configurations (experiments) of a study: cumulative training reward and held-out accuracy.

The SAPO paper compares, e.g., 4 local / 4 external against 8 / 0 by cumulative reward. Here
each configuration is an experiment in the same shared folder; a node's cumulative reward is
the sum of its per-round mean rewards over the rounds every compared experiment completed.
Differences against the baseline measured in the same study come with a 95% percentile bootstrap
confidence interval (``scipy.stats.bootstrap``, 2000 resamples), a two-sided permutation-test p-value
(``scipy.stats.permutation_test``: exact where every relabelling of the workers can be enumerated, as 3 against
3, otherwise 5000 random ones) and Hedges' g; the draws come from ``compare``'s ``seed``. Nothing is hard-coded:
with few nodes the intervals are wide, and the table says so by their width.

In an asynchronous experiment (ROUND_MODE=async, GDRIVE_IMPLEMENTATION.md §5.10) each worker plays its own
rounds: at one moment a fast worker may have played ten and a slow one four. Round R is then each worker's own
R-th round, and an experiment has "completed" R rounds when every worker has played all the stages of its rounds
0..R-1 (the slowest worker's count): so every node's cumulative reward sums the same number of its own rounds,
reached at different moments.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from swarm_gdrive.observe.monitor import eval_rows, reward_rows
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import Storage


@dataclass(frozen=True)
class Comparison:
    """One configuration against the baseline."""

    experiment: str
    nodes: int
    rounds: int
    cumulative_mean: float
    cumulative_ci: tuple[float, float]
    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    hedges_g: float
    eval_first: float | None
    eval_last: float | None
    eval_first_se: float | None = None
    eval_last_se: float | None = None
    #: The rounds of those evaluations (R: evals/round_R, the model after R rounds of training). With a single
    #: evaluation (TEST_MODE: EVAL_BEFORE_TRAINING off, only the one after the last round) there is no first:
    #: eval_first and eval_first_round are None and no change is reported.
    eval_first_round: int | None = None
    eval_last_round: int | None = None
    #: The experiment's ROUND_MODE: ``async``, ``rounds`` are each worker's own first rounds (the module's text).
    mode: str = "sync"

    @property
    def eval_change(self) -> float | None:
        """Held-out pass@1 from the evaluation after ``eval_first_round`` rounds to the one after
        ``eval_last_round``; None without two evaluations."""
        if self.eval_first is None or self.eval_last is None:
            return None
        return self.eval_last - self.eval_first


def _rewards(storage: Storage, experiment: str) -> list[dict]:
    return reward_rows(Exchange(storage, Layout(experiment), "analysis"))


def round_mode(storage: Storage, experiment: str) -> str:
    """The experiment's ROUND_MODE from its experiment.json (``sync`` without one)."""
    record = Exchange(storage, Layout(experiment), "analysis").read_experiment()
    return record.mode if record is not None else "sync"


def _cumulative(rows: list[dict], rounds: int | None) -> dict[str, float]:
    per_node: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        per_node.setdefault(row["node"], {}).setdefault(row["round"], []).append(row["reward"])
    return {
        node: sum(statistics.fmean(v) for r, v in by_round.items() if rounds is None or r < rounds)
        for node, by_round in per_node.items()
    }


def common_rounds(rows: list[dict], mode: str = "sync") -> int:
    """The rounds an experiment's reward ``rows`` count as completed. Synchronous: the rounds any worker submitted a
    reward for. Asynchronous: the fewest rounds 0..R-1 whose every stage a worker has rewarded, over the workers
    (each its own rounds; a round it is still playing not counted)."""
    if mode != "async":
        return len({row["round"] for row in rows})
    stages = max((row["stage"] for row in rows), default=0) + 1
    seen: dict[str, dict[int, set[int]]] = {}
    for row in rows:
        seen.setdefault(row["node"], {}).setdefault(row["round"], set()).add(row["stage"])
    counts = []
    for by_round in seen.values():
        played = 0
        while len(by_round.get(played, ())) == stages:
            played += 1
        counts.append(played)
    return min(counts, default=0)


def cumulative_rewards(storage: Storage, experiment: str, rounds: int | None = None) -> dict[str, float]:
    """Each worker's sum of per-round mean reward over rounds ``0..rounds-1`` (all rounds if None)."""
    return _cumulative(_rewards(storage, experiment), rounds)


def completed_rounds(storage: Storage, experiment: str) -> int:
    """Rounds for which at least one worker submitted a reward; asynchronous, the rounds every worker has played
    (see :func:`_completed`)."""
    return common_rounds(_rewards(storage, experiment), round_mode(storage, experiment))


def _eval_rows(storage: Storage, experiment: str) -> list[dict]:
    return [r for r in eval_rows(Exchange(storage, Layout(experiment), "analysis")) if r["level"] == 0]


def eval_rounds(rows: list[dict]) -> tuple[int | None, int | None]:
    """The rounds of the first and the last evaluation in ``rows``; the first is None when there is only one
    (it is the last: a change needs two)."""
    rounds = {r["round"] for r in rows}
    if not rounds:
        return None, None
    return (min(rounds) if len(rounds) > 1 else None), max(rounds)


def _eval_at(rows: list[dict], round_: int | None) -> tuple[float | None, float | None]:
    """Mean held-out pass@1 of the evaluation of ``round_`` and its SE (None, None for no round)."""
    if round_ is None:
        return None, None
    at = [r for r in rows if r["round"] == round_]
    return statistics.fmean(r["pass1"] for r in at), pass1_se_of_mean(at)


def eval_mean(storage: Storage, experiment: str) -> tuple[float | None, float | None]:
    """Mean held-out pass@1 (level 0, over workers and tasks) at the first and at the last evaluation (the
    first None when there is only one, see :func:`eval_rounds`)."""
    rows = _eval_rows(storage, experiment)
    first, last = eval_rounds(rows)
    return _eval_at(rows, first)[0], _eval_at(rows, last)[0]


def eval_se(storage: Storage, experiment: str) -> tuple[float | None, float | None]:
    """Standard errors of :func:`eval_mean`'s two values (see :func:`pass1_se_of_mean`)."""
    rows = _eval_rows(storage, experiment)
    first, last = eval_rounds(rows)
    return _eval_at(rows, first)[1], _eval_at(rows, last)[1]


def pass1_se_of_mean(rows: list[dict]) -> float:
    """SE of the mean held-out pass@1 over workers and tasks of one evaluation (rows: node, pass1_se).

    A worker's mean over T tasks has SE sqrt(sum se_t^2) / T (independent question sets). Workers answer
    the same questions, so their errors are correlated: the SE of their mean is at most the mean of their
    SEs, which is returned (conservative).
    """
    nodes = sorted({r["node"] for r in rows})
    per_node = []
    for node in nodes:
        own = [r["pass1_se"] for r in rows if r["node"] == node]
        per_node.append(math.sqrt(sum(se**2 for se in own)) / len(own))
    return statistics.fmean(per_node)


def _scipy_stats():
    """``scipy.stats``, imported on first use: it takes about a second, and ``plots`` (so the dashboard and the
    report) imports this module only for :func:`common_rounds`."""
    from scipy import stats

    return stats


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def _abs_mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.abs(_mean_difference(x, y, axis))


def _percentile_interval(samples: tuple[list[float], ...], statistic, rng: np.random.Generator, n: int):
    """95% percentile bootstrap interval (``scipy.stats.bootstrap``, method="percentile": the 2.5th and 97.5th
    percentiles of ``n`` resampled statistics, not BCa), each sample resampled on its own."""
    result = _scipy_stats().bootstrap(
        samples, statistic, n_resamples=n, confidence_level=0.95, method="percentile", rng=rng
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bootstrap_ci(values: list[float], rng: np.random.Generator, stat=np.mean, n: int = 2000) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``stat`` (``scipy.stats.bootstrap``, ``n`` resamples drawn from
    ``rng``). A single value is its own interval: nothing to resample."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    return _percentile_interval((values,), stat, rng, n)


def permutation_p(a: list[float], b: list[float], rng: np.random.Generator, n: int = 5000) -> float:
    """Two-sided p-value of the difference of means under relabelling (``scipy.stats.permutation_test``): the
    share of relabellings whose |mean(a) - mean(b)| is at least the observed one.

    Exact when the C(len(a) + len(b), len(a)) relabellings are at most ``n`` (3 against 3: 20, so p >= 0.10);
    otherwise ``n`` random ones from ``rng``, p = (hits + 1) / (n + 1). scipy needs two values in each group: a
    group of one is tested by shuffling the pooled values (``permutation_type="pairings"`` on one sample, split
    after len(a)), the same relabellings, exact up to n! <= ``n`` orderings.
    """
    if not a or not b:
        return math.nan
    stats = _scipy_stats()
    if len(a) >= 2 and len(b) >= 2:
        data, statistic, kind = (a, b), _abs_mean_difference, "independent"
    else:
        data, kind = (a + b,), "pairings"

        def statistic(pooled: np.ndarray, axis: int = -1) -> np.ndarray:
            return _abs_mean_difference(pooled[..., : len(a)], pooled[..., len(a) :])

    result = stats.permutation_test(
        data, statistic, permutation_type=kind, alternative="greater", n_resamples=n, rng=rng, vectorized=True
    )
    return float(result.pvalue)


def hedges_g(a: list[float], b: list[float]) -> float:
    """Standardised mean difference (a - b) with the small-sample correction."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    pooled = math.sqrt(
        ((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)) / (len(a) + len(b) - 2)
    )
    if pooled == 0:
        return math.nan
    correction = 1 - 3 / (4 * (len(a) + len(b)) - 9)
    return (statistics.fmean(a) - statistics.fmean(b)) / pooled * correction


def compare(
    storage: Storage, experiments: list[str], baseline: str, rounds: int | None = None, seed: int = 0
) -> list[Comparison]:
    """Every experiment (baseline included) against the baseline, over the rounds all of them completed (each
    worker's own first rounds in an asynchronous experiment: the module's text)."""
    names = [baseline] + [e for e in experiments if e != baseline]
    rows = {name: _rewards(storage, name) for name in names}  # every reward file read once
    modes = {name: round_mode(storage, name) for name in names}
    common = min(common_rounds(rows[name], modes[name]) for name in names)
    rounds = common if rounds is None else min(rounds, common)
    base = list(_cumulative(rows[baseline], rounds).values())
    out = []
    for name in names:
        rng = np.random.default_rng(seed)  # each experiment's intervals and p from the same draws
        values = list(_cumulative(rows[name], rounds).values())
        diff_ci = bootstrap_ci_difference(values, base, rng)
        evals = _eval_rows(storage, name)  # every eval file read once
        first_round, last_round = eval_rounds(evals)
        (first, first_se), (last, last_se) = _eval_at(evals, first_round), _eval_at(evals, last_round)
        out.append(
            Comparison(
                experiment=name,
                nodes=len(values),
                rounds=rounds,
                cumulative_mean=statistics.fmean(values) if values else math.nan,
                cumulative_ci=bootstrap_ci(values, rng),
                difference=(statistics.fmean(values) - statistics.fmean(base)) if values and base else math.nan,
                difference_ci=diff_ci,
                p_value=permutation_p(values, base, rng) if name != baseline else 1.0,
                hedges_g=hedges_g(values, base) if name != baseline else 0.0,
                eval_first=first,
                eval_last=last,
                eval_first_se=first_se,
                eval_last_se=last_se,
                eval_first_round=first_round,
                eval_last_round=last_round,
                mode=modes[name],
            )
        )
    return out


def bootstrap_ci_difference(
    a: list[float], b: list[float], rng: np.random.Generator, n: int = 2000
) -> tuple[float, float]:
    """95% percentile bootstrap interval of mean(a) - mean(b), resampling each group on its own
    (``scipy.stats.bootstrap`` on both samples). A group of one value resamples to itself: the interval is then
    the other group's, shifted (scipy needs two values a sample)."""
    if not a or not b:
        return math.nan, math.nan
    if len(a) >= 2 and len(b) >= 2:
        return _percentile_interval((a, b), _mean_difference, rng, n)
    if len(b) < 2:
        low, high = bootstrap_ci(a, rng, n=n)
        return low - b[0], high - b[0]
    low, high = bootstrap_ci(b, rng, n=n)
    return a[0] - high, a[0] - low


def format_table(rows: list[Comparison]) -> str:
    """A Markdown table of :func:`compare`'s result."""

    def num(x: float | None, fmt: str = "{:.3f}") -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    def pm(x: float | None, se: float | None, round_: int | None) -> str:
        text = num(x) if se is None or x is None else f"{num(x)} ± {num(se)}"
        return text if round_ is None else f"{text} (round {round_})"

    def rounds(r: Comparison) -> str:
        return f"{r.rounds} (own, async)" if r.mode == "async" else str(r.rounds)

    lines = [
        "| configuration | workers | rounds | cumulative reward (95% CI) | vs baseline (95% CI) | p | Hedges g |"
        " held-out pass@1 first -> last (± SE; round R: after R rounds of training) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.experiment} | {r.nodes} | {rounds(r)} | {num(r.cumulative_mean)} "
            f"({num(r.cumulative_ci[0])}, {num(r.cumulative_ci[1])}) | {num(r.difference, '{:+.3f}')} "
            f"({num(r.difference_ci[0], '{:+.3f}')}, {num(r.difference_ci[1], '{:+.3f}')}) | {num(r.p_value)} | "
            f"{num(r.hedges_g, '{:+.2f}')} | {pm(r.eval_first, r.eval_first_se, r.eval_first_round)} -> "
            f"{pm(r.eval_last, r.eval_last_se, r.eval_last_round)} |"
        )
    if any(r.mode == "async" for r in rows):
        own = f"0..{rows[0].rounds - 1}" if rows[0].rounds else "(none yet: a worker has not played a whole round)"
        lines += [
            "",
            f"Asynchronous rounds (ROUND_MODE=async): each worker's cumulative reward sums its own rounds {own}, the "
            "rounds the slowest worker of every compared experiment has played; the workers reached them at "
            "different moments.",
        ]
    return "\n".join(lines)
