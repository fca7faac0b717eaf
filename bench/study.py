"""SAPO study with replicated swarms (issue 15, part 5): J = 0 against J > 0, the swarm as the unit.

For each of ``--seeds`` swarm seeds and each J of ``--transplants``, one swarm (a coordinator and W workers,
processes on a local folder, the demo's easy tasks or ``--preset sparse-signal``, ``bench.learning.node_env``) runs;
**all swarms run at once** on one machine or GPU, so that load and drift hit every configuration alike. Within a
seed every configuration has the same SEED and node names (paired: worker-k draws the same question stream); seeds
differ between replicates. Per swarm: cumulative training reward (each worker's sum over rounds of its
mean reward on its own groups, then the mean over the swarm's workers) over the rounds every swarm
completed, and held-out greedy pass@1 (mean over workers and tasks) at the last evaluation every swarm
reached. Workers of one swarm are not independent; swarms are. Then, per J > 0, paired by seed:

- the mean difference with a t-interval over the n seeds (df n - 1) and its two-sided t-test p-value;
- the exact sign-flip permutation p-value, whose floor is 2 / 2^n (0.25 for n = 3): reported, not relied on;
- the minimal detectable difference at alpha 0.05 (two-sided) and power 0.8,
  MDD = (t_{0.975, n-1} + t_{0.8, n-1}) * sd_d / sqrt(n), from the observed SD of paired differences.

    python -m bench study --seeds 3 --transplants 0,4 --workers 4 --groups 8 --rounds 60 --device cuda:0
    python -m bench study --tiny --seeds 3 --workers 2 --groups 2 --transplants 0,1 --rounds 3   # CPU smoke

Writes ``study_<tag>.{json,md,png}`` under ``--out`` (default bench/results).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from itertools import product
from pathlib import Path

from bench import learning

RESULTS = Path(__file__).resolve().parent / "results"

#: Student t quantiles t_{0.975, df} and t_{0.8, df}, df 1..30 (scipy.stats.t.ppf); beyond 30 the normal's.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
T80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868, 0.866)
T80 += (0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854)


def t_quantile(table: tuple[float, ...], df: int, normal: float) -> float:
    return table[df - 1] if df <= len(table) else normal


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (Simpson's rule on the density)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    x = abs(t)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(u: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(u * u / df))

    steps = 4000
    h = x / steps
    area = density(0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return max(0.0, min(1.0, 1.0 - 2.0 * area * h / 3))


def sign_flip_p(diffs: list[float]) -> float:
    """Exact two-sided paired permutation p: the share of the 2^n sign flips with |mean| >= the observed."""
    n = len(diffs)
    observed = abs(sum(diffs))
    hits = sum(
        abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed - 1e-12
        for signs in product((1, -1), repeat=n)
    )
    return hits / 2**n


def paired(treated: list[float], baseline: list[float]) -> dict:
    """Paired comparison over replicates (same order): mean difference, t-interval, p-values, MDD."""
    d = [a - b for a, b in zip(treated, baseline, strict=True) if not (math.isnan(a) or math.isnan(b))]
    n = len(d)
    out: dict = {"n": n, "differences": d, "mean": statistics.fmean(d) if d else math.nan}
    if n < 2:
        return {**out, "sd": math.nan, "ci": [math.nan, math.nan], "p_t": math.nan, "mdd": math.nan}
    sd = statistics.stdev(d)
    se = sd / math.sqrt(n)
    t975, t80 = t_quantile(T975, n - 1, 1.960), t_quantile(T80, n - 1, 0.842)
    return {
        **out,
        "sd": sd,
        "se": se,
        "ci": [out["mean"] - t975 * se, out["mean"] + t975 * se],
        "p_t": t_two_sided_p(out["mean"] / se, n - 1) if se > 0 else (0.0 if out["mean"] else 1.0),
        "p_sign_flip": sign_flip_p(d),
        "p_sign_flip_floor": 2 / 2**n,
        "mdd": (t975 + t80) * se,
        "mdd_per_sd": (t975 + t80) / math.sqrt(n),
    }


def interval(values: list[float]) -> dict:
    """Mean of replicates with a t-interval."""
    v = [x for x in values if not math.isnan(x)]
    if len(v) < 2:
        return {"mean": v[0] if v else math.nan, "ci": [math.nan, math.nan], "sd": math.nan}
    se = statistics.stdev(v) / math.sqrt(len(v))
    t = t_quantile(T975, len(v) - 1, 1.960)
    mean = statistics.fmean(v)
    return {"mean": mean, "sd": statistics.stdev(v), "ci": [mean - t * se, mean + t * se]}


# -- running ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench study", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="smollm2", help="names the result files: study_<tag>.{json,md,png}")
    p.add_argument("--seeds", default="3", help="a count (seeds 1..N) or a comma-separated list of swarm seeds")
    p.add_argument("--transplants", default="0,4", help="J values; the first is the baseline (I = groups - J)")
    p.add_argument("--workers", type=int, default=4, help="W, workers per swarm")
    p.add_argument("--groups", type=int, default=8, help="I + J, the same in every configuration")
    p.add_argument("--generations", type=int, default=8, help="NUM_GENERATIONS (G)")
    p.add_argument("--rounds", type=int, default=60, help="MAX_ROUNDS; the analysis uses the rounds all completed")
    p.add_argument("--eval-interval", type=int, default=20, help="EVAL_INTERVAL")
    p.add_argument(
        "--eval-samples",
        type=int,
        default=100,
        help="EVAL_SAMPLES, held-out questions per task: at least 100 (pass@1's SE at most 0.05), except with --tiny",
    )
    p.add_argument(
        "--seeds-in-turn",
        action="store_true",
        help="run each seed's swarms at once and the seeds one after another (when memory holds one seed's swarms)",
    )
    learning.add_preset_option(p)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole study may run; then stopped")
    p.add_argument("--device", default="cpu", help="DEVICE of every worker (cuda:0: all swarms share one GPU)")
    add_swarm_options(p)
    args = p.parse_args(argv)
    args.js = [int(x) for x in args.transplants.split(",") if x.strip()]
    args.seed_list = seed_list(args.seeds)
    if len(args.js) < 2 or any(j < 0 or j >= args.groups for j in args.js):
        p.error(f"--transplants {args.transplants!r}: at least two J values, each in 0..{args.groups - 1}")
    if len(args.seed_list) < 2:
        p.error("--seeds: at least 2 swarm seeds (the swarm is the unit of replication)")
    if args.workers < 2:
        p.error("--workers must be at least 2")
    if args.eval_samples < 100 and not args.tiny and not args.report_only:
        p.error(f"--eval-samples {args.eval_samples}: a study uses at least 100 held-out questions per task")
    return args


def add_swarm_options(p: argparse.ArgumentParser) -> None:
    """The options a study and ``bench modes`` share: the model, the folders, the report and node overrides."""
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="MODEL_NAME of the workers")
    p.add_argument("--tiny", action="store_true", help="a tiny model built on the spot (a smoke test)")
    p.add_argument("--folder", help="shared folder (default: a fresh temporary one)")
    p.add_argument("--out", default=str(RESULTS), help="where the result files go")
    p.add_argument("--report-only", action="store_true", help="run nothing: analyse the swarms in --folder")
    p.add_argument("--verbose", action="store_true", help="show every log line of every node")
    p.add_argument("--set", action="append", default=[], metavar="VARIABLE=value", help="override a node variable")


def seed_list(text: str) -> list[int]:
    """``--seeds``: a count N (seeds 1..N) or a comma-separated list of swarm seeds."""
    return list(range(1, int(text) + 1)) if text.isdigit() else [int(s) for s in text.split(",")]


def swarms(args: argparse.Namespace) -> list[dict]:
    """Every (seed, J) swarm: its experiment name and configuration name."""
    return [
        {"seed": s, "J": j, "config": learning.config_name(args.groups, j), "experiment": f"{args.tag}-s{s}-j{j}"}
        for s in args.seed_list
        for j in args.js
    ]


def swarm_env(args: argparse.Namespace, folder: Path, swarm: dict) -> dict[str, str]:
    run = copy.copy(args)
    run.seed, run.timeout = swarm["seed"], args.timeout
    env = learning.node_env(run, folder, swarm["experiment"], swarm["J"], str(folder / "nodes"))
    env["NUM_GENERATIONS"] = str(args.generations)
    env["DEVICE"] = args.device
    if "mode" in swarm:  # bench/modes.py: the swarm's ROUND_MODE (its coordinator's; the workers follow it)
        env["ROUND_MODE"] = swarm["mode"]
    if args.device != "cpu":
        env["OMP_NUM_THREADS"] = "1"
    else:  # every node of every swarm shares the cores
        import os

        env["OMP_NUM_THREADS"] = "1" if (os.cpu_count() or 1) < 2 * len(swarms(args)) else env["OMP_NUM_THREADS"]
    return env


def run_all(args: argparse.Namespace, folder: Path, plan: list[dict], timeout: float | None = None) -> dict:
    """Start every swarm's coordinator and workers at once; wait for all, stop them at the timeout (default
    ``--timeout``)."""
    timeout = args.timeout if timeout is None else timeout
    import shutil
    import subprocess

    from swarm_gdrive.procs import NodeProcess

    nodes, sinks = [], []
    started = time.monotonic()
    timed_out = False
    try:
        for swarm in plan:
            env = swarm_env(args, folder, swarm)
            swarm["env"] = env
            shutil.rmtree(folder / "experiments" / swarm["experiment"], ignore_errors=True)
            sink = learning.Progress(swarm["experiment"], folder / f"{swarm['experiment']}.log", args.verbose)
            sinks.append(sink)
            with learning.sigterm_held():  # every node started is in `nodes` before a SIGTERM can stop the study
                nodes.append(
                    NodeProcess(f"{swarm['experiment']}/coordinator", _role(env, "coordinator", "coordinator"), sink)
                )
                nodes += [
                    NodeProcess(f"{swarm['experiment']}/worker-{i}", _role(env, "worker", f"worker-{i}"), sink)
                    for i in range(1, args.workers + 1)
                ]
        deadline = started + timeout
        codes = {n.name: n.wait(timeout=max(1.0, deadline - time.monotonic())) for n in nodes}
    except subprocess.TimeoutExpired:
        print(f"[study] timeout after {timeout:.0f} s: stopping every node", flush=True)
        timed_out, codes = True, stop_together(nodes)
    except BaseException:
        stop_together(nodes)
        raise
    finally:
        for sink in sinks:
            sink.log.close()
    return {"exit_codes": codes, "wall_s": round(time.monotonic() - started, 1), "timed_out": timed_out}


def run_in_turn(args: argparse.Namespace, folder: Path, plan: list[dict]) -> dict:
    """Each seed's swarms at once (paired under the same load), the seeds one after another, each with an equal
    share of ``--timeout``: for a machine whose memory holds one seed's swarms, not all of them."""
    runs = []
    for seed in args.seed_list:
        print(f"[study] seed {seed}: its {len(args.js)} swarms at once", flush=True)
        runs.append(run_all(args, folder, [s for s in plan if s["seed"] == seed], args.timeout / len(args.seed_list)))
    return {
        "exit_codes": {k: v for r in runs for k, v in r["exit_codes"].items()},
        "wall_s": round(sum(r["wall_s"] for r in runs), 1),
        "timed_out": any(r["timed_out"] for r in runs),
        "per_seed_wall_s": [r["wall_s"] for r in runs],
    }


def stop_together(nodes: list, grace: float = 20.0) -> dict[str, int]:
    """SIGTERM every node at once, then SIGKILL those still running after ``grace`` seconds in all.

    ``procs.stop_all`` waits for each node in turn (up to 30 s each): with 30 nodes that could outlast a
    lent machine's time.
    """
    import signal
    import subprocess

    for node in nodes:
        if node.returncode is None:
            node.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    codes = {}
    for node in nodes:
        try:
            codes[node.name] = node.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.proc.kill()
            codes[node.name] = node.wait()
    return codes


def _role(env: dict[str, str], role: str, node: str) -> dict[str, str]:
    return {**env, "NODE_ROLE": role, "NODE_ID": node}


# -- analysis ----------------------------------------------------------------------------------------


def same_question_rewards(folder: Path, experiment: str, rounds: int, k: int) -> list[float]:
    """Per round, the mean over workers of each worker's mean reward on its first ``k`` own groups (from its
    rollout files): the same questions in every configuration of a seed, since worker-k draws the same question
    stream whatever I is. The whole-batch own-group mean is not: with I = 4 against I = 2 it averages 4 questions
    against the first 2 of them (seen as a round-0 gap in the CPU study, bench/README.md §6). NaN for a round
    whose rollout files are gone (ROLLOUT_CLEANUP_ENABLED)."""
    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout

    exchange = Exchange(_storage(folder), Layout(experiment), "study-reader")
    record = exchange.read_experiment()
    if record is None:
        return [math.nan] * rounds
    exchange.run_id = record.run_id
    stages = int(record.config.get("num_stages", 1))
    out = []
    for round_ in range(rounds):
        per_worker: dict[str, list[float]] = {}
        for stage in range(stages):
            for node, batch in exchange.read_rollouts(round_, stage, exclude_self=False).items():
                per_worker.setdefault(node, []).extend(x for g in batch.groups[:k] for x in g.rewards)
        means = [statistics.fmean(v) for v in per_worker.values() if v]
        out.append(statistics.fmean(means) if means else math.nan)
    return out


def swarm_figures(folder: Path, swarm: dict, rounds: int | None, same_k: int = 0) -> dict:
    """Per swarm: cumulative reward (mean over workers), per-round mean reward, held-out pass@1 by round; with
    ``same_k``, the same on each worker's first ``same_k`` own groups (:func:`same_question_rewards`)."""
    summary = learning.summarise(folder, swarm["experiment"], rounds)
    cumulative = list(summary["cumulative"].values())
    by_round: dict[int, list[tuple[float, int]]] = {}
    for e in summary["eval"]:
        by_round.setdefault(e["round"], []).append((e["pass1"], e["n"]))
    held_out = {r: sum(p * n for p, n in v) / sum(n for _, n in v) for r, v in sorted(by_round.items())}
    per_round = summary["per_round"]
    n = min((len(v) for v in per_round.values()), default=0)
    same = same_question_rewards(folder, swarm["experiment"], n, same_k) if same_k > 0 else []
    return {
        "same_questions_per_round": same,
        "cumulative_same_questions": sum(same) if same else math.nan,
        "round0_same_questions": same[0] if same else math.nan,
        "rounds_completed": summary["rounds_completed"],
        "cumulative": statistics.fmean(cumulative) if cumulative else math.nan,
        "cumulative_per_worker": summary["cumulative"],
        "mean_reward_per_round": [statistics.fmean(v[r] for v in per_round.values()) for r in range(n)],
        "held_out": held_out,
        "held_out_questions": {r: sum(n for _, n in v) for r, v in sorted(by_round.items())},
        "external_groups_mean": summary["external_groups_mean"],
        "round_s_mean": summary.get("round_s_mean"),
    }


def analyse(folder: Path, plan: list[dict], js: list[int], groups: int = 0) -> dict:
    """Figures per swarm over the common rounds, then per configuration and paired by seed against J = js[0].

    ``groups`` (I + J): the smallest I, ``groups - max(js)``, sets how many own groups the same-question measures
    read; their round-0 value is a placebo (every configuration of a seed still has the same model there)."""
    from swarm_gdrive.observe.analysis import completed_rounds

    done = [completed_rounds(_storage(folder), s["experiment"]) for s in plan]
    common = min(done) if done else 0
    same_k = max(0, groups - max(js)) if js else 0
    figures = {s["experiment"]: swarm_figures(folder, s, common, same_k) for s in plan}
    eval_rounds = [set(f["held_out"]) for f in figures.values()]
    shared = sorted(set.intersection(*eval_rounds)) if eval_rounds else []
    first, last = (shared[0], shared[-1]) if shared else (None, None)
    seeds = sorted({s["seed"] for s in plan})
    by = {(s["seed"], s["J"]): figures[s["experiment"]] for s in plan}

    def column(j: int, key: str) -> list[float]:
        out = []
        for seed in seeds:
            f = by[(seed, j)]
            if key in ("cumulative", "cumulative_same_questions", "round0_same_questions"):
                out.append(f.get(key, math.nan))
            elif key == "held_out":
                out.append(f["held_out"].get(last, math.nan) if last is not None else math.nan)
            else:  # held-out gain from the first shared evaluation to the last
                ok = last is not None and last != first
                out.append(f["held_out"][last] - f["held_out"][first] if ok else math.nan)
        return out

    metrics = ("cumulative", "held_out", "held_out_gain", "cumulative_same_questions", "round0_same_questions")
    configs = {j: {m: {"values": column(j, m), **interval(column(j, m))} for m in metrics} for j in js}
    comparisons = {j: {m: paired(column(j, m), column(js[0], m)) for m in metrics} for j in js[1:]}
    return {
        "rounds_common": common,
        "rounds_completed": {s["experiment"]: d for s, d in zip(plan, done, strict=True)},
        "eval_rounds": [first, last],
        "seeds": seeds,
        "swarms": figures,
        "configurations": {str(j): v for j, v in configs.items()},
        "comparisons": {str(j): v for j, v in comparisons.items()},
    }


def _gpu(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    import torch

    return {"gpu": torch.cuda.get_device_name(torch.device(device))}


def _storage(folder: Path):
    from swarm_gdrive.storage import LocalStorage

    return LocalStorage(folder)


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _preset_tasks(name: str) -> str:
    """The task settings a study ran with, as its report names them: a preset of swarm_gdrive/presets/."""
    from swarm_gdrive import presets

    preset = presets.get(name)
    return f"the {preset.name} preset's tasks (swarm_gdrive/presets/{preset.name}.json)"


def markdown(study: dict) -> str:
    a, js = study["analysis"], study["transplants"]
    n = len(a["seeds"])
    lines = [
        f"# SAPO study `{study['tag']}`: swarms as replicates",
        "",
        f"{n} swarm seeds ({', '.join(map(str, a['seeds']))}) x J in {js}, "
        + (
            f"each seed's {len(js)} swarms at once, the seeds one after another, on "
            if study.get("seeds_in_turn")
            else f"all {n * len(js)} swarms at once on "
        )
        + f"{study['device']}; {study['workers']} workers a swarm, I + J = {study['groups']}, G = "
        f"{study['generations']}, {_preset_tasks(study.get('preset', 'small-model'))}. Analysed over the "
        f"{a['rounds_common']} rounds every swarm completed (asked: {study['rounds']}); held-out pass@1 at round "
        f"{a['eval_rounds'][1]} "
        f"(first shared evaluation: round {a['eval_rounds'][0]}). Wall time {study['run'].get('wall_s')} s"
        + (", stopped at the timeout" if study["run"].get("timed_out") else "")
        + ".",
        "",
        "Unit of replication: the swarm (its workers share one run, so they are not independent). Cumulative "
        "reward: per worker the sum over rounds of its mean reward on its own groups, averaged over the swarm's "
        "workers. Intervals: 95% t-intervals over seeds (df n - 1); comparisons paired by seed. The whole-batch "
        "own-group mean compares different questions when I differs (I = 4 averages 4 questions, I = 2 the first "
        "2 of them): the same-question columns read each worker's first min(I) own groups from its rollout files, "
        "and their round-0 value, where every configuration of a seed still has the same model, is a placebo that "
        "should be about 0 (its spread is the sampling noise of one round).",
        "",
        "## Per swarm",
        "",
        "| seed | J | rounds completed | cumulative reward | held-out first -> last | external groups / round |",
        "|---|---|---|---|---|---|",
    ]
    first, last = a["eval_rounds"]
    for seed in a["seeds"]:
        for j in js:
            name = f"{study['tag']}-s{seed}-j{j}"
            f = a["swarms"][name]
            h = {int(k): v for k, v in f["held_out"].items()}
            lines.append(
                f"| {seed} | {j} | {a['rounds_completed'][name]} | {_f(f['cumulative'])} | "
                f"{_f(h.get(first))} -> {_f(h.get(last))} | {_f(f['external_groups_mean'], '{:.2f}')} |"
            )
    lines += ["", "## Per configuration (mean over swarms, 95% t-interval)", ""]
    lines += [
        "| J | cumulative reward | held-out pass@1 | held-out gain | cumulative, same questions | round 0, same "
        "questions (placebo) |",
        "|---|---|---|---|---|---|",
    ]
    for j in js:
        c = a["configurations"][str(j)]
        cells = [f"{_f(c[m]['mean'])} ({_f(c[m]['ci'][0])}, {_f(c[m]['ci'][1])})" for m in c]
        lines.append(f"| {j} | " + " | ".join(cells) + " |")
    lines += ["", f"## Paired by seed against J = {js[0]}", ""]
    lines.append(
        "| J | measure | mean difference (95% t-CI) | SD of differences | t-test p | sign-flip p (floor) | MDD |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for j in js[1:]:
        for m, c in a["comparisons"][str(j)].items():
            lines.append(
                f"| {j} | {m} | {_f(c['mean'], '{:+.3f}')} ({_f(c['ci'][0], '{:+.3f}')}, {_f(c['ci'][1], '{:+.3f}')}) "
                f"| {_f(c['sd'])} | {_f(c['p_t'])} | {_f(c.get('p_sign_flip'))} ({_f(c.get('p_sign_flip_floor'))}) "
                f"| {_f(c['mdd'])} |"
            )
    k = (t_quantile(T975, n - 1, 1.96) + t_quantile(T80, n - 1, 0.842)) / math.sqrt(n) if n > 1 else math.nan
    lines += [
        "",
        f"**What this design can detect.** With {n} paired seeds the minimal detectable difference (two-sided "
        f"alpha 0.05, power 0.8, paired t) is MDD = (t_0.975,{n - 1} + t_0.8,{n - 1}) / sqrt({n}) x SD of the "
        f"paired differences = {k:.2f} x SD (the MDD column uses the observed SD, itself estimated from {n} "
        f"pairs). An exact sign-flip permutation test cannot go below p = 2/2^{n} = {2 / 2**n:.3f} here, so the "
        "t-interval is the inference and the permutation p is shown only as a check. More seeds shrink the "
        "factor: 1.43 x SD at 6, 0.99 x SD at 10.",
        "",
        f"Command: `{study['command']}`. Machine: {_machine(study['machine'])}. Written {study['written_at']}.",
    ]
    return "\n".join(lines) + "\n"


def _machine(m: dict) -> str:
    gpu = f"{m['gpu']}, " if m.get("gpu") else ""
    return (
        f"{gpu}{m.get('host_cpu')} ({m.get('cpu_count')} cores, {m.get('memory_gb')} GiB), torch {m.get('torch')}, "
        f"transformers {m.get('transformers')}, load average at start "
        f"{[round(x, 1) for x in m.get('load_average_at_start', [])]}"
    )


def plot(study: dict, path: Path) -> Path:
    """Top: cumulative reward; bottom: held-out pass@1. Left: each swarm over rounds; middle: each configuration's
    mean over swarms with its 95% t-interval; right: the paired differences per seed with their t-interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, js = study["analysis"], study["transplants"]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for k, j in enumerate(js):
        colour = colours[k % len(colours)]
        for seed in a["seeds"]:
            swarm = a["swarms"][f"{study['tag']}-s{seed}-j{j}"]
            label = f"J={j}" if seed == a["seeds"][0] else None
            rewards = swarm["mean_reward_per_round"]
            axes[0][0].plot([sum(rewards[: r + 1]) for r in range(len(rewards))], color=colour, alpha=0.7, label=label)
            held = sorted((int(r), v) for r, v in swarm["held_out"].items())
            axes[1][0].plot(
                [r for r, _ in held], [v for _, v in held], marker="o", color=colour, alpha=0.7, label=label
            )
    for row, (measure, title) in enumerate((("cumulative", "cumulative reward"), ("held_out", "held-out pass@1"))):
        for k, j in enumerate(js):
            c = a["configurations"][str(j)][measure]
            _interval_bar(axes[row][1], k, c["mean"], c["ci"], colours[k % len(colours)])
            axes[row][1].scatter([k] * len(c["values"]), c["values"], color=colours[k % len(colours)], s=12, alpha=0.5)
        axes[row][1].set_xticks(range(len(js)), [f"J={j}" for j in js])
        axes[row][1].set(ylabel=title, title=f"{title}: swarms (dots), mean and 95% t-CI")
        for k, j in enumerate(js[1:], start=1):
            c = a["comparisons"][str(j)][measure]
            colour = colours[k % len(colours)]
            axes[row][2].scatter([k] * len(c["differences"]), c["differences"], color=colour, s=12, alpha=0.5)
            _interval_bar(axes[row][2], k, c["mean"], c["ci"], colour)
        axes[row][2].axhline(0, color="grey", linewidth=0.8)
        axes[row][2].set_xticks(range(1, len(js)), [f"J={j} - J={js[0]}" for j in js[1:]])
        axes[row][2].set(title=f"{title}: paired by seed, 95% t-CI")
    axes[0][0].set(xlabel="round", ylabel="cumulative reward (mean over workers)", title="each swarm")
    axes[1][0].set(xlabel="round", ylabel="held-out pass@1 (mean over workers)", title="each swarm")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(f"SAPO study '{study['tag']}': {len(a['seeds'])} seeds, {study['workers']} workers a swarm")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _interval_bar(ax, x: float, mean: float, ci: list[float], colour: str) -> None:
    if math.isnan(mean):
        return
    err = None if math.isnan(ci[0]) else [[mean - ci[0]], [ci[1] - mean]]
    ax.errorbar([x + 0.1], [mean], yerr=err, fmt="s", color=colour, capsize=5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    learning.exit_on_sigterm()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="swarm-gdrive-study-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    plan = swarms(args)
    run: dict = {}
    if not args.report_only:
        learning.prepare_model(args, folder)
        print(
            f"[study] {len(plan)} swarms x (coordinator + {args.workers} workers) "
            f"{'a seed at a time' if args.seeds_in_turn else 'at once'} on {args.device}, "
            f"{args.rounds} rounds, folder {folder}",
            flush=True,
        )
        run = run_in_turn(args, folder, plan) if args.seeds_in_turn else run_all(args, folder, plan)
    study = {
        "tag": args.tag,
        "transplants": args.js,
        "workers": args.workers,
        "groups": args.groups,
        "generations": args.generations,
        "preset": args.preset,
        "seeds_in_turn": args.seeds_in_turn,
        "rounds": args.rounds,
        "device": args.device,
        "folder": str(folder),
        "command": "python -m bench study " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {**learning.machine_info(), **_gpu(args.device)},
        "git_head": learning.git_head(),
        "run": run,
        "env": plan[0].get("env", {}),
        "analysis": analyse(folder, plan, args.js, args.groups),
        "written_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"study_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(study, indent=1, default=learning._jsonable) + "\n")
    stem.with_suffix(".md").write_text(markdown(study))
    plot(study, stem.with_suffix(".png"))
    print(stem.with_suffix(".md").read_text())
    return 0 if not run.get("timed_out") else 1


if __name__ == "__main__":
    sys.exit(main())
