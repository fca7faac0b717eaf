"""The curriculum's decision (pure): which tasks move up a difficulty level after an evaluation."""

from __future__ import annotations

from collections.abc import Mapping


def curriculum_step(
    levels: Mapping[str, int], accuracy: Mapping[str, float], threshold: float, top: Mapping[str, int]
) -> dict[str, int]:
    """New level per task: one up where held-out accuracy at the current level reached ``threshold``.

    ``accuracy[task]`` is the node's pass@1 on the task's held-out set *at its current level*;
    a task already at ``top[task]`` stays there; a task without an accuracy stays where it is.
    ``threshold <= 0`` turns the curriculum off.
    """
    new = dict(levels)
    if threshold <= 0:
        return new
    for task, level in levels.items():
        if task in accuracy and accuracy[task] >= threshold and level < top[task]:
            new[task] = level + 1
    return new
