"""The coordinator's first-hour feedback and late rewards: whom round 0 waits for, a round closed on the deadline
(who had not submitted, the SYNC_LAG hint), rewards of a closed round counted when they arrive late, and the
wait for the last round's late rewards before the coordinator exits. The workers are played by the test."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol.coordinator import WAITING_REPORT_SECONDS, Coordinator
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import EventRecord, MetricRecord, PeerRecord, RewardRecord, StateRecord, decode_lines
from swarm_gdrive.storage import LocalStorage

LAYOUT = Layout("exp")


def config(folder: Path, **extra: object):
    env = {
        "GDRIVE_PATH": str(folder),
        "EXPERIMENT_NAME": "exp",
        "NODE_ROLE": "coordinator",
        "NODE_ID": "coord",
        "SWARM_LOCAL_DIR": str(folder.parent / "local"),
        "MIN_WORKERS": "2",
        "HEARTBEAT_INTERVAL": "1",
        "POLL_INTERVAL_MIN": "0.02",
        "POLL_INTERVAL_MAX": "0.1",
        "ROUND_MODE": "sync",  # the round clock's feedback, also on a folder that lags (auto: async there)
    }
    return from_env({**env, **{k: str(v) for k, v in extra.items()}})


class Workers:
    """Plays workers on the folder: peer files and reward files, written whenever the test says."""

    def __init__(self, folder: Path, names: list[str]) -> None:
        self.exchange = Exchange(LocalStorage(folder), LAYOUT, "test")
        self.names = names
        self.run_id: str | None = None

    def state(self) -> StateRecord | None:
        return self.exchange.read_state()

    def join(self) -> None:
        experiment = self.wait(self.exchange.read_experiment, "experiment.json")
        self.run_id = experiment.run_id
        for name in self.names:
            self.exchange.write_peer(
                PeerRecord(
                    node_id=name,
                    role="worker",
                    run_id=self.run_id,
                    registered_at=1.0,
                    heartbeat=1,
                    heartbeat_at=1.0,
                    status="alive",
                )
            )

    def submit(self, name: str, round_: int) -> None:
        assert self.run_id is not None
        self.exchange.write_reward(
            RewardRecord(
                node_id=name,
                run_id=self.run_id,
                round=round_,
                stage=0,
                reward=0.5,
                num_local_groups=4,
                num_external_groups=0,
                external_requested=0,
                submitted_at=time.time(),
            )
        )

    def wait_round(self, round_: int, status: str = "running") -> StateRecord:
        return self.wait(
            lambda: s if (s := self.state()) is not None and (s.round, s.status) == (round_, status) else None,
            f"round {round_} {status}",
        )

    @staticmethod
    def wait(check, what: str, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while (value := check()) is None:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)
        return value


def start(coordinator: Coordinator) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(coordinator.run()), daemon=True)
    thread.start()
    return thread, codes


def events(folder: Path, name: str | None = None) -> list[EventRecord]:
    file = folder / LAYOUT.events_file("coord")
    found = decode_lines(file.read_bytes(), EventRecord)[0] if file.exists() else []
    return [e for e in found if name is None or e.event == name]


def metrics(folder: Path) -> list[MetricRecord]:
    return decode_lines((folder / LAYOUT.metrics_file("coord")).read_bytes(), MetricRecord)[0]


def test_a_round_closed_on_the_deadline_names_the_missing_and_its_late_reward_is_counted(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    coordinator = Coordinator(
        config(folder, COORDINATOR_ROUND_INTERVAL=2, MAX_ROUNDS=3), LocalStorage(folder), "coord", threading.Event()
    )
    thread, codes = start(coordinator)
    workers = Workers(folder, ["w1", "w2"])
    workers.join()
    workers.wait_round(0)
    workers.submit("w1", 0)  # w2 is working, but its reward of round 0 comes only after the deadline
    workers.wait_round(1)
    workers.submit("w2", 0)
    for round_ in (1, 2):
        workers.submit("w1", round_)
        workers.submit("w2", round_)
    thread.join(timeout=20)
    assert codes == [0]

    (closed,) = events(folder, "round_closed_on_deadline")
    assert closed.round == 0 and closed.level == "warning" and closed.data["missing"] == ["w2"]
    assert "round 0 closed on the deadline (COORDINATOR_ROUND_INTERVAL=2 s) without rewards from w2" in closed.message
    assert "set SYNC_LAG to its lag" in closed.message
    (late,) = events(folder, "late_submission")
    assert (late.round, late.data["node"]) == (0, "w2") and 0 <= late.data["late_s"] < 2
    counted = [m.values for m in metrics(folder) if m.round == 0]
    assert {"swarm/live_workers": 2, "swarm/submitted": 1, "swarm/advanced_on_interval": 1} in counted
    assert {"swarm/late_submitted": 1, "swarm/never_submitted": 0} in counted
    reasons = [e.data["reason"] for e in events(folder) if e.event in ("round_advanced", "experiment_finished")]
    assert reasons == ["interval", "all_submitted", "all_submitted"]  # rounds 1 and 2 closed as soon as both came


def test_the_coordinator_waits_up_to_sync_lag_for_the_last_rounds_late_rewards(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    cfg = config(folder, SYNC_LAG=1, COORDINATOR_ROUND_INTERVAL=3, MAX_ROUNDS=1)
    coordinator = Coordinator(cfg, LocalStorage(folder), "coord", threading.Event())
    thread, codes = start(coordinator)
    workers = Workers(folder, ["w1", "w2"])
    workers.join()
    workers.wait_round(0)
    workers.submit("w1", 0)
    workers.wait_round(1, "finished")  # the last round closed on the deadline without w2's reward
    time.sleep(0.3)  # w2's reward is on its way: it reaches the coordinator's folder within SYNC_LAG
    assert thread.is_alive(), "the coordinator left before a reward sent in time could reach it"
    workers.submit("w2", 0)
    thread.join(timeout=5)
    assert codes == [0]
    (late,) = events(folder, "late_submission")
    assert (late.round, late.data["node"]) == (0, "w2")
    assert {"swarm/late_submitted": 1, "swarm/never_submitted": 0} in [m.values for m in metrics(folder)]


def test_a_reward_that_never_comes_is_waited_for_no_longer_than_sync_lag(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    cfg = config(folder, SYNC_LAG=1, COORDINATOR_ROUND_INTERVAL=3, MAX_ROUNDS=1)
    coordinator = Coordinator(cfg, LocalStorage(folder), "coord", threading.Event())
    thread, codes = start(coordinator)
    workers = Workers(folder, ["w1", "w2"])
    workers.join()
    workers.wait_round(0)
    workers.submit("w1", 0)
    workers.wait_round(1, "finished")
    finished_at = time.monotonic()
    thread.join(timeout=10)
    assert codes == [0] and time.monotonic() - finished_at < 1 + 1.0
    assert not events(folder, "late_submission")
    assert {"swarm/late_submitted": 0, "swarm/never_submitted": 1} in [m.values for m in metrics(folder)]


def test_waiting_for_workers_says_whom_on_change_and_periodically(tmp_path, caplog):
    folder = tmp_path / "shared"
    folder.mkdir()
    coordinator = Coordinator(
        config(folder, MIN_WORKERS=3, SYNC_LAG=90), LocalStorage(folder), "coord", threading.Event()
    )
    coordinator.open_experiment()
    caplog.set_level(logging.INFO, logger="swarm_gdrive.protocol.coordinator")
    caplog.clear()  # what opening the experiment said (its key, when INFO was already on): not under test here

    coordinator.report_waiting(frozenset(), now=0.0)
    coordinator.workers_seen.update({"worker-1", "worker-2", "worker-3"})
    coordinator.report_waiting(frozenset({"worker-1", "worker-2"}), now=5.0)
    coordinator.report_waiting(frozenset({"worker-1", "worker-2"}), now=5.0 + WAITING_REPORT_SECONDS - 1)

    def lines() -> list[logging.LogRecord]:  # the coordinator's own lines (events have their own logger)
        return [r for r in caplog.records if r.name == "swarm_gdrive.protocol.coordinator"]

    assert not lines()  # nothing changed, and not yet time for a reminder
    coordinator.report_waiting(frozenset({"worker-1", "worker-2"}), now=5.0 + WAITING_REPORT_SECONDS)
    (reminder,) = lines()
    assert reminder.getMessage().startswith("waiting for MIN_WORKERS=3: 2 of 3 workers live: worker-1, worker-2")

    first, second = events(folder, "waiting_for_workers")  # flushed at once: the monitor sees them while it waits
    assert first.message.startswith("waiting for MIN_WORKERS=3: 0 of 3 workers live; no worker has registered yet")
    assert "EXPERIMENT_NAME=exp" in first.message and "SYNC_LAG=90 s" in first.message
    assert second.message == (
        "waiting for MIN_WORKERS=3: 2 of 3 workers live: worker-1, worker-2; "
        "registered but not live (stopped, or no heartbeat for 300 s): worker-3"
    )
    assert second.data == {
        "live": ["worker-1", "worker-2"],
        "registered": ["worker-1", "worker-2", "worker-3"],
        "needed": 3,
    }


@pytest.mark.parametrize("lag, needle", [(0, "set SYNC_LAG to its lag"), (30, "raise SYNC_LAG to the folder's")])
def test_the_deadline_hint_depends_on_whether_a_lag_was_declared(tmp_path, lag, needle):
    folder = tmp_path / "shared"
    folder.mkdir()
    coordinator = Coordinator(config(folder, SYNC_LAG=lag), LocalStorage(folder), "coord", threading.Event())
    state = coordinator.open_experiment()
    coordinator._closed_on_deadline(state, ["w2"], now=0.0)
    coordinator.log.flush()
    (closed,) = events(folder, "round_closed_on_deadline")
    assert needle in closed.message and coordinator.late[0].missing == {"w2"}
