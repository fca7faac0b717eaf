"""Part 13: the readers at scale (issue #30, class 6): ``status``, ``validate``, ``report`` and the dashboard's first
answer on an experiment into which a hostile participant planted 50,000 peer files and 1 GiB of junk.

The experiment is real: ``swarm-gdrive demo --workload synthetic`` (a coordinator and two workers as processes, three
rounds, J = 1) on a local folder. Then, as a participant of the shared folder could, the bench plants ``--files``
files spread over the folders the readers walk (rollouts and rewards of many rounds, peers, evals, logs), most with
names a node would use (``hostile-N.json``): copies of the run's own records, valid (their ``node_id`` rewritten to
match the name) or not (a node id that does not match, truncated JSON), and some with junk names (``--layout``:
``spread`` over hundreds of round folders and 50 log folders, or ``crowded`` into the peers folder and one round's
folders); and ``--junk-gib``
of junk: sparse files under names the readers open (a 600 MiB "rollout batch", a log file), a sparse checkpoint,
and 32 MiB of real random bytes.

Each reader then runs as its own process (``python -m swarm_gdrive ...``) for each source tree (this one and
``--before DIR``, a checkout of older code such as ``git worktree add /tmp/before main``, first on PYTHONPATH):
its wall time and its peak resident memory (``wait4``'s ``ru_maxrss``; the dashboard's ``VmHWM`` from /proc before
it is stopped). The dashboard is timed from its start to the end of its first answer to ``GET /`` (the page with the
experiment rendered). Targets: each under 10 s and 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import machine_info, machine_line, machine_tag, markdown_table, source_version, write_result

ROOT = Path(__file__).resolve().parent.parent
PART = "readers"
EXPERIMENT = "scale"
ROUNDS, WORKERS, TRANSPLANTS = 3, 2, 1
TARGET_S, TARGET_MB = 10.0, 500.0
#: Per layout: the share of each kind of planted file, in the order planted (they sum to 1), and the planted files
#: per round (or log) folder. ``spread``: over 200 round folders of rollouts and rewards (100 a folder), 50 eval
#: rounds, the peers folder and 50 log folders. ``crowded``: in the peers folder and one round's stage folders.
LAYOUTS = {
    "spread": ({"rollouts": 0.4, "rewards": 0.3, "peers": 0.1, "evals": 0.1, "logs": 0.1}, 100),
    "crowded": ({"rollouts": 0.3, "rewards": 0.3, "peers": 0.4}, 10**9),
}


def build_experiment(folder: Path, env: dict[str, str]) -> None:
    """A real experiment: the demo's coordinator and workers on the synthetic workload, on ``folder``."""
    command = [
        sys.executable, "-m", "swarm_gdrive", "demo", "--workload", "synthetic", "--folder", str(folder),
        "--experiment", EXPERIMENT, "--workers", str(WORKERS), "--rounds", str(ROUNDS),
        "--transplants", str(TRANSPLANTS),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"the demo that builds the experiment failed ({done.returncode}):\n{done.stdout[-3000:]}")


def _forged(template: dict[str, Any], node: str, valid: bool) -> bytes:
    record = {**template, "node_id": node if valid else "worker-1"}
    return json.dumps(record, separators=(",", ":")).encode()


def plant(root: Path, files: int, junk_bytes: int, layout: str = "spread", seed: int = 0) -> dict[str, int]:
    """Plant ``files`` peer files (:data:`LAYOUTS`) and ``junk_bytes`` of junk into the experiment at ``root``; what
    went where."""
    shares, per_folder = LAYOUTS[layout]
    rng = random.Random(seed)
    templates = {
        "rollouts": json.loads((root / "rollouts/round_0/stage_0/worker-1.json").read_bytes()),
        "rewards": json.loads((root / "rewards/round_0/stage_0/worker-1.json").read_bytes()),
        "peers": json.loads((root / "peers/worker-1.json").read_bytes()),
    }
    evals = sorted((root / "evals").rglob("*.json")) if (root / "evals").is_dir() else []
    if evals:
        templates["evals"] = json.loads(evals[0].read_bytes())
    metrics = (root / "logs/worker-1/metrics.jsonl").read_bytes()
    counts: dict[str, int] = {}
    planted = 0
    for kind, share in shares.items():
        n = files - planted if kind == list(shares)[-1] else int(files * share)
        counts[kind] = n
        for i in range(n):
            folder_no, name_no = divmod(i, per_folder)
            node = f"hostile-{i}"
            if kind in ("rollouts", "rewards"):
                folder = root / kind / f"round_{folder_no}" / "stage_0"
            elif kind == "evals":
                folder = root / kind / f"round_{folder_no}"
            elif kind == "logs":
                folder = root / kind / f"hostile-{folder_no}"
            else:
                folder = root / kind
            folder.mkdir(parents=True, exist_ok=True)
            roll = rng.random()
            if kind == "logs":
                names = ("metrics.jsonl", "training_events.jsonl")
                name = names[name_no] if name_no < len(names) else f"junk-{name_no}.jsonl"
                (folder / name).write_bytes(metrics if name_no != 1 else b"{not json\n")
                continue
            if roll < 0.1:
                (folder / f"junk name {i}.tmp").write_bytes(b"\x00junk" * 20)
                continue
            template = templates.get(kind, templates["rewards"])
            if roll < 0.2:
                data = _forged(template, node, True)[: rng.randrange(1, 200)]  # truncated
            else:
                data = _forged(template, node, valid=roll < 0.6)
            (folder / f"{node}.json").write_bytes(data)
        planted += n
    # Junk: sparse files where the readers look (over every cap), a sparse checkpoint, and real random bytes.
    real = min(32 << 20, junk_bytes)
    sparse = junk_bytes - real
    targets = [
        (root / "rollouts/round_1/stage_0/hostile-big.json", sparse * 6 // 10),
        (root / "logs/hostile-big/metrics.jsonl", sparse * 2 // 10),
        (root / "checkpoints/hostile-big/round_2/model.safetensors", sparse - sparse * 8 // 10),
    ]
    for path, size in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
    noise = root / "rewards/round_2/stage_0/hostile-noise.json"
    noise.write_bytes(rng.randbytes(real))
    counts["junk_bytes"] = junk_bytes
    return counts


def _peak_mb_of(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_command(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One reader as its own process: wall seconds, peak RSS (MB), exit code, the tail of its output."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        # Run from another folder: ``python -m`` puts the working directory first on sys.path, which would import
        # this tree's package whatever PYTHONPATH says.
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                break
            time.sleep(0.02)
        wall = time.monotonic() - started
        out.seek(0)
        tail = out.read()[-1500:].decode(errors="replace")
    code = os.waitstatus_to_exitcode(status) if proc.returncode is None else proc.returncode
    return {
        "seconds": round(wall, 2),
        "peak_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": code,
        "timed_out": code == -9,
        "tail": tail,
    }


def run_dashboard(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Start the dashboard, wait for its address, time its first ``GET /`` (from the process's start). Its output
    goes to a file: a pipe nobody drains would stop a dashboard that logs much."""
    started = time.monotonic()
    result: dict[str, Any] = {"exit": None, "timed_out": False}
    with tempfile.NamedTemporaryFile("w+b") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
        try:
            url = None
            while url is None and proc.poll() is None and time.monotonic() < started + timeout:
                match = re.search(rb"on (http://\S+/)", Path(out.name).read_bytes()[:4096])
                url = match.group(1).decode() if match else None
                time.sleep(0.02)
            if url is None:
                result.update(exit=proc.poll(), timed_out=proc.poll() is None)
                result["tail"] = Path(out.name).read_bytes()[-1500:].decode(errors="replace")
                return result
            asked = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=max(1.0, started + timeout - asked)) as answer:
                    body = answer.read()
                result.update(http=answer.status, page_bytes=len(body), experiment_shown=b"data-experiment" in body)
            except OSError as exc:
                result.update(http=None, error=str(exc), timed_out="timed out" in str(exc))
            done = time.monotonic()
            result.update(
                seconds=round(done - started, 2),
                first_get_s=round(done - asked, 2),
                startup_s=round(asked - started, 2),
                peak_mb=_peak_mb_of(proc.pid),
            )
            return result
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure_tree(tree: Path, folder: Path, timeout: float, out_dir: Path) -> dict[str, Any]:
    """Each reader of ``tree`` (its code first on PYTHONPATH) on the planted folder."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    env.pop("GDRIVE_PATH", None)
    base = [sys.executable, "-m", "swarm_gdrive"]
    where = ["--folder", str(folder), "--experiment", EXPERIMENT]
    readers = {
        "status": [*base, "status", *where],
        "validate": [
            *base,
            "validate",
            *where,
            "--rounds",
            str(ROUNDS),
            "--nodes",
            str(WORKERS),
            "--transplants",
            str(TRANSPLANTS),
        ],  # fmt: skip
        "report": [*base, "report", *where, "--out", str(out_dir / "report")],
    }
    results: dict[str, Any] = {}
    for name, argv in readers.items():
        results[name] = run_command(argv, env, timeout)
        print(f"   {name}: {results[name]['seconds']} s, {results[name]['peak_mb']} MB", file=sys.stderr, flush=True)
    dashboard = [*base, "dashboard", "--folder", str(folder), "--experiment", EXPERIMENT, "--port", "0"]
    results["dashboard"] = run_dashboard(dashboard, env, timeout)
    d = results["dashboard"]
    print(f"   dashboard: {d.get('seconds')} s, {d.get('peak_mb')} MB", file=sys.stderr, flush=True)
    return results


def _cell(result: dict[str, Any], key: str, timeout: float) -> str:
    value = result.get(key)
    if result.get("timed_out"):  # stopped at the timeout: its time and its peak so far are lower bounds
        return f"> {timeout:g} (stopped)" if key == "seconds" else "—" if value is None else f"≥ {value:.0f}"
    return "—" if value is None else f"{value:.3g}"


def render(result: dict[str, Any]) -> str:
    timeout = result["settings"]["timeout_s"]
    header = ["reader"]
    for label in result["trees"]:
        header += [f"{label}: s", f"{label}: peak MB", f"{label}: exit"]
    rows = []
    for reader in ("status", "validate", "report", "dashboard"):
        row: list[Any] = [reader]
        for label in result["trees"]:
            r = result["trees"][label][reader]
            row += [_cell(r, "seconds", timeout), _cell(r, "peak_mb", timeout), r.get("http", r.get("exit"))]
        rows.append(row)
    planted = result["planted"]
    lines = [
        f"# Readers at scale ({PART}, issue #30 class 6)",
        "",
        f"A real experiment (`swarm-gdrive demo --workload synthetic`, {WORKERS} workers, {ROUNDS} rounds, "
        f"J = {TRANSPLANTS}) with {result['settings']['files']} planted peer files, layout "
        f"`{result['settings']['layout']}` "
        f"({', '.join(f'{k} {v}' for k, v in planted.items() if k != 'junk_bytes')}) and "
        f"{planted['junk_bytes'] / 2**30:.2f} GiB of junk; each reader a process of its own; the dashboard from "
        "its start to the end of its first `GET /` (exit column: the HTTP status). "
        f"Targets: under {TARGET_S:g} s and {TARGET_MB:g} MB each.",
        "",
        markdown_table(header, rows),
        "",
        machine_line(result["machine"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench readers", description=__doc__)
    parser.add_argument("--files", type=int, default=50_000, help="peer files to plant (default 50,000)")
    parser.add_argument("--junk-gib", type=float, default=1.0, help="GiB of junk to plant (default 1)")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="spread", help="where the files go (spread)")
    parser.add_argument("--before", type=Path, help="a checkout of older code, measured on the same folder")
    parser.add_argument("--folder", type=Path, help="work folder (default: a temporary one, removed after)")
    parser.add_argument("--reuse", action="store_true", help="--folder already holds the planted experiment")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a reader may take before it is stopped")
    parser.add_argument("--tag", help="result file tag (default: the machine's)")
    parser.add_argument("--out-dir", type=Path, help="where to write the results (default bench/results)")
    args = parser.parse_args(argv)
    source = source_version()
    work = args.folder or Path(tempfile.mkdtemp(prefix="bench-readers-"))
    shared = work / "shared"
    planted: dict[str, int]
    try:
        if args.reuse:
            planted = json.loads((work / "planted.json").read_text())
        else:
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir(parents=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
            started = time.monotonic()
            build_experiment(shared, env)
            planted = plant(shared / "experiments" / EXPERIMENT, args.files, int(args.junk_gib * 2**30), args.layout)
            (work / "planted.json").write_text(json.dumps(planted))
            print(f"== built and planted in {time.monotonic() - started:.0f} s: {planted}", file=sys.stderr)
        trees = {"this tree": ROOT} | ({f"before ({args.before})": args.before.resolve()} if args.before else {})
        measured = {}
        for label, tree in trees.items():
            print(f"== {label}", file=sys.stderr, flush=True)
            measured[label] = measure_tree(tree, shared, args.timeout, work)
    finally:
        if args.folder is None:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "part": PART,
        "settings": {
            "files": args.files,
            "junk_gib": args.junk_gib,
            "layout": args.layout,
            "timeout_s": args.timeout,
            "rounds": ROUNDS,
            "workers": WORKERS,
            "transplants": TRANSPLANTS,
        },
        "planted": planted,
        "trees": {
            label: {k: {kk: vv for kk, vv in v.items() if kk != "tail"} for k, v in r.items()}
            for label, r in measured.items()
        },  # fmt: skip
        "targets": {"seconds": TARGET_S, "peak_mb": TARGET_MB},
        "machine": machine_info("cpu", source),
    }
    for label, r in measured.items():
        for name, one in r.items():
            if one.get("exit") not in (0, None) and name != "validate":
                print(f"{label} {name} exited {one.get('exit')}:\n{one.get('tail', '')}", file=sys.stderr)
    tag = args.tag or machine_tag("cpu") + ("" if args.layout == "spread" else f"-{args.layout}")
    path = write_result(PART, tag, result, render(result), args.out_dir)
    print(render(result))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
