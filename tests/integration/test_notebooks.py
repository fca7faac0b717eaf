"""Every Colab notebook in notebooks/ executed headless with papermill, on a temporary folder, fast parameters."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

papermill = pytest.importorskip("papermill")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

#: Fast protocol settings for every node.
FAST = {
    "HEARTBEAT_INTERVAL": "0.5",
    "LIVENESS_TIMEOUT": "30",
    "POLL_INTERVAL_MIN": "0.05",
    "POLL_INTERVAL_MAX": "0.5",
    "COORDINATOR_ROUND_INTERVAL": "60",
    "ROLLOUT_WAIT_TIMEOUT": "20",
    "COORDINATOR_WAIT_TIMEOUT": "60",
    "SYNTHETIC_STEP_SECONDS": "0.05",
}


def execute(name: str, out_dir: Path, **parameters) -> dict:
    """Run notebooks/``name`` with ``parameters``; returns the executed notebook (raises if a cell failed)."""
    out = out_dir / name
    papermill.execute_notebook(
        str(NOTEBOOKS / name),
        str(out),
        parameters=parameters,
        kernel_name="python3",
        cwd=str(out_dir),
        progress_bar=False,
        execution_timeout=120,
    )
    return json.loads(out.read_text())


def output_text(nb: dict) -> str:
    """Every text the executed notebook showed: streams, results, displayed Markdown."""
    parts = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            if "text" in output:
                parts.append("".join(output["text"]))
            for mime in ("text/plain", "text/markdown"):
                if mime in output.get("data", {}):
                    parts.append("".join(output["data"][mime]))
    return "\n".join(parts)


WIDGET = "application/vnd.jupyter.widget-view+json"


def images(nb: dict) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from swarm_gdrive.tiny_model import build_tiny_model, teach_answer_format

    return str(teach_answer_format(build_tiny_model(tmp_path_factory.mktemp("tiny-model")), steps=40))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, dict]:
    """sapo_experiments.ipynb with two synthetic configurations; its folder is reused by the readers."""
    base = tmp_path_factory.mktemp("study")
    drive = base / "drive"
    drive.mkdir()
    nb = execute(
        "sapo_experiments.ipynb",
        base,
        GDRIVE_PATH=str(drive),
        STUDY_NAME="sapo",
        CONFIGURATIONS="8/0,4/4",
        BASELINE="8/0",
        NUM_WORKERS=2,
        MAX_ROUNDS=3,
        NUM_GENERATIONS=4,
        WORKLOAD="synthetic",
        DEVICE="cpu",
        TIMEOUT_SECONDS=90,
        SWARM_LOCAL_DIR=str(base / "local"),
        EXTRA_ENV=FAST,
    )
    return drive, nb


def test_coordinator_and_worker_notebooks_run_a_swarm_together(tmp_path):
    drive = tmp_path / "drive"
    drive.mkdir()
    common = {
        "GDRIVE_PATH": str(drive),
        "EXPERIMENT_NAME": "pair",
        "WORKLOAD": "synthetic",
        "MAX_ROUNDS": 2,
        "NUM_TRANSPLANT_TREES": 0,
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
        "EXTRA_ENV": FAST,
    }
    failures: list[BaseException] = []
    results: dict = {}

    def coordinator() -> None:
        try:
            (tmp_path / "c").mkdir()
            results["coordinator"] = execute("coordinator.ipynb", tmp_path / "c", MIN_WORKERS=1, **common)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            failures.append(exc)

    thread = threading.Thread(target=coordinator)
    thread.start()
    (tmp_path / "w").mkdir()
    worker = execute("worker.ipynb", tmp_path / "w", NODE_ID="worker-1", DEVICE="cpu", **common)
    thread.join(120)
    assert not thread.is_alive() and not failures, failures

    assert "node stopped, exit code 0" in output_text(results["coordinator"])
    assert "node stopped, exit code 0" in output_text(worker)
    root = drive / "experiments" / "pair"
    state = json.loads((root / "state" / "current_state.json").read_text())
    assert (state["status"], state["round"]) == ("finished", 2)
    assert "worker-1" in output_text(results["coordinator"])  # the summary table of rewards


def test_test_mode_notebook_passes_the_validator(tmp_path):
    drive = tmp_path / "drive"
    drive.mkdir()
    nb = execute(
        "test_mode.ipynb",
        tmp_path,
        GDRIVE_PATH=str(drive),
        EXPERIMENT_NAME="tm",
        NUM_WORKERS=2,
        NUM_TRANSPLANT_TREES=1,
        WORKLOAD="synthetic",
        TIMEOUT_SECONDS=90,
        SWARM_LOCAL_DIR=str(tmp_path / "local"),
        EXTRA_ENV=FAST,
    )
    text = output_text(nb)
    assert "validator: all checks passed" in text and "FAIL" not in text
    assert "TEST_MODE: 3 rounds" in text
    assert "[worker-2]" in text  # the processes' output streamed into the notebook
    assert (drive / "experiments" / "tm" / "state" / "current_state.json").exists()


def test_sapo_experiments_notebook_compares_both_configurations(study):
    drive, nb = study
    text = output_text(nb)
    for name in ("sapo-i8-j0", "sapo-i4-j4"):
        assert (drive / "experiments" / name / "state" / "current_state.json").exists()
        assert f"| {name} | 2 | 3 |" in text, text[-3000:]  # a row of the comparison table, 2 workers, 3 rounds
    assert "vs baseline (95% CI)" in text


def test_monitoring_notebook_shows_status_findings_and_plots(study, tmp_path):
    drive, _ = study
    nb = execute(
        "monitoring.ipynb",
        tmp_path,
        GDRIVE_PATH=str(drive),
        EXPERIMENT_NAME="sapo-i4-j4",
        REPORT_DIR=str(tmp_path / "r"),
        LIVE_DASHBOARD=True,
        REFRESH_SECONDS=0,
    )
    text = output_text(nb)
    assert "worker-1" in text and "worker-2" in text  # the status table
    assert "INFO    state: experiment sapo-i4-j4: finished" in text
    assert (tmp_path / "r" / "reward_per_round.png").stat().st_size > 0
    assert images(nb) >= 1
    widgets = [o for c in nb["cells"] for o in c.get("outputs", []) if WIDGET in o.get("data", {})]
    assert widgets or "live dashboard not available" in text  # the ipywidgets dashboard, where installed


def test_results_analysis_notebook_compares_and_plots(study, tmp_path):
    drive, _ = study
    nb = execute(
        "results_analysis.ipynb",
        tmp_path,
        GDRIVE_PATH=str(drive),
        EXPERIMENTS="sapo-i8-j0,sapo-i4-j4",
        BASELINE="sapo-i8-j0",
        REPORT_DIR=str(tmp_path / "reports"),
    )
    text = output_text(nb)
    assert "| sapo-i8-j0 | 2 | 3 |" in text and "| sapo-i4-j4 | 2 | 3 |" in text
    assert "held-out pass@1 first -> last" in text
    for name in ("sapo-i8-j0", "sapo-i4-j4"):
        assert (tmp_path / "reports" / name / "reward_per_round.png").exists()
    assert images(nb) >= 2


def test_multi_node_one_gpu_notebook_trains_workers_on_one_device(tmp_path, tiny_model):
    drive = tmp_path / "drive"
    drive.mkdir()
    nb = execute(
        "multi_node_one_gpu.ipynb",
        tmp_path,
        GDRIVE_PATH=str(drive),
        EXPERIMENT_NAME="one-gpu",
        WORKLOAD="grpo",
        MODEL_NAME=tiny_model,
        MAX_ROUNDS=1,
        NUM_TRAIN_SAMPLES=2,
        NUM_GENERATIONS=2,
        NUM_TRANSPLANT_TREES=1,
        NUM_WORKERS=2,
        DEVICE="cpu",
        MEMORY_PER_WORKER_GB=0.1,
        TIMEOUT_SECONDS=100,
        SWARM_LOCAL_DIR=str(tmp_path / "local"),
        EXTRA_ENV={
            **FAST,
            "MAX_NEW_TOKENS": "8",
            "EVAL_SAMPLES": "2",
            "OMP_NUM_THREADS": "1",
        },
    )
    text = output_text(nb)
    assert "cpu: " in text and "GiB needed" in text  # the memory check ran first
    assert "worker-1: exit code 0" in text and "worker-2: exit code 0" in text
    rewards = list((drive / "experiments" / "one-gpu").rglob("rewards/**/*.json"))
    assert {p.stem for p in rewards} == {"worker-1", "worker-2"}


def _in_process_swarm(drive: Path, local: Path) -> int:
    """A coordinator run in this (main) thread and a worker in another, one synthetic round: the
    coordinator's run_node installs its SIGTERM/SIGINT handlers here, as a node run in a kernel cell does."""
    from swarm_gdrive import notebook
    from swarm_gdrive.launcher import run_node

    env = notebook.node_env(str(drive), "before", extra=FAST, WORKLOAD="synthetic", MAX_ROUNDS=1)
    env["SWARM_LOCAL_DIR"] = str(local)
    worker_code: dict[str, int] = {}
    worker = threading.Thread(
        target=lambda: worker_code.setdefault("code", run_node({**env, "NODE_ROLE": "worker", "NODE_ID": "w"}))
    )
    worker.start()
    code = run_node({**env, "NODE_ROLE": "coordinator", "NODE_ID": "coordinator"})
    worker.join(60)
    assert worker_code.get("code") == 0
    return code


@pytest.mark.parametrize("inherited", ["ignored", "default", "python"])
def test_the_stop_button_stops_an_in_kernel_node_cleanly(tmp_path, inherited):
    """run_node_here (coordinator.ipynb, worker.ipynb): a KeyboardInterrupt, as Colab's stop button sends,
    makes the node flush and return 0, whatever SIGINT disposition the process started with (a background
    job of a shell starts with SIGINT ignored) and after a node already ran in this thread."""
    import _thread
    import signal
    import time

    from swarm_gdrive import notebook

    start_with = {"ignored": signal.SIG_IGN, "default": signal.SIG_DFL, "python": signal.default_int_handler}
    outer = signal.signal(signal.SIGINT, start_with[inherited])
    try:
        drive = tmp_path / "drive"
        drive.mkdir()
        assert _in_process_swarm(drive, tmp_path / "local-before") == 0
        assert signal.getsignal(signal.SIGINT) is start_with[inherited]  # run_node put back what it found

        env = notebook.node_env(
            str(drive),
            "stop",
            extra=FAST,
            WORKLOAD="synthetic",
            MIN_WORKERS=1,  # no worker ever comes: the coordinator waits until stopped
            NODE_ROLE="coordinator",
            NODE_ID="coordinator",
            SWARM_LOCAL_DIR=str(tmp_path / "local"),
        )
        timer = threading.Timer(2.0, _thread.interrupt_main)
        timer.start()
        started = time.monotonic()
        try:
            code = notebook.run_node_here(env)
        finally:
            timer.cancel()
        assert signal.getsignal(signal.SIGINT) is start_with[inherited]
    finally:
        signal.signal(signal.SIGINT, outer)
    assert code == 0
    assert time.monotonic() - started < 20
    assert (drive / "experiments" / "stop" / "experiment.json").exists()


def test_memory_check_refuses_more_workers_than_fit():
    from swarm_gdrive import notebook

    free = notebook.check_memory(1, 0.001, "cpu")
    assert free > 0
    with pytest.raises(MemoryError, match="lower NUM_WORKERS"):
        notebook.check_memory(4, free, "cpu")
