"""``swarm-gdrive dashboard`` in a real headless browser (Debian's Chromium, driven by Playwright) while a real
swarm runs: the page renders the experiment's figures and updates itself when a new round lands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import env_fields
from swarm_gdrive.observe.web import FIGURES
from swarm_gdrive.procs import NodeProcess, stop_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _chromium() -> str | None:
    """Debian's chromium, once .ci/run's background install of it has ended (it touches SWARM_TEST_CHROMIUM_DONE)."""
    done, deadline = os.environ.get("SWARM_TEST_CHROMIUM_DONE"), time.monotonic() + 600
    while done and not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(1)
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM = _chromium()


def clean_env() -> dict[str, str]:
    names = {f.metadata["env"] for f in env_fields()}
    return {k: v for k, v in os.environ.items() if k not in names}


def start_dashboard(folder: Path, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm_gdrive", "dashboard", "--folder", str(folder), "--port", "0", *args],
        env={**clean_env(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
    assert match, line
    return proc, match.group(1)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_the_page_renders_the_figures_and_follows_new_rounds(tmp_path):
    from playwright.sync_api import sync_playwright

    shared = tmp_path / "shared"
    shared.mkdir()
    common = {
        **clean_env(),
        "GDRIVE_PATH": str(shared),
        "EXPERIMENT_NAME": "watched",
        "WORKLOAD": "synthetic",
        "MAX_ROUNDS": "8",
        "SYNTHETIC_STEP_SECONDS": "1.5",  # rounds of about 2 s: the page sees several land
        "HEARTBEAT_INTERVAL": "0.5",
        "POLL_INTERVAL_MIN": "0.05",
        "POLL_INTERVAL_MAX": "0.3",
        "SWARM_LOCAL_DIR": str(tmp_path / "local"),
    }
    nodes = [
        NodeProcess("coord", {**common, "NODE_ROLE": "coordinator", "NODE_ID": "coord"}),
        NodeProcess("w1", {**common, "NODE_ROLE": "worker", "NODE_ID": "w1"}),
    ]
    server, url = start_dashboard(shared, "--experiment", "watched", "--refresh", "0.5")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            deadline = time.monotonic() + 60
            while True:  # the coordinator may not have created the experiment yet
                page.goto(url)
                if page.query_selector("section[data-experiment=watched]") or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            page.wait_for_function(
                "document.querySelector('section').dataset.round !== ''"
                " && Number(document.querySelector('section').dataset.round) >= 1",
                timeout=60_000,
            )
            first = int(page.get_attribute("section", "data-round"))
            # No reload from here on: the page's own script must bring the next rounds in.
            page.wait_for_function(
                f"Number(document.querySelector('section').dataset.round) >= {first + 2}", timeout=60_000
            )
            later = int(page.get_attribute("section", "data-round"))
            assert later >= first + 2
            # Every figure is there and rendered by the browser (a decoded PNG of real size).
            shown = page.eval_on_selector_all(
                "figure",
                "fs => fs.map(f => [f.dataset.figure, f.querySelector('img').complete,"
                " f.querySelector('img').naturalWidth, f.querySelector('figcaption').textContent])",
            )
            assert [name for name, *_ in shown] == list(FIGURES)
            assert all(complete and width > 300 for _, complete, width, _ in shown), shown
            assert [caption for *_, caption in shown] == list(FIGURES.values())
            assert "w1" in page.inner_text("pre")  # the workers' table, with the heartbeat's age
            assert "s ago" in page.inner_text("pre")
            assert "watched" in page.inner_text("nav")
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            browser.close()
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    finally:
        server.terminate()
        server.wait(timeout=10)
        stop_all(nodes, timeout=10)


def test_bad_options_are_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "dashboard", "--folder", str(tmp_path), "--refresh", "0"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.strip() == (
        "swarm-gdrive: error: --refresh=0: use a number of seconds > 0"
    )
    result = subprocess.run(
        [sys.executable, "-m", "swarm_gdrive", "dashboard", "--folder", str(tmp_path / "absent")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "GDRIVE_PATH=" in result.stderr and len(result.stderr.strip().splitlines()) == 1
