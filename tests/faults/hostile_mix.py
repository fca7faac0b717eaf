"""The hostile classes of issue 14 as planters for the randomised trials (trials.run_mixed_trial).

Each planter acts once, at the moment the trial chooses, on a running swarm: it writes what an attacker with
write access to the folder (or a careless user) could, and returns a :class:`Planted` saying which paths are
hostile (readers may reject them; the watcher skips them), which states are forged (the watcher's monotonic
check ignores them), which nodes' logs it replaced, and which extra process it started. hostile.py's planters
(truncated JSON, sparse 1 GiB files, FIFOs, forged groups, ...) are the class ``classic``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from faultkit import LAYOUT, Swarm
from hostile import flood_batch, plant, plant_for_coordinator, plant_rollouts

from swarm_gdrive.protocol.records import PeerRecord, RewardRecord, StateRecord, decode, encode

#: A JSON integer longer than Python's int-conversion limit (4300 digits): ``json.loads`` raises ValueError.
HUGE_INT = b"1" * 5000


@dataclass
class Planted:
    """What one planter did."""

    what: str
    paths: set[str] = field(default_factory=set)  # hostile paths under the shared folder (files, folders, links)
    forged_states: set[tuple[int, int, str]] = field(default_factory=set)  # (round, seq, run_id) the watcher ignores
    forged_runs: set[str] = field(default_factory=set)  # run ids of forged states, whatever their round and seq
    tainted_logs: set[str] = field(default_factory=set)  # nodes whose log files the planter replaced
    twin: object | None = None  # a second process with a running node's NODE_ID
    twin_of: str | None = None


@dataclass
class Scene:
    """The running trial, as a planter sees it."""

    folder: Path
    outside: Path  # a folder outside GDRIVE_PATH that links point into; it must stay as it is
    tmp: Path
    swarm: Swarm
    run_id: str
    round: int  # the round open now
    workers: list[str]
    spare: str  # a worker that is not killed in this trial
    rng: random.Random
    variant: str | None = None  # the class's variant to plant; None: one drawn with rng


def _pick(scene: Scene, variants: list[str]) -> str:
    if scene.variant is None:
        return scene.rng.choice(variants)
    if scene.variant not in variants:
        raise ValueError(f"unknown variant {scene.variant!r}; use one of {variants}")
    return scene.variant


def _hostile_json(kind: str) -> bytes:
    return b'{"schema_version": 1, "kind": "%s", "x": %s}' % (kind.encode(), HUGE_INT)


def _write(scene: Scene, rel: str, data: bytes) -> str:
    target = scene.folder / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".hostile.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return rel


def flash_state(scene: Scene, data: bytes, seconds: float = 0.6) -> None:
    """Replace the state file with ``data`` for ``seconds``, then put back what was there, unless the coordinator
    wrote meanwhile (its write replaced the forgery; putting the old one back would undo it)."""
    path = scene.folder / LAYOUT.state_file
    real = path.read_bytes()
    _write(scene, LAYOUT.state_file, data)
    time.sleep(seconds)  # the forgery's lifetime, chosen by the attacker
    if path.read_bytes() == data:
        _write(scene, LAYOUT.state_file, real)


def _state(scene: Scene) -> StateRecord:
    return decode((scene.folder / LAYOUT.state_file).read_bytes(), StateRecord)


def _coordinator_beating(scene: Scene) -> bool:
    """A coordinator process of the swarm runs and its peer record beat within the last second and a half."""
    if not any(p.name.startswith("coord") and p.returncode is None for p in scene.swarm.procs):
        return False
    try:
        peer = decode((scene.folder / LAYOUT.peer_file("coord")).read_bytes(), PeerRecord)
    except (OSError, ValueError):
        return False
    return peer.status == "alive" and time.time() - peer.heartbeat_at < 1.5


def _furthest_reward_round(scene: Scene) -> int:
    """The highest round any node has a reward file of (-1: none yet): each worker's own progress in async mode."""
    rounds = [-1]
    for folder in (scene.folder / LAYOUT.rewards_dir).glob("round_*"):
        with contextlib.suppress(ValueError):
            if any(folder.rglob("*.json")):
                rounds.append(int(folder.name.removeprefix("round_")))
    return max(rounds)


# -- the classes ---------------------------------------------------------------------------------------


def classic(scene: Scene) -> Planted:
    """hostile.py's files: broken and hostile rollouts of the next round, peers and rewards for the coordinator."""
    seed = int(scene.swarm.env.get("SEED", "42"))
    expected = plant_rollouts(scene.folder, LAYOUT, scene.run_id, scene.round + 1, seed)
    expected |= plant_for_coordinator(scene.folder, LAYOUT, scene.run_id, scene.round + 2)
    stage = LAYOUT.rollouts_stage_dir(scene.round + 1, 0)
    paths = set(expected) | {f"{stage}/forger.json", f"{stage}/many.json"}
    paths |= {LAYOUT.peer_file("fakecoord")} | {LAYOUT.reward_file(r, 0, "ghost") for r in range(scene.round + 2)}
    return Planted("classic", paths)


def huge_int(scene: Scene) -> Planted:
    """A 5 KB file with an integer longer than the int-conversion limit, where a reader will parse it."""
    where = _pick(scene, ["rollout", "peer", "reward", "state", "metrics"])
    if where == "state":
        flash_state(scene, _hostile_json("state"))
        return Planted(f"huge_int in {where}", {LAYOUT.state_file})
    rel = {
        "rollout": LAYOUT.rollout_file(scene.round + 1, 0, "bigint"),
        "peer": LAYOUT.peer_file("bigint"),
        "reward": LAYOUT.reward_file(scene.round, 0, "bigint"),
        "metrics": LAYOUT.metrics_file("bigint"),
    }[where]
    kind = {"rollout": "rollouts", "peer": "peer", "reward": "reward", "metrics": "metric"}[where]
    data = _hostile_json(kind) + (b"\n" if where == "metrics" else b"")
    return Planted(f"huge_int in {where}", {_write(scene, rel, data)})


def _last_reward(scene: Scene, node: str) -> int:
    """The last round ``node`` has a reward file of (stage 0), -1 without one."""
    last = int(scene.swarm.env["MAX_ROUNDS"])
    rounds = [r for r in range(last) if (scene.folder / LAYOUT.reward_file(r, 0, node)).is_file()]
    return max(rounds, default=-1)


def type_confusion(scene: Scene) -> Planted:
    """A file where a folder belongs and the reverse, a FIFO for a folder, in paths nodes are about to use."""
    where = _pick(scene, ["file_for_round", "dir_for_reward", "fifo_for_round", "dir_for_state", "old_round"])
    next_round = scene.round + 1
    if where == "file_for_round":  # the next round's rewards folder is a regular file
        rel = LAYOUT.rewards_dir + f"/round_{next_round}"
        if not (scene.folder / rel).exists():
            _write(scene, rel, b"not a folder")
    elif where == "dir_for_reward":  # a folder where a worker's next reward file belongs
        # In async the worker plays its own rounds: it may be past the round open when the planter acts.
        rel = LAYOUT.reward_file(max(next_round, _last_reward(scene, scene.spare) + 1), 0, scene.spare)
        (scene.folder / rel).mkdir(parents=True, exist_ok=True)
    elif where == "fifo_for_round":  # the next round's rollouts folder is a FIFO
        rel = LAYOUT.rollouts_round_dir(next_round)
        if not (scene.folder / rel).exists():
            plant(scene.folder, rel, fifo=True)
    elif where == "dir_for_state":  # the coordinator's own file is a folder (its previous content gone)
        rel = LAYOUT.state_file
        target = scene.folder / rel
        target.unlink(missing_ok=True)
        target.mkdir()
    else:  # with cleanup on, the coordinator prunes old round folders: a file named like a stage folder in one
        rel = LAYOUT.rollouts_round_dir(0) + "/stage_7"
        _write(scene, rel, b"not a folder")
    return Planted(f"type_confusion {where}", {rel})


def symlink(scene: Scene) -> Planted:
    """A symbolic link inside the experiment that points outside GDRIVE_PATH."""
    where = _pick(scene, ["events_file", "logs_folder", "round_folder", "reward_round"])
    node = scene.spare
    planted = Planted(f"symlink {where}")
    if where == "events_file":  # the node's own training_events.jsonl
        rel = LAYOUT.events_file(node)
        (scene.folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (scene.folder / rel).unlink(missing_ok=True)
        os.symlink(scene.outside / "events.jsonl", scene.folder / rel)
        planted.tainted_logs.add(node)
    elif where == "logs_folder":  # the node's logs folder, moved away and replaced by a link
        rel = LAYOUT.logs_dir(node)
        target = scene.folder / rel
        if target.exists():
            os.replace(target, scene.tmp / f"logs-{node}-moved-away")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(scene.outside, target)
        planted.tainted_logs.add(node)
    elif where == "round_folder":  # the next round's rollouts folder, before anyone creates it
        rel = LAYOUT.rollouts_round_dir(scene.round + 1)
        (scene.folder / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (scene.folder / rel).exists():
            os.symlink(scene.outside, scene.folder / rel)
    else:
        rel = LAYOUT.rewards_dir + f"/round_{scene.round + 1}"
        (scene.folder / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (scene.folder / rel).exists():
            os.symlink(scene.outside, scene.folder / rel)
    planted.paths.add(rel)
    return planted


def forged_state(scene: Scene) -> Planted:
    """A forged state, visible for under a second."""
    real = _state(scene)
    change = {
        "far_ahead": {"round": 999, "seq": 10**6, "max_rounds": 1000, "status": "running"},
        "finished": {"round": real.max_rounds, "seq": 10**6, "status": "finished", "advance_reason": "finished"},
        "other_run": {"run_id": "0123456789abcdef", "seq": real.seq + 1},
        "other_coordinator": {"coordinator_id": "mallory", "round": real.round + 1, "seq": real.seq + 1},
        "huge_seq": {"seq": 10**9},  # the same round, a seq the coordinator will never reach
    }
    change = change[_pick(scene, sorted(change))]
    fake = real.model_copy(update={**change, "updated_at": time.time()})
    flash_state(scene, encode(fake))
    what = ", ".join(f"{k}={v}" for k, v in change.items() if k != "advance_reason")
    return Planted(f"forged_state {what}", {LAYOUT.state_file}, {(fake.round, fake.seq, fake.run_id)})


def _named(path_of, name: str, *args) -> str:
    """``path_of(*args, name)`` for a name the layout refuses (uppercase, reserved on Windows): an attacker writes
    files directly, without the layout's checks."""
    return path_of(*args, "zzname").replace("zzname", name)


def portable_names(scene: Scene) -> Planted:
    """Names that collide by case with a node's, or that Windows reserves, as peers, rewards and rollouts."""
    now = time.time()
    peer = PeerRecord(
        node_id=scene.spare.upper(),
        role="worker",
        run_id=scene.run_id,
        registered_at=now,
        heartbeat=1,
        heartbeat_at=now,
        status="alive",
    )
    reward = RewardRecord(
        node_id=scene.spare.upper(),
        run_id=scene.run_id,
        round=scene.round,
        stage=0,
        reward=1.0,
        num_local_groups=1,
        num_external_groups=0,
        external_requested=0,
        submitted_at=now,
    )
    seed = int(scene.swarm.env.get("SEED", "42"))
    paths = {
        _write(scene, _named(LAYOUT.peer_file, peer.node_id), encode(peer)),
        _write(scene, _named(LAYOUT.reward_file, peer.node_id, scene.round, 0), encode(reward)),
    }
    for name in ("CON", "aux", "nul.txt", "lpt1", "w9."):
        batch = flood_batch(name, scene.run_id, scene.round + 1, seed, 2, 4)
        paths.add(_write(scene, _named(LAYOUT.rollout_file, name, scene.round + 1, 0), encode(batch)))
        paths.add(_write(scene, _named(LAYOUT.peer_file, name), encode(peer.model_copy(update={"node_id": name}))))
    return Planted("portable_names", paths)


def bad_manifest(scene: Scene) -> Planted:
    """Malformed checkpoint manifests under a worker's name (read by load_latest and pruning)."""
    node = scene.spare
    deep = b"[" * 100_000 + b"]" * 100_000
    huge = b'{"kind": "checkpoint", "round": %s, "node_id": "%s", "files": {}}' % (HUGE_INT, node.encode())
    wrong = json.dumps({"kind": "checkpoint", "round": 3, "node_id": node, "files": [1, 2]}).encode()
    paths = set()
    for round_, data in ((1, deep), (2, huge), (3, wrong)):
        paths.add(_write(scene, f"{LAYOUT.checkpoint_dir(node, round_)}/checkpoint.json", data))
    upper = LAYOUT.checkpoint_dir("zzname", 4).replace("zzname", node.upper())
    paths.add(_write(scene, f"{upper}/checkpoint.json", huge))
    return Planted("bad_manifest", paths)


def unregistered_flood(scene: Scene, files: int = 12) -> Planted:
    """Many valid rollout batches (1 MiB each) of names that never registered, in the next stage folder."""
    seed = int(scene.swarm.env.get("SEED", "42"))
    paths = set()
    for i in range(files):
        batch = flood_batch(f"flood{i}", scene.run_id, scene.round + 1, seed, 2, 64)
        long = [g.model_copy(update={"completions": ["0" * 8192] * 64}) for g in batch.groups]
        data = encode(batch.model_copy(update={"groups": long}))
        paths.add(_write(scene, LAYOUT.rollout_file(scene.round + 1, 0, f"flood{i}"), data))
    return Planted(f"unregistered_flood {files} files", paths)


def twin(scene: Scene) -> Planted:
    """A second process with a running worker's NODE_ID, on another machine (another SWARM_LOCAL_DIR)."""
    proc = scene.swarm.start("twin", node=scene.spare, SWARM_LOCAL_DIR=str(scene.tmp / "twin-local"))
    return Planted(f"twin of {scene.spare}", twin=proc, twin_of=scene.spare)


# -- the classes of issue 30 (their planting functions are the class tests'; imported here when planted) -----


def hard_link(scene: Scene) -> Planted:
    """A hard link where a live node appends its JSONL log (metrics or training events), to a file outside
    GDRIVE_PATH: the trial's own ``outside/sentinel.txt``, whose bytes the trial checks at its end. The node must
    write by replacing the link (or refuse), never append through it (issue 30, class 1)."""
    from test_fault_links import plant_hard_link

    where = _pick(scene, ["metrics", "events"])
    # The spare worker, never the node the trial kills: the restart check reads the victim's own events, and the
    # link's bytes, not the node's, are what is at the path until the node replaces it.
    node = scene.spare
    rel = LAYOUT.metrics_file(node) if where == "metrics" else LAYOUT.events_file(node)
    for attempt in range(10):  # the live node may recreate its log between the planter's unlink and link
        try:
            plant_hard_link(scene.folder, rel, scene.outside / "sentinel.txt")
            break
        except FileExistsError:
            if attempt == 9:
                raise
    return Planted(f"hard_link {where} of {node}", {rel}, tainted_logs={node})


def names_not_utf8(scene: Scene) -> Planted:
    """Folders and files whose names are not UTF-8 beside the experiment and where every reader lists inside it
    (peers, rewards, rollouts, evals, state, logs): no node, reader or command may fail for them (class 5)."""
    from test_fault_utf8 import plant_names_not_utf8

    planted = plant_names_not_utf8(scene.folder, LAYOUT.experiment)
    return Planted(f"names_not_utf8 {len(planted)} names", {os.fsdecode(rel) for rel in planted})


def forged_run(scene: Scene) -> Planted:
    """experiment.json and the state rewritten with another run id, in the real coordinator's name, again every
    0.5 s for 1 to 4 s: no worker may exit for it, and the run must go on under its own run id (class 3). Every
    state of the forged run id is a forgery (the watcher's monotonic check leaves them out)."""
    from test_fault_rivals import FORGED_RUN, plant_forged_run

    seconds = scene.rng.uniform(1.0, 4.0)
    times = plant_forged_run(scene.folder, seconds)
    paths = {LAYOUT.experiment_file, LAYOUT.state_file}
    return Planted(f"forged_run {times} plants over {seconds:.1f} s", paths, forged_runs={FORGED_RUN})


def rival_coordinator(scene: Scene) -> Planted:
    """A second coordinator (another NODE_ID, another machine) started with RESET_EXPERIMENT=true while the
    first runs: it must refuse to start (exit code 2) and change nothing (class 3). The trial judges its exit.

    Not started in the last round or later (a fast trial can end before the planter acts, or before the second
    coordinator reads the state, about a second after its start): a coordinator started with RESET_EXPERIMENT=true
    after the end, without the first one's key, is the operator's documented reset (a new run, a new key), not a
    rival (seed 30 of run --classes forged_run,rival_coordinator, trial 37)."""
    state = _state(scene)
    if state.status == "finished" or state.round >= state.max_rounds - 1:
        return Planted(f"rival_coordinator not started: round {state.round} ({state.status}) is the last")
    if not _coordinator_beating(scene):
        # With no coordinator alive (killed, not yet restarted), RESET_EXPERIMENT=true is the operator's reset of an
        # abandoned experiment, indistinguishable from a participant moving it away (deletions: §13, not stopped);
        # the restarted coordinator then refuses (another key) and the workers give up (not their pinned key).
        return Planted("rival_coordinator not started: no coordinator beats now (killed, not yet back)")
    furthest = _furthest_reward_round(scene)
    if state.mode == "async" and furthest >= state.max_rounds - 2:
        # The async state's round stays where the run began: the workers' own rounds tell how near the end it is, and
        # a fast worker plays its last two rounds within the second coordinator's start (seed 32, trials 6 and 14).
        return Planted(f"rival_coordinator not started: a worker has played round {furthest}, near the last")
    proc = scene.swarm.start(
        "rival",
        node="coord2",
        NODE_ROLE="coordinator",
        ROUND_MODE=scene.swarm.round_mode,
        RESET_EXPERIMENT="true",
        SWARM_LOCAL_DIR=str(scene.tmp / "rival-local"),
    )
    return Planted("rival_coordinator coord2 with RESET_EXPERIMENT=true", twin=proc, twin_of="coord")


# Issue 30's other classes are not planted here: a huge checkpoint (class 2) needs a worker that restores from its
# checkpoints, and the synthetic workload is stateless (it saves and loads none; tests/faults/test_fault_sizes.py
# plants it for the tiny model); a peer's completion trained on what was not scored (class 4) needs the grpo
# workload (tests/faults/test_fault_scored.py); readers at scale (class 6) is a benchmark.

CLASSES: dict[str, Callable[[Scene], Planted]] = {
    "classic": classic,
    "huge_int": huge_int,
    "type_confusion": type_confusion,
    "symlink": symlink,
    "forged_state": forged_state,
    "portable_names": portable_names,
    "bad_manifest": bad_manifest,
    "unregistered_flood": unregistered_flood,
    "twin": twin,
    "hard_link": hard_link,
    "names_not_utf8": names_not_utf8,
    "forged_run": forged_run,
    "rival_coordinator": rival_coordinator,
}


class Planter(threading.Thread):
    """Runs one planter once the chosen round has opened plus a delay; keeps what it planted (or why it failed).

    ``name`` is a class of :data:`CLASSES`, or ``class:variant`` to plant that variant rather than one drawn.
    """

    def __init__(self, scene_for: Callable[[int], Scene], name: str, round_: int, delay: float) -> None:
        super().__init__(daemon=True)
        self.cls, _, self.variant = name.partition(":")
        if self.cls not in CLASSES:
            raise ValueError(f"unknown hostile class {self.cls!r}; use one of {sorted(CLASSES)}")
        self.scene_for, self.round, self.delay = scene_for, round_, delay
        self.planted: Planted | None = None
        self.error: str | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            scene = self.scene_for(self.round)  # waits for the round
            scene.variant = self.variant or None
            if self.halt.wait(self.delay):
                return
            self.planted = CLASSES[self.cls](scene)
        except Exception as exc:  # noqa: BLE001 - a planter that could not act is reported with the trial
            self.error = f"{type(exc).__name__}: {exc}"
