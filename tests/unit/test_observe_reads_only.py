"""observe/ reads experiments and draws, nothing else: the commands' parsers and entry points are swarm_gdrive.cli's.

import-linter cannot forbid a standard-library module, so the source of every module of observe/ is read here for
an ``argparse`` import (at the top or inside a function) and for a command's parser or entry point by name; the
contract that observe imports no entry point (pyproject.toml) is shown to catch a violation on a copy.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

pytest.importorskip("grimp", reason="import-linter (the test extra) brings grimp")

from test_layering import lint_imports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swarm_gdrive"


def command_code(folder: Path) -> list[str]:
    """``module: what`` for each argparse import and each ``add_*_parser`` / ``*_main`` function of the modules
    under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        module = path.relative_to(folder.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            found += [f"{module}: imports {name}" for name in names if name.partition(".")[0] == "argparse"]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.name.endswith("_main") or node.name.startswith("add_") and node.name.endswith("_parser")
            ):
                found.append(f"{module}: defines {node.name}")
    return found


def test_no_module_of_observe_parses_a_command_line():
    assert command_code(PACKAGE / "observe") == []


def test_the_commands_live_in_the_cli_package():
    """The check finds what it looks for: the cli package has the parsers and the entry points."""
    found = command_code(PACKAGE / "cli")
    for expected in (
        "cli/readers.py: imports argparse",
        "cli/readers.py: defines status_main",
        "cli/readers.py: defines add_dashboard_parser",
        "cli/demo.py: defines demo_main",
    ):
        assert expected in found, found


def test_an_argparse_import_inside_a_function_of_observe_is_found(tmp_path):
    copy = tmp_path / "observe"
    shutil.copytree(PACKAGE / "observe", copy, ignore=shutil.ignore_patterns("__pycache__"))
    web = copy / "web.py"
    web.write_text(web.read_text() + "\n\ndef serve():\n    from argparse import Namespace\n\n    return Namespace\n")
    assert command_code(copy) == ["observe/web.py: imports argparse"]


def test_observation_importing_the_cli_breaks_the_contracts(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "swarm_gdrive", ignore=shutil.ignore_patterns("__pycache__"))
    report = copy / "swarm_gdrive" / "observe" / "report.py"
    report.write_text(report.read_text() + "\nfrom swarm_gdrive.cli import readers  # noqa\n")
    result = lint_imports(tmp_path, copy)
    assert result.returncode != 0
    assert "Observation reads experiments and draws: it imports no entry point BROKEN" in result.stdout
    assert "swarm_gdrive.observe.report -> swarm_gdrive.cli.readers" in result.stdout
