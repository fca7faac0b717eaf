"""The asynchronous pickup (ROUND_MODE=async) on batches written by hand into a local folder: the staleness bounds
in seconds and in the receiver's rounds, the recorded age and staleness, no group taken twice, each peer's freshest
complete batch, registered live workers only, and the pure end rule of the asynchronous coordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_gdrive.protocol.coordinator import decide_async
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.pickup import Pickup
from swarm_gdrive.protocol.records import PeerRecord, Provenance, RolloutBatch, RolloutGroup, StateRecord
from swarm_gdrive.protocol.workload import SYNTHETIC_DATASET, StageContext, SyntheticWorkload
from swarm_gdrive.storage import LocalStorage

RUN = "abcdef0123456789"
SEED = 7
NOW = 1_800_000_000.0  # the receiver's wall clock in these tests


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def group(index: int, useful: bool = True) -> RolloutGroup:
    """A synthetic group that re-scores as written: answers right and wrong (reward variance), or all right."""
    text, answer = SyntheticWorkload.question(SEED, index)
    completions = [str(answer), str(answer + 1)] * 2 if useful else [str(answer)] * 4
    return RolloutGroup(
        group_id=f"g{index}",
        task=SYNTHETIC_DATASET,
        question=text,
        provenance=Provenance(dataset=SYNTHETIC_DATASET, seed=SEED, index=index),
        completions=completions,
        rewards=[SyntheticWorkload.score(c, answer) for c in completions],
    )


class Folder:
    """An experiment folder where the test writes peers' files as they would."""

    def __init__(self, root: Path) -> None:
        self.storage = LocalStorage(str(root))
        self.layout = Layout("pick")
        self.writers: dict[str, Exchange] = {}

    def exchange(self, node: str) -> Exchange:
        return Exchange(self.storage, self.layout, node, run_id=RUN)

    def peer(self, node: str, round_: int | None, status: str = "alive", beat: int = 1) -> None:
        self.exchange(node).write_peer(
            PeerRecord(
                node_id=node,
                role="worker",
                run_id=RUN,
                registered_at=NOW - 100,
                heartbeat=beat,
                heartbeat_at=NOW,
                status=status,
                round=round_,
            )
        )

    def batch(
        self, node: str, round_: int, groups: list[RolloutGroup], created_at: float, complete: bool = True
    ) -> None:
        self.exchange(node).write_rollouts(
            RolloutBatch(
                node_id=node,
                run_id=RUN,
                round=round_,
                stage=0,
                groups=groups,
                complete=complete,
                created_at=created_at,
            )
        )


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    return Folder(tmp_path)


def pickup_for(folder: Folder, clock: Clock, wanted: int = 2, **kwargs) -> tuple[Pickup, list[tuple]]:
    """Worker ``me``'s pickup; the events it records."""
    events: list[tuple] = []
    workload = SyntheticWorkload(1, 4, 0.0)
    settings = {"max_peers": 0, "max_age_s": 1800.0, "max_stale_rounds": 0, "listing_reuse_s": 0.0, **kwargs}
    pickup = Pickup(
        folder.exchange("me"),
        settings["max_peers"],
        wanted,
        workload.rescore,
        lambda event, message="", level="info", **data: events.append((event, message, data)),
        settings["max_age_s"],
        settings["max_stale_rounds"],
        liveness_timeout=60.0,
        peers_reuse_s=0.0,
        clock=clock,
        **{k: v for k, v in settings.items() if k not in ("max_peers", "max_age_s", "max_stale_rounds")},
    )
    return pickup, events


def ctx(round_: int) -> StageContext:
    return StageContext("me", round_, 0, SEED)


def test_a_batch_older_than_max_staleness_seconds_is_not_taken_and_the_age_is_recorded(folder):
    clock = Clock()
    folder.peer("old", 4)
    folder.batch("old", 4, [group(1), group(2)], created_at=NOW - 1801)
    folder.peer("young", 9)
    folder.batch("young", 9, [group(3), group(4)], created_at=NOW - 12.5)
    pickup, _ = pickup_for(folder, clock, wanted=4)
    pickup.round_started(NOW - 20)

    picked = pickup.run(ctx(0))

    assert picked.stale_skipped == 1
    assert sorted((t.source, t.source_round, t.group_id) for t in picked.taken) == [
        ("young", 9, "g3"),
        ("young", 9, "g4"),
    ]
    assert {t.age_s for t in picked.taken} == {12.5}
    assert {t.staleness_rounds for t in picked.taken} == {0}  # created during this worker's current round
    assert picked.selection.shortfall == 2
    metrics = picked.metrics()
    assert metrics["swarm/external_age_s_mean"] == metrics["swarm/external_age_s_max"] == 12.5
    assert metrics["swarm/external_staleness_rounds_max"] == 0
    assert metrics["swarm/external_stale_skipped"] == 1


def test_max_staleness_seconds_0_is_no_bound_and_a_clock_ahead_gives_age_0(folder):
    clock = Clock()
    folder.peer("old", 0)
    folder.batch("old", 0, [group(1)], created_at=NOW - 10**6)
    folder.peer("ahead", 0)
    folder.batch("ahead", 0, [group(2)], created_at=NOW + 30)  # the writer's clock runs 30 s ahead of this one
    pickup, _ = pickup_for(folder, clock, max_age_s=0.0)

    picked = pickup.run(ctx(0))

    assert {t.source: t.age_s for t in picked.taken} == {"old": 10**6, "ahead": 0.0}


def test_staleness_in_the_receivers_rounds_counts_its_round_starts_since_the_batch_and_bounds_what_it_takes(folder):
    clock = Clock()
    folder.peer("slow", 0)
    folder.batch("slow", 0, [group(1), group(2)], created_at=NOW - 50)
    pickup, _ = pickup_for(folder, clock, max_stale_rounds=2)
    for started in (NOW - 60, NOW - 40, NOW - 30):  # one round start before the batch, two after it
        pickup.round_started(started)

    picked = pickup.run(ctx(2))
    assert [t.staleness_rounds for t in picked.taken] == [2, 2]

    folder.batch("slow", 0, [group(3), group(4)], created_at=NOW - 50)  # the same age, groups not taken yet
    pickup.round_started(NOW - 1)  # a third round start since the batch: beyond MAX_STALENESS_ROUNDS=2
    picked = pickup.run(ctx(3))
    assert picked.taken == [] and picked.stale_skipped == 1
    assert "swarm/external_staleness_rounds_mean" not in picked.metrics()  # no external taken: no age metrics


def test_a_group_is_never_taken_twice(folder):
    clock = Clock()
    folder.peer("peer", 5)
    folder.batch("peer", 5, [group(i) for i in range(5)], created_at=NOW - 1)
    pickup, _ = pickup_for(folder, clock, wanted=2)

    taken = []
    for round_ in range(4):
        pickup.round_started(NOW)
        taken += [(t.source, t.source_round, t.stage, t.group_id) for t in pickup.run(ctx(round_)).taken]

    assert len(taken) == 5 == len(set(taken))  # 2 + 2 + 1, then nothing left to take
    assert {g for *_, g in taken} == {f"g{i}" for i in range(5)}


def test_the_freshest_complete_batch_first_then_older_ones_with_groups_left(folder):
    clock = Clock()
    folder.peer("peer", 3)  # its record says round 3, whose batch is still being written
    folder.batch("peer", 2, [group(1)], created_at=NOW - 5)
    folder.batch("peer", 3, [group(2)], created_at=NOW - 1, complete=False)
    folder.batch("peer", 1, [group(3)], created_at=NOW - 9)
    pickup, _ = pickup_for(folder, clock, wanted=1)

    assert [(t.source_round, t.group_id) for t in pickup.run(ctx(0)).taken] == [(2, "g1")]

    folder.batch("peer", 3, [group(2)], created_at=NOW - 1)  # now complete
    assert [(t.source_round, t.group_id) for t in pickup.run(ctx(1)).taken] == [(3, "g2")]
    # Rounds 2 and 3 taken: the newest batch with something left is round 1's, then nothing is left.
    assert [(t.source_round, t.group_id) for t in pickup.run(ctx(2)).taken] == [(1, "g3")]
    assert pickup.run(ctx(3)).taken == []


def test_only_live_registered_workers_are_read_and_at_most_sapo_max_peers(folder):
    clock = Clock()
    for node in ("a", "b", "c"):
        folder.peer(node, 0)
        folder.batch(node, 0, [group(ord(node))], created_at=NOW - 1)
    folder.peer("gone", 0, status="stopped")
    folder.batch("gone", 0, [group(10)], created_at=NOW - 1)
    folder.batch("stranger", 0, [group(11)], created_at=NOW - 1)  # no peer file: never registered
    folder.peer("me", 0)
    folder.batch("me", 0, [group(12)], created_at=NOW - 1)

    everyone, _ = pickup_for(folder, clock, wanted=8)
    assert {t.source for t in everyone.run(ctx(0)).taken} == {"a", "b", "c"}

    capped, _ = pickup_for(folder, clock, wanted=8, max_peers=2)
    picked = capped.run(ctx(0))
    assert len(picked.gathered.batches) == 2 and len(picked.taken) == 2


def test_reading_stops_once_j_useful_groups_are_in_hand(folder):
    clock = Clock()
    for node, index in (("a", 1), ("b", 2), ("c", 3)):
        folder.peer(node, 0)
        folder.batch(node, 0, [group(index)], created_at=NOW - 1)
    pickup, _ = pickup_for(folder, clock, wanted=2)

    picked = pickup.run(ctx(0))

    assert len(picked.taken) == 2 and len(picked.gathered.batches) == 2  # the third peer drawn is not read


def test_groups_failing_their_provenance_are_rejected_and_logged_and_no_zero_variance_group_is_chosen(folder):
    clock = Clock()
    forged = group(3).model_copy(update={"question": "What is 1 + 1?"})  # fails its provenance check
    folder.peer("a", 0)
    folder.batch("a", 0, [group(1, useful=False), forged, group(2)], created_at=NOW - 1)
    pickup, events = pickup_for(folder, clock, wanted=3)

    picked = pickup.run(ctx(0))

    assert [t.group_id for t in picked.taken] == ["g2"]
    assert picked.gathered.dropped == 1
    assert [e[2]["group_id"] for e in events if e[0] == "group_rejected"] == ["g3"]
    assert (picked.selection.offered, picked.selection.zero_variance_dropped) == (2, 1)


def test_the_taken_groups_event_data_lists_each_group(folder):
    clock = Clock()
    folder.peer("a", 2)
    folder.batch("a", 2, [group(1)], created_at=NOW - 3.25)
    pickup, _ = pickup_for(folder, clock, wanted=1)
    pickup.round_started(NOW - 10)

    data = pickup.run(ctx(0)).event_data()

    assert data == {
        "sources": ["a"],
        "source_rounds": [2],
        "stages": [0],
        "group_ids": ["g1"],
        "age_s": [3.25],
        "staleness_rounds": [0],
    }


def state(status: str = "running", live: tuple[str, ...] = ()) -> StateRecord:
    return StateRecord(
        experiment="pick",
        run_id=RUN,
        round=0,
        status=status,
        seq=3,
        max_rounds=5,
        num_stages=1,
        round_opened_at=NOW,
        round_deadline=NOW + 60,
        live_workers=list(live),
        coordinator_id="coord",
        updated_at=NOW,
        mode="async",
    )


def test_decide_async_opens_at_min_workers_and_never_advances_a_round():
    live = frozenset({"w1", "w2"})
    opened = decide_async(state("waiting"), live, live, frozenset(), 60.0, 2, NOW).state
    assert (opened.status, opened.round, opened.mode, opened.live_workers) == ("running", 0, "async", ["w1", "w2"])
    assert decide_async(state("waiting"), frozenset({"w1"}), live, frozenset(), 60.0, 2, NOW).state is None
    assert decide_async(state(live=("w1", "w2")), live, live, frozenset({"w1"}), 60.0, 1, NOW).state is None
    changed = decide_async(state(live=("w1",)), live, live, frozenset(), 60.0, 1, NOW).state
    assert (changed.round, changed.status, changed.live_workers, changed.seq) == (0, "running", ["w1", "w2"], 4)


def test_decide_async_finishes_once_no_live_worker_that_joined_is_still_playing_and_one_is_done():
    joined = frozenset({"w1", "w2", "w3"})
    # w3 is live and playing: the end waits for it
    playing = state(live=("w3",))
    assert decide_async(playing, frozenset({"w3"}), joined, frozenset({"w1", "w2"}), 60.0, 2, NOW).state is None
    # w3 stopped (or fell silent): it does not hold the end
    finished = decide_async(state(), frozenset(), joined, frozenset({"w1", "w2"}), 60.0, 2, NOW).state
    assert (finished.status, finished.round, finished.advance_reason, finished.mode) == (
        "finished",
        5,
        "finished",
        "async",
    )
    # fewer than MIN_WORKERS done, the others gone for good: they do not keep the experiment open
    assert decide_async(state(), frozenset(), joined, frozenset({"w1"}), 60.0, 2, NOW).state.status == "finished"
    # none done yet and nobody live: no end (the workers may be starting again)
    assert decide_async(state(), frozenset(), joined, frozenset(), 60.0, 1, NOW).state is None
    assert decide_async(state("finished"), frozenset(), joined, joined, 60.0, 1, NOW).state is None
    # w3 stopped less than SYNC_LAG ago (settling): its last reward may still be on its way, so it holds the end
    done = frozenset({"w1", "w2"})
    assert decide_async(state(), frozenset(), joined, done, 60.0, 2, NOW, settling=frozenset({"w3"})).state is None


def test_a_batch_kept_from_an_earlier_pickup_is_let_go_once_its_peer_has_moved_on(folder):
    clock = Clock()
    folder.peer("peer", 1)
    folder.batch("peer", 1, [group(1), group(2)], created_at=NOW - 2)
    pickup, _ = pickup_for(folder, clock, wanted=1)
    kept = folder.layout.rollout_file(1, 0, "peer")
    assert len(pickup.run(ctx(0)).taken) == 1
    assert kept in pickup.exchange._cache  # read again at the next pickup only if it changed

    folder.peer("peer", 5, beat=2)
    folder.batch("peer", 5, [group(3)], created_at=NOW - 1)
    assert [(t.source_round, t.group_id) for t in pickup.run(ctx(1)).taken] == [(5, "g3")]
    assert kept not in pickup.exchange._cache  # round 1 is before the peer's round - 1: nobody reads it again


def test_a_store_outage_during_the_pickup_is_a_shortfall_not_a_crash(folder, monkeypatch):
    """The store goes away in the middle of a pickup (the second peer's read): the worker trains on the groups in
    hand; with the peers' listing down too, on the peers last seen (review of issue #28: it crashed the worker)."""
    from swarm_gdrive.storage.base import StorageUnavailableError

    clock = Clock()
    for name, index in (("p1", 1), ("p2", 3)):
        folder.peer(name, 2)
        folder.batch(name, 2, [group(index), group(index + 1)], created_at=NOW - 5)
    pickup, _ = pickup_for(folder, clock, wanted=4)
    exchange = pickup.exchange
    real = exchange.read_rollouts
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) > 1:
            raise StorageUnavailableError("drive is down")
        return real(*args, **kwargs)

    monkeypatch.setattr(exchange, "read_rollouts", failing)
    picked = pickup.run(ctx(0))
    assert len(picked.taken) == 2 and picked.selection.shortfall == 2  # the first peer's groups, then it stopped
    monkeypatch.setattr(exchange, "read_peers", lambda: (_ for _ in ()).throw(StorageUnavailableError("down")))
    monkeypatch.setattr(exchange, "read_rollouts", real)
    again = pickup.run(ctx(1))  # the peers last seen are read: the other peer's groups
    assert {t.source for t in again.taken} == {"p1", "p2"} - {t.source for t in picked.taken}


# -- the fallback to older batches (the lagged replicas: the batches of the record's round arrive late) ----------


def test_a_peer_whose_recorded_rounds_are_not_visible_yet_is_read_at_its_newest_older_batch_within_the_bound(folder):
    clock = Clock()
    folder.peer("lagged", 10)  # its record says round 10: rounds 8 to 10 have not reached this view yet
    folder.batch("lagged", 7, [group(1), group(2)], created_at=NOW - 30)
    folder.batch("lagged", 6, [group(3), group(4)], created_at=NOW - 31)
    folder.batch("lagged", 2, [group(5), group(6)], created_at=NOW - 100)  # beyond MAX_STALENESS_SECONDS=60
    pickup, _ = pickup_for(folder, clock, wanted=2, max_age_s=60.0)

    picked = pickup.run(ctx(0))
    assert sorted((t.source_round, t.group_id, t.age_s) for t in picked.taken) == [(7, "g1", 30.0), (7, "g2", 30.0)]

    picked = pickup.run(ctx(1))  # round 7 has nothing left: the next older one
    assert sorted((t.source_round, t.group_id) for t in picked.taken) == [(6, "g3"), (6, "g4")]

    picked = pickup.run(ctx(2))  # round 2's batch is beyond the bound: passed over, and so is all older
    assert picked.taken == [] and picked.stale_skipped == 1
    reads = pickup.exchange.stats["reads"]
    folder.batch("lagged", 1, [group(7)], created_at=NOW - 101)
    assert pickup.run(ctx(3)).taken == [] and pickup.exchange.stats["reads"] == reads  # not even read


def test_the_fallback_never_takes_a_group_twice_as_batches_arrive_out_of_order(folder):
    clock = Clock()
    folder.peer("a", 20)
    folder.peer("b", 20)
    pickup, _ = pickup_for(folder, clock, wanted=3)
    arrivals = [("a", 12), ("b", 15), ("a", 18), ("b", 9), ("a", 5), ("b", 19)]  # late and in any order
    taken = []
    for index, (node, round_) in enumerate(arrivals):
        folder.batch(node, round_, [group(10 * index + i) for i in range(4)], created_at=NOW - 40 + round_)
        pickup.round_started(NOW)
        taken += [(t.source, t.source_round, t.group_id) for t in pickup.run(ctx(index)).taken]
    for extra in range(len(arrivals), len(arrivals) + 6):  # then whatever is left
        taken += [(t.source, t.source_round, t.group_id) for t in pickup.run(ctx(extra)).taken]

    assert len(taken) == len(set(taken)) == 4 * len(arrivals)  # every group once, none twice


def test_one_listing_of_a_stage_folder_serves_every_peer_and_a_pickup_lists_at_most_its_cap(folder):
    clock = Clock()
    peers = [f"p{i}" for i in range(6)]
    for index, node in enumerate(peers):
        folder.peer(node, 5)  # each record says round 5; every batch of round 4 is visible
        folder.batch(node, 4, [group(index)], created_at=NOW - 2)
    pickup, _ = pickup_for(folder, clock, wanted=6, listing_reuse_s=60.0)

    lists = pickup.exchange.stats["lists"]
    picked = pickup.run(ctx(0))
    assert len(picked.taken) == 6
    listed = pickup.exchange.stats["lists"] - lists
    assert listed <= 3 + 1  # rounds 6, 5 and 4 once each (and the peers' folder), not a listing per peer

    # Lagged far behind: the newest batch visible is 30 rounds below the records' round. At most 4 folders a
    # pickup (max_listings): the next pickups go on deeper from where the last one stopped and find it.
    for node in peers:
        folder.peer(node, 40, beat=2)
    folder.batch("p0", 10, [group(50), group(51)], created_at=NOW - 30)
    capped, _ = pickup_for(folder, clock, wanted=1, max_listings=4, listing_reuse_s=60.0)
    found_at = None
    for attempt in range(12):
        before = capped.exchange.stats["lists"]
        picked = capped.run(ctx(attempt))
        assert capped.exchange.stats["lists"] - before <= 4 + 1  # the cap, plus the peers' folder
        if picked.taken:
            found_at = attempt
            break
    assert found_at == 7  # rounds 41 down to 10 listed 4 a pickup, newest first
    assert [(t.source, t.source_round) for t in picked.taken] == [("p0", 10)]


def test_a_peer_whose_record_says_no_round_yet_is_read_from_the_rounds_being_played(folder):
    clock = Clock()
    folder.peer("starting", None)  # registered, its first heartbeat with a round not written yet
    folder.batch("starting", 0, [group(1)], created_at=NOW - 1)
    pickup, _ = pickup_for(folder, clock, wanted=1)

    assert [(t.source, t.source_round) for t in pickup.run(ctx(0)).taken] == [("starting", 0)]


def test_what_is_known_of_a_peer_stays_within_its_window(folder):
    clock = Clock()
    folder.peer("peer", 3)
    for round_ in range(4):
        folder.batch("peer", round_, [group(round_)], created_at=NOW - 10 + round_)
    pickup, _ = pickup_for(folder, clock, wanted=1, scan_rounds=4)
    for index in range(4):
        pickup.run(ctx(index))
    assert {k[1] for k in pickup.taken} == {0, 1, 2, 3}

    folder.peer("peer", 30, beat=2)  # moved on: rounds below 31 - 4 are out of its window
    folder.batch("peer", 29, [group(29)], created_at=NOW - 1)
    assert [t.source_round for t in pickup.run(ctx(5)).taken] == [29]
    assert {k[1] for k in pickup.taken} == {29}
    assert all(r >= 27 for r, _ in pickup._listings) and all(k[1] >= 27 for k in pickup._judged)
    assert pickup._kept == {("peer", 0): 29}


def test_a_short_pickup_lists_a_round_that_stays_empty_ever_more_rarely(folder):
    """Retention left a peer's last 3 rounds (60-62) of a 64-round window, with nothing to take: a worker short of
    groups at every pickup (one a second) lists the emptied rounds ever more rarely, not 8 folders a pickup."""
    clock, ticks = Clock(), Clock(0.0)
    folder.peer("peer", 62)
    for round_ in (60, 61, 62):
        folder.batch("peer", round_, [group(round_, useful=False)], created_at=NOW - 63 + round_)
    pickup, _ = pickup_for(folder, clock, wanted=1, max_listings=8, listing_reuse_s=1.0, monotonic=ticks)

    counts = []
    for index in range(300):
        ticks.now += 1.0
        folder.peer("peer", 62, beat=index + 2)  # it beats on
        before = pickup.exchange.stats["lists"]
        assert pickup.run(ctx(index)).taken == []
        counts.append(pickup.exchange.stats["lists"] - before - 1)  # less the peers' folder
    assert counts[0] == 8  # the window's newest 8 rounds at first
    assert sum(counts[:60]) > 4 * 60  # the whole window listed again and again while it may still fill
    assert sum(counts[-100:]) <= 2 * 100  # then about the top round a pickup (where its next batch will be)


def test_a_round_listed_empty_many_times_is_still_listed_promptly_above_the_peers_oldest_batch(folder):
    """On a late mount a round stays empty in this view for up to a minute, then its batch arrives: above the
    peer's oldest batch known, the search keeps listing it at the reuse interval (no backoff), so it is found."""
    clock, ticks = Clock(), Clock(0.0)
    folder.peer("peer", 20)
    folder.batch("peer", 5, [group(5, useful=False)], created_at=NOW - 30)  # the oldest known: nothing to take
    pickup, _ = pickup_for(folder, clock, wanted=1, max_listings=8, listing_reuse_s=1.0, monotonic=ticks)
    for index in range(40):  # 40 s of empty listings of rounds 6-21
        ticks.now += 1.0
        folder.peer("peer", 20, beat=index + 2)
        assert pickup.run(ctx(index)).taken == []

    folder.batch("peer", 15, [group(15)], created_at=NOW - 20)  # arrives at last
    found = []
    for index in range(40, 43):
        ticks.now += 1.0
        folder.peer("peer", 20, beat=index + 2)
        found += [(t.source_round, t.group_id) for t in pickup.run(ctx(index)).taken]
    assert found == [(15, "g15")]
