"""What every benchmark part shares: the machine's description, its tag, and writing results.

Each part writes ``bench/results/<part>_<tag>.json`` (the figures and the machine) and a
Markdown rendering of the same figures beside it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def source_version() -> dict[str, Any]:
    """The commit measured, and whether the package's files differed from it (other work in the tree)."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    dirty = git("status", "--porcelain", "--", "swarm_gdrive")
    return {"commit": git("rev-parse", "--short", "HEAD"), "package_uncommitted_changes": bool(dirty)}


def machine_info(device: str = "cpu", source: dict[str, Any] | None = None) -> dict[str, Any]:
    """CPU, cores, memory, accelerator and library versions, for the result file.

    ``source``: :func:`source_version` taken when the run started (the tree may change during a run).
    """
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "device": device,
        **{name: _version(name) for name in ("torch", "transformers", "trl")},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # Other work on the machine slows a timed run: the load averages when the result was written.
        "load_avg_1_5_15m": [round(x, 2) for x in os.getloadavg()],
        **(source if source is not None else source_version()),
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError):
        pass
    if device.startswith("cuda"):
        import torch

        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def machine_tag(device: str = "cpu") -> str:
    """A short file-name tag for the machine: ``cpu-2c`` on a 2-core CPU, ``nvidia-h200`` on that GPU."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"cpu-{os.cpu_count()}c"


def finite(value: float | None) -> float | None:
    """JSON cannot hold NaN or infinity: those become None."""
    if value is None or not math.isfinite(value):
        return None
    return value


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers to ``digits`` significant figures, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line(machine: dict[str, Any]) -> str:
    """One Markdown line naming the machine a result came from."""
    versions = ", ".join(f"{k} {machine.get(k)}" for k in ("torch", "transformers", "trl") if machine.get(k))
    where = machine.get("gpu") or f"{machine.get('cpu')} ({machine.get('cores')} cores)"
    load = machine.get("load_avg_1_5_15m")
    return (
        f"Machine: {where}, {machine.get('memory_gib', '?')} GiB; {versions}; {machine.get('date_utc')}; "
        f"load average (1/5/15 min) at the end: {load}."
    )


def write_result(part: str, tag: str, result: dict[str, Any], markdown: str, out_dir: Path | None = None) -> Path:
    """Write ``<part>_<tag>.json`` and ``.md`` under ``out_dir`` (default bench/results); the JSON's path."""
    folder = Path(out_dir) if out_dir is not None else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{part}_{tag}.json"
    path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    path.with_suffix(".md").write_text(markdown.rstrip() + "\n")
    return path
