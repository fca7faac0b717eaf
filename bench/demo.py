"""The demo's profile: where ``swarm-gdrive demo`` spends its time, phase by phase, for one or more source trees.

Each run is ``python -m swarm_gdrive demo --verbose`` as a new process with a new HOME (so the packaged model is
prepared again, unless ``--keep-model``) and a new folder, from the repository root or from ``--before DIR`` (a
checkout of older code, for example ``git worktree add /tmp/before <commit>``: it goes first on PYTHONPATH, the
same interpreter and packages run it). Runs of the trees alternate, so that they share the machine's load. Every
line the demo prints is stamped on arrival; the phases are read from worker-1's lines and the round timings
from its metrics.jsonl:

- **prepare**: from the start to the first node's first line (the demo command's imports; before issue #26 also the
  model's preparation, which the nodes now wait for while they start);
- **start + load**: until worker-1 has loaded the model (its imports, reading the tasks, the model's preparation
  where it overlaps, loading the weights);
- **evaluate before**: held-out pass@1 before round 0;
- **rounds**: until worker-1's last round is done (generate, gather, update and the waits between, per round from
  metrics.jsonl);
- **evaluate after**, **checkpoint** (the final one), **exit** (until the demo prints its closing line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result

ROOT = Path(__file__).resolve().parent.parent

#: (phase, the worker-1 line that ends it); phases end in this order.
MARKS = (
    ("prepare", re.compile(r"^\[(coordinator|worker-\d+)\] ")),
    ("start + load", re.compile(r"^\[worker-1\] .* loaded .* in [\d.]+ s")),
    ("evaluate before", re.compile(r"^\[worker-1\] .*held-out pass@1 before round 0")),
    ("rounds", re.compile(r"^\[worker-1\] .*round \d+ done \((\d+) of \1")),
    ("evaluate after", re.compile(r"^\[worker-1\] .*held-out pass@1 before round [1-9]")),
    ("checkpoint", re.compile(r"^\[worker-1\] .*checkpoint (upload|of round)")),
    ("exit", re.compile(r"^demo: finished in")),
)


def run_demo(source: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One demo run from ``source``: the phases' seconds, the rounds' timings and the whole wall time."""
    home = scratch / "home"
    home.mkdir(parents=True)
    folder = scratch / "folder"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODEL_CACHE_DIR")}
    env.update(HOME=str(home), PYTHONPATH=str(source), TMPDIR=str(scratch))
    if args.keep_model:
        env["MODEL_CACHE_DIR"] = str(Path(args.keep_model).expanduser())
    command = [sys.executable, "-m", "swarm_gdrive", "demo", "--verbose", "--folder", str(folder), *args.demo_args]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    stamps: list[tuple[float, str]] = []
    proc = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: stamps.extend((time.monotonic() - started, line) for line in proc.stdout))
    reader.start()
    code = proc.wait(timeout=args.timeout)
    reader.join()
    wall = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the demo and every node it started and reaped
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    phases, last = {}, 0.0
    for phase, pattern in MARKS:
        at = next((t for t, line in stamps if t >= last and pattern.search(line)), None)
        if at is not None and phase == "rounds":  # the last "round R done (N of N ...)" line
            at = max(t for t, line in stamps if pattern.search(line))
        phases[phase] = None if at is None else at - last
        last = at if at is not None else last
    metrics = folder / "experiments" / "demo" / "logs" / "worker-1" / "metrics.jsonl"
    by_round: dict[int, dict[str, Any]] = {}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        if line.strip():
            record = json.loads(line)
            by_round.setdefault(record["round"], {}).update(record.get("values", {}))
    keys = ("round/seconds", "time/generate_s", "time/gather_s", "time/train_s")
    rounds = [{k: v.get(k) for k in keys} for _, v in sorted(by_round.items()) if "round/seconds" in v]
    return {
        "exit": code,
        "wall_s": wall,
        "cpu_s": cpu,
        "phases": phases,
        "rounds": rounds,
        "tail": [x[1] for x in stamps[-3:]],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench demo", description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, help="a checkout of older code to run beside this tree")
    p.add_argument("--runs", type=int, default=1, help="runs of each tree (alternating)")
    p.add_argument("--keep-model", help="a MODEL_CACHE_DIR holding the converted model (default: prepare it anew)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--tag", default=None)
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("demo_args", nargs="*", help="options for swarm-gdrive demo (after --)")
    return p.parse_args(argv)


def render(result: dict[str, Any]) -> str:
    runs = result["runs"]
    names = list(dict.fromkeys(r["tree"] for r in runs))
    header = ["phase"] + [f"{r['tree']} #{i + 1}" for i, r in enumerate(runs)]
    rows = [[phase] + [r["phases"].get(phase) for r in runs] for phase, _ in MARKS]
    rows.append(["**whole demo**"] + [r["wall_s"] for r in runs])
    rows.append(["CPU seconds, all its processes"] + [r.get("cpu_s") for r in runs])
    cores = result["machine"].get("cores") or os.cpu_count() or 1
    rows.append(
        [f"CPU seconds / {cores} cores (no wall time below it)"]
        + [r["cpu_s"] / cores if r.get("cpu_s") is not None else None for r in runs]
    )
    round_rows = []
    for r in runs:
        for i, rd in enumerate(r["rounds"]):
            round_rows.append([r["tree"], i, rd["round/seconds"], rd["time/generate_s"], rd["time/gather_s"],
                               rd["time/train_s"]])  # fmt: skip
    return "\n\n".join(
        [
            "# Demo profile",
            machine_line(result["machine"]),
            f"`swarm-gdrive demo {' '.join(result['settings']['demo_args'])}` from a new HOME"
            f"{' (model kept)' if result['settings']['keep_model'] else ' (the model prepared anew)'}; trees: "
            + ", ".join(names)
            + "; seconds, phases in order (worker-1's lines).",
            markdown_table(header, rows),
            "Rounds (worker-1's metrics.jsonl, seconds):",
            markdown_table(["tree", "round", "round", "generate", "gather", "update"], round_rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = source_version()
    trees = [("this tree", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    runs = []
    for index in range(args.runs):
        for name, path in trees:
            with tempfile.TemporaryDirectory(prefix="bench-demo-") as scratch:
                load = os.getloadavg()
                run = run_demo(path, args, Path(scratch))
            run.update(tree=name, run=index, load_before=load, load_after=os.getloadavg())
            print(f"{name} #{index + 1}: {run['wall_s']:.1f} s, exit {run['exit']}", file=sys.stderr, flush=True)
            runs.append(run)
    result = {
        "part": "demo",
        "machine": machine_info("cpu", source),
        "settings": {"demo_args": args.demo_args, "keep_model": bool(args.keep_model), "before": str(args.before)},
        "runs": runs,
    }
    write_result("demo", args.tag or machine_tag("cpu"), result, render(result), args.out_dir)
    return 0 if all(r["exit"] == 0 for r in runs) else 1
