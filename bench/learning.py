"""Learning study (issue 6, part 4): SAPO with J = 0 against J > 0, the same seeds, rounds and total groups.

For each configuration a real swarm runs on a local folder: a coordinator and W workers as separate
processes (``swarm_gdrive.procs.NodeProcess``), with the demo's easy-task settings (``swarm-gdrive
demo``: easy chain_sum + basic_arithmetic, ``ANSWER_PREFIX``, lenient extraction; ``--preset small-model``) or
the sparse-signal regime (``--preset sparse-signal``: swarm_gdrive/presets/, harder settings of the same
tasks, where the model solves about 5-25% and most local groups have zero variance) and the packaged
SmolLM2-135M-Instruct. Held-out pass@1 is on ``--eval-samples`` (default 100) questions per task, reported
with its standard error. Configuration ``I{i}-J{j}`` trains each round on ``i`` of a worker's own
groups plus ``j`` groups taken from other workers, with ``i + j`` the same in every configuration
(as the paper's 8/0 against 4/4). Every configuration uses the same SEED and the same node names,
so worker-k draws the same questions in the same order in each (the J > 0 run draws the first ``i``).

After each run the rewards are read back from the shared folder with the package's own loaders
(``swarm_gdrive.observe.analysis``, ``swarm_gdrive.observe.report``, ``swarm_gdrive.observe.monitor``) and the study is
written to ``bench/results/learning_<tag>.{json,md,png}``. A configuration already finished with the
same settings is not run again (``--force`` reruns it), so a stopped study resumes where it stopped.

    python bench/learning.py --tag smollm2 --workers 3 --rounds 30          # the CPU study
    python bench/learning.py --tag sparse --preset sparse-signal --workers 3 --rounds 30
    python bench/learning.py --tag smoke --tiny --workers 2 --rounds 2      # seconds, a tiny model
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from swarm_gdrive import presets

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench learning", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="smollm2", help="names the result files: learning_<tag>.{json,md,png}")
    p.add_argument("--workers", type=int, default=3, help="W, workers per swarm")
    p.add_argument("--rounds", type=int, default=30, help="rounds per configuration")
    p.add_argument("--groups", type=int, default=4, help="I + J: groups trained on per round, in every configuration")
    p.add_argument(
        "--transplants",
        default="0,2",
        help="comma-separated J values; the first is the baseline (each run uses I = groups - J)",
    )
    p.add_argument("--seed", type=int, default=42, help="SEED of every node, the same in every configuration")
    p.add_argument("--eval-interval", type=int, default=10, help="EVAL_INTERVAL (held-out pass@1 every N rounds)")
    p.add_argument(
        "--eval-samples",
        type=int,
        default=100,
        help="EVAL_SAMPLES (held-out questions per task; 100 gives pass@1 a standard error of at most 0.05)",
    )
    add_preset_option(p)
    p.add_argument("--folder", help="shared folder of the runs (default: a folder under the temp dir, per tag)")
    p.add_argument("--out", default=str(RESULTS), help="where the result files go")
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="MODEL_NAME of the workers")
    p.add_argument("--tiny", action="store_true", help="a tiny model built on the spot (a smoke test of the script)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one configuration may run")
    p.add_argument("--force", action="store_true", help="rerun configurations that already have a finished result")
    p.add_argument("--verbose", action="store_true", help="show every log line of every node")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: read again the configurations of the result file whose runs are in the folder",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="VARIABLE=value", help="override a node variable (repeatable)"
    )
    args = p.parse_args(argv)
    args.js = [int(x) for x in args.transplants.split(",") if x.strip()]
    if len(args.js) < 2 or any(j < 0 or j >= args.groups for j in args.js):
        p.error(f"--transplants {args.transplants!r}: give at least two J values, each in 0..{args.groups - 1}")
    if args.workers < 2:
        p.error("--workers must be at least 2 (J > 0 takes groups from other workers)")
    return args


# -- running one configuration -----------------------------------------------------------------


def config_name(groups: int, j: int) -> str:
    return f"I{groups - j}-J{j}"


def task_presets() -> list[presets.Preset]:
    """The presets of swarm_gdrive/presets/ that set TASKS: the task settings a learning run or a study can take."""
    return [p for p in map(presets.get, presets.names()) if "TASKS" in p.settings]


def add_preset_option(p: argparse.ArgumentParser) -> None:
    """--preset: the task settings of a learning run or a study (read by :func:`node_env`), a preset by its name or
    an alias (``demo``, ``sparse``: the names earlier studies were run with)."""
    choices = [name for preset in task_presets() for name in (preset.name, *preset.aliases)]
    named = "; ".join(f"{t.name} (or {', '.join(t.aliases)})" if t.aliases else t.name for t in task_presets())
    p.add_argument(
        "--preset",
        choices=choices,
        default="small-model",
        help=f"task settings, a preset of swarm_gdrive/presets/ that sets TASKS: {named}",
    )


def node_env(args: argparse.Namespace, folder: Path, experiment: str, j: int, local_dir: str) -> dict[str, str]:
    """The environment of every node of one configuration: the demo's (local processes: the local-swarm preset),
    the task preset ``--preset``, with this study's settings."""
    from swarm_gdrive.config import swarm_env

    env = swarm_env(
        folder,
        experiment,
        presets.load("local-swarm"),
        presets.load(getattr(args, "preset", "small-model")),
        MAX_ROUNDS=args.rounds,
        NUM_TRANSPLANT_TREES=j,
        MIN_WORKERS=args.workers,
        SWARM_LOCAL_DIR=local_dir,
        WORKLOAD="grpo",
        OMP_NUM_THREADS=max(1, (os.cpu_count() or 2) // max(args.workers, 1)),
        MODEL_NAME=args.model,
        DEVICE="cpu",
        NUM_TRAIN_SAMPLES=args.groups - j,
        SEED=args.seed,
        EVAL_INTERVAL=args.eval_interval,
        EVAL_SAMPLES=args.eval_samples,
        # The round closes when every worker has submitted; these only bound a stalled node.
        COORDINATOR_ROUND_INTERVAL=max(900, int(args.timeout)),
    )
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench learning: --set {item!r}: write VARIABLE=value")
        env[key] = value
    return env


def settings_digest(env: dict[str, str]) -> str:
    """What makes two runs the same configuration (paths and names left out)."""
    skip = {"GDRIVE_PATH", "EXPERIMENT_NAME", "SWARM_LOCAL_DIR"}
    text = json.dumps({k: v for k, v in sorted(env.items()) if k not in skip})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Progress:
    """Prints a node's progress lines with the configuration's name and elapsed time; keeps every line."""

    KEEP = ("stage ", "held-out pass@1", "error", "traceback", "round_advanced")

    def __init__(self, name: str, log_path: Path, verbose: bool) -> None:
        self.name, self.verbose, self.started = name, verbose, time.monotonic()
        self.log = log_path.open("a", encoding="utf-8")

    def __call__(self, line: str) -> None:
        self.log.write(line + "\n")
        self.log.flush()
        if self.verbose or any(k in line.lower() for k in self.KEEP):
            message = line.split(": ", 1)[-1] if "swarm_gdrive." in line else line
            node = line.split("]", 1)[0].lstrip("[")
            print(f"[{self.name} {time.monotonic() - self.started:6.0f}s {node}] {message}", flush=True)


def run_configuration(args: argparse.Namespace, folder: Path, experiment: str, env: dict[str, str]) -> dict:
    """Start the coordinator and workers, wait for all of them; returns exit codes and wall time."""
    from swarm_gdrive.procs import NodeProcess, stop_all

    shutil.rmtree(folder / "experiments" / experiment, ignore_errors=True)  # a fresh run, never a half one
    sink = Progress(experiment, folder / f"{experiment}.log", args.verbose)
    started, timed_out = time.monotonic(), False
    nodes: list = []
    try:
        with sigterm_held():
            nodes.append(
                NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"}, sink)
            )
            nodes += [
                NodeProcess(f"worker-{i}", {**env, "NODE_ROLE": "worker", "NODE_ID": f"worker-{i}"}, sink)
                for i in range(1, args.workers + 1)
            ]
        deadline = started + args.timeout
        codes = {n.name: n.wait(timeout=max(1.0, deadline - time.monotonic())) for n in nodes}
    except subprocess.TimeoutExpired:
        print(f"[{experiment}] timed out after {args.timeout:.0f} s: stopping the nodes", flush=True)
        timed_out, codes = True, stop_all(nodes)
    except BaseException:
        stop_all(nodes)
        raise
    finally:
        sink.log.close()
    return {"exit_codes": codes, "wall_s": round(time.monotonic() - started, 1), "timed_out": timed_out}


# -- reading a configuration back ----------------------------------------------------------------


def summarise(folder: Path, experiment: str, rounds: int | None = None) -> dict:
    """Per node: reward per round, cumulative reward, groups used, held-out pass@1; read with the package's loaders."""
    from swarm_gdrive.observe import monitor
    from swarm_gdrive.observe.analysis import completed_rounds, cumulative_rewards, eval_mean
    from swarm_gdrive.storage import LocalStorage

    storage = LocalStorage(folder)
    snap = monitor.load(storage, experiment)
    rewards = snap.rewards[snap.rewards["round"] < rounds] if rounds is not None else snap.rewards
    per_round = {
        node: [float(v) for v in frame.groupby("round")["reward"].mean().sort_index()]
        for node, frame in rewards.groupby("node")
    }
    cumulative = cumulative_rewards(storage, experiment, rounds)
    values = [cumulative[n] for n in sorted(cumulative)]
    first, last = eval_mean(storage, experiment)
    evals = _evals(snap.evals)
    rounds_evaluated = sorted({e["round"] for e in evals})
    state = snap.state_record or {}
    out = {
        "status": state.get("status"),
        "rounds_completed": completed_rounds(storage, experiment),
        "rounds_summed": int(rewards["round"].nunique()) if not rewards.empty else 0,
        "per_round": per_round,
        "cumulative": {n: cumulative[n] for n in sorted(cumulative)},
        "cumulative_mean": statistics.fmean(values) if values else math.nan,
        "cumulative_sd": statistics.stdev(values) if len(values) > 1 else math.nan,
        "cumulative_min": min(values, default=math.nan),
        "cumulative_max": max(values, default=math.nan),
        "mean_reward_per_round": statistics.fmean(rewards["reward"]) if not rewards.empty else math.nan,
        "local_groups_mean": float(rewards["local_groups"].mean()) if not rewards.empty else math.nan,
        "external_groups_mean": float(rewards["external_groups"].mean()) if not rewards.empty else math.nan,
        "eval_pass1_first": first,
        "eval_pass1_last": last,
        "eval_pass1_first_se": pass1_at(evals, rounds_evaluated[0])[1] if len(rounds_evaluated) > 1 else None,
        "eval_pass1_last_se": pass1_at(evals, rounds_evaluated[-1])[1] if rounds_evaluated else None,
        "eval": evals,
    }
    out.update(_metric_means(snap.metrics))
    out.update(_thirds(per_round))
    return out


def _thirds(per_round: dict[str, list[float]]) -> dict:
    """Mean reward over workers in the first and in the last third of the rounds: did the reward rise?"""
    n = min((len(v) for v in per_round.values()), default=0)
    third = n // 3
    if third == 0:
        return {}
    first = [r for v in per_round.values() for r in v[:third]]
    last = [r for v in per_round.values() for r in v[n - third : n]]
    return {
        "thirds_rounds": third,
        "first_third_mean": statistics.fmean(first),
        "last_third_mean": statistics.fmean(last),
    }


def _evals(evals) -> list[dict]:
    """Held-out pass@1 (level 0) and its standard error per node, task and round."""
    if evals.empty:
        return []
    base = evals[evals["level"] == 0].sort_values(["node", "task", "round"])
    return [
        {
            "node": r.node,
            "task": r.task,
            "round": int(r.round),
            "n": int(r.n),
            "pass1": float(r.pass1),
            "pass1_se": float(r.pass1_se),
        }
        for r in base.itertuples()
    ]


def pass1_at(evals: list[dict], round_: int) -> tuple[float, float]:
    """Mean held-out pass@1 over workers and tasks at one evaluation, and its (conservative) standard error."""
    from swarm_gdrive.observe.analysis import pass1_se_of_mean

    rows = [e for e in evals if e["round"] == round_]
    return statistics.fmean(e["pass1"] for e in rows), pass1_se_of_mean(rows)


def _metric_means(metrics) -> dict:
    """Means over workers and rounds of the training metrics a reader needs to judge the run."""
    keys = {
        "train_step_s_mean": "time/train_s",
        "generate_s_mean": "time/generate_s",
        "round_s_mean": "round/seconds",
        "zero_variance_fraction_mean": "reward/local_zero_variance_fraction",
        "external_offered_mean": "swarm/external_offered",
    }
    out = {}
    for name, key in keys.items():
        if key in metrics.columns:
            col = metrics[key].dropna()
            out[name] = float(col.mean()) if not col.empty else None
    return out


def local_groups(folder: Path, experiment: str, k: int, rounds: int) -> dict[str, dict[int, list[tuple[str, float]]]]:
    """node -> round -> (question, mean reward) of the node's first ``k`` local groups, from its rollout files."""
    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.storage import LocalStorage

    exchange = Exchange(LocalStorage(folder), Layout(experiment), "learning-study")
    out: dict[str, dict[int, list[tuple[str, float]]]] = {}
    for round_ in range(rounds):
        for node, batch in exchange.read_rollouts(round_, 0, exclude_self=False).items():
            first = sorted(batch.groups, key=lambda g: int(g.group_id.rsplit("g", 1)[1]))[:k]
            out.setdefault(node, {})[round_] = [(g.question, statistics.fmean(g.rewards)) for g in first]
    return out


def matched(folder: Path, experiments: dict[str, str], baseline: str, k: int, rounds: int) -> dict:
    """Reward on the same questions: each worker's first ``k`` questions of each round, the same in every run.

    Every configuration draws its I questions per (node, round) from the same seeded stream, so
    the first ``k = min(I)`` are the same questions; the rollout files show whether they are. The
    sum over rounds of their mean reward compares the policies on identical questions, which the
    submitted reward (over all I questions) does not.
    """
    groups = {name: local_groups(folder, exp, k, rounds) for name, exp in experiments.items()}
    base = groups[baseline]
    out: dict = {"k": k, "rounds": rounds, "configurations": {}}
    for name, per_node in groups.items():
        same = total = 0
        cumulative: dict[str, float] = {}
        for node, by_round in sorted(per_node.items()):
            cumulative[node] = sum(statistics.fmean(r for _, r in gs) for gs in by_round.values() if gs)
            for round_, gs in by_round.items():
                theirs = [q for q, _ in base.get(node, {}).get(round_, [])]
                same += sum(q == t for (q, _), t in zip(gs, theirs, strict=False))
                total += len(gs)
        values = list(cumulative.values())
        diffs = [_paired(per_node[n], base.get(n, {})) for n in cumulative]
        out["configurations"][name] = {
            "cumulative": cumulative,
            "mean": statistics.fmean(values) if values else math.nan,
            "sd": statistics.stdev(values) if len(values) > 1 else math.nan,
            "paired_difference_mean": statistics.fmean(diffs) if diffs else math.nan,
            "paired_differences": dict(zip(cumulative, diffs, strict=True)),
            "same_questions_fraction": same / total if total else math.nan,
        }
    return out


def _paired(mine: dict[int, list[tuple[str, float]]], theirs: dict[int, list[tuple[str, float]]]) -> float:
    """Sum over the rounds both have of (my mean reward - theirs) on the same questions."""
    both = sorted(set(mine) & set(theirs))
    return sum(statistics.fmean(r for _, r in mine[x]) - statistics.fmean(r for _, r in theirs[x]) for x in both)


def comparison(folder: Path, names: list[str], baseline: str) -> list[dict]:
    """``swarm_gdrive.observe.analysis.compare`` over the rounds every configuration completed."""
    from dataclasses import asdict

    from swarm_gdrive.observe.analysis import compare
    from swarm_gdrive.storage import LocalStorage

    rows = compare(LocalStorage(folder), names, baseline)
    return [asdict(r) for r in rows]


# -- writing the study ---------------------------------------------------------------------------


def machine_info() -> dict:
    import torch
    import transformers

    model = next(
        (line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines() if "model name" in line), ""
    )
    return {
        "host_cpu": model or platform.processor(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_at_start": list(os.getloadavg()),
    }


def git_head() -> str | None:
    """The commit the nodes ran from (other engineers' uncommitted changes in the tree are not in it)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=RESULTS.parent, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def markdown(study: dict) -> str:
    """The study as a Markdown page: settings, per-node table, comparison, machine and command."""
    confs, baseline = study["configurations"], study["baseline"]
    table = {name: conf.get("summary_common") or conf.get("summary") for name, conf in confs.items()}
    base = table.get(baseline) or {}
    common = (
        ""
        if not any(c.get("summary_common") for c in confs.values())
        else (" Some configuration stopped early: every sum below runs over the rounds all configurations completed.")
    )
    lines = [
        f"# Learning study `{study['tag']}`: SAPO with J = 0 against J > 0{' (PARTIAL)' if study['partial'] else ''}",
        "",
        f"Written by `bench/learning.py` on {study['written_at']}. {study['workers']} workers + a coordinator per "
        f"configuration as real processes on a local folder, {study['rounds']} rounds, I + J = {study['groups']} "
        f"groups per round in every configuration, SEED {study['seed']} on every node.",
        "",
        "Command: `" + study["command"] + "`",
        "",
        "## Cumulative training reward per worker",
        "",
        "Cumulative reward: a worker's sum over rounds of its mean reward on its own I groups (the reward it",
        f"submits). Spread: sample standard deviation across workers, and min..max.{common}",
        "",
        "| configuration | status | workers | rounds | "
        + " | ".join(f"worker-{i}" for i in range(1, study["workers"] + 1))
        + " | mean ± sd | min..max | ratio vs "
        + baseline
        + " | groups trained / round: local + external | held-out pass@1 first -> last | wall s |",
        "|---|---|---|---|" + "---|" * study["workers"] + "---|---|---|---|---|---|",
    ]
    for name, conf in confs.items():
        s = table[name]
        if not s:
            continue
        cells = [_num(s["cumulative"].get(f"worker-{i}")) for i in range(1, study["workers"] + 1)]
        r = ratio(s["cumulative_mean"], base.get("cumulative_mean"))
        trained = f"{_num(s['local_groups_mean'], '{:.0f}')} + {_num(s['external_groups_mean'], '{:.2f}')}"
        lines.append(
            f"| {name} | {conf['status']} | {len(s['cumulative'])} | {s['rounds_summed']} | "
            + " | ".join(cells)
            + f" | {_num(s['cumulative_mean'])} ± {_num(s['cumulative_sd'])} | {_num(s['cumulative_min'])}.."
            f"{_num(s['cumulative_max'])} | {_num(r, '{:.2f}x')} | {trained} | "
            f"{_pm(s['eval_pass1_first'], s.get('eval_pass1_first_se'))} -> "
            f"{_pm(s['eval_pass1_last'], s.get('eval_pass1_last_se'))} | {_num(conf.get('wall_s'), '{:.0f}')} |"
        )
    lines += ["", "## Against the baseline (`observe.analysis.compare`, rounds all configurations completed)", ""]
    lines.append("| configuration | rounds | cumulative mean (95% bootstrap CI) | difference (95% CI) | p | Hedges g |")
    lines.append("|---|---|---|---|---|---|")
    for c in study.get("comparison", []):
        lines.append(
            f"| {c['experiment']} | {c['rounds']} | {_num(c['cumulative_mean'])} ({_num(c['cumulative_ci'][0])}, "
            f"{_num(c['cumulative_ci'][1])}) | {_num(c['difference'], '{:+.3f}')} "
            f"({_num(c['difference_ci'][0], '{:+.3f}')}, {_num(c['difference_ci'][1], '{:+.3f}')}) | "
            f"{_num(c['p_value'])} | {_num(c['hedges_g'], '{:+.2f}')} |"
        )
    lines += _matched_section(study)
    lines += _eval_section(confs)
    lines += ["", "## Per-round time and signal (means over workers and rounds)", ""]
    lines.append(
        "| configuration | round s | generate s | train step s | local groups with zero variance "
        "| reward, first third of rounds -> last third |"
    )
    lines.append("|---|---|---|---|---|---|")
    for name, conf in confs.items():
        s = conf.get("summary", {})
        if s:
            cells = [_num(s.get(k), "{:.1f}") for k in ("round_s_mean", "generate_s_mean", "train_step_s_mean")]
            cells.append(_num(s.get("zero_variance_fraction_mean"), "{:.2f}"))
            cells.append(f"{_num(s.get('first_third_mean'))} -> {_num(s.get('last_third_mean'))}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Settings of each configuration (every variable the nodes got besides their role and id)", ""]
    for name, conf in confs.items():
        skip = ("GDRIVE_PATH", "SWARM_LOCAL_DIR")
        env = ", ".join(f"{k}={v}" for k, v in sorted(conf["env"].items()) if k not in skip)
        head = f" (nodes ran from commit {conf['git_head'][:10]})" if conf.get("git_head") else ""
        lines.append(f"- **{name}**{head}: {env}")
    m = study["machine"]
    lines += [
        "",
        "## Machine",
        "",
        f"{m['host_cpu']}, {m['cpu_count']} cores, {m['memory_gb']} GiB; {m['platform']}; Python {m['python']}, "
        f"torch {m['torch']}, transformers {m['transformers']}; load average at start {m['load_average_at_start']}.",
        "",
        f"Plot: `learning_{study['tag']}.png`. Data: `learning_{study['tag']}.json`.",
    ]
    return "\n".join(lines) + "\n"


def _matched_section(study: dict) -> list[str]:
    m = study.get("matched")
    if not m:
        return []
    base = m["configurations"][study["baseline"]]
    lines = [
        "",
        f"## The same questions: reward on each worker's first {m['k']} questions of each round",
        "",
        f"Every configuration draws a worker's questions of a round from the same seeded stream, so its first "
        f"{m['k']} questions are the same in every run (checked against the rollout files: column 'same "
        f"questions'). Sum over {m['rounds']} rounds of the mean reward of those groups, read from the rollout files.",
        "",
        "| configuration | same questions | "
        + " | ".join(f"worker-{i}" for i in range(1, study["workers"] + 1))
        + " | mean ± sd | ratio vs "
        + study["baseline"]
        + " | paired difference per worker (mean) |",
        "|---|---|" + "---|" * study["workers"] + "---|---|---|",
    ]
    for name, c in m["configurations"].items():
        cells = [_num(c["cumulative"].get(f"worker-{i}")) for i in range(1, study["workers"] + 1)]
        diffs = ", ".join(_num(d, "{:+.2f}") for _, d in sorted(c["paired_differences"].items()))
        lines.append(
            f"| {name} | {_num(c['same_questions_fraction'], '{:.2f}')} | "
            + " | ".join(cells)
            + f" | {_num(c['mean'])} ± {_num(c['sd'])} | {_num(ratio(c['mean'], base['mean']), '{:.2f}x')} | "
            f"{diffs} ({_num(c['paired_difference_mean'], '{:+.3f}')}) |"
        )
    return lines


def _pm(value: float | None, se: float | None) -> str:
    return _num(value) if se is None else f"{_num(value)} ± {_num(se)}"


def _eval_section(confs: dict) -> list[str]:
    """Held-out greedy pass@1 (level 0), mean over workers and tasks ± its standard error, at each evaluation."""
    by_conf = {
        name: {round_: pass1_at(_with_se(conf["summary"]["eval"]), round_) for round_ in _rounds(conf)}
        for name, conf in confs.items()
        if conf.get("summary", {}).get("eval")
    }
    rounds = sorted({r for v in by_conf.values() for r in v})
    if not rounds:
        return []
    sizes = sorted({e["n"] for conf in confs.values() for e in conf.get("summary", {}).get("eval", [])})
    lines = [
        "",
        "## Held-out greedy pass@1 (mean over workers and tasks ± 1 standard error), before round R",
        "",
        f"Questions per task: {', '.join(map(str, sizes))}. The SE is the mean of the workers' SEs (they answer the "
        "same questions); a difference between configurations smaller than about twice it is noise.",
        "",
    ]
    lines.append("| configuration | " + " | ".join(f"R={r}" for r in rounds) + " |")
    lines.append("|---|" + "---|" * len(rounds))
    for name, values in by_conf.items():
        lines.append(f"| {name} | " + " | ".join(_pm(*values[r]) if r in values else "-" for r in rounds) + " |")
    return lines


def _rounds(conf: dict) -> list[int]:
    return sorted({e["round"] for e in conf["summary"]["eval"]})


def _with_se(evals: list[dict]) -> list[dict]:
    """Rows of a study written before the SE was recorded get the binomial sqrt(p (1 - p) / n)."""
    return [
        e if "pass1_se" in e else {**e, "pass1_se": math.sqrt(e["pass1"] * (1 - e["pass1"]) / e["n"])} for e in evals
    ]


def plot(study: dict, path: Path) -> Path:
    """Left: cumulative reward per round, each worker thin and the mean thick. Right: the mean reward per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (name, conf) in enumerate(study["configurations"].items()):
        per_round = conf.get("summary", {}).get("per_round", {})
        if not per_round:
            continue
        colour = colours[k % len(colours)]
        curves = []
        for _node, rewards in sorted(per_round.items()):
            cum = [sum(rewards[: r + 1]) for r in range(len(rewards))]
            curves.append(cum)
            ax.plot(range(len(cum)), cum, color=colour, alpha=0.35, linewidth=1)
        n = min(len(c) for c in curves)
        mean = [statistics.fmean(c[r] for c in curves) for r in range(n)]
        ax.plot(range(n), mean, color=colour, linewidth=2.5, label=f"{name} (mean of {len(curves)} workers)")
        per_round_mean = [statistics.fmean(v[r] for v in per_round.values()) for r in range(n)]
        ax2.plot(range(n), per_round_mean, color=colour, linewidth=1.5, marker=".", label=name)
    ax.set(xlabel="round", ylabel="cumulative training reward", title="Cumulative reward (thin lines: workers)")
    ax2.set(xlabel="round", ylabel="mean training reward", title="Reward per round, mean over workers")
    for a in (ax, ax2):
        a.legend()
        a.grid(alpha=0.3)
    fig.suptitle(f"SAPO learning study '{study['tag']}': I + J = {study['groups']}, {study['workers']} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_study(study: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"learning_{study['tag']}"
    files = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    files[0].write_text(json.dumps(study, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    files[1].write_text(markdown(study), encoding="utf-8")
    files.append(plot(study, stem.with_suffix(".png")))
    return files


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


# -- the study -----------------------------------------------------------------------------------


def prepare_model(args: argparse.Namespace, folder: Path) -> None:
    if args.tiny:
        from swarm_gdrive.training.tiny_model import build_tiny_model, teach_answer_format

        tiny = folder / "tiny-model"
        if not (tiny / "config.json").exists():
            teach_answer_format(build_tiny_model(tiny))  # so that its groups have reward variance
        args.model = str(tiny)
    else:
        from swarm_gdrive.config import Config
        from swarm_gdrive.training.models import resolve_model

        resolve_model(args.model, Path(Config.model_cache_dir).expanduser())


def load_study(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


#: sigterm_held's depth, a SIGTERM it held back (its number), and whether the run is already on its way out.
_SIGTERM = {"holding": 0, "pending": 0, "exiting": 0}


def exit_on_sigterm() -> None:
    """SIGTERM (``timeout``, a scheduler, ``kill``) as SystemExit, so that the node processes a run started are stopped
    on the way out (``run_configuration`` and ``study.run_all`` stop them on any exception) instead of being left
    running, orphaned, on the machine: seen when a study was stopped with ``kill``."""

    def terminate(signum: int, _frame: object) -> None:
        # A second SIGTERM must not cut the clean-up short. Not SIG_IGN: a node started after it would inherit it.
        if _SIGTERM["exiting"]:
            return
        if _SIGTERM["holding"]:
            _SIGTERM["pending"] = signum
            return
        _SIGTERM["exiting"] = 1
        raise SystemExit(128 + signum)

    _SIGTERM.update(pending=0, exiting=0)
    signal.signal(signal.SIGTERM, terminate)


@contextlib.contextmanager
def sigterm_held() -> Iterator[None]:
    """A SIGTERM that arrives while node processes are started and listed takes effect on leaving: a node
    started but not yet in the list that the clean-up stops would be left running. (Not a signal mask: child
    processes inherit one, and would then ignore the SIGTERM that stops them.)"""
    _SIGTERM["holding"] += 1
    try:
        yield
    finally:
        _SIGTERM["holding"] -= 1
    if not _SIGTERM["holding"] and _SIGTERM["pending"]:
        signum, _SIGTERM["pending"], _SIGTERM["exiting"] = _SIGTERM["pending"], 0, 1
        raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    folder = Path(args.folder or Path(tempfile.gettempdir()) / f"swarm-gdrive-learning-{args.tag}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    if not args.report_only:
        prepare_model(args, folder)
    local_dir = str(folder.parent / f"{folder.name}-nodes")  # node-local folders are refused inside GDRIVE_PATH
    names = [config_name(args.groups, j) for j in args.js]
    experiments = {name: f"{args.tag}-{name}".lower() for name in names}  # experiment names are lowercase
    saved = load_study(out / f"learning_{args.tag}.json")
    previous = saved.get("configurations", {})
    study = {
        "tag": args.tag,
        "workers": args.workers,
        "rounds": args.rounds,
        "groups": args.groups,
        "seed": args.seed,
        "baseline": names[0],
        "folder": str(folder),
        "command": "python bench/learning.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "configurations": {},
    }
    if args.report_only and saved:  # the command and machine of the runs, not of this re-reading
        study["command"], study["machine"] = saved.get("command", study["command"]), saved.get("machine", {})
    for name, j in zip(names, args.js, strict=True):
        env = node_env(args, folder, experiments[name], j, local_dir)
        digest, old = settings_digest(env), previous.get(name, {})
        keep = old.get("status") == "finished" and old.get("settings_digest") == digest and not args.force
        if args.report_only and not old:
            continue
        if keep or args.report_only:
            print(f"[{name}] {old['status']}: kept ({'--force reruns it' if keep else '--report-only'})", flush=True)
            if (folder / "experiments" / experiments[name]).exists():  # read again, with this version's summary
                old["summary"] = summarise(folder, experiments[name], args.rounds)
            study["configurations"][name] = old
            continue
        print(
            f"[{name}] I={args.groups - j}, J={j}: coordinator + {args.workers} workers, {args.rounds} rounds, "
            f"folder {folder / 'experiments' / experiments[name]}",
            flush=True,
        )
        head = git_head()
        result = run_configuration(args, folder, experiments[name], env)
        summary = summarise(folder, experiments[name], args.rounds)
        finished = (
            not result["timed_out"]
            and all(c == 0 for c in result["exit_codes"].values())
            and summary["rounds_completed"] >= args.rounds
        )
        study["configurations"][name] = {
            "experiment": experiments[name],
            "I": args.groups - j,
            "J": j,
            "status": "finished" if finished else "partial",
            "settings_digest": digest,
            "git_head": head,
            "env": env,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **result,
            "summary": summary,
        }
        print(
            f"[{name}] {study['configurations'][name]['status']} in {result['wall_s']:.0f} s: cumulative reward "
            f"{_num(summary['cumulative_mean'])} ± {_num(summary['cumulative_sd'])} over {summary['rounds_completed']} "
            f"rounds, per worker {json.dumps({k: round(v, 3) for k, v in summary['cumulative'].items()})}",
            flush=True,
        )
        save_study(study, names, experiments, folder, out)
    files = save_study(study, names, experiments, folder, out)
    print("\n".join(str(f) for f in files))
    return 0 if not study["partial"] else 1


def save_study(study: dict, names: list[str], experiments: dict[str, str], folder: Path, out: Path) -> list[Path]:
    """Mark the study partial or not, compare the configurations whose runs are in ``folder``, write the files."""
    done = [n for n in names if n in study["configurations"]]
    study["partial"] = len(done) < len(names) or any(study["configurations"][n]["status"] != "finished" for n in done)
    study["written_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    present = [n for n in done if (folder / "experiments" / experiments[n]).exists()]
    rounds = [study["configurations"][n]["summary"]["rounds_summed"] for n in present]
    for n in present:  # unequal rounds (a run stopped early): the table sums the rounds every run completed
        conf = study["configurations"][n]
        conf.pop("summary_common", None)
        if len(set(rounds)) > 1:
            conf["summary_common"] = summarise(folder, experiments[n], min(rounds))
    if len(present) >= 2 and names[0] in present:
        study["comparison"] = comparison(folder, [experiments[n] for n in present], experiments[names[0]])
        k = min(study["configurations"][n]["I"] for n in present)
        chosen = {n: experiments[n] for n in present}
        study["matched"] = matched(folder, chosen, names[0], k, min(rounds))
    return write_study(study, out)


if __name__ == "__main__":
    sys.exit(main())
