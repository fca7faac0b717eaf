"""Executing the notebooks the way Colab would, without Colab (tests/integration/test_notebooks.py).

- **A Colab-like Python environment** (:func:`colab_environment`): a venv that holds torch==2.13.0 and the
  packages of ``tests/colab_packages.txt`` (what a Colab runtime ships, at the versions assumed for Colab:
  ipywidgets 7.7.1, ipykernel 6.17.1, transformers 4.57, pandas 2.2, ...) and *not* swarm_gdrive, reasoning-gym
  or gguf, which the notebooks' install cell adds. Building it takes minutes (pip, from its cache once warm),
  so it is built once per machine and per content of that file, into ``$SWARM_TEST_CACHE`` (default
  ``~/.cache/swarm-gdrive-tests``); each test session works on a copy made of hard links (about 2 s), so the
  cached one stays as built. ``colab-preinstalled.txt`` in it is its ``pip freeze`` as built.
- **A runtime** (:class:`ColabRuntime`): what one Colab runtime has of its own: a folder standing for its disk
  (Drive is mounted under it at ``content/drive``, the sign-in writes its credentials under it), its record of
  google.colab calls and its secrets, and a kernelspec that runs the environment's python with the stand-in
  ``google.colab`` (``tests/colab_standin``) on its PYTHONPATH instead of the test process's. The runtimes of one
  test share one Drive folder, as the runtimes of a swarm share a Drive. Unlike Colab they also share the
  session's Python environment: what one runtime installed, the next finds installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NOTEBOOKS = REPO / "notebooks"
PACKAGES = HERE / "colab_packages.txt"
STANDIN = HERE / "colab_standin"
TORCH = "torch==2.13.0"
PRISTINE_FREEZE = "colab-preinstalled.txt"
KERNEL = "colab"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class ColabSetupError(RuntimeError):
    """The Colab-like environment could not be built or copied; the message has the failing command's output."""


def _run(cmd: list, what: str, timeout: float = 900, **kwargs) -> str:
    try:
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ColabSetupError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        said = (done.stdout + done.stderr)[-4000:]
        raise ColabSetupError(f"{what} failed (exit {done.returncode}): {' '.join(map(str, cmd))}\n{said}")
    return done.stdout


def cache_dir() -> Path:
    return Path(os.environ.get("SWARM_TEST_CACHE") or "~/.cache/swarm-gdrive-tests").expanduser()


def _key() -> str:
    """What the built environment depends on: the package list, torch, this Python."""
    blob = PACKAGES.read_bytes() + f"{TORCH} {sys.version} {getattr(sys, '_base_executable', '')}".encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def pristine_venv() -> Path:
    """The cached Colab-like venv, built first if missing (one builder at a time: a lock file)."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"colab-venv-{_key()}"
    with open(cache / "colab-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "READY").exists():
            _build(target)
    return target


def _build(target: Path) -> None:
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", partial], "creating the Colab-like venv")
    python = partial / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", TORCH], f"pip install {TORCH} into the Colab-like venv")
    _run([python, "-m", "pip", "install", "-q", "-r", PACKAGES], f"pip install -r {PACKAGES.name}")
    (partial / PRISTINE_FREEZE).write_text(_run([python, "-m", "pip", "freeze", "--all"], "pip freeze"))
    (partial / "READY").write_text(time.ctime())
    shutil.rmtree(target, ignore_errors=True)
    os.rename(partial, target)
    for stale in target.parent.glob("colab-venv-*"):  # built for another package list: no longer used
        if stale != target and ".partial-" not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)


def parse_freeze(text: str) -> dict[str, str]:
    """``pip freeze`` -> {normalized name: version}."""
    out = {}
    for line in text.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


@dataclass
class ColabEnvironment:
    """This session's copy of the Colab-like venv."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def preinstalled(self) -> dict[str, str]:
        return parse_freeze((self.venv / PRISTINE_FREEZE).read_text())

    def installed(self) -> dict[str, str]:
        """{normalized name: version} of every distribution installed now (also those installed from a path)."""
        code = (
            "import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"
        )
        return json.loads(_run([self.python, "-c", code], "listing the installed distributions"))

    def changed_preinstalled(self) -> dict[str, tuple[str, str | None]]:
        """Preinstalled packages whose version is no longer the one Colab shipped: {name: (before, now)}."""
        now = self.installed()
        return {name: (v, now.get(name)) for name, v in self.preinstalled().items() if now.get(name) != v}


def colab_environment(dest: Path) -> ColabEnvironment:
    """A copy of the cached Colab-like venv at ``dest`` (hard links where the file system allows)."""
    source = pristine_venv()
    try:
        _run(["cp", "-al", source, dest], "hard-linking the Colab-like venv")
    except ColabSetupError:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(source, dest, symlinks=True)
    return ColabEnvironment(dest)


def copy_repository(dest: Path) -> Path:
    """The repository as a user copies it to their Drive: every file of this checkout that git does not ignore."""
    try:
        listed = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], "git ls-files", cwd=REPO)
        files = [f for f in listed.split("\0") if f and (REPO / f).is_file()]
    except ColabSetupError:
        files = [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not {".git", ".venv", "build", "__pycache__"} & set(p.relative_to(REPO).parts)
        ]
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    return dest


def build_wheel(dest: Path, work: Path) -> Path:
    """The wheel ``pip wheel --no-deps .`` builds from this checkout (built from a copy: nothing is written here)."""
    source = copy_repository(work / "source")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dest, source], "wheel")
    (wheel,) = dest.glob("swarm_gdrive-*.whl")
    return wheel


def tiny_model(env: ColabEnvironment, dest: Path) -> Path:
    """swarm_gdrive.training.tiny_model's model, saved by the Colab-like environment's transformers: a folder saved by
    transformers 5 names a tokenizer class (TokenizersBackend) that Colab's 4.x cannot load."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from swarm_gdrive.training.tiny_model import build_tiny_model; "
        f"print(build_tiny_model({str(dest)!r}))"
    )
    _run([env.python, "-c", code], "building the tiny model in the Colab-like environment", cwd=dest.parent)
    return dest


def _kernel_manager_class(kernels: Path) -> type:
    """A kernel manager that finds kernelspecs in ``kernels`` only (a runtime's own)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class RuntimeKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self) -> KernelSpecManager:
            return KernelSpecManager(kernel_dirs=[str(kernels)])

    return RuntimeKernelManager


@dataclass
class ColabRuntime:
    """One Colab runtime: its disk (``root``), the shared Drive (``drive``, which holds ``MyDrive/``), its secrets,
    and, for API mode, what its sign-in yields: an access token (the Drive emulator must accept it) and the
    token endpoint written into the credentials."""

    env: ColabEnvironment
    root: Path
    drive: Path
    secrets: dict[str, str | None] = field(default_factory=dict)
    token_uri: str | None = None
    access_token: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        (self.drive / "MyDrive").mkdir(parents=True, exist_ok=True)
        (self.root / "secrets.json").write_text(json.dumps(self.secrets))
        spec_dir = self.root / "kernels" / KERNEL
        spec_dir.mkdir(parents=True, exist_ok=True)
        spec = {
            "argv": [str(self.env.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Colab-like",
            "language": "python",
            "env": self.kernel_env(),
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
        self._manager = _kernel_manager_class(self.root / "kernels")

    @property
    def mount(self) -> Path:
        """Where this runtime mounts Drive (the notebooks' DRIVE_MOUNT)."""
        return self.root / "content" / "drive"

    @property
    def my_drive(self) -> Path:
        """My Drive as this runtime's notebooks name it (through the mount)."""
        return self.mount / "MyDrive"

    def kernel_env(self) -> dict[str, str]:
        env = {
            # The stand-in google.colab, and nothing of the test process (whose PYTHONPATH has this checkout).
            "PYTHONPATH": str(STANDIN),
            "PYTHONNOUSERSITE": "1",
            "VIRTUAL_ENV": str(self.env.venv),
            "PATH": f"{self.env.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "COLAB_STANDIN_ROOT": str(self.root),
            "COLAB_STANDIN_DRIVE": str(self.drive),
            "COLAB_STANDIN_CALLS": str(self.root / "colab-calls.jsonl"),
            "COLAB_STANDIN_SECRETS": str(self.root / "secrets.json"),
            "DATALAB_ROOT": str(self.root),
            "TMPDIR": str(self.root / "tmp"),  # the runtime's own /tmp, as each Colab runtime has
            # Two busy cores: OpenMP threads of a tiny model in a kernel only slow it down.
            "OMP_NUM_THREADS": "1",
            **self.extra_env,
        }
        if self.token_uri:
            env["COLAB_STANDIN_TOKEN_URI"] = self.token_uri
        if self.access_token:
            env["COLAB_STANDIN_ACCESS_TOKEN"] = self.access_token
        return env

    def calls(self, name: str | None = None) -> list[dict]:
        """The google.colab calls this runtime made, in order (optionally only those named ``name``)."""
        path = self.root / "colab-calls.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [r for r in records if name is None or r["call"] == name]

    def interrupt(self) -> int:
        """Colab's stop button: SIGINT to this runtime's kernel (the process whose COLAB_STANDIN_ROOT is ``root``).
        Returns how many kernels it reached (one while a notebook runs)."""
        import signal

        mine = f"COLAB_STANDIN_ROOT={self.root}".encode()
        reached = 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if b"ipykernel_launcher" in cmdline and mine in environ.split(b"\0"):
                os.kill(int(proc.name), signal.SIGINT)
                reached += 1
        return reached

    def execute(
        self, notebook: str, out_dir: Path | None = None, cell_timeout: float = 240, **parameters: object
    ) -> dict:
        """Run ``notebooks/{notebook}`` in this runtime with ``parameters`` (DRIVE_MOUNT set to its mount);
        returns the executed notebook. A failing cell raises papermill's error, with the traceback. A cell that
        runs longer than ``cell_timeout`` seconds fails: a node's run cell needs the time its rounds take on a
        loaded CI machine, not the 240 s that bounds every other cell."""
        import papermill

        out_dir = out_dir or self.root / "work"
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / notebook
        papermill.execute_notebook(
            str(NOTEBOOKS / notebook),
            str(out),
            parameters={"DRIVE_MOUNT": str(self.mount), **parameters},
            kernel_name=KERNEL,
            kernel_manager_class=self._manager,
            cwd=str(out_dir),
            progress_bar=False,
            execution_timeout=cell_timeout,
        )
        return json.loads(out.read_text())


def output_text(nb: dict) -> str:
    """Every text the executed notebook showed: streams, results, displayed Markdown, errors."""
    parts = []
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            if "text" in output:
                parts.append("".join(output["text"]))
            for mime in ("text/plain", "text/markdown"):
                if mime in output.get("data", {}):
                    parts.append("".join(output["data"][mime]))
            if output.get("output_type") == "error":
                parts.append("\n".join(output.get("traceback", [])))
    return "\n".join(parts)


def cell_output(nb: dict, source_part: str) -> str:
    """The text output of the one code cell whose source contains ``source_part``."""
    (cell,) = [c for c in nb["cells"] if c["cell_type"] == "code" and source_part in "".join(c["source"])]
    return output_text({"cells": [cell]})


def images(nb: dict) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def widget_states(nb: dict) -> dict[str, dict]:
    """The saved state of every widget of the executed notebook, by model id."""
    return nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
