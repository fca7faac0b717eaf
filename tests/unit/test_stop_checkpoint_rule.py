"""A stop: the signals that ask for it (launcher), and when a stopped worker checkpoints (stop_checkpoint_due)."""

from __future__ import annotations

import signal
import threading

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.launcher import install_signal_handlers, restore_signal_handlers
from swarm_gdrive.training.grpo_workload import stop_checkpoint_due


@pytest.mark.parametrize(
    ("trained", "saved", "age_s", "due"),
    [
        (None, None, None, False),  # it trained nothing (stopped while joining, or restored and stopped)
        (13, None, None, True),  # trained rounds, no checkpoint written by this process: the round 13
        (13, 9, 600.0, True),  # the latest checkpoint is of an older round and old enough
        (13, 9, 30.0, False),  # ... younger than a minute: not written again so soon
        (13, 13, 600.0, False),  # the latest checkpoint holds the round already
        (13, 12, 60.0, True),  # exactly the minimum is old enough
    ],
)
def test_a_stop_checkpoints_the_last_round_trained_unless_the_latest_is_younger_than_a_minute(
    trained, saved, age_s, due, tmp_path
):
    minimum = from_env({"GDRIVE_PATH": str(tmp_path)}).stop_checkpoint_min_seconds
    assert minimum == 60.0  # the default: a minute
    assert stop_checkpoint_due(trained, saved, age_s, minimum) is due
    assert stop_checkpoint_due(trained, saved, age_s, 0.0) is (trained is not None and trained != saved)


def test_sigterm_and_the_first_ctrl_c_ask_for_a_clean_stop_and_a_second_ctrl_c_interrupts_at_once():
    """The first SIGINT (or any SIGTERM) only sets the stop event, so the worker finishes its step and saves its
    checkpoint; a second SIGINT raises KeyboardInterrupt wherever the main thread is (the save included)."""
    stop = threading.Event()
    previous = install_signal_handlers(stop)
    try:
        on_int, on_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        on_term(signal.SIGTERM, None)
        assert stop.is_set()
        on_term(signal.SIGTERM, None)  # a second SIGTERM: still the clean stop under way
        with pytest.raises(KeyboardInterrupt):
            on_int(signal.SIGINT, None)
    finally:
        restore_signal_handlers(previous)
    assert signal.getsignal(signal.SIGINT) is previous[signal.SIGINT]
