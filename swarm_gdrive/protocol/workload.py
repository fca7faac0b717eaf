"""What a worker does each stage, behind a narrow interface, and the synthetic stand-in.

The worker loop (:mod:`swarm_gdrive.protocol.worker`) owns the protocol; a :class:`Workload` owns
generation, local re-scoring of other nodes' groups, and the update. The
:class:`SyntheticWorkload` is a named stand-in for protocol tests and load benchmarks:
it trains nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from swarm_gdrive.protocol.records import Provenance, RolloutGroup, TaskEval
from swarm_gdrive.protocol.sapo import ScoredGroup, rng_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageContext:
    """Where in the experiment a stage runs."""

    node_id: str
    round: int
    stage: int
    seed: int


class Workload(Protocol):
    """The per-stage work of a worker."""

    #: True for a workload without model state: nothing to checkpoint, so a restart has nothing to miss.
    stateless: bool
    #: A digest of the parameters :meth:`resume` restored (None before a restore, or without a model).
    restored_digest: str | None

    def generate(self, ctx: StageContext) -> Iterator[RolloutGroup]:
        """Yield this node's groups for the stage (with the node's own rewards), one at a time."""
        ...

    def rescore(self, ctx: StageContext, group: RolloutGroup) -> tuple[float, ...] | None:
        """Rewards of another node's group, computed here from its provenance; None to drop it."""
        ...

    def train(self, ctx: StageContext, local: list[ScoredGroup], external: list[ScoredGroup]) -> dict[str, float]:
        """One update on the I + J groups; returns metrics (``train/…`` keys)."""
        ...

    def resume(self) -> int | None:
        """Restore this node's latest checkpoint; the round it was taken after, or None."""
        ...

    def evaluate(self, round_: int) -> list[TaskEval]:
        """Held-out evaluation of the current policy, one result per task ([] if it has no model)."""
        ...

    def end_round(self, round_: int, final: bool) -> dict[str, float]:
        """After a round (``final``: the experiment finished): checkpoint when due; returns metrics."""
        ...

    def checkpoint_on_stop(self) -> int | None:
        """Before a stopped worker exits: checkpoint the last round trained whole (its ``end_round`` done), unless
        the latest checkpoint holds it or is younger than STOP_CHECKPOINT_MIN_SECONDS; the round saved, or None.
        Not called while a round is trained in part (the worker then saves nothing)."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


SYNTHETIC_DATASET = "synthetic_sum"


class SyntheticWorkload:
    """A stand-in workload: sum questions, random answers, an exact verifier, no model.

    Questions are regenerated from (seed, index), so re-scoring checks provenance the same
    way the real workload does. ``train`` performs no update; it simulates compute time.
    ``completion_chars`` pads each completion after its answer to about that length (a benchmark's
    stand-in for a model's text: a rollout batch as large as a real one); the answer still decides the reward.
    """

    stateless = True  # no model: nothing to checkpoint or resume
    restored_digest: str | None = None

    def __init__(
        self,
        num_samples: int,
        num_generations: int,
        step_seconds: float,
        stop: threading.Event | None = None,
        completion_chars: int = 0,
    ) -> None:
        self.num_samples = num_samples
        self.num_generations = num_generations
        self.step_seconds = step_seconds
        self.completion_chars = completion_chars
        self._stop = stop or threading.Event()

    @staticmethod
    def question(seed: int, index: int) -> tuple[str, int]:
        rng = rng_for(seed, "question", index, purpose=SYNTHETIC_DATASET)
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"What is {a} + {b}?", a + b

    @staticmethod
    def score(completion: str, answer: int) -> float:
        words = completion.split()
        return 1.0 if words and words[0] == str(answer) else 0.0

    def _completion(self, value: int) -> str:
        text = str(value)
        pad = self.completion_chars - len(text) - 1
        return f"{text} {'x' * pad}" if pad > 0 else text

    def generate(self, ctx: StageContext) -> Iterator[RolloutGroup]:
        rng = rng_for(ctx.seed, ctx.node_id, ctx.round, ctx.stage, purpose="synthetic-generate")
        for i in range(self.num_samples):
            index = rng.randrange(2**31)
            text, answer = self.question(ctx.seed, index)
            completions = [self._completion(answer + rng.choice((-1, 0, 0, 1))) for _ in range(self.num_generations)]
            yield RolloutGroup(
                group_id=f"r{ctx.round}-s{ctx.stage}-g{i}",
                task=SYNTHETIC_DATASET,
                question=text,
                provenance=Provenance(dataset=SYNTHETIC_DATASET, seed=ctx.seed, index=index),
                completions=completions,
                rewards=[self.score(c, answer) for c in completions],
            )

    def rescore(self, ctx: StageContext, group: RolloutGroup) -> tuple[float, ...] | None:
        prov = group.provenance
        if prov.dataset != SYNTHETIC_DATASET or group.task != SYNTHETIC_DATASET:
            return None
        text, answer = self.question(prov.seed, prov.index)
        if text != group.question:
            return None
        return tuple(self.score(c, answer) for c in group.completions)

    def train(self, ctx: StageContext, local: list[ScoredGroup], external: list[ScoredGroup]) -> dict[str, float]:
        self._stop.wait(self.step_seconds)  # simulated compute; returns early on stop
        rewards = [r for g in local for r in g.rewards]
        return {
            "train/synthetic_groups": float(len(local) + len(external)),
            "train/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        }

    def resume(self) -> int | None:
        return None  # nothing to restore: the stand-in has no model

    def evaluate(self, round_: int) -> list[TaskEval]:
        return []  # nothing to evaluate: the stand-in has no model

    def end_round(self, round_: int, final: bool) -> dict[str, float]:
        return {}

    def checkpoint_on_stop(self) -> int | None:
        return None  # no model: nothing to keep

    def close(self) -> None:
        pass
