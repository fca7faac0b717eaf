"""Names in the folder that are not regular files (a FIFO, links to a folder and to a device): a reader refuses them
at once instead of hanging, crashing or following the link."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import NotRegularFileError

LAYOUT = Layout("e")


@pytest.fixture
def planted(tmp_path):
    folder = tmp_path / LAYOUT.rollouts_stage_dir(0, 0)
    folder.mkdir(parents=True)
    os.mkfifo(folder / "fifo.json")  # opening it for reading would block until a writer came
    os.symlink(tmp_path, folder / "link.json")  # a link to a folder: never followed
    os.symlink("/dev/zero", folder / "zero.json")  # a link to a device (endless, its size says 0): never followed
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
    for name, what in (("fifo", "a FIFO"), ("link", "a symbolic link"), ("zero", "a symbolic link")):
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
        LAYOUT.rollout_file(0, 0, "link"): "a symbolic link, not a regular file",
        LAYOUT.rollout_file(0, 0, "zero"): "a symbolic link, not a regular file",
    }


def test_an_outage_longer_than_the_retries_is_ridden_out_by_a_bounded_wait(tmp_path, monkeypatch):
    from swarm_gdrive.protocol.polling import Backoff, wait_for
    from swarm_gdrive.storage import local
    from swarm_gdrive.storage.base import StorageUnavailableError

    storage = LocalStorage(tmp_path, retry_attempts=2, retry_max_wait=0.01)
    storage.write_bytes("state.json", b"{}")
    real, failures = local.LocalStorage._read, [7]  # 7 failing calls: more than one call's 2 attempts

    def flaky(*args):
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", str(args[0]))
        return real(*args)

    monkeypatch.setattr(local.LocalStorage, "_read", staticmethod(flaky))
    with pytest.raises(StorageUnavailableError) as info:  # one call alone gives up, as before, but says so
        storage.read_bytes("state.json")
    assert info.value.errno == errno.ENOTCONN and failures[0] == 5
    got = wait_for(lambda: storage.read_bytes("state.json"), threading.Event(), 10, Backoff(0.01, 0.02))
    assert got == b"{}" and failures[0] == 0  # the poll went on through the outage instead of crashing
