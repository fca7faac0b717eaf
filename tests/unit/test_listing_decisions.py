"""The coordinator decides from listings what it would decide from reading every file (issue #16).

Its economy (GDRIVE_IMPLEMENTATION.md §5.3, §6, §15.5): liveness from the listing of ``peers/`` (a peer file
downloaded only when it changed and its record matters), each reward file downloaded once per version, several
at once. The
reference reads every file afresh, through a backend with no cache. Both run against the Drive emulator with
listings that lag behind creates, names written twice in one folder (a newer garbage copy, then the worker's own
update), a duplicate round folder made by a lagging worker, workers that stop, peer files that turn to garbage and
rewards from names that never registered. After every burst of changes, once listings have caught up and two
heartbeat intervals have passed in silence, the two must agree on the live workers, the submissions and so on the
round's decision; before that, the coordinator never counts a submission that the reference never saw.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from swarm_gdrive.config import from_env
from swarm_gdrive.protocol import exchange as exchange_module
from swarm_gdrive.protocol.coordinator import Coordinator, decide
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import PeerRecord, RewardRecord, StateRecord, encode
from swarm_gdrive.storage import drive as drive_module
from swarm_gdrive.storage.base import FileInfo
from swarm_gdrive.storage.drive import DriveStorage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from drive_emulator import DriveEmulator  # noqa: E402

LAG_S = 0.25  # files.list hides what was created this recently
TTL_S = 0.3  # folder ids and listings are looked up again after this long
HEARTBEAT_S = 0.4
WORKERS = ["w1", "w2", "w3", "w4"]
PREFIX = "swarm"


@pytest.fixture
def emu(monkeypatch):
    monkeypatch.setattr(drive_module, "YOUNG_FOLDER_S", 0.0)  # every folder re-resolved after TTL_S
    emulator = DriveEmulator().start()
    emulator.list_lag_s = LAG_S
    yield emulator
    emulator.stop()


def storage(emu: DriveEmulator) -> DriveStorage:
    return DriveStorage(emu.root_id, PREFIX, service=emu.service(), cache_ttl=TTL_S, retry_max_wait=0.05)


class Swarm:
    """A coordinator, the workers' own backends, and a forger that plants copies under their names."""

    def __init__(self, emu: DriveEmulator, tmp_path: Path) -> None:
        self.emu = emu
        config = from_env(
            {
                "GDRIVE_PATH": str(tmp_path),
                "EXPERIMENT_NAME": "exp",
                "NODE_ROLE": "coordinator",
                "SWARM_LOCAL_DIR": f"{tmp_path}-local",  # beside the shared folder, never in it
                "HEARTBEAT_INTERVAL": str(HEARTBEAT_S),
            }
        )
        self.coordinator = Coordinator(config, storage(emu), "coord", threading.Event())
        self.state = self.coordinator.open_experiment().model_copy(update={"status": "running"})
        self.run_id = self.state.run_id
        self.layout = Layout("exp")
        self.writers = {w: Exchange(storage(emu), self.layout, w, self.run_id) for w in WORKERS}
        self.beats = dict.fromkeys(WORKERS, 0)
        self.coordinator.exchange.prepare_round(0, 1)

    def beat(self, worker: str, status: str = "alive") -> None:
        self.beats[worker] += 1
        self.writers[worker].write_peer(
            PeerRecord(
                node_id=worker,
                role="worker",
                run_id=self.run_id,
                registered_at=1.0,
                heartbeat=self.beats[worker],
                heartbeat_at=time.time(),
                status=status,
            )
        )

    def reward(self, worker: str, round_: int = 0) -> RewardRecord:
        return RewardRecord(
            node_id=worker,
            run_id=self.run_id,
            round=round_,
            stage=0,
            reward=0.5,
            num_local_groups=1,
            num_external_groups=0,
            external_requested=0,
            submitted_at=time.time(),
        )

    def submit(self, worker: str) -> None:
        self.writers[worker].write_reward(self.reward(worker))

    def folder_id(self, path: str) -> str:
        parent = self.emu.root_id
        for name in f"{PREFIX}/{path}".split("/"):
            parent = next(
                f["id"]
                for f in self.emu.files()
                if f["name"] == name and parent in f.get("parents", []) and not f.get("trashed")
            )
        return parent

    def plant(self, path: str, data: bytes) -> None:
        """A second file of the same name, newer than the one there (Drive allows it)."""
        folder, name = path.rsplit("/", 1)
        self.emu.create_file(self.folder_id(folder), name, data)

    def forge_inline(self, worker: str) -> None:
        """A newer copy of the worker's reward whose properties carry a valid record while its content is
        garbage: a reader that trusted the properties would count a submission no download shows."""
        path = self.layout.reward_file(0, 0, worker)
        folder, name = path.rsplit("/", 1)
        genuine = encode(self.reward(worker))
        carried = drive_module.inline_properties(genuine, clear=False)
        self.emu.create_file(self.folder_id(folder), name, b"x" * len(genuine), properties=carried)

    def duplicate_round_with(self, worker: str) -> None:
        """A lagging worker made its own rewards/round_0 and wrote its reward into it."""
        rewards = self.folder_id(self.layout.rewards_dir)
        round_dir = self.emu.create_duplicate_folder(rewards, "round_0")
        stage_dir = self.emu.create_duplicate_folder(round_dir, "stage_0")
        self.emu.create_file(stage_dir, f"{worker}.json", encode(self.reward(worker)))


class Downloading:
    """A Drive backend whose listings carry no content: every file the reference reads is downloaded."""

    def __init__(self, inner: DriveStorage) -> None:
        self.inner = inner

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return [dataclasses.replace(info, inline=None) for info in self.inner.list(folder, include_hidden)]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def reference(
    emu: DriveEmulator, layout: Layout, run_id: str, registered: set[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """(live, submitted) from reading every peer and reward file afresh: live workers are the ones whose newest
    peer record is a valid worker's, alive; submissions count for names that ever registered as a worker
    (``registered`` collects them)."""
    ex = Exchange(Downloading(storage(emu)), layout, "reference", run_id)
    records = {node: seen.record for node, seen in ex.read_peers().items()}
    workers = {n for n, r in records.items() if isinstance(r, PeerRecord) and r.role == "worker"}
    registered |= workers
    live = frozenset(n for n in workers if records[n].status == "alive")  # type: ignore[union-attr]
    return live, frozenset(ex.read_rewards(0, 0, only=registered))


def coordinator_view(swarm: Swarm, now: float) -> tuple[frozenset[str], frozenset[str]]:
    c = swarm.coordinator
    live = c.observe(now, every=False)
    return live, c.submissions(swarm.state)


def decision(state: StateRecord, live: frozenset[str], submitted: frozenset[str]) -> tuple[object, ...]:
    d = decide(state, live, submitted, 1.0, 60.0, 1, now=1000.0)
    return (d.reason, None if d.state is None else (d.state.round, d.state.status, tuple(d.state.live_workers)))


ACTIONS = [
    "beat",
    "beat",
    "submit",
    "garbage_reward",
    "forged_inline",
    "garbage_peer",
    "stop",
    "stranger",
    "duplicate_round",
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_decision_from_listings_is_the_decision_from_reading_every_file(emu, tmp_path, seed):
    rng = random.Random(seed)
    swarm = Swarm(emu, tmp_path)
    for w in WORKERS:
        swarm.beat(w)
    started = time.monotonic()
    registered: set[str] = set()
    ever_submitted: frozenset[str] = frozenset()
    ever_written: set[str] = set()
    compared = 0
    for _ in range(6):
        for _ in range(rng.randint(1, 4)):
            action, worker = rng.choice(ACTIONS), rng.choice(WORKERS)
            if action == "beat":
                swarm.beat(worker)
            elif action == "submit":
                swarm.submit(worker)
                ever_written.add(worker)  # there, if only until a garbage reward lands on it in this same step
            elif action == "garbage_reward":
                swarm.plant(swarm.layout.reward_file(0, 0, worker), b'{"kind": "reward", "node_id": 7}')
            elif action == "forged_inline":
                swarm.forge_inline(worker)
            elif action == "garbage_peer":
                swarm.plant(swarm.layout.peer_file(worker), b"\xff not json")
            elif action == "stop":
                swarm.beat(worker, status="stopped")
            elif action == "stranger":
                Exchange(storage(emu), swarm.layout, "ghost", swarm.run_id).write_reward(swarm.reward("ghost"))
            else:
                swarm.duplicate_round_with(worker)
        # While listings lag, the coordinator sees an older view, never a submission that was never there.
        early_live, early_submitted = coordinator_view(swarm, time.monotonic() - started)
        # Listings catch up, and two heartbeat intervals pass with no write: a silent worker's file is read again.
        time.sleep(max(LAG_S, TTL_S) + 2 * HEARTBEAT_S + 0.1)
        live, submitted = coordinator_view(swarm, time.monotonic() - started)
        truth_live, truth_submitted = reference(emu, swarm.layout, swarm.run_id, registered)
        assert early_submitted <= ever_submitted | truth_submitted | ever_written
        ever_submitted |= truth_submitted
        assert (live, submitted) == (truth_live, truth_submitted)
        assert decision(swarm.state, live, submitted) == decision(swarm.state, truth_live, truth_submitted)
        compared += 1
    assert compared == 6


@pytest.mark.parametrize("carried", [True, False], ids=["in-listing", "downloaded"])
def test_reward_files_are_read_once_each_from_the_listing_or_downloaded_together(emu, tmp_path, carried):
    """Rewards written by this package travel in the listing: the coordinator's poll of the round is that listing
    and no download. Rewards without that copy (a writer on a mounted folder, which sets no properties) are
    downloaded, the four at once. Either way, polling again costs a listing: nothing is read twice."""
    swarm = Swarm(emu, tmp_path)
    for w in WORKERS:
        swarm.beat(w)
        if carried:
            swarm.submit(w)
        else:
            folder, name = swarm.layout.reward_file(0, 0, w).rsplit("/", 1)
            emu.create_file(swarm.folder_id(folder), name, encode(swarm.reward(w)))
    time.sleep(LAG_S + 0.05)
    c = swarm.coordinator
    assert c.observe(0.0) == frozenset(WORKERS)
    before = dict(c.exchange.stats)
    down_before = c.exchange.storage.counters["bytes_down"]
    assert c.submissions(swarm.state) == frozenset(WORKERS)
    assert c.exchange.stats["reads"] - before["reads"] == len(WORKERS)
    assert c.exchange.stats["listed_reads"] - before["listed_reads"] == (len(WORKERS) if carried else 0)
    downloaded = c.exchange.storage.counters["bytes_down"] - down_before
    read = c.exchange.stats["bytes_read"] - before["bytes_read"]
    assert read > 0 and downloaded == (0 if carried else read)
    again = c.exchange.stats["reads"]
    assert c.submissions(swarm.state) == frozenset(WORKERS)
    assert c.exchange.stats["reads"] == again, "an unchanged reward is not read again"


def test_a_state_poll_is_its_listing_and_a_reuse_grown_old_downloads(emu, tmp_path, monkeypatch):
    """The state travels in the listing of ``state/``; once STATE_REUSE_S has passed, the state is downloaded,
    not taken from a listing that may lag behind the update."""
    swarm = Swarm(emu, tmp_path)
    time.sleep(LAG_S + 0.05)
    reader = Exchange(storage(emu), swarm.layout, "w1", swarm.run_id)
    state = reader.read_state_file()
    assert state is not None and state.run_id == swarm.run_id
    assert reader.stats["listed_reads"] == 1 and reader.storage.counters["bytes_down"] == 0
    monkeypatch.setattr(exchange_module, "STATE_REUSE_S", 0.0)
    time.sleep(0.01)
    assert reader.read_state_file() == state
    assert reader.stats["listed_reads"] == 1 and reader.storage.counters["bytes_down"] > 0
