"""The asynchronous coordinator's record of the swarm's progress (ROUND_MODE=async): pure bookkeeping, no I/O.

Each worker plays its own rounds, so the rewards of the swarm are spread over as many round folders as the fastest
worker has played. The coordinator lists at most one ``rewards/round_R/stage_{last}/`` folder per pass:
:meth:`SwarmProgress.target` picks R, :meth:`SwarmProgress.add` takes the valid rewards found there. R is the next
round looked for of the worker whose turn it is (the one listed for the longest ago among those not done), moved up
to the round before the one its peer record says it plays, so a listing never trails a fast worker by more than a
heartbeat: each worker gets one sampled round per turn, and its last round (which makes it *done*) as soon as it has
played it. Every reward found in a listed folder counts, whichever worker the listing was for.
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
    _passes: int = 0
    _counted: set[tuple[str, int]] = field(default_factory=set)  # (worker, round) rewards counted once
    _pending: list[float] = field(default_factory=list)  # rewards counted since the last line

    def target(self, candidates: set[str] | frozenset[str], rounds: dict[str, int | None]) -> int | None:
        """The round whose last-stage rewards to list this pass (None: no candidate).

        ``candidates``: the registered workers not done; ``rounds``: each worker's round as its last peer record
        read says (it plays that round; a stopped worker may have played it). Of the candidates, the one whose turn
        came longest ago (then by name) is served: its next round, moved up to one before its record's round."""
        waiting = sorted(set(candidates) - self.done)
        if not waiting:
            return None
        self._passes += 1
        node = min(waiting, key=lambda n: (self._turn.get(n, 0), n))
        self._turn[node] = self._passes
        recorded = rounds.get(node)
        floor = recorded - 1 if recorded is not None else 0
        round_ = min(max(self._next.get(node, 0), floor), self.max_rounds - 1)
        self._next[node] = round_
        return round_

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
