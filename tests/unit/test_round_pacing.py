"""Brisk pickup (issue #16): polls bunch around the moment the next round is expected, and back off elsewhere."""

from __future__ import annotations

import random
import threading

import pytest

from swarm_gdrive.protocol.polling import BRISK_FRACTION, MAX_BRISK_POLLS, Backoff, Pacer, RoundClock, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_round_clock_expects_the_median_round_length_after_the_last_opening():
    rounds = RoundClock(history=3)
    assert rounds.next_open() is None
    rounds.opened(0, 10.0)
    assert rounds.next_open() is None, "one opening says nothing about a round's length"
    rounds.opened(1, 14.0)
    assert rounds.next_open() == (18.0, pytest.approx(0.4)), "one length: a tenth of it either side"
    for round_, at in [(2, 17.0), (3, 21.0)]:
        rounds.opened(round_, at)
    assert rounds.length() == 4.0  # spans 4, 3, 4
    at, window = rounds.next_open()
    assert at == 25.0 and window == pytest.approx(1.0), "how much the lengths varied, at most a quarter of a round"
    irregular = RoundClock()
    for round_, at in [(0, 0.0), (1, 20.0), (2, 80.0), (3, 100.0)]:  # one round closed on a 60 s deadline
        irregular.opened(round_, at)
    assert irregular.next_open() == (120.0, pytest.approx(5.0))
    pacer = Pacer(Backoff(0.5, 10.0), brisk=0.1, clock=Clock())
    pacer.expect(*irregular.next_open())
    assert pacer.window == pytest.approx(MAX_BRISK_POLLS * 0.1), (
        "never more than MAX_BRISK_POLLS brisk delays either side"
    )
    for round_, at in [(4, 25.0), (5, 29.0), (6, 33.0)]:
        rounds.opened(round_, at)
    assert rounds.next_open() == (37.0, pytest.approx(0.2)), "steady rounds: a twentieth of a round"
    rounds.opened(6, 99.0)  # seen again: the first sighting stands
    assert rounds.next_open()[0] == 37.0
    rounds.opened(9, 50.0)  # rounds skipped: a span over several rounds is not a round's length
    assert rounds.length() == 4.0


def test_the_pacer_sleeps_to_the_window_polls_briskly_in_it_and_backs_off_after():
    clock = Clock()
    pacer = Pacer(Backoff(0.5, 10.0, rng=random.Random(0)), brisk=0.1, clock=clock)
    pacer.expect(5.0, 0.25)
    delays = []
    while clock.now < 8.0:
        delay = pacer.next()
        delays.append((clock.now, delay))
        clock.now += delay
    before = [d for t, d in delays if t < 4.75]
    inside = [d for t, d in delays if 4.75 <= t <= 5.25]
    after = [d for t, d in delays if t > 5.25]
    assert len(before) <= 5, "before the window: the backoff's few polls"
    assert any(abs(t - 4.75) < 1e-9 for t, _ in delays), "the first brisk poll lands on the window's start"
    assert inside and all(d == 0.1 for d in inside)
    assert after[0] == pytest.approx(0.1) and after[-1] > 0.5, "after the window it backs off again from brisk"


def test_without_an_expected_moment_the_pacer_is_the_backoff_started_brisk():
    """A node's first rounds, before two openings were seen: the backoff, from the brisk delay after a reset (a
    wait sees its event within about a third of the time waited), from its minimum once something is expected."""
    a = Pacer(Backoff(0.5, 10.0, rng=random.Random(1)), brisk=0.1, clock=Clock())
    b = Backoff(0.5, 10.0, rng=random.Random(1))
    assert [a.next() for _ in range(8)] == [b.next() for _ in range(8)]
    a.reset()
    b.reset(0.1)
    assert [a.next() for _ in range(8)] == [b.next() for _ in range(8)]
    a.expect(100.0, 0.2)
    a.reset()
    assert a.next() >= 0.4, "expecting a moment, the backoff starts from its minimum again"


def test_announced_openings_free_the_expected_moment_of_this_worker_s_own_pickup_delays():
    """A worker saw each round open some varying time after the coordinator opened it: the lengths between the
    announced times (the state's round_opened_at) are the true ones, and the moment is put on this worker's clock
    by the quickest pickup seen; the same sightings without the announced times expect the next round late."""
    announced = [1000.0, 1004.0, 1008.0, 1012.0]  # the coordinator's wall clock: 4 s rounds
    offset = -900.0  # this worker's monotonic clock against that wall clock
    pickups = [0.1, 0.9, 0.2, 0.9]  # how late it saw each round open
    with_times, without = RoundClock(), RoundClock()
    for round_, (a, p) in enumerate(zip(announced, pickups, strict=True)):
        with_times.opened(round_, a + offset + p, a)
        without.opened(round_, a + offset + p)
    truth = 1016.0 + offset
    at, window = with_times.next_open()
    assert at == pytest.approx(truth + 0.1) and window == pytest.approx(0.2), "the quickest pickup, steady rounds"
    late_at, _ = without.next_open()
    assert late_at - truth > 0.5, "the last pickup's delay carries over"
    garbage = RoundClock()  # a forged round_opened_at going backwards: the worker's own sightings are used
    for round_, (a, p) in enumerate(zip(reversed(announced), pickups, strict=True)):
        garbage.opened(round_, announced[round_] + offset + p, a)
    assert garbage.next_open() == without.next_open()


def test_a_worker_that_waits_for_the_next_round_picks_it_up_within_a_brisk_poll_of_the_expected_moment():
    """wait_for with a pacer: the event at the expected moment is seen within brisk + a check; the plain backoff
    from the same start, at that point past 1.6**k x 0.5 s, would see it later."""
    clock = Clock()
    opened_at = 3.0
    brisk = 0.5 * BRISK_FRACTION

    def check():
        return True if clock.now >= opened_at else None

    class Waiting(threading.Event):
        def wait(self, timeout=None):  # time passes instead of sleeping
            clock.now += timeout
            return False

    waiting = Waiting()
    pacer = Pacer(Backoff(0.5, 10.0, rng=random.Random(2)), brisk, clock)
    pacer.expect(opened_at, 0.15)
    assert wait_for(check, waiting, 60.0, pacer, clock) is True
    assert clock.now - opened_at <= brisk + 1e-9
    clock.now = 0.0
    assert wait_for(check, waiting, 60.0, Backoff(0.5, 10.0, rng=random.Random(2)), clock) is True
    assert clock.now - opened_at > brisk


def test_of_two_lengths_the_shorter_is_expected():
    """Expecting a round early costs a few brisk polls; expecting it late sleeps a backed-off delay through it."""
    rounds = RoundClock()
    for round_, at in [(0, 0.0), (1, 6.0), (2, 8.0)]:  # round 0 waited for everyone to join
        rounds.opened(round_, at)
    assert rounds.length() == 2.0 and rounds.next_open()[0] == 10.0


def test_a_round_s_folder_lookup_runs_beside_generation_and_its_first_write_waits_for_it(tmp_path):
    """prefetch_round returns at once (the lookup costs round trips on Drive, generation need not wait for it);
    the round's first write waits for it, so it uses the folders it found instead of looking them up again."""
    import threading

    from swarm_gdrive.protocol.exchange import Exchange
    from swarm_gdrive.protocol.layout import Layout
    from swarm_gdrive.protocol.records import RolloutBatch
    from swarm_gdrive.storage import LocalStorage

    release, order = threading.Event(), []

    class SlowLookup(LocalStorage):
        def prefetch_folders(self, folders):
            order.append(("prefetch", tuple(folders)))
            assert release.wait(10)
            order.append(("prefetched", None))

        def write_bytes(self, path, data):
            order.append(("write", path))
            super().write_bytes(path, data)

    layout = Layout("exp")
    exchange = Exchange(SlowLookup(tmp_path), layout, "w1", run_id="abcdef12")
    exchange.prefetch_round(3, 1)  # returns while the lookup is held
    assert not release.is_set()
    batch = RolloutBatch(node_id="w1", run_id="abcdef12", round=3, stage=0, groups=[], complete=True, created_at=1.0)
    writer = threading.Thread(target=exchange.write_rollouts, args=(batch,))
    writer.start()
    writer.join(0.3)
    assert writer.is_alive(), "the write waits for the lookup under way"
    release.set()
    writer.join(10)
    assert [kind for kind, _ in order] == ["prefetch", "prefetched", "write"]
    assert layout.rollouts_stage_dir(3, 0) in order[0][1] and layout.rewards_stage_dir(3, 0) in order[0][1]
    exchange.close()
