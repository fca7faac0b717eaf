"""Publishing this node's files and reading the swarm's, through a Storage.

Everything read is size-capped and validated (:mod:`swarm_gdrive.protocol.records`) and
cross-checked against its path (the node id in a file name must be the node id inside,
the run id must be this experiment's). A rejected file is logged once with its reason
and skipped; it is never trusted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from swarm_gdrive.protocol.layout import Layout, node_id_from_filename, parse_round_dir, parse_stage_dir
from swarm_gdrive.protocol.records import (
    MAX_BYTES,
    EvalRecord,
    ExperimentRecord,
    PeerRecord,
    R,
    RecordError,
    RewardRecord,
    RolloutBatch,
    StateRecord,
    decode,
    encode,
)
from swarm_gdrive.storage import FileInfo, FileTooLargeError, Storage
from swarm_gdrive.storage.base import NotRegularFileError, is_temp_of

logger = logging.getLogger(__name__)

RejectHook = Callable[[str, str], None]


class RunChangedError(RuntimeError):
    """The state belongs to another run of the experiment: it was reset while this node ran."""


@dataclass(frozen=True)
class Observed:
    """A file seen in a listing, with the record read from it (None if rejected)."""

    info: FileInfo
    record: object | None


class Exchange:
    """The shared-folder I/O of one node."""

    def __init__(
        self,
        storage: Storage,
        layout: Layout,
        node_id: str,
        run_id: str | None = None,
        on_reject: RejectHook | None = None,
    ) -> None:
        self.storage = storage
        self.layout = layout
        self.node_id = node_id
        self.run_id = run_id
        self._on_reject = on_reject
        self._newest_state: StateRecord | None = None
        self._cache: dict[str, tuple[tuple[int, float], object | None]] = {}
        self._cached_rollouts: dict[int, set[str]] = {}  # round -> rollout paths in _cache (batches are large)
        self._rejected: dict[str, str] = {}
        self._cleaned_below = 0  # rounds below this hold none of this node's rollouts any more
        self.stats = {"reads": 0, "writes": 0, "lists": 0, "deletes": 0, "bytes_read": 0, "bytes_written": 0}

    # -- generic ---------------------------------------------------------------------------

    def _reject(self, path: str, reason: str) -> None:
        if self._rejected.get(path) == reason:  # polled again, same verdict: said once already
            return
        self._rejected[path] = reason
        logger.warning("rejected %s: %s", path, reason)
        if self._on_reject is not None:
            self._on_reject(path, reason)

    def _write(self, path: str, record: object) -> None:
        data = encode(record)  # type: ignore[arg-type]
        self.storage.write_bytes(path, data)
        self.stats["writes"] += 1
        self.stats["bytes_written"] += len(data)

    def _list(self, folder: str) -> list[FileInfo]:
        self.stats["lists"] += 1
        return self.storage.list(folder)

    def _read(self, path: str, model: type[R], check_run: bool = True) -> R | None:
        """Read and validate one file; None (and a logged reason) if absent or invalid."""
        kind = model.model_fields["kind"].default
        try:
            data = self.storage.read_bytes(path, MAX_BYTES[kind])
        except FileNotFoundError:
            return None
        except FileTooLargeError as exc:
            self._reject(path, f"{exc.size} bytes exceeds the {exc.cap}-byte cap for a {kind} file")
            return None
        except NotRegularFileError as exc:
            self._reject(path, f"{exc.what}, not a regular file")
            return None
        self.stats["reads"] += 1
        self.stats["bytes_read"] += len(data)
        try:
            record = decode(data, model)
        except RecordError as exc:
            self._reject(path, str(exc))
            return None
        problem = self._cross_check(path, record, check_run)
        if problem:
            self._reject(path, problem)
            return None
        return record

    def _read_cached(self, folder: str, info: FileInfo, model: type[R]) -> R | None:
        """Read a listed file unless the same (size, mtime) was read before."""
        path = f"{folder}/{info.name}"
        key = (info.size, info.mtime)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]  # type: ignore[return-value]
        record = self._read(path, model)
        self._cache[path] = (key, record)
        return record

    def _cross_check(self, path: str, record: object, check_run: bool = True) -> str | None:
        run_id = getattr(record, "run_id", None)
        if check_run and self.run_id is not None and run_id is not None and run_id != self.run_id:
            return f"run_id {run_id} is not this experiment's ({self.run_id})"
        owner = getattr(record, "node_id", None)
        if owner is not None:
            stem = node_id_from_filename(path.rsplit("/", 1)[-1])
            if stem != owner:
                return f"node_id {owner!r} inside does not match the file name"
        return None

    # -- experiment and state --------------------------------------------------------------

    def read_experiment(self) -> ExperimentRecord | None:
        """experiment.json as it is now. It defines the run, so its run id is not checked against the reader's:
        after a reset it names the new run."""
        return self._read(self.layout.experiment_file, ExperimentRecord, check_run=False)

    def write_experiment(self, record: ExperimentRecord) -> None:
        self._write(self.layout.experiment_file, record)

    def read_state(self) -> StateRecord | None:
        """The newest state seen so far: an older file (a lagging sync) never wins.

        Raises :class:`RunChangedError` if the state belongs to another run (a reset).
        """
        state = self._read(self.layout.state_file, StateRecord, check_run=False)
        if state is not None and self.run_id is not None and state.run_id != self.run_id:
            raise RunChangedError(f"the state now belongs to run {state.run_id}, not {self.run_id}")
        if state is not None and state.experiment != self.layout.experiment:
            self._reject(self.layout.state_file, f"experiment {state.experiment!r} is not {self.layout.experiment!r}")
            state = None
        if state is not None and state.is_newer_than(self._newest_state):
            self._newest_state = state
        elif state is not None and state != self._newest_state:
            logger.info("ignoring an older state (round %d seq %d) than one already seen", state.round, state.seq)
        return self._newest_state

    def read_state_file(self) -> StateRecord | None:
        """The state file as it is now, validated, with neither the run check nor the monotonic memory of
        :meth:`read_state`: for a reader with its own trust rule (the worker's, GDRIVE_IMPLEMENTATION.md §5.5)."""
        state = self._read(self.layout.state_file, StateRecord, check_run=False)
        if state is not None and state.experiment != self.layout.experiment:
            self._reject(self.layout.state_file, f"experiment {state.experiment!r} is not {self.layout.experiment!r}")
            return None
        return state

    def write_state(self, record: StateRecord) -> None:
        self._write(self.layout.state_file, record)
        self._newest_state = record

    # -- peers -----------------------------------------------------------------------------

    def write_peer(self, record: PeerRecord) -> None:
        self._write(self.layout.peer_file(record.node_id), record)

    def read_peer(self, node_id: str) -> PeerRecord | None:
        """One node's peer file as it is now (validated; None if absent or rejected)."""
        return self._read(self.layout.peer_file(node_id), PeerRecord)

    def read_peers(self) -> dict[str, Observed]:
        """Every peer file of the folder: its listing entry and its record (re-read only when changed)."""
        folder = self.layout.peers_dir
        out: dict[str, Observed] = {}
        for info in self._list(folder):
            node_id = node_id_from_filename(info.name)
            if info.is_dir or node_id is None:
                continue
            out[node_id] = Observed(info, self._read_cached(folder, info, PeerRecord))
        return out

    # -- rewards ---------------------------------------------------------------------------

    def write_reward(self, record: RewardRecord) -> None:
        self._write(self.layout.reward_file(record.round, record.stage, record.node_id), record)

    def read_rewards(self, round_: int, stage: int) -> dict[str, RewardRecord]:
        """Valid reward submissions of a stage, by node id."""
        folder = self.layout.rewards_stage_dir(round_, stage)
        out: dict[str, RewardRecord] = {}
        for info in self._list(folder):
            if info.is_dir or node_id_from_filename(info.name) is None:
                continue
            record = self._read_cached(folder, info, RewardRecord)
            if record is not None and (record.round, record.stage) == (round_, stage):
                out[record.node_id] = record
            elif record is not None:
                self._reject(f"{folder}/{info.name}", "round/stage inside do not match the folder")
        return out

    # -- evaluations -----------------------------------------------------------------------

    def write_eval(self, record: EvalRecord) -> None:
        self._write(self.layout.eval_file(record.round, record.node_id), record)

    def read_evals(self) -> list[EvalRecord]:
        """Every valid eval record of the experiment (for reports; one listing per round folder)."""
        out: list[EvalRecord] = []
        for round_info in self._list(self.layout.evals_dir):
            round_ = parse_round_dir(round_info.name)
            if round_ is None or not round_info.is_dir:
                continue
            folder = f"{self.layout.evals_dir}/{round_info.name}"
            for info in self._list(folder):
                if info.is_dir or node_id_from_filename(info.name) is None:
                    continue
                record = self._read_cached(folder, info, EvalRecord)
                if record is not None and record.round == round_:
                    out.append(record)
        return out

    # -- rollouts --------------------------------------------------------------------------

    def write_rollouts(self, batch: RolloutBatch) -> None:
        self._write(self.layout.rollout_file(batch.round, batch.stage, batch.node_id), batch)

    def read_rollouts(
        self, round_: int, stage: int, exclude_self: bool = True, only: Collection[str] | None = None
    ) -> dict[str, RolloutBatch]:
        """Valid rollout batches of a stage by node id (of the nodes in ``only``, if given); a file is re-read only
        when it changed."""
        folder = self.layout.rollouts_stage_dir(round_, stage)
        for old in [r for r in self._cached_rollouts if r < round_]:  # readers move forward: free older batches
            for path in self._cached_rollouts.pop(old):
                self._cache.pop(path, None)
        out: dict[str, RolloutBatch] = {}
        for info in self._list(folder):
            node_id = node_id_from_filename(info.name)
            if info.is_dir or node_id is None or (exclude_self and node_id == self.node_id):
                continue
            if only is not None and node_id not in only:
                continue
            self._cached_rollouts.setdefault(round_, set()).add(f"{folder}/{info.name}")
            batch = self._read_cached(folder, info, RolloutBatch)
            if batch is not None and (batch.round, batch.stage) == (round_, stage):
                out[node_id] = batch
            elif batch is not None:
                self._reject(f"{folder}/{info.name}", "round/stage inside do not match the folder")
        return out

    # -- housekeeping ----------------------------------------------------------------------

    def own_rollout_rounds(self, since: int = 0, before: int | None = None) -> list[tuple[int, int]]:
        """(round, stage) pairs with rounds in ``[since, before)`` for which this node has a rollout file.

        Only the round folders in that range are opened, so a sweep does not re-list every kept round.
        """
        found: list[tuple[int, int]] = []
        own = f"{self.node_id}.json"
        for round_info in self._list(self.layout.rollouts_dir):
            round_ = parse_round_dir(round_info.name)
            if round_ is None or not round_info.is_dir or round_ < since or (before is not None and round_ >= before):
                continue
            for stage_info in self._list(self.layout.rollouts_round_dir(round_)):
                stage = parse_stage_dir(stage_info.name)
                if stage is None or not stage_info.is_dir:
                    continue
                names = {i.name for i in self._list(self.layout.rollouts_stage_dir(round_, stage))}
                if own in names:
                    found.append((round_, stage))
        return found

    def cleanup_rollouts(self, current_round: int, keep_last: int, archive: bool) -> int:
        """Delete (or move to archives/) this node's rollouts of rounds older than the last ``keep_last``.

        Only this node's own files are touched. Returns how many files were removed.
        """
        oldest_kept = current_round - keep_last + 1
        removed = 0
        # The first sweep of a process looks at every old round; later ones only at rounds new to the window.
        for round_, stage in self.own_rollout_rounds(since=self._cleaned_below, before=oldest_kept):
            path = self.layout.rollout_file(round_, stage, self.node_id)
            if archive:
                self.storage.move(path, self.layout.archived_rollout_file(round_, stage, self.node_id))
            else:
                self.storage.delete(path)
            self.stats["deletes"] += 1
            removed += 1
        self._cleaned_below = max(self._cleaned_below, oldest_kept)
        return removed

    def remove_own_temporaries(self, own_paths: list[str]) -> int:
        """Delete the temporary files that a killed process left beside files this node owns."""
        removed = 0
        by_folder: dict[str, set[str]] = {}
        for path in own_paths:
            folder, name = path.rsplit("/", 1)
            by_folder.setdefault(folder, set()).add(name)
        for folder, names in by_folder.items():
            for info in self.storage.list(folder, include_hidden=True):
                if any(is_temp_of(info.name, name) for name in names):
                    self.storage.delete(f"{folder}/{info.name}")
                    removed += 1
        return removed
