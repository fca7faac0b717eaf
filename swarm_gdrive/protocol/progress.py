"""The asynchronous coordinator's record of the swarm's progress (ROUND_MODE=async): pure bookkeeping, no I/O.

Each worker plays its own rounds, so the rewards of the swarm are spread over as many round folders as the fastest
worker has played. The coordinator lists at most one ``rewards/round_R/stage_{last}/`` folder per pass:
:meth:`SwarmProgress.target` picks R, :meth:`SwarmProgress.add` takes the valid rewards found there. R is the next
round looked for of the worker whose turn it is (the one listed for the longest ago among those not done), moved up
to the round before the one its peer record says it plays, so a listing never trails a fast worker by more than a
heartbeat: each worker gets one sampled round per turn, and its last round (which makes it *done*) as soon as it has
played it. A worker that is not live gets one turn for the round its last record names (it may have played it),
then none until a record names another, except its last round, which keeps its turns until its reward is seen.
Every reward found in a listed folder counts, whichever worker the listing was for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm_gdrive.protocol.records import RewardRecord


@dataclass
class SwarmProgress:
    """Per-worker rounds done and the rewards counted since the last metric line.

    ``rounds_done[w]``: one past the newest round of ``w`` with a valid reward of the last stage seen (0: none);
    ``done``: the workers whose reward of round ``max_rounds`` - 1 was seen.
    """

    max_rounds: int
    rounds_done: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    _next: dict[str, int] = field(default_factory=dict)  # the round whose reward is looked for next
    _turn: dict[str, int] = field(default_factory=dict)  # the pass at which a listing was last aimed at the worker
    _aimed: dict[str, int] = field(default_factory=dict)  # the round of that listing
    _passes: int = 0
    _counted: set[tuple[str, int]] = field(default_factory=set)  # (worker, round) rewards counted once
    _pending: list[float] = field(default_factory=list)  # rewards counted since the last line

    def target(
        self, candidates: set[str] | frozenset[str], rounds: dict[str, int | None], live: frozenset[str]
    ) -> int | None:
        """The round whose last-stage rewards to list this pass (None: no candidate).

        ``candidates``: the registered workers; ``rounds``: each one's round as its last peer record read says (a
        live worker plays that round; one that stopped or fell silent may have played it); ``live``: the live
        workers. Served, of the live candidates not done and the others not done whose recorded round has not been
        listed for them yet, the one whose turn came longest ago (then by name): its next round, moved up to one
        before its record's round (live), or to that round (not live)."""
        waiting = sorted(n for n in set(candidates) - self.done if n in live or self._may_have_played(n, rounds.get(n)))
        if not waiting:
            return None
        self._passes += 1
        node = min(waiting, key=lambda n: (self._turn.get(n, 0), n))
        self._turn[node] = self._passes
        recorded = rounds.get(node)
        floor = 0 if recorded is None else recorded - 1 if node in live else recorded
        round_ = min(max(self._next.get(node, 0), floor), self.max_rounds - 1)
        self._next[node] = self._aimed[node] = round_
        return round_

    def _may_have_played(self, node: str, recorded: int | None) -> bool:
        """A worker no longer live whose reward may still appear: the round its last record names, not listed for
        it yet; or its last round, listed every turn until its reward is seen. A worker's last reward can reach
        this node after its ``stopped`` record (a lagging folder), or the last round can have been listed while it
        was still playing it: without the second clause neither is ever counted done, and an experiment whose
        workers all ended so would never finish."""
        if recorded is None:
            return False
        return self._aimed.get(node, -1) < recorded or recorded >= self.max_rounds - 1

    def add(self, round_: int, rewards: dict[str, RewardRecord]) -> list[str]:
        """Count the rewards of ``round_`` found in its folder (validated by the reader); returns the workers that
        are done by it (their last round), in name order."""
        newly_done: list[str] = []
        for node in sorted(rewards):
            if (node, round_) not in self._counted:
                self._counted.add((node, round_))
                self._pending.append(rewards[node].reward)
            self._next[node] = max(self._next.get(node, 0), round_ + 1)
            self.rounds_done[node] = max(self.rounds_done.get(node, 0), round_ + 1)
            if round_ >= self.max_rounds - 1 and node not in self.done:
                self.done.add(node)
                newly_done.append(node)
        return newly_done

    @property
    def pending(self) -> int:
        """Rewards counted since the last :meth:`line`."""
        return len(self._pending)

    def line(self) -> dict[str, float | int | None]:
        """The metric values of the rewards counted since the last line (then forgotten) and each worker's rounds
        done: ``swarm/rewards_counted``, ``swarm/reward_mean`` (None without a reward), ``swarm/rounds_done_min``,
        ``_max`` and ``_mean`` over the workers with a reward."""
        values: dict[str, float | int | None] = {
            "swarm/rewards_counted": len(self._pending),
            "swarm/reward_mean": sum(self._pending) / len(self._pending) if self._pending else None,
        }
        self._pending = []
        done = list(self.rounds_done.values())
        if done:
            values.update(
                {
                    "swarm/rounds_done_min": min(done),
                    "swarm/rounds_done_max": max(done),
                    "swarm/rounds_done_mean": sum(done) / len(done),
                }
            )
        return values
