"""Every notebook in notebooks/ executed headless with papermill, the way Colab would run it, on fast parameters.

Colab runtimes (tests/colab_runtime.py): a Colab-like venv that holds Colab's preinstalled packages
(ipywidgets 7.7.1, transformers 4.57, pandas 2.2, ...) but not swarm_gdrive, and the stand-in google.colab
(tests/colab_standin) in the kernel. Each notebook runs from its first cell: parameters, connect (the stand-in
mounts the test's Drive folder, or signs in), install (from the repository folder or its wheel, placed in that
Drive), then the nodes and readers. API mode runs against the Drive emulator, which accepts only the sign-in's
token. One test runs a notebook in this environment's own kernel, as a local Jupyter would (nothing installed,
nothing mounted). The synthetic workload or the tiny model keeps them fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import papermill  # the test extra installs it: a missing one fails here, it is not skipped
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from colab_runtime import (  # noqa: E402
    NOTEBOOKS,
    ColabEnvironment,
    ColabRuntime,
    build_wheel,
    cell_output,
    colab_environment,
    copy_repository,
    images,
    output_text,
    widget_states,
)
from colab_runtime import tiny_model as colab_tiny_model  # noqa: E402
from drive_emulator import DriveEmulator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.drive_budget import WriteCounter  # noqa: E402  (the bench measures a real hour with it)

# One xdist worker runs them one after another: they share the session's Colab-like venv, wheel and tiny model
# (built once there instead of once per worker) and the module's study.
# Each test has its own runtimes and Drive, so they run on any xdist worker, side by side; the three that read the
# SAPO study notebook's Drive share one worker (STUDY_GROUP), where the module fixture ``study`` runs it once.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
STUDY_GROUP = pytest.mark.xdist_group("notebooks-study")

#: A cold build of the Colab-like venv (no cache yet) takes minutes; the tests that need it get this much.
COLD_BUILD = pytest.mark.timeout(900)

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
    "SYNC_LAG": "0",  # nodes of one machine see each other's writes at once; these timeouts are for that
}
#: The Hugging Face token a user keeps in Colab's secrets: it must reach the node and nowhere else.
HF_SECRET = "hf_colabSecretThatMustNeverBePrinted42"
SIGN_IN_TOKEN = "colab-sign-in-access-token"


@pytest.fixture(scope="session")
def colab(tmp_path_factory) -> ColabEnvironment:
    """This session's Colab-like environment (a copy of the cached build; built first when missing)."""
    return colab_environment(tmp_path_factory.mktemp("colab-env") / "venv")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    return build_wheel(base / "dist", base)


@pytest.fixture(scope="session")
def tiny_model(colab, tmp_path_factory) -> str:
    """The tiny model, saved by the Colab-like environment's transformers (4.57), which loads it."""
    return str(colab_tiny_model(colab, tmp_path_factory.mktemp("tiny-model") / "model"))


def storage_params(runtime: ColabRuntime, source: str, storage: str = "mount") -> dict:
    """The connect and install parameters of a notebook in ``runtime``: paths as its mount names them."""
    return {
        "STORAGE": storage,
        "GDRIVE_PATH": str(runtime.my_drive / "rl-swarm"),
        "PACKAGE_SOURCE": str(runtime.my_drive / source),
    }


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a thread; the returned dict gets its ``result`` or its ``error``."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def wait_for(condition, timeout: float, what: str, box: dict) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if "error" in box:
            raise box["error"]
        if "result" in box:
            raise AssertionError(
                f"{what} did not happen: the notebook ended first\n{output_text(box['result'])[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.2)


def finish(thread: threading.Thread, box: dict, timeout: float = 240) -> dict:
    thread.join(timeout)
    assert not thread.is_alive(), "the notebook did not finish"
    if "error" in box:
        raise box["error"]
    return box["result"]


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- records across the environments of one swarm -----------------------------------------------


@COLD_BUILD
def test_records_written_here_read_and_sign_the_same_in_colabs_pydantic(colab, tmp_path):
    """A coordinator in one environment and workers in Colab (pydantic 2.11, where this environment has a newer
    one): every record encodes to the same bytes in both, and a signature made here verifies there. pydantic 2.12's
    exclude_if, which 2.11 ignores, once made a Colab worker sign and check other bytes (``"mode":"sync"``), so it
    refused every experiment.json of a coordinator started elsewhere."""
    import cryptography

    from swarm_gdrive.protocol.records import (
        ExperimentRecord,
        Provenance,
        RolloutBatch,
        RolloutGroup,
        StateRecord,
        encode,
    )
    from swarm_gdrive.protocol.signing import CoordinatorKey

    pristine = colab.preinstalled()
    assert pristine["pydantic"] != __import__("pydantic").VERSION  # else this test proves nothing
    done = subprocess.run(
        [colab.python, "-m", "pip", "install", "-q", "--no-deps", f"cryptography=={cryptography.__version__}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    key = CoordinatorKey.load_or_create(tmp_path / "key.pem")
    run = "0123456789abcdef"
    experiment = key.sign(
        ExperimentRecord(
            experiment="x",
            run_id=run,
            fingerprint="0" * 16,
            config={"seed": 42, "lr": 1.5e-06},
            coordinator_id="coordinator",
            created_at=1795851943.994236,
            public_key=key.public,
        )
    )
    state = key.sign(
        StateRecord(
            experiment="x",
            run_id=run,
            round=0,
            status="waiting",
            seq=3,
            max_rounds=4,
            num_stages=1,
            round_opened_at=1.5,
            round_deadline=61.5,
            coordinator_id="coordinator",
            updated_at=2.25,
        )
    )
    group = RolloutGroup(
        group_id="g1",
        task="chain_sum",
        question="1+1?",
        completions=["2"],
        rewards=[1.0],
        provenance=Provenance(dataset="chain_sum", seed=1, index=0),
    )
    batch = RolloutBatch(node_id="w1", run_id=run, round=0, stage=0, groups=[group], created_at=3.5)
    files = {"experiment": experiment, "state": state, "rollouts": batch}
    for name, record in files.items():
        (tmp_path / f"{name}.json").write_bytes(encode(record))
    script = """
import json, sys
from pathlib import Path
from swarm_gdrive.protocol.records import ExperimentRecord, RolloutBatch, StateRecord, decode, encode
from swarm_gdrive.protocol.signing import signed_by
import pydantic
folder, key = Path(sys.argv[1]), sys.argv[2]
kinds = {"experiment": ExperimentRecord, "state": StateRecord, "rollouts": RolloutBatch}
read = {name: decode((folder / f"{name}.json").read_bytes(), kind) for name, kind in kinds.items()}
print(json.dumps({
    "pydantic": pydantic.VERSION,
    "bytes": {name: encode(record).decode() for name, record in read.items()},
    "signed": {name: signed_by(read[name], key) for name in ("experiment", "state")},
}))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([colab.python, "-c", script, tmp_path, key.public], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    there = json.loads(done.stdout)
    assert there["pydantic"] == pristine["pydantic"]
    assert there["bytes"] == {name: encode(record).decode() for name, record in files.items()}
    assert there["signed"] == {"experiment": True, "state": True}


# -- mount mode: two runtimes, the package from the repository folder in Drive -----------------


@COLD_BUILD
def test_coordinator_and_worker_in_two_colab_runtimes_install_from_the_drive_folder(colab, tmp_path):
    """Mount mode, as the README's quick start: the repository folder copied to My Drive is the package source.
    It installs without upgrading any package Colab ships and without writing into the Drive; the worker's Hub
    token comes from Colab's secrets into its environment only; each runtime flushes and unmounts Drive after
    the last cell that reads it. TEST_MODE ticked: both notebooks run the test preset's 3 rounds, not the form's
    MAX_ROUNDS = 20."""
    drive = tmp_path / "drive"
    repository = copy_repository(drive / "MyDrive" / "swarm-gdrive")
    now = time.time()
    os.utime(repository / "setup.py", (now, now))  # a source this session has not installed yet: installed here
    before = files_under(repository)
    coordinator_rt = ColabRuntime(colab, tmp_path / "coordinator-runtime", drive)
    worker_rt = ColabRuntime(colab, tmp_path / "worker-runtime", drive, secrets={"HF_TOKEN": HF_SECRET})
    common = {"EXPERIMENT_NAME": "pair", "WORKLOAD": "synthetic", "TEST_MODE": True, "NUM_TRANSPLANT_TREES": 0}
    common["EXTRA_ENV"] = {"SYNC_LAG": "0"}  # shipped timeouts for a folder without lag (the runtimes share it)
    experiment = drive / "MyDrive" / "rl-swarm" / "experiments" / "pair"

    thread, box = in_background(
        coordinator_rt.execute,
        "coordinator.ipynb",
        MIN_WORKERS=1,
        SWARM_LOCAL_DIR=str(coordinator_rt.root / "local"),
        **storage_params(coordinator_rt, "swarm-gdrive"),
        **common,
    )
    wait_for((experiment / "experiment.json").exists, 240, "the coordinator's install and start", box)
    worker = worker_rt.execute(
        "worker.ipynb",
        NODE_ID="worker-1",
        DEVICE="cpu",
        HF_TOKEN_SECRET="HF_TOKEN",
        SWARM_LOCAL_DIR=str(worker_rt.root / "local"),
        **storage_params(worker_rt, "swarm-gdrive"),
        **common,
    )
    coordinator = finish(thread, box)

    assert "node stopped, exit code 0" in output_text(coordinator)
    assert "node stopped, exit code 0" in output_text(worker)
    state = json.loads((experiment / "state" / "current_state.json").read_text())
    assert (state["status"], state["round"]) == ("finished", 3)  # TEST_MODE's rounds, not the form's 20
    for nb in (coordinator, worker):
        assert "TEST_MODE: the test preset applies" in output_text(nb) and "MAX_ROUNDS=3 (not 20)" in output_text(nb)
    assert "worker-1" in cell_output(coordinator, "notebook.show_summary(env)")  # the reward table, before unmount

    # Installed from the Drive folder; the second runtime found it installed from the same, unchanged source.
    source = coordinator_rt.my_drive / "swarm-gdrive"
    assert f"installed swarm-gdrive 0.1.0 from {source}" in cell_output(coordinator, "#@title Install")
    assert "is already installed from" in cell_output(worker, "#@title Install")
    installed = colab.installed()
    assert installed["swarm-gdrive"] == "0.1.0" and "reasoning-gym" in installed and "gguf" in installed
    assert colab.changed_preinstalled() == {}  # ipywidgets 7.7.1, transformers, pandas, ... as Colab shipped them
    assert files_under(repository) == before  # no build/, no *.egg-info written into the user's Drive
    assert not list((coordinator_rt.root / "tmp").glob("swarm-gdrive-*"))  # nor the copy pip built from, left

    # The Hub token: from the worker runtime's secrets into its node's configuration, printed nowhere.
    assert "Hub: token taken from the Colab secret 'HF_TOKEN'" in output_text(worker)
    assert "HUGGINGFACE_ACCESS_TOKEN=<set>" in output_text(worker)  # the node's settings line
    assert "non-default settings" in output_text(coordinator) and "ACCESS_TOKEN=<set>" not in output_text(coordinator)
    executed = [p for runtime in (coordinator_rt, worker_rt) for p in (runtime.root / "work").glob("*.ipynb")]
    assert len(executed) == 2 and not any(HF_SECRET in p.read_text() for p in executed)
    assert [c["key"] for c in worker_rt.calls("userdata.get")] == ["HF_TOKEN"]

    # Each runtime mounted Drive, then flushed and unmounted it as its last step.
    for runtime in (coordinator_rt, worker_rt):
        assert [c["mountpoint"] for c in runtime.calls("drive.mount")] == [str(runtime.mount)]
        assert [c["mounted"] for c in runtime.calls("drive.flush_and_unmount")] == [[str(runtime.mount)]]
        assert runtime.calls()[-1]["call"] == "drive.flush_and_unmount" and not runtime.mount.exists()
        assert runtime.calls("auth.authenticate_user") == []  # mount mode: no sign-in to the API
    assert "Drive: pending writes flushed" in cell_output(coordinator, "notebook.flush_drive(DRIVE_MOUNT)")


# -- API mode: sign in, every request carries the sign-in's token -------------------------------


def drive_storage(emu: DriveEmulator, prefix: str):
    """A reader of the emulator's My Drive/``prefix`` with a token of its own (the emulator refuses anonymous calls)."""
    from google.oauth2.credentials import Credentials
    from googleapiclient.discovery import build_from_document

    from swarm_gdrive.storage.drive import DriveStorage

    emu.accept_token("test-reader")
    service = build_from_document(emu.discovery_document(), credentials=Credentials(token="test-reader"))
    return DriveStorage(emu.my_drive_id, prefix, service=service)


def upload_package(emu: DriveEmulator, wheel: Path, tmp_path: Path) -> None:
    """What a user copies to My Drive, there through the API: the repository folder (the notebooks' default
    PACKAGE_SOURCE: setup.py, requirements.txt, README.md, swarm_gdrive/) and the wheel."""
    repository = copy_repository(tmp_path / "upload" / "swarm-gdrive")
    storage = drive_storage(emu, "swarm-gdrive")
    for path in repository.rglob("*"):
        relative = path.relative_to(repository)
        if path.is_file() and (relative.parts[0] == "swarm_gdrive" or len(relative.parts) == 1):
            storage.write_bytes(relative.as_posix(), path.read_bytes())
    drive_storage(emu, "").write_bytes(wheel.name, wheel.read_bytes())


@COLD_BUILD
def test_api_mode_signs_in_and_the_nodes_and_readers_use_the_drive_api(colab, wheel, tmp_path):
    """STORAGE=api (the notebooks' default) in three runtimes (coordinator, worker, monitoring): each signs in
    through Colab once and mounts nothing: the install cell reads PACKAGE_SOURCE (the repository folder, then the
    wheel) through the Drive API with that sign-in, the shared folder named as on the mount (My Drive/rl-swarm)
    is reached through the API, every request carries the sign-in's token (the emulator answers 401 to any other,
    also through GDRIVE_API_URL, a proxy), the folder's own id is printed with how to share it, no warning reads
    like an error, and the monitoring notebook's status, report and dashboard read the API."""
    from swarm_gdrive.protocol.records import StateRecord, decode

    with DriveEmulator() as emu:
        emu.accept_token(SIGN_IN_TOKEN)
        upload_package(emu, wheel, tmp_path)
        uploaded = len(emu.authorizations)  # the test's own requests, with a token of its own
        drive = tmp_path / "drive"
        (drive / "MyDrive").mkdir(parents=True)
        runtimes = {
            role: ColabRuntime(
                colab, tmp_path / f"{role}-runtime", drive, token_uri=emu.token_uri, access_token=SIGN_IN_TOKEN
            )
            for role in ("coordinator", "worker", "monitor")
        }
        common = {"EXPERIMENT_NAME": "pair", "WORKLOAD": "synthetic", "MAX_ROUNDS": 2, "NUM_TRANSPLANT_TREES": 0}
        common["EXTRA_ENV"] = {"GDRIVE_API_URL": emu.root_url}  # the shipped timeouts (SYNC_LAG auto: 0 in api mode)
        rt = runtimes["coordinator"]
        thread, box = in_background(
            rt.execute,
            "coordinator.ipynb",
            MIN_WORKERS=1,
            SWARM_LOCAL_DIR=str(rt.root / "local"),
            **storage_params(rt, "swarm-gdrive", "api"),
            **common,
        )
        wait_for(lambda: any(f["name"] == "experiment.json" for f in emu.files()), 240, "the coordinator's start", box)
        rt = runtimes["worker"]
        worker = rt.execute(
            "worker.ipynb",
            NODE_ID="worker-1",
            DEVICE="cpu",
            SWARM_LOCAL_DIR=str(rt.root / "local"),
            **storage_params(rt, "swarm-gdrive", "api"),
            **common,
        )
        coordinator = finish(thread, box)
        rt = runtimes["monitor"]
        monitor = rt.execute(
            "monitoring.ipynb",
            EXPERIMENT_NAME="pair",
            REPORT_DIR=str(rt.root / "report"),
            LIVE_DASHBOARD=True,
            REFRESH_SECONDS=0.5,
            DASHBOARD_MINUTES=0.04,
            EXTRA_ENV=common["EXTRA_ENV"],
            **storage_params(rt, wheel.name, "api"),  # the wheel this time: read through the API and installed
        )
        assert set(emu.authorizations[uploaded:]) == {f"Bearer {SIGN_IN_TOKEN}"}
        storage = drive_storage(emu, "rl-swarm")
        state = decode(storage.read_bytes("experiments/pair/state/current_state.json"), StateRecord)
        assert (state.status, state.round) == ("finished", 2)
        readers_on_a_drive_url(emu, tmp_path)

    assert "node stopped, exit code 0" in output_text(coordinator) and "node stopped, exit code 0" in output_text(
        worker
    )
    assert f"through the Drive API (gdrive://{emu.my_drive_id}/rl-swarm)" in output_text(coordinator)
    (folder,) = [f for f in emu.files() if f["name"] == "rl-swarm"]
    for nb in (coordinator, worker):  # what a second account needs: the folder's own id, and how to share it
        assert "share My Drive/rl-swarm with it as Editor" in output_text(nb)
        assert f'GDRIVE_PATH = "gdrive://{folder["id"]}"' in output_text(nb)
    assert "worker-1" in cell_output(coordinator, "notebook.show_summary(env)")
    assert not (drive / "MyDrive" / "rl-swarm").exists()
    for runtime in runtimes.values():  # one sign-in, no mount: one permission prompt
        assert len(runtime.calls("auth.authenticate_user")) == 1
        assert runtime.calls("drive.mount") == []
    source = runtimes["coordinator"].my_drive / "swarm-gdrive"
    installed = cell_output(coordinator, "#@title Install")
    assert "through the Drive API" in installed and f"installed swarm-gdrive 0.1.0 from {source}" in installed
    assert "is already installed from" in cell_output(worker, "#@title Install")  # the same files, listed again
    assert f"from {runtimes['monitor'].my_drive / wheel.name}" in cell_output(monitor, "#@title Install")
    for runtime in runtimes.values():  # the files read through the API were removed once installed
        assert not list((runtime.root / "tmp").glob("swarm-gdrive-*"))
    assert colab.changed_preinstalled() == {}
    for nb in (coordinator, worker, monitor):  # no warning that reads like an error
        assert "per-request timeout" not in output_text(nb) and "anonymously" not in output_text(nb)

    # The monitoring notebook read the same folder through the API.
    text = output_text(monitor)
    assert "worker-1" in cell_output(monitor, "notebook.show_status(env)")
    assert "state: experiment pair: finished" in text
    assert (runtimes["monitor"].root / "report" / "reward_per_round.png").stat().st_size > 0 and images(monitor) >= 1
    states = widget_states(monitor)
    (dropdown,) = [w["state"] for w in states.values() if w["state"].get("description") == "experiment"]
    assert dropdown["_options_labels"] == ["pair"] and dropdown["index"] == 0
    refreshed = [w["state"]["value"] for w in states.values() if "refreshed at" in str(w["state"].get("value"))]
    assert len(refreshed) == 1 and "(#1)" not in refreshed[0]  # redrawn by the refresh loop after the first draw
    assert "dashboard: " in text and "refreshes in" in text and "ended after the set duration" in text


def readers_on_a_drive_url(emu: DriveEmulator, tmp_path: Path) -> None:
    """The notebook helpers that read (validator, summary, comparison, report, dashboard) on a gdrive:// path,
    with the credentials and endpoint of the environment they are given (GDRIVE_TOKEN_FILE, GDRIVE_API_URL)."""
    from swarm_gdrive import notebook

    token = tmp_path / "reader-token.json"
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    token.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "c",
                "client_secret": "s",
                "refresh_token": "r",
                "token": "test-reader",
                "expiry": expiry,
            }
        )
    )
    env = {
        "GDRIVE_PATH": f"gdrive://{emu.my_drive_id}/rl-swarm",
        "EXPERIMENT_NAME": "pair",
        "GDRIVE_API_URL": emu.root_url,
        "GDRIVE_TOKEN_FILE": str(token),
    }
    before = len(emu.authorizations)
    assert notebook.validate_run(env, rounds=2, nodes=1, transplants=0) == []
    assert "worker-1" in notebook.show_summary(env)
    (row,) = notebook.show_comparison(env, ["pair"], "pair")
    assert (row.experiment, row.nodes, row.rounds) == ("pair", 1, 2)
    files = notebook.show_report(env, tmp_path / "api-report")
    assert tmp_path / "api-report" / "reward_per_round.png" in files
    dashboard = notebook.show_dashboard(env, refresh_s=0, minutes=0)
    assert list(dashboard.experiment.options) == ["pair"] and dashboard.snapshot is not None
    assert set(dashboard.nodes.options) == {"worker-1"}
    assert set(emu.authorizations[before:]) == {"Bearer test-reader"}


# -- the stop button, then a new runtime with the same NODE_ID resumes the worker ------------------


#: The worker notebook's shipped parameters this test changes, and why: the coordinator is not a notebook here,
#: one worker has no peers to take external groups from (J = 0, else it would wait for peers every round), and
#: the local disk plays the Drive (mount mode: the bytes written are counted on files).
RESUME_OVERRIDES = {"STORAGE": "mount", "NUM_TRANSPLANT_TREES": 0, "EXPERIMENT_NAME": "reconnect", "MAX_ROUNDS": 4}
#: The protocol settings changed from the shipped defaults: a worker polls the state at most every 10 s by
#: default, which would add up to 10 s to each round here; and the local folder has no lag, so SYNC_LAG = 0
#: (mount mode's auto, 90 s, makes the worker wait 92 s before it trusts the state that ends the experiment).
#: Every timeout follows from these as shipped.
RESUME_ENV = {"POLL_INTERVAL_MAX": "1", "SYNC_LAG": "0"}


def shipped_parameters(name: str) -> dict:
    """The parameters cell of ``notebooks/{name}`` as shipped: {variable: value}."""
    nb = json.loads((NOTEBOOKS / name).read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    scope: dict = {}
    exec("".join(cell["source"]), scope)  # noqa: S102 - the repository's own notebook
    return {k: v for k, v in scope.items() if k.isupper()}


def fresh_runtime(colab: ColabEnvironment, root: Path, drive: Path) -> ColabRuntime:
    """A new Colab runtime whose model cache is on its own disk (lost with it), as in Colab, not this machine's
    (which another transformers version wrote)."""
    return ColabRuntime(colab, root, drive, extra_env={"MODEL_CACHE_DIR": str(root / "model-cache")})


def coordinator_process(folder: Path, params: dict):
    """The coordinator as a process of this environment (it runs all along in its own runtime in a real swarm), with
    the experiment definition the worker notebook's ``params`` give its node."""
    from swarm_gdrive import notebook
    from swarm_gdrive.procs import NodeProcess

    env = notebook.node_env(
        str(folder),
        params["EXPERIMENT_NAME"],
        small_model=params["SMALL_MODEL_SETTINGS"],
        extra=RESUME_ENV,
        storage=params["STORAGE"],
        sync_lag=params["SYNC_LAG"],
        WORKLOAD=params["WORKLOAD"],
        MODEL_NAME=params["MODEL_NAME"],
        MAX_ROUNDS=params["MAX_ROUNDS"],
        NUM_TRAIN_SAMPLES=params["NUM_TRAIN_SAMPLES"],
        NUM_GENERATIONS=params["NUM_GENERATIONS"],
        NUM_TRANSPLANT_TREES=params["NUM_TRANSPLANT_TREES"],
        SEED=params["SEED"],
        MIN_WORKERS=1,
        SWARM_LOCAL_DIR=str(folder.parent / "coordinator-local"),
        NODE_ROLE="coordinator",
        NODE_ID="coordinator",
    )
    return NodeProcess("coordinator", env)


@COLD_BUILD
@pytest.mark.timeout(1500)
def test_the_stop_button_keeps_the_round_and_a_new_runtime_with_the_node_id_resumes_it(colab, tmp_path):
    """worker.ipynb with its shipped settings (the packaged SmolLM2-135M, SMALL_MODEL_SETTINGS, CHECKPOINT_MINUTES
    = 30 and the default CHECKPOINT_INTERVAL of 0, so no checkpoint is due in this run) trains; after round 1
    the user presses the stop button (SIGINT to the kernel): the worker saves a checkpoint of the last round it
    trained before it exits 0. The runtime is recycled (its disk, so its SWARM_LOCAL_DIR, is gone); the same
    notebook with the same NODE_ID in a new runtime resumes from that checkpoint and plays only the rounds it had
    not played: the swarm loses no round. Measured on the way: the bytes the worker wrote to the folder per hour
    and the size of its checkpoint."""
    params = {**shipped_parameters("worker.ipynb"), **RESUME_OVERRIDES}
    drive = tmp_path / "drive"
    folder = drive / "MyDrive" / "rl-swarm"
    folder.mkdir(parents=True)
    copy_repository(drive / "MyDrive" / "swarm-gdrive")
    experiment = folder / "experiments" / params["EXPERIMENT_NAME"]
    logs = experiment / "logs" / "worker-1"
    counter = WriteCounter(experiment, "worker-1")
    notebook_params = {
        **{k: v for k, v in RESUME_OVERRIDES.items() if k != "STORAGE"},  # storage_params sets it
        "NODE_ID": "worker-1",
        "DEVICE": "cpu",
        "EXTRA_ENV": RESUME_ENV,
    }

    def trained() -> list[int]:
        path = logs / "metrics.jsonl"
        return [m["round"] for m in read_jsonl(path) if "round/seconds" in m["values"]] if path.exists() else []

    # Runtime 1: trains until round 1 is done, then the stop button.
    coordinator = coordinator_process(folder, params)
    runtime = fresh_runtime(colab, tmp_path / "worker-runtime-0", drive)
    started = time.time()
    try:
        thread, box = in_background(
            runtime.execute,
            "worker.ipynb",
            cell_timeout=900,  # the run cell lasts until the stop button, which waits up to 900 s for round 1
            SWARM_LOCAL_DIR=str(runtime.root / "local"),  # on the runtime's own disk: lost with it
            **storage_params(runtime, "swarm-gdrive", "mount"),
            **notebook_params,
        )
        wait_for(lambda: 1 in trained(), 900, "round 1 of the worker", box)
        assert runtime.interrupt() == 1  # the stop button
        first = finish(thread, box, timeout=300)
    finally:
        coordinator.terminate()
    text = output_text(first)
    assert "interrupted: the node finishes its current step" in text and "node stopped, exit code 0" in text
    events = read_jsonl(logs / "training_events.jsonl")
    (saved,) = [e for e in events if e["event"] == "checkpoint_on_stop"]
    stopped_at = saved["data"]["checkpoint_round"]
    assert stopped_at == max(trained()) >= 1  # the last round it trained, not an older checkpoint
    checkpoints = experiment / "checkpoints" / "worker-1"
    assert (checkpoints / f"round_{stopped_at}" / "checkpoint.json").exists()
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith("round_")] == [f"round_{stopped_at}"]
    played_first = trained()

    # Runtime 2, after the first was recycled: the same notebook and NODE_ID resume the stop-button checkpoint.
    coordinator = coordinator_process(folder, params)
    runtime = fresh_runtime(colab, tmp_path / "worker-runtime-1", drive)
    resumed_at = time.time()
    try:
        second = runtime.execute(
            "worker.ipynb",
            cell_timeout=900,  # the two rounds left, on a loaded CI machine
            SWARM_LOCAL_DIR=str(runtime.root / "local"),
            **storage_params(runtime, "swarm-gdrive", "mount"),
            **notebook_params,
        )
        code = coordinator.wait(timeout=120)
    finally:
        if coordinator.returncode is None:
            coordinator.terminate()
    assert code == 0, "\n".join(coordinator.lines[-30:])
    assert "node stopped, exit code 0" in output_text(second)
    events = read_jsonl(logs / "training_events.jsonl")
    resumed = [e for e in events if e["event"] == "resumed_from_checkpoint"]
    assert len(resumed) == 1 and resumed[0]["data"]["checkpoint_round"] == stopped_at
    assert resumed[0]["ts"] > resumed_at
    assert not [e for e in events if e["event"] == "resumed_without_checkpoint"]
    played = trained()
    assert played[: len(played_first)] == played_first
    assert played == list(range(params["MAX_ROUNDS"]))  # every round once: none lost, none played twice
    state = json.loads((experiment / "state" / "current_state.json").read_text())
    assert (state["status"], state["round"]) == ("finished", params["MAX_ROUNDS"])

    # What the worker wrote to the folder with the shipped settings, measured on its files (docs/colab.md cites it).
    counter.stop()
    saved_rounds = {name for name in counter.checkpoint_folders if name.startswith("round_")}
    assert counter.largest_checkpoint > 0 and counter.other_bytes > 0
    round_s = [
        m["values"]["round/seconds"] for m in read_jsonl(logs / "metrics.jsonl") if "round/seconds" in m["values"]
    ]
    per_round = counter.other_bytes / len(played)
    rounds_per_hour = 3600 / (sum(round_s) / len(round_s))
    # A checkpoint every CHECKPOINT_INTERVAL rounds (the shipped default: 0, none), and one when CHECKPOINT_MINUTES
    # have passed since the last.
    from swarm_gdrive.config import Config

    interval = {f.name: f.default for f in dataclasses.fields(Config)}["checkpoint_interval"]
    per_hour_checkpoints = max(rounds_per_hour / interval if interval else 0, 60 / params["CHECKPOINT_MINUTES"])
    print(
        f"\nMEASURED worker.ipynb, shipped settings (model {params['MODEL_NAME']}, LORA_R={params['LORA_R']}, "
        f"CHECKPOINT_MINUTES={params['CHECKPOINT_MINUTES']}): a checkpoint is {counter.largest_checkpoint:,} bytes "
        f"({len(saved_rounds)} written, {counter.checkpoint_bytes:,} bytes in all); the other files "
        f"{counter.other_bytes:,} bytes in {len(played)} rounds ({per_round:,.0f} a round); a round took "
        f"{sum(round_s) / len(round_s):.1f} s on this CPU. An hour at that pace: about {per_hour_checkpoints:.1f} "
        f"checkpoints and {rounds_per_hour:.0f} rounds, "
        f"{per_hour_checkpoints * counter.largest_checkpoint + rounds_per_hour * per_round:,.0f} bytes an hour; "
        f"{time.time() - started:.0f} s for both runtimes"
    )


# -- the other notebooks, each in a Colab runtime -------------------------------------------------


@pytest.fixture(scope="module")
def study(colab, tmp_path_factory) -> tuple[Path, dict]:
    """sapo_experiments.ipynb with two synthetic configurations and TEST_MODE ticked (its shipped MAX_ROUNDS = 20 and
    NUM_GENERATIONS = 8 give way to the preset's 3 and 4); its Drive is read by the next runtimes."""
    base = tmp_path_factory.mktemp("study")
    drive = base / "drive"
    copy_repository(drive / "MyDrive" / "swarm-gdrive")
    runtime = ColabRuntime(colab, base / "study-runtime", drive)
    nb = runtime.execute(
        "sapo_experiments.ipynb",
        STUDY_NAME="sapo",
        CONFIGURATIONS="8/0,4/4",
        BASELINE="8/0",
        NUM_WORKERS=2,
        TEST_MODE=True,
        WORKLOAD="synthetic",
        DEVICE="cpu",
        TIMEOUT_SECONDS=90,
        SWARM_LOCAL_DIR=str(runtime.root / "local"),
        EXTRA_ENV=FAST,
        **storage_params(runtime, "swarm-gdrive"),
    )
    assert [c["mounted"] for c in runtime.calls("drive.flush_and_unmount")] == [[str(runtime.mount)]]
    return drive, nb


@COLD_BUILD
def test_test_mode_notebook_passes_the_validator(colab, tmp_path):
    """test_mode.ipynb with its shipped settings (2 workers, J = 1, the synthetic workload, every timeout as
    shipped); only the folders are the test's (the Drive on a local folder in mount mode, SWARM_LOCAL_DIR)."""
    drive = tmp_path / "drive"
    copy_repository(drive / "MyDrive" / "swarm-gdrive")
    runtime = ColabRuntime(colab, tmp_path / "runtime", drive)
    nb = runtime.execute(
        "test_mode.ipynb",
        EXPERIMENT_NAME="tm",
        SWARM_LOCAL_DIR=str(runtime.root / "local"),
        **storage_params(runtime, "swarm-gdrive"),
    )
    text = output_text(nb)
    assert "validator: all checks passed" in text and "FAIL" not in text
    assert "TEST_MODE: 3 rounds" in text
    assert "[worker-2]" in text  # the processes' output streamed into the notebook
    assert (drive / "MyDrive" / "rl-swarm" / "experiments" / "tm" / "state" / "current_state.json").exists()
    assert "worker-1" in cell_output(nb, "notebook.show_summary(env)")
    assert runtime.calls()[-1]["call"] == "drive.flush_and_unmount"


@COLD_BUILD
@STUDY_GROUP
def test_sapo_experiments_notebook_compares_both_configurations(study):
    drive, nb = study
    text = output_text(nb)
    for name in ("sapo-i8-j0", "sapo-i4-j4"):
        assert (drive / "MyDrive" / "rl-swarm" / "experiments" / name / "state" / "current_state.json").exists()
        assert f"| {name} | 2 | 3 |" in text, text[-3000:]  # a row of the comparison table, 2 workers, 3 rounds
    assert "vs baseline (95% CI)" in text
    assert "MAX_ROUNDS=3 (not 20)" in text and "NUM_GENERATIONS=4 (not 8)" in text  # TEST_MODE in a study
    assert "kept: EVAL_BEFORE_TRAINING=true" in text  # the baseline evaluation each configuration is measured from


@COLD_BUILD
@STUDY_GROUP
def test_monitoring_notebook_shows_status_findings_plots_and_a_dashboard_of_every_experiment(colab, study, tmp_path):
    """ipywidgets 7.7.1, as in Colab: the dashboard's dropdown holds every experiment of the folder, and the
    refresh loop redraws it in the cell, then ends after DASHBOARD_MINUTES."""
    drive, _ = study
    runtime = ColabRuntime(colab, tmp_path / "runtime", drive)
    started = time.monotonic()
    nb = runtime.execute(
        "monitoring.ipynb",
        EXPERIMENT_NAME="sapo-i4-j4",
        REPORT_DIR=str(tmp_path / "r"),
        LIVE_DASHBOARD=True,
        REFRESH_SECONDS=0.5,
        DASHBOARD_MINUTES=0.05,
        **storage_params(runtime, "swarm-gdrive"),
    )
    assert time.monotonic() - started < 120
    text = output_text(nb)
    status = cell_output(nb, "notebook.show_status(env)")
    assert "worker-1" in status and "worker-2" in status  # the status table
    assert "INFO    state: experiment sapo-i4-j4: finished" in text
    assert (tmp_path / "r" / "reward_per_round.png").stat().st_size > 0
    assert images(nb) >= 1
    states = widget_states(nb)
    assert any(w["model_module_version"].startswith("1.") for w in states.values())  # ipywidgets 7's models
    (dropdown,) = [w["state"] for w in states.values() if w["state"].get("description") == "experiment"]
    assert dropdown["_options_labels"] == ["sapo-i4-j4", "sapo-i8-j0"] and dropdown["index"] == 0
    (nodes,) = [w["state"] for w in states.values() if w["state"].get("description") == "nodes"]
    assert nodes["_options_labels"] == ["worker-1", "worker-2"]
    (output,) = [w["state"] for w in states.values() if w["model_name"] == "OutputModel"]
    assert sum("image/png" in o["data"] for o in output["outputs"]) >= 5  # the plots, drawn into the widget
    line = cell_output(nb, "notebook.show_dashboard(")
    assert "ended after the set duration" in line
    refreshes = int(line.split("dashboard: ")[1].split(" refreshes")[0])
    assert refreshes >= 1
    (status_line,) = [w["state"]["value"] for w in states.values() if "refreshed at" in str(w["state"].get("value"))]
    assert f"(#{refreshes + 1})" in status_line  # the first draw, then each refresh of the loop
    assert runtime.calls("drive.flush_and_unmount") == []  # a reader leaves the mount alone


@COLD_BUILD
@STUDY_GROUP
def test_results_analysis_notebook_compares_and_plots(colab, study, tmp_path):
    drive, _ = study
    runtime = ColabRuntime(colab, tmp_path / "runtime", drive)
    nb = runtime.execute(
        "results_analysis.ipynb",
        EXPERIMENTS="sapo-i8-j0,sapo-i4-j4",
        BASELINE="sapo-i8-j0",
        REPORT_DIR=str(tmp_path / "reports"),
        **storage_params(runtime, "swarm-gdrive"),
    )
    text = output_text(nb)
    assert "| sapo-i8-j0 | 2 | 3 |" in text and "| sapo-i4-j4 | 2 | 3 |" in text
    assert "held-out pass@1 first -> last" in text
    for name in ("sapo-i8-j0", "sapo-i4-j4"):
        assert (tmp_path / "reports" / name / "reward_per_round.png").exists()
    assert images(nb) >= 2


@COLD_BUILD
def one_gpu_params(runtime: ColabRuntime, tiny_model: str) -> dict[str, object]:
    """multi_node_one_gpu.ipynb's form on the tiny model: 2 workers on the CPU, one round of 2 questions x 2."""
    return dict(
        EXPERIMENT_NAME="one-gpu",
        WORKLOAD="grpo",
        MODEL_NAME=tiny_model,
        MAX_ROUNDS=1,
        NUM_TRAIN_SAMPLES=2,
        NUM_GENERATIONS=2,
        NUM_TRANSPLANT_TREES=1,
        NUM_WORKERS=2,
        DEVICE="cpu",
        MEMORY_PER_WORKER_GB=0.0,  # estimated from the model and settings (training.memory)
        TIMEOUT_SECONDS=100,
        SWARM_LOCAL_DIR=str(runtime.root / "local"),
        EXTRA_ENV={**FAST, "MAX_NEW_TOKENS": "8", "EVAL_SAMPLES": "2", "OMP_NUM_THREADS": "1"},
        **storage_params(runtime, "swarm-gdrive"),
    )


def test_multi_node_one_gpu_notebook_trains_workers_on_one_device(colab, tmp_path, tiny_model):
    drive = tmp_path / "drive"
    copy_repository(drive / "MyDrive" / "swarm-gdrive")
    runtime = ColabRuntime(colab, tmp_path / "runtime", drive)
    nb = runtime.execute("multi_node_one_gpu.ipynb", **one_gpu_params(runtime, tiny_model))
    text = output_text(nb)
    assert "cpu: " in text and "GiB needed" in text  # the memory check ran first
    assert "one worker of" in text and "peak" in text  # on the estimate, printed part by part
    assert "worker-1: exit code 0" in text and "worker-2: exit code 0" in text
    rewards = list((drive / "MyDrive" / "rl-swarm" / "experiments" / "one-gpu").rglob("rewards/**/*.json"))
    assert {p.stem for p in rewards} == {"worker-1", "worker-2"}


def test_multi_node_one_gpu_notebook_trains_on_a_dataset_from_its_form_fields(colab, tmp_path, tiny_model):
    """TASK_SOURCE and DATASET_PATH (the form fields of docs/tasks.md): the runtime's own JSONL copy, GSM8K's format."""
    drive = tmp_path / "drive"
    copy_repository(drive / "MyDrive" / "swarm-gdrive")
    runtime = ColabRuntime(colab, tmp_path / "runtime", drive)
    data = runtime.root / "apples.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(
        "".join(
            json.dumps({"question": f"Ana has {a} apples and buys {b} more. How many?", "answer": f"#### {a + b}"})
            + "\n"
            for a in range(2, 6)
            for b in range(1, 5)
        ),
        encoding="utf-8",
    )
    had_math_verify = "math-verify" in colab.installed()
    nb = runtime.execute(
        "multi_node_one_gpu.ipynb",
        **one_gpu_params(runtime, tiny_model),
        TASK_SOURCE="datasets",
        DATASET_PATH=str(data),
    )
    text = output_text(nb)
    assert "worker-1: exit code 0" in text and "worker-2: exit code 0" in text
    # The install cell added the datasets extra's math-verify (Colab ships datasets) and upgraded none of Colab's.
    assert had_math_verify or "installing what TASK_SOURCE=datasets needs: math-verify" in text
    assert "math-verify" in colab.installed() and colab.changed_preinstalled() == {}
    experiment = drive / "MyDrive" / "rl-swarm" / "experiments" / "one-gpu"
    config = json.loads((experiment / "experiment.json").read_text())["config"]
    assert config["task_source"] == "datasets" and len(config["dataset_rows_hash"]) == 16
    rollouts = list(experiment.rglob("rollouts/**/*.json"))
    assert rollouts and all(g["task"] == "dataset" for p in rollouts for g in json.loads(p.read_text())["groups"])


# -- outside Colab: a local Jupyter with the package installed --------------------------------


def test_outside_colab_a_notebook_installs_nothing_mounts_nothing_and_runs(tmp_path):
    """This environment's own kernel (swarm_gdrive importable, no google.colab): the connect and install cells
    do nothing, the notebook runs on a local folder, and flush_drive has nothing to flush."""
    folder = tmp_path / "shared"
    folder.mkdir()
    out = tmp_path / "test_mode.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOKS / "test_mode.ipynb"),
        str(out),
        parameters={
            "GDRIVE_PATH": str(folder),
            "PACKAGE_SOURCE": "/nowhere",
            "EXPERIMENT_NAME": "local",
            "NUM_WORKERS": 1,
            "NUM_TRANSPLANT_TREES": 0,
            "TIMEOUT_SECONDS": 90,
            "SWARM_LOCAL_DIR": str(tmp_path / "local"),
            "EXTRA_ENV": FAST,
        },
        kernel_name="python3",
        cwd=str(tmp_path),
        progress_bar=False,
        execution_timeout=120,
    )
    nb = json.loads(out.read_text())
    assert "not in Colab: nothing to install, using" in cell_output(nb, "#@title Install")
    assert "validator: all checks passed" in output_text(nb)
    assert cell_output(nb, "notebook.flush_drive(DRIVE_MOUNT)") == ""
    assert (folder / "experiments" / "local" / "state" / "current_state.json").exists()


# -- in-kernel nodes and the stop button (this environment, no notebook) ----------------------


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
