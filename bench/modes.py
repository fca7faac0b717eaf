"""Learning in the two round modes (issue #28): ROUND_MODE=sync against ROUND_MODE=async, the same worker rounds.

For each of ``--seeds`` swarm seeds, two swarms run at once on a local folder, a coordinator and W workers each as
processes (``bench.study.run_all``: the demo's easy tasks or ``--preset sparse-signal``, ``learning.node_env``), one
in each mode, with the same SEED, node names, I and J: worker-k draws the same question stream in both (a worker's
questions of its round R are ``rng_for(SEED, node, R, ...)``, whatever the mode), and every worker plays MAX_ROUNDS
of its own rounds in both. The seeds run one after another (``--seeds-in-turn`` of the study: a pair shares its
load; all pairs at once do not fit a 2-core machine's memory with SmolLM2).

Per swarm: cumulative training reward (each worker's sum over its rounds of its mean reward on its own groups,
averaged over the swarm's workers: ``bench.study.swarm_figures``), the external groups a worker trained on per round,
and in async the median age of the external groups taken (``externals_taken`` events). Then async − sync paired by
seed, with a t-interval (df n − 1), the t-test p, the sign-flip permutation p (floor 2 / 2^n) and the minimal
detectable difference (``bench.study.paired``). Held-out evaluation is off by default (``--eval-interval 0``): on
2 CPU cores 200 greedy questions take about 6 minutes a worker.

    python -m bench modes --tag cpu-demo --seeds 3 --workers 2 --groups 4 --transplants 2 --rounds 6
    python -m bench modes --tag smoke --tiny --seeds 2 --rounds 2        # a tiny model: the pipeline, not learning

Writes ``modes_<tag>.{json,md}`` under ``--out`` (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import learning, study

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("sync", "async")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench modes", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default="cpu-demo", help="names the result files: modes_<tag>.{json,md}")
    p.add_argument("--seeds", default="3", help="a count (seeds 1..N) or a comma-separated list of swarm seeds")
    p.add_argument("--transplants", type=int, default=2, help="J, the same in both modes (I = groups - J)")
    p.add_argument("--workers", type=int, default=2, help="W, workers per swarm")
    p.add_argument("--groups", type=int, default=4, help="I + J")
    p.add_argument("--generations", type=int, default=4, help="NUM_GENERATIONS (G)")
    p.add_argument("--rounds", type=int, default=6, help="MAX_ROUNDS: each worker's own rounds, in both modes")
    p.add_argument("--eval-interval", type=int, default=0, help="EVAL_INTERVAL (0: no held-out evaluation)")
    p.add_argument("--eval-samples", type=int, default=100, help="EVAL_SAMPLES when --eval-interval is set")
    learning.add_preset_option(p)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole comparison may run")
    study.add_swarm_options(p)
    args = p.parse_args(argv)
    args.seed_list = study.seed_list(args.seeds)
    if len(args.seed_list) < 2:
        p.error("--seeds: at least 2 swarm seeds (the swarm is the unit of replication)")
    if args.workers < 2:
        p.error("--workers must be at least 2 (a worker takes external groups from its peers)")
    if not 0 < args.transplants < args.groups:
        p.error(f"--transplants {args.transplants}: J in 1..{args.groups - 1} (the modes differ in the pickup)")
    # What bench.study's helpers read: its J list (one J here) and its device and in-turn settings.
    args.js, args.device, args.seeds_in_turn = [args.transplants], "cpu", True
    return args


def plan(args: argparse.Namespace) -> list[dict]:
    """Every (seed, mode) swarm: its experiment name, J and ROUND_MODE."""
    return [
        {"seed": s, "J": args.transplants, "mode": mode, "experiment": f"{args.tag}-s{s}-{mode}"}
        for s in args.seed_list
        for mode in MODES
    ]


def median_age(folder: Path, experiment: str) -> float:
    """The median age in seconds of every external group an asynchronous swarm's workers took (NaN: none)."""
    ages: list[float] = []
    for path in (folder / "experiments" / experiment / "logs").glob("*/training_events.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "externals_taken":
                ages += [float(a) for a in event.get("data", {}).get("age_s", [])]
    return statistics.median(ages) if ages else math.nan


def analyse(folder: Path, swarms: list[dict], rounds: int) -> dict:
    """Figures per swarm over the rounds asked for, and async − sync paired by seed."""
    figures = {}
    for swarm in swarms:
        f = study.swarm_figures(folder, swarm, rounds)
        f["median_age_s"] = median_age(folder, swarm["experiment"]) if swarm["mode"] == "async" else math.nan
        figures[swarm["experiment"]] = f
    seeds = sorted({s["seed"] for s in swarms})
    by = {(s["seed"], s["mode"]): figures[s["experiment"]] for s in swarms}
    column = {mode: [by[(seed, mode)]["cumulative"] for seed in seeds] for mode in MODES}
    return {
        "seeds": seeds,
        "swarms": figures,
        "modes": {mode: {"values": column[mode], **study.interval(column[mode])} for mode in MODES},
        "async_minus_sync": study.paired(column["async"], column["sync"]),
    }


def markdown(result: dict) -> str:
    a = result["analysis"]
    d = a["async_minus_sync"]
    f = study._f
    lines = [
        f"# Learning in the two round modes: `{result['tag']}`",
        "",
        f"{len(a['seeds'])} swarm seeds ({', '.join(map(str, a['seeds']))}), each with a synchronous and an "
        f"asynchronous swarm at once, the seeds one after another; {result['workers']} workers a swarm, I = "
        f"{result['groups'] - result['J']}, J = {result['J']}, G = {result['generations']}, "
        f"{result['rounds']} rounds a worker, {result['preset']} preset, model {result['model']}, on "
        f"{result['machine'].get('host_cpu') or 'this CPU'} ({result['machine'].get('cpu_count')} cores). "
        f"Wall time {result['run'].get('wall_s')} s"
        + (", stopped at the timeout" if result["run"].get("timed_out") else "")
        + f". Commit {result.get('git_head')}.",
        "",
        "Cumulative reward: per worker the sum over its rounds of its mean reward on its own groups (the same "
        "questions in both modes: a worker draws its round-R questions from SEED, its name and R), averaged over the "
        "swarm's workers.",
        "",
        "| seed | mode | rounds (every worker) | cumulative reward | external groups a round | median age of "
        "externals (s) | mean round (s) | exit codes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for swarm in result["swarms"]:
        fig = a["swarms"][swarm["experiment"]]
        codes = sorted({c for n, c in result["run"].get("exit_codes", {}).items() if n.startswith(swarm["experiment"])})
        lines.append(
            f"| {swarm['seed']} | {swarm['mode']} | {fig['rounds_completed']} | {f(fig['cumulative'])} | "
            f"{f(fig['external_groups_mean'], '{:.2f}')} | {f(fig['median_age_s'], '{:.1f}')} | "
            f"{f(fig.get('round_s_mean'), '{:.1f}')} | {', '.join(map(str, codes)) or '—'} |"
        )
    lines += [
        "",
        "| mode | cumulative reward, mean over seeds (95% t-CI) |",
        "|---|---|",
    ]
    for mode in MODES:
        m = a["modes"][mode]
        lines.append(f"| {mode} | {f(m['mean'])} ({f(m['ci'][0])}, {f(m['ci'][1])}) |")
    lines += [
        "",
        f"**async − sync, paired by seed**: {f(d['mean'], '{:+.3f}')} (95% t-CI {f(d['ci'][0], '{:+.3f}')}, "
        f"{f(d['ci'][1], '{:+.3f}')}), t-test p {f(d['p_t'])}, sign-flip p {f(d.get('p_sign_flip'))} (floor "
        f"{f(d.get('p_sign_flip_floor'))}), minimal detectable difference {f(d['mdd'])} (alpha 0.05, power 0.8), "
        f"over {d['n']} seeds.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    learning.exit_on_sigterm()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="swarm-gdrive-modes-")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    swarms = plan(args)
    runs: list[dict] = []
    if not args.report_only:
        learning.prepare_model(args, folder)
        print(f"[modes] {len(swarms)} swarms, a seed's pair at a time, {args.rounds} rounds, folder {folder}")
        for seed in args.seed_list:
            pair = [s for s in swarms if s["seed"] == seed]
            print(f"[modes] seed {seed}: sync and async at once", flush=True)
            runs.append(study.run_all(args, folder, pair, args.timeout / len(args.seed_list)))
    run = {
        "exit_codes": {k: v for r in runs for k, v in r["exit_codes"].items()},
        "wall_s": round(sum(r["wall_s"] for r in runs), 1),
        "timed_out": any(r["timed_out"] for r in runs),
        "per_seed_wall_s": [r["wall_s"] for r in runs],
    }
    result = {
        "tag": args.tag,
        "J": args.transplants,
        "workers": args.workers,
        "groups": args.groups,
        "generations": args.generations,
        "rounds": args.rounds,
        "preset": args.preset,
        "model": "a tiny model" if args.tiny else args.model,
        "folder": str(folder),
        "command": "python -m bench modes " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": learning.machine_info(),
        "git_head": learning.git_head(),
        "run": run,
        "swarms": [{k: v for k, v in s.items() if k != "env"} for s in swarms],
        "analysis": analyse(folder, swarms, args.rounds),
        "written_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"modes_{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=learning._jsonable) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(stem.with_suffix(".md").read_text())
    return 0 if not run["timed_out"] else 1


if __name__ == "__main__":
    sys.exit(main())
