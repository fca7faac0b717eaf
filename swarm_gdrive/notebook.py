"""Helpers the Colab notebooks in ``notebooks/`` call, so that the notebooks only set variables.

Every node setting is an environment variable (``swarm-gdrive env``); these helpers turn a
notebook's parameters into such an environment, run a node in the kernel (stoppable with the
stop button) or as child processes (output streamed live), check memory before launching
several workers on one device, and show what the monitor, the report and the analysis say.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from swarm_gdrive.procs import NodeProcess, stop_all

#: The meaning of a node's exit code (see launcher.py).
EXIT_MEANINGS = {0: "finished or stopped cleanly", 1: "unexpected error", 2: "bad input", 3: "gave up waiting"}


def in_colab() -> bool:
    return "google.colab" in sys.modules


def settings(**values: object) -> dict[str, str]:
    """Keyword parameters as environment variables: names upper-cased, None and "" left out, booleans lower-case."""
    env: dict[str, str] = {}
    for key, value in values.items():
        if value is None or value == "":
            continue
        env[key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def small_model_settings() -> dict[str, str]:
    """The demo's training settings for a learning signal on a small model (README, "Training"), less
    DEVICE, NUM_TRAIN_SAMPLES and NUM_GENERATIONS, which the notebooks set themselves."""
    from swarm_gdrive.cli import DEMO_TRAINING

    return {k: v for k, v in DEMO_TRAINING.items() if k not in ("DEVICE", "NUM_TRAIN_SAMPLES", "NUM_GENERATIONS")}


def node_env(
    gdrive_path: str,
    experiment: str,
    extra: Mapping[str, object] | None = None,
    small_model: bool = False,
    **values: object,
) -> dict[str, str]:
    """The environment shared by a swarm's nodes: GDRIVE_PATH, EXPERIMENT_NAME, the small-model settings
    (when ``small_model``), ``values``, then ``extra`` (a dict of any other variables)."""
    env = {"GDRIVE_PATH": str(gdrive_path), "EXPERIMENT_NAME": experiment}
    if small_model:
        env.update(small_model_settings())
    env.update(settings(**values))
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    return env


def effective_config(env: Mapping[str, str]):
    """The Config a coordinator would resolve from ``env`` (TEST_MODE presets applied)."""
    from swarm_gdrive.config import from_env

    return from_env({**os.environ, **env, "NODE_ROLE": "coordinator"})


def describe_exit(code: int) -> str:
    return f"exit code {code}: {EXIT_MEANINGS.get(code, 'unknown')}"


# -- one node in the kernel -------------------------------------------------------------------


def run_node_here(env: Mapping[str, str]) -> int:
    """Run one node inside this kernel until it finishes; the stop button (KeyboardInterrupt) stops it cleanly.

    The node runs in a thread with its own stop event: an interrupt sets the event, the node
    finishes its current step, flushes what it buffered and returns, as on SIGTERM.
    """
    from swarm_gdrive.launcher import run_node

    stop = threading.Event()
    done = threading.Event()  # waited on instead of Thread.join, which an interrupt can leave broken
    result: dict[str, int] = {}

    def target() -> None:
        try:
            result["code"] = run_node({**os.environ, **env}, stop)
        except BaseException as exc:  # noqa: BLE001 - reported below as exit code 1
            print(f"node failed: {exc!r}", file=sys.stderr, flush=True)
            result["code"] = 1
        finally:
            done.set()

    thread = threading.Thread(target=target, name=f"node-{env.get('NODE_ROLE', 'worker')}", daemon=True)
    with _ctrl_c_raises():
        thread.start()
        try:
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt:
            print("interrupted: the node finishes its current step, flushes, then stops", flush=True)
            stop.set()
            while not done.wait(0.2):
                pass
    code = result.get("code", 1)
    print(f"node stopped, {describe_exit(code)}", flush=True)
    return code


@contextlib.contextmanager
def _ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread while the block runs, whatever handler it found.

    The stop button interrupts the kernel with SIGINT, which only becomes a KeyboardInterrupt under
    ``signal.default_int_handler``. A process started with SIGINT ignored (a background job of a
    shell script), or a kernel where earlier code installed its own handler, would otherwise never
    see the stop.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


# -- swarms of processes ----------------------------------------------------------------------


def _print_line(line: str) -> None:
    print(line, flush=True)


def start_swarm(
    env: Mapping[str, str],
    workers: int,
    coordinator: bool = True,
    worker_env: Mapping[str, str] | None = None,
    sink: Callable[[str], None] | None = _print_line,
) -> list[NodeProcess]:
    """Start a coordinator (unless ``coordinator`` is False) and ``workers`` workers as child processes.

    Each process's output is read by a thread and printed live, prefixed with its name.
    """
    nodes: list[NodeProcess] = []
    try:
        if coordinator:
            nodes.append(
                NodeProcess("coordinator", {**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"}, sink)
            )
        for i in range(1, workers + 1):
            name = f"worker-{i}"
            nodes.append(NodeProcess(name, {**env, **(worker_env or {}), "NODE_ROLE": "worker", "NODE_ID": name}, sink))
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def wait_swarm(nodes: list[NodeProcess], timeout: float) -> dict[str, int]:
    """Wait for every node to exit; returns the exit codes by node name.

    The stop button stops them all cleanly; so does a node exiting with an error (the others
    would wait for it). After ``timeout`` seconds they are stopped and TimeoutError is raised.
    """
    deadline = time.monotonic() + timeout
    try:
        while any(n.returncode is None for n in nodes):
            failed = [n.name for n in nodes if n.returncode not in (None, 0)]
            if failed:
                print(f"{', '.join(failed)} exited with an error: stopping the other nodes", flush=True)
                break
            if time.monotonic() > deadline:
                codes = stop_all(_workers_first(nodes))
                raise TimeoutError(f"the swarm did not finish within {timeout} s; stopped it: {codes}")
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("interrupted: stopping every node cleanly", flush=True)
    finally:
        stop_all(_workers_first([n for n in nodes if n.returncode is None]))
    return {n.name: n.wait() for n in nodes}


def _workers_first(nodes: list[NodeProcess]) -> list[NodeProcess]:
    return sorted(nodes, key=lambda n: n.name == "coordinator")


def run_swarm(env: Mapping[str, str], workers: int, timeout: float, **kwargs) -> dict[str, int]:
    """:func:`start_swarm` then :func:`wait_swarm`; prints and returns the exit codes."""
    codes = wait_swarm(start_swarm(env, workers, **kwargs), timeout)
    for name, code in codes.items():
        print(f"{name}: {describe_exit(code)}", flush=True)
    return codes


# -- memory and device ------------------------------------------------------------------------


def pick_device(device: str = "auto") -> str:
    """``auto``: cuda:0 when CUDA is available, else cpu; any other value is returned as is."""
    if device != "auto":
        return device
    try:
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def free_memory_gb(device: str) -> float:
    """Free memory of ``device``: the GPU's (torch.cuda.mem_get_info) for cuda, else available RAM."""
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        free, _total = torch.cuda.mem_get_info(index)
        return free / 2**30
    try:
        import psutil

        return psutil.virtual_memory().available / 2**30
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def check_memory(workers: int, per_worker_gb: float, device: str) -> float:
    """Raise MemoryError unless ``device`` has ``workers`` x ``per_worker_gb`` GiB free; returns the free GiB."""
    free = free_memory_gb(device)
    needed = workers * per_worker_gb
    print(f"{device}: {free:.1f} GiB free, {workers} workers x {per_worker_gb} GiB = {needed:.1f} GiB needed")
    if free < needed:
        raise MemoryError(
            f"{device} has {free:.1f} GiB free but {workers} workers need about {needed:.1f} GiB: "
            "lower NUM_WORKERS or the per-worker estimate's drivers (model, batch sizes)"
        )
    return free


# -- monitoring, validation, reports, comparisons ---------------------------------------------


def _storage(gdrive_path: str):
    from swarm_gdrive.storage import open_storage

    return open_storage(gdrive_path)


def show_status(gdrive_path: str, experiment: str, liveness_timeout: float = 120.0):
    """Print the status table and the health findings of an experiment; returns (snapshot, findings)."""
    from swarm_gdrive import monitor

    snapshot = monitor.load(_storage(gdrive_path), experiment, liveness_timeout=liveness_timeout)
    found = monitor.findings(snapshot, liveness_timeout)
    print(monitor.status_table(snapshot))
    print()
    for finding in found:
        print(f"{finding.severity.upper():<7} {finding.code}: {finding.message}")
    return snapshot, found


def validate_run(gdrive_path: str, experiment: str, rounds: int, nodes: int, transplants: int) -> list[str]:
    """The TEST_MODE validator on a finished run: prints PASS/FAIL per check; returns the failures."""
    from swarm_gdrive import monitor

    snapshot = monitor.load(_storage(gdrive_path), experiment)
    failures: list[str] = []
    for name, failed in monitor.checks(snapshot, rounds, nodes, transplants):
        print(f"{'PASS' if not failed else 'FAIL'} {name}")
        for msg in failed:
            print(f"     {msg}")
        failures += [f"{name}: {msg}" for msg in failed]
    print("validator: all checks passed" if not failures else f"validator: {len(failures)} failure(s)")
    return failures


def show_summary(gdrive_path: str, experiment: str) -> str:
    """Print the reward per worker per round (with external groups used), as the demo does."""
    from swarm_gdrive.cli import summary_table

    table = summary_table(_storage(gdrive_path), experiment)
    print(table)
    return table


def show_report(gdrive_path: str, experiment: str, out: str | Path) -> list[Path]:
    """Write the report (CSVs, PNGs, index.html) into ``out`` and display its plots."""
    from IPython.display import Image, display

    from swarm_gdrive.report import write_report

    files = write_report(_storage(gdrive_path), experiment, Path(out))
    for file in files:
        print(file)
    for file in files:
        if file.suffix == ".png":
            display(Image(filename=str(file)))
    return files


def parse_configurations(text: str) -> list[tuple[int, int]]:
    """``"8/0,4/4"`` -> [(8, 0), (4, 4)]: I local and J external groups per configuration."""
    out = []
    for item in text.replace(";", ",").split(","):
        if not item.strip():
            continue
        i, sep, j = item.strip().partition("/")
        if not sep:
            raise ValueError(f"configuration {item!r}: write I/J, e.g. 4/4")
        out.append((int(i), int(j)))
    if not out:
        raise ValueError("no configuration given: write e.g. 8/0,4/4")
    return out


def study_experiment(prefix: str, i: int, j: int) -> str:
    """The experiment name of configuration I/J in a study."""
    return f"{prefix}-i{i}-j{j}"


def run_study(
    env: Mapping[str, str], configurations: str, workers: int, prefix: str, timeout: float
) -> dict[str, dict[str, int]]:
    """One experiment per I/J configuration, in sequence (coordinator + workers as processes).

    Returns exit codes by experiment name; raises RuntimeError when a node of one failed.
    """
    results = {}
    for i, j in parse_configurations(configurations):
        name = study_experiment(prefix, i, j)
        print(f"=== {name}: I={i} local, J={j} external groups per stage, {workers} workers", flush=True)
        run_env = {**env, "EXPERIMENT_NAME": name, "NUM_TRAIN_SAMPLES": str(i), "NUM_TRANSPLANT_TREES": str(j)}
        codes = run_swarm(run_env, workers, timeout)
        results[name] = codes
        if any(code != 0 for code in codes.values()):
            raise RuntimeError(f"{name}: a node failed: {codes}")
    return results


def show_comparison(gdrive_path: str, experiments: list[str], baseline: str, rounds: int | None = None):
    """:func:`swarm_gdrive.analysis.compare` against ``baseline``, displayed as a table; returns its rows."""
    from IPython.display import Markdown, display

    from swarm_gdrive.analysis import compare, format_table

    rows = compare(_storage(gdrive_path), experiments, baseline, rounds)
    display(Markdown(format_table(rows)))
    for r in rows:
        change = "-" if r.eval_change is None else f"{r.eval_change:+.3f}"
        print(
            f"{r.experiment}: cumulative reward {r.cumulative_mean:.3f} over {r.rounds} rounds, "
            f"{r.difference:+.3f} vs {baseline} (95% CI {r.difference_ci[0]:+.3f}, {r.difference_ci[1]:+.3f}), "
            f"held-out pass@1 change {change}"
        )
    return rows


def show_dashboard(gdrive_path: str, experiment: str, refresh_s: float = 30, enabled: bool = True):
    """The live ipywidgets dashboard (swarm_gdrive.dashboard) of ``experiment``, when ``enabled`` and
    installed; returns it (None otherwise). ``refresh_s`` 0 turns auto-refresh off."""
    if not enabled:
        return None
    try:
        from swarm_gdrive.dashboard import Dashboard
    except ImportError as exc:
        print(f"live dashboard not available ({exc}); the status, findings and plots above are the same data")
        return None
    dashboard = Dashboard(gdrive_path, experiments=[experiment], refresh_s=refresh_s)
    dashboard.show()
    return dashboard
