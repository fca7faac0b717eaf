"""Fault injection inside a real node process (test-side only; never part of the package).

A node process started with this folder on PYTHONPATH imports this module at interpreter start-up.
It does nothing unless ``SWARM_FAULTS`` holds a JSON object; its keys switch on:

- ``park``: ``{"point": P, "round": R, "dir": D}``: when the node reaches point P of round R, it
  writes the marker ``D/parked`` (atomically; its text is the point) and then blocks for ever,
  so that the test can SIGKILL it exactly there. Points: ``generate`` (after the first group of a
  stage was generated), ``publish`` (half of the rollout file written to its temporary name),
  ``train`` (inside the update), ``submit`` (half of the reward file written to its temporary
  name), ``flush`` (half of the metrics chunk appended to metrics.jsonl), ``checkpoint`` (half of
  ``model.safetensors`` of a checkpoint written to its temporary name, also where it is renamed into
  place), ``state`` (coordinator: half of the state file of round R written to its temporary name).
  With ``"until": "released"``, a node parked at ``generate`` goes on once the test writes
  ``D/released`` (its heartbeat beats meanwhile).
- ``oserror``: ``{"every": N, "burst": K, "seed": S, "cooldown": C}``: the local backend's file
  operations fail with a burst of K ``OSError`` (EIO, or ENOTCONN "Transport endpoint is not
  connected", chosen at random) once every N calls on average; the C calls after a burst (default 8)
  succeed. Every injected error is appended to ``D/oserrors.log``
  when ``dir`` is given.
- ``clock_skew_s``: ``time.time()`` of this process is off by that many seconds.
- ``spy``: a folder; every call of the workload's ``train`` appends one JSON line to
  ``spy/train.jsonl`` with what went into the update (source, group id, question, completions
  and the rewards used, for local and external groups).
- ``spy`` also records any call of ``pickle.load(s)`` / ``torch.load`` in ``spy/unpickle.jsonl``.
"""

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time

_CONFIG = json.loads(os.environ.get("SWARM_FAULTS", "") or "null")


def _write_marker(folder: str, name: str, text: str) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(folder, name))


def _append_line(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


class _Park:
    def __init__(self, spec: dict) -> None:
        self.point = spec["point"]
        self.round = int(spec["round"])
        self.dir = spec["dir"]
        self.released = spec.get("until") == "released"

    def here(self, point: str, round_: int | None) -> None:
        """Block for ever if this is the chosen point, after telling the test where we are."""
        if point != self.point or round_ != self.round:
            return
        _write_marker(self.dir, "parked", point)
        if not self.released:
            threading.Event().wait()
        while not os.path.exists(os.path.join(self.dir, "released")):
            time.sleep(0.05)
        self.round = -1  # parked once

    def half_write(self, target, data: bytes, point: str, round_: int | None) -> bool:
        """Leave half of ``data`` in the temporary file that the real write would use, then park."""
        if point != self.point or round_ != self.round:
            return False
        from swarm_gdrive.storage.base import temp_name_for

        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_name(temp_name_for(target.name)), "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            os.fsync(fh.fileno())
        self.here(point, round_)
        return True  # pragma: no cover - here() never returns for the chosen point


def _round_of(parts: tuple[str, ...]) -> int | None:
    from swarm_gdrive.protocol.layout import parse_round_dir

    for part in parts:
        round_ = parse_round_dir(part)
        if round_ is not None:
            return round_
    return None


def _install_park(spec: dict) -> None:
    park = _Park(spec)
    _park_storage(park)
    _park_workload(park, spec.get("grpo", False))


def _park_storage(park: _Park) -> None:
    from swarm_gdrive.storage import local

    real_write, real_append = local.LocalStorage._write, local.LocalStorage._append

    def write(target, data):
        parts = target.parts
        if "rollouts" in parts and "archives" not in parts:
            park.half_write(target, data, "publish", _round_of(parts))
        elif "rewards" in parts:
            park.half_write(target, data, "submit", _round_of(parts))
        elif "checkpoints" in parts and target.name == "model.safetensors":
            park.half_write(target, data, "checkpoint", _round_of(parts))
        elif target.name == "current_state.json":
            park.half_write(target, data, "state", json.loads(data).get("round"))
        return real_write(target, data)

    def append(target, data):
        if target.name == "metrics.jsonl":
            rounds = [json.loads(line).get("round") for line in data.splitlines() if line.strip()]
            if park.round in rounds:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "ab") as fh:
                    fh.write(data[: len(data) // 2])
                park.here("flush", park.round)
        return real_append(target, data)

    real_move_in = local.LocalStorage._move_in

    def move_in(target, source):  # a checkpoint's file renamed into place: parked as if half written, as above
        if park.point == "checkpoint" and "checkpoints" in target.parts and target.name == "model.safetensors":
            park.half_write(target, source.read_bytes(), "checkpoint", _round_of(target.parts))
        return real_move_in(target, source)

    local.LocalStorage._write = staticmethod(write)
    local.LocalStorage._append = staticmethod(append)
    local.LocalStorage._move_in = staticmethod(move_in)


def _park_workload(park: _Park, grpo: bool) -> None:
    from swarm_gdrive.protocol.workload import SyntheticWorkload

    def wrap_generate(cls) -> None:
        real = cls.generate

        def generate(self, ctx):
            for i, group in enumerate(real(self, ctx)):
                yield group
                if i == 0:
                    park.here("generate", ctx.round)

        cls.generate = generate

    def wrap_train(cls) -> None:
        real = cls.train

        def train(self, ctx, local_groups, external):
            park.here("train", ctx.round)
            return real(self, ctx, local_groups, external)

        cls.train = train

    wrap_generate(SyntheticWorkload)
    wrap_train(SyntheticWorkload)
    if grpo:
        from swarm_gdrive.training.grpo_workload import GRPOWorkload

        wrap_generate(GRPOWorkload)
        wrap_train(GRPOWorkload)


def _install_oserrors(spec: dict) -> None:
    from swarm_gdrive.storage import local

    rng = random.Random(spec.get("seed", 0))
    every, burst = int(spec["every"]), int(spec["burst"])
    lock = threading.Lock()
    cooldown = int(spec.get("cooldown", 8))
    pending, quiet = [0], [0]
    log = os.path.join(spec["dir"], f"oserrors-{os.getpid()}.log") if spec.get("dir") else None

    def maybe_fail(name: str, target) -> None:
        with lock:
            if quiet[0]:  # calls after a burst succeed: bursts, not one endless outage
                quiet[0] -= 1
                return
            if pending[0] == 0 and rng.random() < 1.0 / every:
                pending[0] = burst
            if pending[0] == 0:
                return
            pending[0] -= 1
            quiet[0] = cooldown if pending[0] == 0 else 0
            use_eio = rng.random() < 0.5
        if log:
            _append_line(log, {"op": name, "path": str(target), "errno": "EIO" if use_eio else "ENOTCONN"})
        if use_eio:
            raise OSError(errno.EIO, "Input/output error", str(target))
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected", str(target))

    for name in ("_read", "_write", "_append", "_list", "_delete", "_rmdir", "_move", "_move_in"):
        real = getattr(local.LocalStorage, name)

        def flaky(*args, _real=real, _name=name):
            maybe_fail(_name, args[0])
            return _real(*args)

        setattr(local.LocalStorage, name, staticmethod(flaky))


def _install_skew(seconds: float) -> None:
    real = time.time
    time.time = lambda: real() + seconds


def _install_spy(folder: str, grpo: bool) -> None:
    import pickle

    from swarm_gdrive.protocol.workload import SyntheticWorkload

    def describe(groups) -> list[dict]:
        return [
            {
                "source": g.source,
                "group_id": g.group.group_id,
                "question": g.group.question,
                "provenance": g.group.provenance.model_dump(),
                "completions": list(g.group.completions),
                "claimed_rewards": list(g.group.rewards),
                "rewards": list(g.rewards),
            }
            for g in groups
        ]

    def spy_train(cls) -> None:
        real = cls.train

        def train(self, ctx, local_groups, external):
            record = {"round": ctx.round, "stage": ctx.stage, "node": ctx.node_id}
            record.update(local=describe(local_groups), external=describe(external))
            _append_line(os.path.join(folder, "train.jsonl"), record)
            return real(self, ctx, local_groups, external)

        cls.train = train

    def spy_unpickle(module, name: str) -> None:
        real = getattr(module, name)

        def call(*args, **kwargs):
            _append_line(os.path.join(folder, "unpickle.jsonl"), {"call": f"{module.__name__}.{name}"})
            return real(*args, **kwargs)

        setattr(module, name, call)

    spy_train(SyntheticWorkload)
    spy_unpickle(pickle, "load")
    spy_unpickle(pickle, "loads")
    if grpo:
        import torch

        from swarm_gdrive.training.grpo_workload import GRPOWorkload

        spy_train(GRPOWorkload)
        spy_unpickle(torch, "load")


if _CONFIG:
    if "clock_skew_s" in _CONFIG:
        _install_skew(float(_CONFIG["clock_skew_s"]))
    if "park" in _CONFIG:
        _install_park({**_CONFIG["park"], "grpo": _CONFIG.get("grpo", False)})
    if "oserror" in _CONFIG:
        _install_oserrors(_CONFIG["oserror"])
    if "spy" in _CONFIG:
        _install_spy(_CONFIG["spy"], _CONFIG.get("grpo", False))
