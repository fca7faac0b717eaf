"""The asynchronous worker's SAPO pickup (ROUND_MODE=async): J external groups from what it can already see.

A worker that plays its own rounds back to back never waits for a peer. At each stage a :class:`Pickup` looks at
the live workers other than itself (their peer files, listed at most every :data:`PEERS_REUSE_S` seconds), in an
order drawn by ``rng_for(SEED, node, round, stage, purpose="pickup")``, at most SAPO_MAX_PEERS of them (0: all).
For each it takes the newest complete batch of the stage it can see that still holds a group with reward variance
it has not taken, within the staleness bounds: a batch older than MAX_STALENESS_SECONDS, or created before more
than MAX_STALENESS_ROUNDS of this worker's own rounds started, is passed over, and so is every older batch of that
peer. Every group is re-scored from its provenance (:func:`~swarm_gdrive.protocol.gather.score_batch`); a group
already trained on, identified by (source, source round, stage, group id), is never taken again. Reading stops
once J useful groups are in hand, and J are sampled uniformly from the useful ones read
(:func:`~swarm_gdrive.protocol.sapo.select_external`).

Where the batches are is learnt from listings of ``rollouts/round_R/stage_S`` folders, one listing serving every
peer whose file it shows, kept as the pickup's index of the batches present. A peer's rounds are looked at from
its *top* (the round after the one its peer record says, or after the newest of its batches seen, whichever is
later: on a lagging mount the record and the batches arrive independently) down at most :data:`SCAN_ROUNDS`.
Per peer, the top :data:`TOP_LISTINGS` rounds above its newest batch known are listed first (again once their
listing is older than :data:`LISTING_REUSE_S`), then its known batches are read newest first; when J are not in
hand, the rounds of the windows where no batch of the peer is known yet are listed (never listed first, newest
first, then the least recently listed; below the peer's oldest batch known, a folder whose listings keep showing
nothing new ever more rarely), so a batch that reached this node's view a minute late is still found.
A pickup lists at most :data:`MAX_PICKUP_LISTINGS` folders and reads within the synchronous gather's caps
(:data:`MAX_GATHER_FILES`, :data:`MAX_GATHER_BYTES`); a batch judged once (too stale, incomplete, or with nothing
left to take) is not read again while its listing entry is unchanged. Memory: the listings and judgements of the
rounds within each live peer's window, and the bytes of at most one batch per peer and stage (the one last taken
from).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarm_gdrive.protocol.coordinator import Liveness
from swarm_gdrive.protocol.exchange import OVER_BUDGET, Exchange, ReadBudget, listing_key
from swarm_gdrive.protocol.gather import (
    MAX_GATHER_BYTES,
    MAX_GATHER_FILES,
    EventSink,
    Gathered,
    Rescore,
    Verdicts,
    say_budget_spent,
    score_batch,
)
from swarm_gdrive.protocol.records import PeerRecord, RolloutBatch
from swarm_gdrive.protocol.sapo import Selection, rng_for, select_external
from swarm_gdrive.protocol.workload import StageContext
from swarm_gdrive.storage import FileInfo
from swarm_gdrive.storage.base import StorageUnavailableError

logger = logging.getLogger(__name__)

#: Longest the list of live peers and their rounds is reused: a fast worker plays many rounds a second, and a
#: listing of ``peers/`` per round (a request on Drive, N downloads of changed files) would cost more than its
#: rounds. A peer's record says its round only at each of its heartbeats anyway.
PEERS_REUSE_S = 5.0
#: Longest the listing of one rollouts stage folder is reused before it is listed again when a batch is looked
#: for there: it serves every peer whose batch it shows, and a fast worker picks up once a second or more.
LISTING_REUSE_S = 2.0
#: Most stage folders one pickup lists (the listings kept cost nothing): a pickup's Drive requests stay bounded
#: however late the batches arrive; the rounds left unlisted are listed by the next pickups.
MAX_PICKUP_LISTINGS = 8
#: Rounds at the top of a peer's window listed before its batches known are read (its record's round and the one
#: after: where its newest batch is when the view is not late); deeper rounds are listed only when J are not in hand.
TOP_LISTINGS = 2
#: Most doublings of a deeper round's listing reuse when its listings show nothing new (2 s x 2**7: about 4 min).
MAX_BACKOFF_DOUBLINGS = 7
#: Deepest a pickup looks below a peer's top round (see the module's docstring): past it no batch is looked for and
#: what is known of it is forgotten, whatever MAX_STALENESS_SECONDS and MAX_STALENESS_ROUNDS allow.
SCAN_ROUNDS = 64
#: How long an empty list of live peers is reused (the run's start: the peers register one by one).
EMPTY_PEERS_REUSE_S = 1.0
#: This worker's round starts remembered for the staleness in rounds: a batch older than that many of its rounds
#: is counted that stale (MAX_STALENESS_ROUNDS is capped accordingly in effect).
ROUND_STARTS_KEPT = 10_000

#: (source node, source round, stage, group id): a group trained on once, never taken again.
GroupKey = tuple[str, int, int, str]
#: (source node, source round, stage): one peer's batch of a stage.
BatchKey = tuple[str, int, int]

#: Verdicts on a batch read, kept while its listing entry is unchanged: no later pickup reads it again.
STALE, INCOMPLETE, SPENT = "stale", "incomplete", "spent"


@dataclass(frozen=True)
class Taken:
    """One external group trained on, with how stale it was when it was taken."""

    source: str
    source_round: int
    stage: int
    group_id: str
    age_s: float
    staleness_rounds: int


@dataclass
class PickedUp:
    """What one stage's pickup read and chose."""

    gathered: Gathered
    selection: Selection
    taken: list[Taken] = field(default_factory=list)
    stale_skipped: int = 0  # batches passed over for their age (seconds or rounds)

    def metrics(self) -> dict[str, float | int | None]:
        """The stage metrics of the asynchronous mode (the age and staleness keys only when a group was taken)."""
        values: dict[str, float | int | None] = {"swarm/external_stale_skipped": self.stale_skipped}
        if self.taken:
            ages = [t.age_s for t in self.taken]
            rounds = [t.staleness_rounds for t in self.taken]
            values["swarm/external_age_s_mean"] = sum(ages) / len(ages)
            values["swarm/external_age_s_max"] = max(ages)
            values["swarm/external_staleness_rounds_mean"] = sum(rounds) / len(rounds)
            values["swarm/external_staleness_rounds_max"] = max(rounds)
        return values

    def event_data(self) -> dict[str, list[str | int | float]]:
        """The ``externals_taken`` event's data, one list per field (an event's data holds lists of scalars), the
        i-th entry of each list describing the i-th group taken."""
        return {
            "sources": [t.source for t in self.taken],
            "source_rounds": [t.source_round for t in self.taken],
            "stages": [t.stage for t in self.taken],
            "group_ids": [t.group_id for t in self.taken],
            "age_s": [round(t.age_s, 3) for t in self.taken],
            "staleness_rounds": [t.staleness_rounds for t in self.taken],
        }


@dataclass
class _Listing:
    """One rollouts stage folder as listed: when (monotonic), and its batch files by node id."""

    at: float
    files: dict[str, FileInfo]
    unchanged: int = 0  # listings in a row that showed no new batch: the next one waits that much longer


@dataclass
class _Reading:
    """One pickup under way: its caps, what it has read and what it holds."""

    ctx: StageContext
    now: float
    budget: ReadBudget
    listings_left: int
    gathered: Gathered = field(default_factory=Gathered)
    seen: dict[str, tuple[int, float, int]] = field(default_factory=dict)  # source -> (round, age, staleness)
    done: set[str] = field(default_factory=set)  # peers taken from, or passed over for good this pickup
    listed: set[int] = field(default_factory=set)  # rounds whose stage folder this pickup listed
    useful: int = 0
    stale: int = 0
    spent: bool = False  # the read budget is spent: nothing more is read


#: What considering one batch came to.
TAKEN, STOP, NEXT = "taken", "stop", "next"


class Pickup:
    """One asynchronous worker's pickups, stage after stage: it remembers the groups taken, its own round starts,
    the live peers and the listings of the rollouts folders looked at."""

    def __init__(
        self,
        exchange: Exchange,
        max_peers: int,
        wanted: int,
        rescore: Rescore,
        event: EventSink,
        max_age_s: float,
        max_stale_rounds: int,
        liveness_timeout: float,
        peers_reuse_s: float = PEERS_REUSE_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        listing_reuse_s: float = LISTING_REUSE_S,
        max_listings: int = MAX_PICKUP_LISTINGS,
        scan_rounds: int = SCAN_ROUNDS,
    ) -> None:
        """``max_age_s``, ``max_stale_rounds``: MAX_STALENESS_SECONDS and MAX_STALENESS_ROUNDS (0: no bound)."""
        self.exchange, self.max_peers, self.wanted, self.rescore, self.event = (
            exchange,
            max_peers,
            wanted,
            rescore,
            event,
        )
        self.max_age_s, self.max_stale_rounds = max_age_s, max_stale_rounds
        self.peers_reuse_s, self.listing_reuse_s = peers_reuse_s, listing_reuse_s
        self.max_listings, self.scan_rounds = max_listings, scan_rounds
        self.clock, self.monotonic = clock, monotonic
        self.liveness = Liveness(liveness_timeout)
        self.taken: set[GroupKey] = set()
        self._starts: list[float] = []  # this worker's round starts, wall clock, oldest first
        self._peers: dict[str, int | None] = {}  # live peer -> the round its record says it plays (None: not yet)
        self._peers_read_at: float | None = None
        self._listings: dict[tuple[int, int], _Listing] = {}  # (round, stage) -> its rollouts folder as listed
        self._newest: dict[tuple[str, int], int] = {}  # (peer, stage) -> the newest round of its batch listed
        self._floors: dict[tuple[str, int], int] = {}  # (peer, stage) -> its rounds up to this one are too stale
        self._judged: dict[BatchKey, tuple[tuple[int, float, str | None], str]] = {}  # -> (listing key, verdict)
        self._kept: dict[tuple[str, int], int] = {}  # (peer, stage) -> the round of the batch whose bytes are kept
        self._verdicts: dict[BatchKey, Verdicts] = {}  # the kept batches' groups' re-scores

    # -- this worker's rounds ----------------------------------------------------------------

    def round_started(self, at: float | None = None) -> None:
        """This worker starts one of its rounds (``at``: wall time, now by default)."""
        self._starts.append(self.clock() if at is None else at)
        if len(self._starts) > ROUND_STARTS_KEPT:
            del self._starts[: len(self._starts) - ROUND_STARTS_KEPT]

    def staleness_rounds(self, created_at: float) -> int:
        """How many of this worker's rounds have started since ``created_at`` (the writer's clock, so as exact as
        the two machines' clocks agree): 0 for a batch created during this worker's current round."""
        return len(self._starts) - bisect.bisect_right(self._starts, created_at)

    def age_s(self, created_at: float, now: float) -> float:
        """Seconds since ``created_at``, by this node's clock against the writer's, at least 0: the clocks of two
        machines may disagree by seconds (or more, unsynchronised), so a batch can look younger or older than it is,
        and one from a clock ahead of this one would look as if created in the future."""
        return max(0.0, now - created_at)

    def too_stale(self, age_s: float, staleness_rounds: int) -> bool:
        """Whether a batch of that age is beyond MAX_STALENESS_SECONDS or MAX_STALENESS_ROUNDS (0: no bound)."""
        if self.max_age_s and age_s > self.max_age_s:
            return True
        return bool(self.max_stale_rounds) and staleness_rounds > self.max_stale_rounds

    # -- the pickup --------------------------------------------------------------------------

    def run(self, ctx: StageContext) -> PickedUp:
        """This stage's external groups: at most J, never waiting; nothing read twice in one call."""
        rng = rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage, purpose="pickup")
        try:
            peers = self.live_peers()
        except StorageUnavailableError as exc:  # the store is down for now: the peers last seen, or none
            logger.warning("storage unavailable while listing peers (%s); the pickup goes on without", exc)
            peers = self._peers
        order = sorted(peers)
        rng.shuffle(order)
        if self.max_peers:
            order = order[: self.max_peers]
        windows = self._windows(peers, ctx)
        reading = _Reading(ctx, self.clock(), ReadBudget(MAX_GATHER_FILES, MAX_GATHER_BYTES), self.max_listings)
        try:
            for peer in order:
                if reading.useful >= self.wanted or reading.spent:
                    break
                self._newest_first(peer, windows[peer], reading)
            if reading.useful < self.wanted and not reading.spent:
                self._search([p for p in order if p not in reading.done], windows, reading)
        except StorageUnavailableError as exc:  # never a crash mid-round: train on what is in hand
            logger.warning("storage unavailable while reading the peers' rollouts (%s); the pickup stops here", exc)
        if reading.spent:
            say_budget_spent(self.event, reading.budget, [p for p in order if p not in reading.done], "a pickup")
        selection = select_external(reading.gathered.pool(), self.wanted, rng)
        taken = []
        for group in selection.chosen:
            source_round, age, rounds = reading.seen[group.source]
            self.taken.add((group.source, source_round, ctx.stage, group.group.group_id))
            taken.append(Taken(group.source, source_round, ctx.stage, group.group.group_id, age, rounds))
        self._forget_old(windows, ctx.stage)
        return PickedUp(reading.gathered, selection, taken, reading.stale)

    def live_peers(self) -> dict[str, int | None]:
        """The live workers other than this one, each with the round its peer record says it plays (None before its
        first round); listed again at most every ``peers_reuse_s`` seconds (:data:`EMPTY_PEERS_REUSE_S` while none is
        live: at the run's start the peers register one by one).

        Live as the coordinator judges it (:class:`~swarm_gdrive.protocol.coordinator.Liveness`): a worker peer
        file of this run that says ``alive`` and whose listing entry changed within LIVENESS_TIMEOUT, by this
        node's clock. Only registered workers are read: a batch of a name without such a peer file never is.
        """
        now = self.monotonic()
        reuse = self.peers_reuse_s if self._peers else min(self.peers_reuse_s, EMPTY_PEERS_REUSE_S)
        if self._peers_read_at is not None and now - self._peers_read_at < reuse:
            return self._peers
        self._peers_read_at = now
        peers: dict[str, int | None] = {}
        for node_id, seen in self.exchange.read_peers().items():
            record = seen.record
            if node_id == self.exchange.node_id or not isinstance(record, PeerRecord):
                continue
            if record.role != "worker" or record.status != "alive":
                self.liveness.forget(node_id)
                continue
            self.liveness.observe(node_id, listing_key(seen.info), now)
            peers[node_id] = record.round
        live = self.liveness.live(now)
        self._peers = {node: round_ for node, round_ in peers.items() if node in live}
        return self._peers

    def _windows(self, peers: dict[str, int | None], ctx: StageContext) -> dict[str, tuple[int, int]]:
        """Each live peer's rounds to look at for ``ctx.stage``, (lowest, top): the top is the round after the one
        its record says or after its newest batch listed, whichever is later (a peer that has not said a round yet
        and of which no batch is known: after the latest round any peer says, or this worker's); at most
        ``scan_rounds`` below it, and above the newest round found too stale."""
        said = [r + 1 for r in peers.values() if r is not None]
        default = max([ctx.round + 1, *said])
        windows = {}
        for peer, round_ in peers.items():
            newest = self._newest.get((peer, ctx.stage))
            tops = [r + 1 for r in (round_, newest) if r is not None]
            top = max(tops) if tops else default
            lowest = max(0, top - self.scan_rounds, self._floors.get((peer, ctx.stage), -1) + 1)
            windows[peer] = (lowest, top)
        return windows

    def _newest_first(self, peer: str, window: tuple[int, int], reading: _Reading) -> None:
        """The peer's newest batch with something to take: its top :data:`TOP_LISTINGS` rounds above its newest
        batch known listed first (those not listed within ``listing_reuse_s``), then its known batches read newest
        first."""
        lowest, top = window
        stage = reading.ctx.stage
        for round_ in range(top, max(lowest, top - TOP_LISTINGS + 1) - 1, -1):
            if self._usable(peer, round_, stage):
                break
            if not self._fresh(round_, reading):
                self._list(round_, stage, reading)
        for round_ in range(top, lowest - 1, -1):
            info = self._file(peer, round_, stage)
            if info is not None and self._consider(peer, round_, info, reading) != NEXT:
                return

    def _search(self, wanting: list[str], windows: dict[str, tuple[int, int]], reading: _Reading) -> None:
        """Short of J: list the rounds of the wanting peers' windows where none of their batches is known (never
        listed first, newest first, then the least recently listed), within the pickup's listings, and consider
        each batch of theirs a listing shows."""
        stage = reading.ctx.stage
        while reading.listings_left and reading.useful < self.wanted and not reading.spent:
            wanting = [p for p in wanting if p not in reading.done]
            round_ = self._next_to_list(wanting, windows, reading)
            if round_ is None:
                return
            self._list(round_, stage, reading)
            for peer in wanting:
                info = self._file(peer, round_, stage)
                if info is not None and self._consider(peer, round_, info, reading) != NEXT:
                    reading.done.add(peer)
                if reading.useful >= self.wanted or reading.spent:
                    return

    def _next_to_list(self, wanting: list[str], windows: dict[str, tuple[int, int]], reading: _Reading) -> int | None:
        """The round whose stage folder :meth:`_search` lists next, or None when every one is listed freshly. Below
        the peer's oldest batch known, with the listing backoff (:meth:`_fresh`): rounds emptied by retention lie
        there, and a batch still to arrive that far down would be its stalest."""
        stage = reading.ctx.stage
        best: tuple[bool, float, int] | None = None
        for peer in wanting:
            lowest, top = windows[peer]
            oldest = next((r for r in range(lowest, top + 1) if self._file(peer, r, stage) is not None), lowest)
            for round_ in range(top, lowest - 1, -1):
                listing = self._listings.get((round_, stage))
                if listing is not None and (
                    self._usable(peer, round_, stage) or self._fresh(round_, reading, backoff=round_ < oldest)
                ):
                    continue
                rank = (listing is not None, listing.at if listing is not None else 0.0, -round_)
                if best is None or rank < best:
                    best = rank
        return None if best is None else -best[2]

    def _fresh(self, round_: int, reading: _Reading, backoff: bool = False) -> bool:
        """Whether the stage folder of ``round_`` was listed by this pickup or within ``listing_reuse_s``; with
        ``backoff``, within ``listing_reuse_s`` doubled for each listing in a row that showed no new batch, up to
        :data:`MAX_BACKOFF_DOUBLINGS` times: a round whose batches never come (removed by their writers'
        retention) is listed ever more rarely."""
        listing = self._listings.get((round_, reading.ctx.stage))
        if round_ in reading.listed:
            return True
        if listing is None:
            return False
        reuse = self.listing_reuse_s * 2 ** min(listing.unchanged, MAX_BACKOFF_DOUBLINGS) if backoff else 0.0
        return self.monotonic() - listing.at < max(reuse, self.listing_reuse_s)

    def _usable(self, peer: str, round_: int, stage: int) -> bool:
        """Whether a batch of the peer is listed at ``round_`` and not found incomplete as listed (its listing is
        then worth renewing: the complete batch replaces it)."""
        info = self._file(peer, round_, stage)
        if info is None:
            return False
        judged = self._judged.get((peer, round_, stage))
        return judged is None or judged[1] != INCOMPLETE or judged[0] != listing_key(info)

    def _file(self, peer: str, round_: int, stage: int) -> FileInfo | None:
        listing = self._listings.get((round_, stage))
        return None if listing is None else listing.files.get(peer)

    def _list(self, round_: int, stage: int, reading: _Reading) -> bool:
        """List the stage folder of ``round_`` (one request on Drive) if the pickup may still list: whether it did."""
        if reading.listings_left <= 0:
            return False
        reading.listings_left -= 1
        reading.listed.add(round_)
        files = self.exchange.rollout_entries(round_, stage)
        before = self._listings.get((round_, stage))
        unchanged = 0 if before is None or files.keys() - before.files.keys() else before.unchanged + 1
        self._listings[(round_, stage)] = _Listing(self.monotonic(), files, unchanged)
        for node in files:
            if round_ > self._newest.get((node, stage), -1):
                self._newest[(node, stage)] = round_
        return True

    def _consider(self, peer: str, round_: int, info: FileInfo, reading: _Reading) -> str:
        """Read the peer's batch listed as ``info`` unless judged before: TAKEN when it holds a useful group not
        taken yet (in ``reading`` now), STOP when nothing older of this peer is to be read (too stale, or the read
        budget spent), NEXT otherwise (incomplete, nothing left to take, unreadable)."""
        stage = reading.ctx.stage
        key = (peer, round_, stage)
        judged = self._judged.get(key)
        if judged is not None and judged[0] == listing_key(info):
            return NEXT  # a stale one is below the peer's floor, never looked at again
        skipped: dict[str, str] = {}
        batch = self.exchange.read_rollouts(
            round_, stage, only={peer}, budget=reading.budget, skipped=skipped, evict_older=False, listed={peer: info}
        ).get(peer)
        if skipped.get(peer) == OVER_BUDGET:
            reading.spent = True
            return STOP
        verdict = self._judge(peer, batch, info, reading)
        if verdict is None:
            return TAKEN
        self._judged[key] = (listing_key(info), verdict)
        self._let_go(key)  # never read again as listed (the batch last taken from too, once nothing is left in it)
        if verdict == STALE:
            self._floors[(peer, stage)] = max(round_, self._floors.get((peer, stage), -1))
            reading.stale += 1
            reading.done.add(peer)
            return STOP
        return NEXT

    def _judge(self, peer: str, batch: RolloutBatch | None, info: FileInfo, reading: _Reading) -> str | None:
        """Why the batch read is of no use now (a verdict), or None when it was put in hand (``reading``)."""
        if batch is None:  # gone since the listing, or rejected (logged): read again only once it changes
            return INCOMPLETE
        if not batch.complete:
            return INCOMPLETE
        age, rounds = self.age_s(batch.created_at, reading.now), self.staleness_rounds(batch.created_at)
        if self.too_stale(age, rounds):
            return STALE
        key = (peer, batch.round, batch.stage)
        verdicts = self._verdicts.setdefault(key, {})
        scored, rejected = score_batch(reading.ctx, peer, batch, self.rescore, self.event, verdicts)
        fresh = [g for g in scored if (*key, g.group.group_id) not in self.taken]
        useful = sum(g.has_variance for g in fresh)
        if not useful:
            self._verdicts.pop(key, None)
            return SPENT
        gathered = reading.gathered
        gathered.batches[peer], gathered.scored[peer] = batch, fresh
        gathered.dropped += rejected
        reading.seen[peer] = (batch.round, age, rounds)
        reading.useful += useful
        reading.done.add(peer)
        previous = self._kept.get((peer, batch.stage))
        if previous is not None and previous != batch.round:
            self._let_go((peer, previous, batch.stage))
        self._kept[(peer, batch.stage)] = batch.round
        return None

    def _let_go(self, key: BatchKey) -> None:
        """Free a batch's bytes and re-scores (read again, if ever, only once its listing entry changes)."""
        source, round_, stage = key
        self._verdicts.pop(key, None)
        if self._kept.get((source, stage)) == round_:
            del self._kept[(source, stage)]
        self.exchange.forget_rollout_file(round_, stage, source)

    def _forget_old(self, windows: dict[str, tuple[int, int]], stage: int) -> None:
        """Let go of what no later pickup of ``stage`` reads: the listings of rounds below every live peer's window,
        and of each peer what is below its window (its judgements, its groups taken, its batch kept), everything of
        a peer no longer live. Memory then holds about ``scan_rounds`` listings a stage and one batch a live peer."""
        lowest = min((low for low, _ in windows.values()), default=None)
        for round_, listed_stage in list(self._listings):
            if listed_stage == stage and (lowest is None or round_ < lowest):
                del self._listings[(round_, listed_stage)]

        def below(source: str, round_: int) -> bool:
            window = windows.get(source)
            return window is None or round_ < window[0]

        for key in [k for k in self._judged if k[2] == stage and below(k[0], k[1])]:
            del self._judged[key]
        for source, kept_stage in list(self._kept):
            if kept_stage == stage and below(source, self._kept[(source, kept_stage)]):
                self._let_go((source, self._kept[(source, kept_stage)], kept_stage))
        self.taken = {k for k in self.taken if k[2] != stage or k[0] not in windows or k[1] >= windows[k[0]][0]}
        for peer, peer_stage in list(self._newest):
            if peer_stage == stage and peer not in windows:
                del self._newest[(peer, peer_stage)]
                self._floors.pop((peer, peer_stage), None)
