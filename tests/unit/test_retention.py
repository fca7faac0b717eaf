"""Retention of a worker's own rollouts (GDRIVE_IMPLEMENTATION.md §9), against a real local folder: in an
asynchronous experiment a batch a peer may still take within MAX_STALENESS_SECONDS is kept, whatever the writer's
own round; the last ROLLOUT_KEEP_LAST_N_ROUNDS rounds are kept as in sync."""

from __future__ import annotations

import time

from swarm_gdrive.protocol.exchange import Exchange, retention_seconds
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.records import RolloutBatch
from swarm_gdrive.storage import LocalStorage

RUN = "abcdef0123456789"
LAYOUT = Layout("exp")
NOW = time.time()
BOUND = retention_seconds("async", 1800.0, 90.0)


def write(exchange: Exchange, round_: int, created_at: float, stages: int = 1) -> None:
    for stage in range(stages):
        exchange.write_rollouts(
            RolloutBatch(node_id="w1", run_id=RUN, round=round_, stage=stage, groups=[], created_at=created_at)
        )


def kept(tmp_path) -> list[int]:
    return sorted(int(p.parts[-3].removeprefix("round_")) for p in (tmp_path / LAYOUT.rollouts_dir).glob("*/*/w1.json"))


def test_the_retention_bound_is_the_staleness_bound_plus_the_lag_in_async_only():
    assert retention_seconds("async", 1800.0, 90.0) == 1890.0
    assert retention_seconds("sync", 1800.0, 90.0) == 0.0  # the last N rounds, as always
    assert retention_seconds("async", 0.0, 90.0) == 0.0  # no bound in seconds: the last N rounds


def test_a_fast_writer_keeps_every_batch_a_peer_may_still_take_and_no_older_one(tmp_path):
    """A fast worker has played 6 rounds in a few seconds, after 3 rounds played over an hour ago; keep the last
    round: today's rule would delete rounds 0-4, which a slower peer may still take within MAX_STALENESS_SECONDS."""
    writer = Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN)
    for round_ in range(3):
        write(writer, round_, NOW - 4000 + round_, stages=2)
    for round_ in range(3, 9):
        write(writer, round_, NOW - 8 + round_, stages=2)
    assert writer.cleanup_rollouts(8, 1, archive=False, keep_seconds=BOUND, now=NOW) == 6  # rounds 0-2, 2 stages each
    assert kept(tmp_path) == [3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8]
    lists = writer.stats["lists"]
    assert writer.cleanup_rollouts(8, 1, archive=False, keep_seconds=BOUND, now=NOW + 1) == 0
    assert writer.stats["lists"] == lists, "nothing out of reach: not even a listing"
    # half an hour on, all but the last round have aged out of reach
    assert writer.cleanup_rollouts(8, 1, archive=False, keep_seconds=BOUND, now=NOW + 1900) == 10
    assert kept(tmp_path) == [8, 8]


def test_a_slow_writer_keeps_its_last_n_rounds_however_old(tmp_path):
    writer = Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN)
    for round_ in range(4):
        write(writer, round_, NOW - 10_000 + round_)
    assert writer.cleanup_rollouts(3, 2, archive=False, keep_seconds=BOUND, now=NOW) == 2
    assert kept(tmp_path) == [2, 3]


def test_a_restarted_writer_reads_the_age_of_its_batches_and_stops_at_the_first_young_one(tmp_path):
    write(Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN), 0, NOW - 4000)
    for round_ in range(1, 30):
        write(Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN), round_, NOW - 100 + round_)
    restarted = Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN)
    assert restarted.cleanup_rollouts(29, 1, archive=False, keep_seconds=BOUND, now=NOW) == 1
    assert kept(tmp_path) == list(range(1, 30))
    # rounds 0 and 1 read; rollouts/ and those two rounds' folders listed, not the 27 rounds after them
    assert restarted.stats["reads"] == 2 and restarted.stats["lists"] == 5
    assert restarted.cleanup_rollouts(30, 1, archive=False, keep_seconds=BOUND, now=NOW + 1) == 0
    assert restarted.stats["reads"] == 2, "the young batch's age is remembered"


def test_without_a_bound_in_seconds_the_last_n_rounds_are_kept_as_in_sync(tmp_path):
    writer = Exchange(LocalStorage(tmp_path), LAYOUT, "w1", RUN)
    for round_ in range(5):
        write(writer, round_, NOW)
    assert writer.cleanup_rollouts(4, 2, archive=False, keep_seconds=retention_seconds("async", 0.0, 0.0)) == 3
    assert kept(tmp_path) == [3, 4]
