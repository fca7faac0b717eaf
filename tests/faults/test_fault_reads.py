"""Names in the folder that are not regular files: a reader refuses them at once instead of hanging or crashing."""

from __future__ import annotations

import os
import threading
import time

import pytest

from swarm_gdrive.exchange import Exchange
from swarm_gdrive.layout import Layout
from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import NotRegularFileError

LAYOUT = Layout("e")


@pytest.fixture
def planted(tmp_path):
    folder = tmp_path / LAYOUT.rollouts_stage_dir(0, 0)
    folder.mkdir(parents=True)
    os.mkfifo(folder / "fifo.json")  # opening it for reading would block until a writer came
    os.symlink(tmp_path, folder / "link.json")  # a link to a folder: open() raises IsADirectoryError
    os.symlink("/dev/zero", folder / "zero.json")  # endless, and its size says 0
    return tmp_path


def within(seconds: float, fn, *args):
    """``fn(*args)``'s result or exception, from a daemon thread, failing if it blocks longer than ``seconds``."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"{fn.__name__}{args} blocked for more than {seconds} s"
    return out[0]


def test_a_fifo_a_link_to_a_folder_and_a_device_are_refused_at_once(planted):
    storage = LocalStorage(planted, retry_attempts=8)
    for name, what in (("fifo", "a FIFO"), ("link", "a folder"), ("zero", "a device")):
        started = time.monotonic()
        error = within(10, storage.read_bytes, LAYOUT.rollout_file(0, 0, name))
        assert isinstance(error, NotRegularFileError) and what in str(error), error
        assert time.monotonic() - started < 1.0  # refused, not retried with backoff


def test_the_exchange_rejects_them_with_a_reason_and_goes_on(planted):
    rejected = {}
    exchange = Exchange(LocalStorage(planted), LAYOUT, "w1", run_id="abcdef12", on_reject=rejected.__setitem__)
    assert within(10, exchange.read_rollouts, 0, 0) == {}
    assert rejected == {
        LAYOUT.rollout_file(0, 0, "fifo"): "a FIFO, not a regular file",
        LAYOUT.rollout_file(0, 0, "link"): "a folder, not a regular file",
        LAYOUT.rollout_file(0, 0, "zero"): "a device, not a regular file",
    }
