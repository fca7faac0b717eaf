"""The package's floors hold: import-linter's contracts (pyproject.toml) and no import circle between any two
modules. The contracts are shown to catch a violation on a copy of the package with one wrong import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="import-linter (the test extra) brings grimp")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swarm_gdrive"


def lint_imports(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of this repository's pyproject.toml, on the package found first on
    ``pythonpath``."""
    shutil.copy(ROOT / "pyproject.toml", cwd / "pyproject.toml")
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_import_contract_is_kept(tmp_path):
    result = lint_imports(tmp_path, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_contract_ignores_an_import_or_looks_away_from_type_checking_imports():
    """Issue 29: the floors hold with no exception, and an import made only for type checkers counts as one."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    assert not linter.get("exclude_type_checking_imports", False)
    ignored = {c["name"]: c["ignore_imports"] for c in linter["contracts"] if c.get("ignore_imports")}
    assert ignored == {}
    assert len(linter["contracts"]) >= 6


def test_a_protocol_module_importing_observation_breaks_the_contracts(tmp_path):
    """The instrument can fail: the same contracts on a copy where the worker imports the monitor."""
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "swarm_gdrive", ignore=shutil.ignore_patterns("__pycache__"))
    worker = copy / "swarm_gdrive" / "protocol" / "worker.py"
    worker.write_text(worker.read_text() + "\nfrom swarm_gdrive.observe import monitor  # noqa\n")
    result = lint_imports(tmp_path, copy)
    assert result.returncode != 0
    assert "The protocol imports neither training nor observation BROKEN" in result.stdout
    assert "swarm_gdrive.protocol.worker -> swarm_gdrive.observe.monitor" in result.stdout


def test_an_import_only_for_type_checkers_that_reaches_up_breaks_the_contracts(tmp_path):
    """Imports under TYPE_CHECKING count too: storage naming the composed Config only for type checkers is caught."""
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "swarm_gdrive", ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "swarm_gdrive" / "storage" / "__init__.py"
    typed = "\nimport typing\n\nif typing.TYPE_CHECKING:\n    from swarm_gdrive.config import Config  # noqa\n"
    init.write_text(init.read_text() + typed)
    result = lint_imports(tmp_path, copy)
    assert result.returncode != 0
    assert "Storage imports nothing of the package above it BROKEN" in result.stdout
    assert "swarm_gdrive.storage -> swarm_gdrive.config" in result.stdout


def test_no_module_imports_itself_through_others():
    """No import circle between any two modules of the package (function-level imports included)."""
    graph = grimp.build_graph("swarm_gdrive")
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(imported=module, importer=imported):
                circles.append(f"{module} -> {imported} -> ... -> {module}")
    assert not circles, "\n".join(circles)


def test_the_top_floor_is_small_and_each_concept_has_its_room():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    for room in ("storage", "protocol", "training", "observe"):
        assert (PACKAGE / room / "__init__.py").is_file(), room
