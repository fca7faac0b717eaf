"""Native Windows: every module of the package imports, and node identities are claimed, without POSIX-only modules.

CI runs no Windows, so a child interpreter hides those modules behind an import hook (and empties
``os.supports_dir_fd``, as on Windows) before it imports the package; what a module merely reads from ``os``,
``signal`` or ``select`` at import time is checked in its source.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swarm_gdrive"
POSIX_ONLY_MODULES = ("fcntl", "resource", "termios", "tty", "pty", "pwd", "grp", "posix")

_CHILD = r"""
import importlib, importlib.abc, json, os, pkgutil, sys, tempfile, warnings

POSIX_ONLY = set(sys.argv[1].split(","))


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in POSIX_ONLY:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: native Windows has none)", name=name)
        return None


for name in POSIX_ONLY:
    sys.modules.pop(name, None)  # posix: loaded at start-up by os, which keeps its own reference
sys.meta_path.insert(0, Absent())
os.supports_dir_fd = set()  # no call takes dir_fd on Windows
warnings.simplefilter("ignore")  # filelock warns that only its soft lock is left
report = {"hidden": [], "imported": [], "failed": []}
for name in sorted(POSIX_ONLY):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        report["hidden"].append(name)

import swarm_gdrive

report["origin"] = swarm_gdrive.__file__


def failed(name):
    report["failed"].append([name, repr(sys.exc_info()[1])])


for module in pkgutil.walk_packages(swarm_gdrive.__path__, "swarm_gdrive.", onerror=failed):
    argv, sys.argv = sys.argv, ["swarm-gdrive", "--help"]  # __main__ runs the CLI when imported
    try:
        importlib.import_module(module.name)
    except SystemExit as exc:
        if module.name != "swarm_gdrive.__main__" or exc.code != 0:
            failed(module.name)
        else:
            report["imported"].append(module.name)
    except BaseException:
        failed(module.name)
    else:
        report["imported"].append(module.name)
    finally:
        sys.argv = argv

print("IMPORTS", json.dumps(report), flush=True)  # the usage --help printed came before
if report["failed"]:
    sys.exit(1)

from swarm_gdrive.protocol.identity import IdentityError, claim_identity
from swarm_gdrive.storage import StorageError
from swarm_gdrive.storage.local import LocalStorage

report = {}
local = tempfile.mkdtemp()
alice = claim_identity(local, "exp", "worker", "alice")
generated = claim_identity(local, "exp", "worker", None)
report["lock"] = type(alice._lock).__name__
report["ids"] = [alice.node_id, generated.node_id]
try:
    claim_identity(local, "exp", "worker", "alice")
    report["second_claim"] = "granted"
except IdentityError as exc:
    report["second_claim"] = str(exc)
alice.release()
generated.release()
again = [claim_identity(local, "exp", "worker", n) for n in ("alice", None)]  # kept: a lost Identity lets go
report["after_release"] = [identity.node_id for identity in again]
try:
    LocalStorage(local)
    report["local_folder"] = "accepted"
except StorageError as exc:
    report["local_folder"] = str(exc)
report["still_absent"] = sorted(POSIX_ONLY - set(sys.modules))
print("CLAIMS", json.dumps(report))
"""


def package_modules() -> set[str]:
    """Every module of the package, from its files (not from the import machinery under test)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_and_identities_work_without_posix_only_modules():
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(POSIX_ONLY_MODULES)],
        cwd=ROOT,  # the checkout's package, first on the child's path
        capture_output=True,
        text=True,
        timeout=240,
    )
    reports = dict(
        line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("IMPORTS ", "CLAIMS "))
    )
    assert "IMPORTS" in reports, result.stderr[-4000:]
    imports = json.loads(reports["IMPORTS"])
    assert imports["origin"] == str(PACKAGE / "__init__.py")
    assert imports["hidden"] == sorted(POSIX_ONLY_MODULES)  # the hook works: each import fails as on Windows
    assert imports["failed"] == []
    assert set(imports["imported"]) == package_modules() - {"swarm_gdrive"}  # the package itself came first

    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(reports["CLAIMS"])
    assert report["still_absent"] == sorted(POSIX_ONLY_MODULES)  # nothing reached them another way
    alice, generated = report["ids"]
    assert alice == "alice" and generated.startswith("worker-")
    assert report["lock"] == "SoftFileLock"  # neither flock nor LockFileEx here: filelock's own fallback
    assert report["second_claim"].startswith("NODE_ID='alice': another running process on this machine")
    assert report["after_release"] == ["alice", generated]  # both free again; the generated one is reused
    assert "needs Linux, macOS or WSL 2" in report["local_folder"]  # refused with the fix, not an AttributeError


#: Read from ``os`` at import time, these fail on native Windows (a sample of the usual ones, not every one).
POSIX_ONLY_OS = frozenset(
    """O_NONBLOCK O_DIRECTORY O_NOFOLLOW O_CLOEXEC O_SYNC O_DSYNC O_NOCTTY O_NDELAY O_PATH O_TMPFILE O_NOATIME
    O_ASYNC O_DIRECT EX_OK getuid geteuid getgid getegid getgroups setuid setgid getpgid getpgrp setsid killpg
    fork forkpty wait3 wait4 WNOHANG sysconf sysconf_names confstr pathconf statvfs fstatvfs getloadavg uname
    nice sync fchown chown lchown mkfifo mknod openpty ttyname getpriority setpriority sched_getaffinity
    sched_setaffinity pipe2 posix_spawn posix_fadvise register_at_fork getresuid initgroups sendfile lockf
    fwalk memfd_create""".split()  # noqa: SIM905 - a word list reads best as words
)
#: All that ``signal`` has on Windows.
WINDOWS_SIGNAL = frozenset(
    """SIGABRT SIGFPE SIGILL SIGINT SIGSEGV SIGTERM SIGBREAK CTRL_C_EVENT CTRL_BREAK_EVENT SIG_DFL SIG_IGN NSIG
    signal getsignal default_int_handler raise_signal set_wakeup_fd strsignal valid_signals Signals
    Handlers""".split()  # noqa: SIM905
)
POSIX_ONLY_SELECT = frozenset({"poll", "epoll", "kqueue", "devpoll"})


def _guarded(node: ast.AST) -> bool:
    """An ``if`` on the platform (``sys.platform``, ``os.name``, ``hasattr``) or a ``try`` catching AttributeError."""
    if isinstance(node, ast.If):
        source = ast.unparse(node.test)
        return any(key in source for key in ("platform", "os.name", "hasattr"))
    if isinstance(node, ast.Try):
        return any(h.type is None or "AttributeError" in ast.unparse(h.type) for h in node.handlers)
    return False


def import_time_posix_uses(source: str) -> list[str]:
    """POSIX-only names of ``os``, ``signal`` and ``select`` that run when the module is imported: everything but
    function bodies (decorators and default values do run), outside a platform guard."""
    tree = ast.parse(source)
    denied = {"os": POSIX_ONLY_OS.__contains__, "select": POSIX_ONLY_SELECT.__contains__}
    denied["signal"] = lambda name: name not in WINDOWS_SIGNAL
    aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(
                [*getattr(node, "decorator_list", []), *node.args.defaults, *filter(None, node.args.kw_defaults)]
            )
            continue
        if _guarded(node):
            continue
        if isinstance(node, ast.ImportFrom) and node.module in denied:
            names = [a.name for a in node.names if denied[node.module](a.name)]
            found += [(node.lineno, f"from {node.module} import {name}") for name in names]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module in denied and denied[module](node.attr):
                found.append((node.lineno, f"{module}.{node.attr}"))
        stack.extend(ast.iter_child_nodes(node))
    return [f"line {line}: {use}" for line, use in sorted(found)]


def test_no_module_reads_a_posix_only_name_at_import_time():
    found = {
        str(path.relative_to(ROOT)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := import_time_posix_uses(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "use getattr(os, NAME, default), a platform guard, or read it inside the function that needs it"


def test_the_source_check_finds_import_time_uses():
    source = """
import os as _os
import signal
from select import epoll
from os import getcwd
FLAGS = _os.O_RDONLY | _os.O_NONBLOCK | getattr(_os, "O_DIRECTORY", 0)
class A:
    hup = signal.SIGHUP
    term = signal.SIGTERM
def f(n=_os.sysconf("SC_PAGE_SIZE")):
    return _os.getuid(), signal.SIGKILL
if hasattr(_os, "getuid"):
    UID = _os.getuid()
"""
    assert import_time_posix_uses(source) == [
        "line 4: from select import epoll",
        "line 6: os.O_NONBLOCK",
        "line 8: signal.SIGHUP",
        "line 10: os.sysconf",
    ]
