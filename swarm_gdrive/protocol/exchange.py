"""Publishing this node's files and reading the swarm's, through a Storage.

Everything read is size-capped and validated (:mod:`swarm_gdrive.protocol.records`) and
cross-checked against its path (the node id in a file name must be the node id inside,
the run id must be this experiment's). A rejected file is logged once with its reason
and skipped; it is never trusted. The same holds for what is not a file at all: a folder
where a file belongs, a file (or FIFO, device, link) where a folder belongs, a path the
store refuses; only an outage of the store itself (``StorageUnavailableError``) is raised,
for the caller's bounded wait to ride out.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

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
    encode_checked,
)
from swarm_gdrive.storage import FileInfo, FileTooLargeError, Storage
from swarm_gdrive.storage.base import (
    NotRegularFileError,
    StorageUnavailableError,
    is_temp_of,
    make_dirs,
    prefetch_folders,
)

logger = logging.getLogger(__name__)

RejectHook = Callable[[str, str], None]

#: Reasons for names a listing shows in the wrong shape.
A_FOLDER = "a folder, not a regular file"
NOT_A_FOLDER = "not a folder (a file, FIFO, device or link where a folder belongs)"
#: Why :meth:`Exchange.read_rollouts` left a listed batch unread (its ``skipped`` argument).
NOT_ASKED = "not asked for"
OVER_BUDGET = "over the read budget"
#: Longest a poll of the state reuses an earlier read of it while the listing shows the same entry: a listing
#: may lag behind an update (Drive's listings are not promised to be current), a download by id does not.
STATE_REUSE_S = 5.0
#: Files of one listing downloaded at once (a thread each, kept for the node's life): on a remote store a
#: round's rewards or a stage's peer batches cost about one round trip instead of one each.
READ_CONCURRENCY = 8
#: Longest a round's first write waits for the folder lookup started at its start (:meth:`Exchange.prefetch_round`)
#: before it looks the folders up itself.
PREFETCH_WAIT_S = 60.0


def os_reason(exc: OSError) -> str:
    """A one-line reason for an error of the store that is not an outage: what the path is, not a traceback."""
    if isinstance(exc, NotADirectoryError):
        return "a file where a folder of its path belongs"
    if isinstance(exc, IsADirectoryError):
        return A_FOLDER
    if isinstance(exc, NotRegularFileError):
        return f"{exc.what}, not a regular file"
    if isinstance(exc, FileTooLargeError):
        return f"{exc.size} bytes exceeds the {exc.cap}-byte cap"
    return f"unreadable ({type(exc).__name__}: {exc.strerror or exc})"


@dataclass
class ReadBudget:
    """What a reader may still read: ``files`` distinct files, ``bytes`` bytes (a re-read counts again)."""

    files: int
    bytes: int
    paths: set[str] = field(default_factory=set)

    def allows(self, path: str, size: int) -> bool:
        return (path in self.paths or len(self.paths) < self.files) and size <= self.bytes

    def spend(self, path: str, size: int) -> None:
        self.paths.add(path)
        self.bytes -= size


def listing_key(info: FileInfo) -> tuple[int, float, str | None]:
    """What must be unchanged for an earlier read of a listed file to stand for it."""
    return (info.size, info.mtime, info.version)


class RunChangedError(RuntimeError):
    """The state belongs to another run of the experiment: it was reset while this node ran."""


@dataclass(frozen=True)
class Observed:
    """A file seen in a listing, with the record read from it (None if rejected)."""

    info: FileInfo
    record: object | None


def retention_seconds(mode: str, max_staleness_seconds: float, sync_lag: float) -> float:
    """How long a worker keeps its own rollout batch beyond its last ROLLOUT_KEEP_LAST_N_ROUNDS rounds (0: no longer).

    Asynchronous (§5.10): each worker's rounds advance at its own pace, so a writer's last N rounds say nothing about
    what a peer may still take; a peer takes no batch older than MAX_STALENESS_SECONDS (its own clock), so the writer
    keeps each batch that long, plus SYNC_LAG for clocks that disagree and files that reach the peer late. With no
    bound in seconds (0) nothing tells when a batch is out of reach: the last N rounds are kept, as in sync.
    """
    if mode != "async" or not max_staleness_seconds:
        return 0.0
    return max_staleness_seconds + sync_lag


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
        #: The coordinator's (protocol/signing.py): every experiment.json and state this node writes is signed by it.
        self.signer: Callable[[Any], Any] | None = None
        self._newest_state: StateRecord | None = None
        self._cache: dict[str, tuple[tuple[int, float, str | None], object | None]] = {}
        self._cached_rollouts: dict[int, set[str]] = {}  # round -> rollout paths in _cache (batches are large)
        self._rejected: dict[str, str] = {}
        self._cleaned_below = 0  # rounds below this hold none of this node's rollouts any more
        self._own_created: dict[tuple[int, int], float] = {}  # (round, stage) -> created_at of its own batches
        self._registered: set[str] = set()  # workers of this run with a valid peer file, as seen so far
        self._prepared: set[int] = set()  # rounds whose folders this node created ahead (prepare_round)
        self._state_read_at = -math.inf  # when the state file was last downloaded (monotonic)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._prefetching: Future[None] | None = None  # prefetch_round under way
        self.stats = {
            "reads": 0,
            "listed_reads": 0,  # of the reads, the ones whose bytes came in a listing (no download)
            "writes": 0,
            "lists": 0,
            "deletes": 0,
            "bytes_read": 0,
            "bytes_written": 0,
        }

    # -- generic ---------------------------------------------------------------------------

    def _reject(self, path: str, reason: str) -> None:
        if self._rejected.get(path) == reason:  # polled again, same verdict: said once already
            return
        self._rejected[path] = reason
        logger.warning("rejected %s: %s", path, reason)
        if self._on_reject is not None:
            self._on_reject(path, reason)

    def rejection(self, path: str) -> str | None:
        """Why ``path`` was last rejected, if it was."""
        return self._rejected.get(path)

    def _write(self, path: str, record: object) -> None:
        data = encode_checked(record)  # type: ignore[arg-type]
        self.storage.write_bytes(path, data)
        self.stats["writes"] += 1
        self.stats["bytes_written"] += len(data)

    def _list(self, folder: str) -> list[FileInfo]:
        """The folder's entries; none (and a logged reason) when the store refuses to list it."""
        self.stats["lists"] += 1
        try:
            return self.storage.list(folder)
        except StorageUnavailableError:
            raise
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            self._reject(folder, os_reason(exc))
            return []

    def entries(self, folder: str) -> list[FileInfo]:
        """The folder's entries; none (and a logged reason) when the store refuses to list it."""
        return self._list(folder)

    def _files(self, folder: str) -> Iterator[tuple[FileInfo, str]]:
        """``(entry, node id)`` of each ``{node id}.json`` of ``folder``; such a name that is a folder is rejected."""
        for info in self._list(folder):
            node_id = node_id_from_filename(info.name)
            if node_id is None:
                continue
            if info.is_dir:
                self._reject(f"{folder}/{info.name}", A_FOLDER)
                continue
            yield info, node_id

    def numbered_folders(self, folder: str, parse: Callable[[str], int | None]) -> Iterator[tuple[FileInfo, int]]:
        """``(entry, number)`` of each ``round_N`` (or ``stage_N``) folder; such a name that is not a folder is
        rejected."""
        for info in self._list(folder):
            number = parse(info.name)
            if number is None:
                continue
            if not info.is_dir:
                self._reject(f"{folder}/{info.name}", NOT_A_FOLDER)
                continue
            yield info, number

    def _read(self, path: str, model: type[R], check_run: bool = True) -> R | None:
        """Read and validate one file; None (and a logged reason) if absent or invalid."""
        kind = model.model_fields["kind"].default
        try:
            data = self.storage.read_bytes(path, MAX_BYTES[kind])
        except OSError as exc:
            return self._unread(path, kind, exc)
        return self._verify(path, data, model, check_run)

    def _unread(self, path: str, kind: str, exc: OSError) -> None:
        """What a failed read means: absent (None), an outage (raised), or a rejection (logged, None)."""
        if isinstance(exc, FileNotFoundError):
            return None
        if isinstance(exc, StorageUnavailableError):
            raise exc
        if isinstance(exc, FileTooLargeError):
            self._reject(path, f"{exc.size} bytes exceeds the {exc.cap}-byte cap for a {kind} file")
            return None
        self._reject(path, os_reason(exc))  # a folder, FIFO or device in its place, a file in its path, a link
        return None

    def close(self) -> None:
        """Let go of the download threads; a download still under way is not waited for."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _fetch_all(self, paths: list[str], cap: int) -> list[bytes | OSError]:
        """The bytes of each path (or the OSError its read raised), downloaded concurrently when there are several."""

        def fetch(path: str) -> bytes | OSError:
            try:
                return self.storage.read_bytes(path, cap)
            except OSError as exc:
                return exc

        if len(paths) < 2:
            return [fetch(p) for p in paths]
        return list(self._executor().map(fetch, paths))

    def _executor(self) -> ThreadPoolExecutor:
        """The download threads (started on first use, let go by :meth:`close`)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(READ_CONCURRENCY, thread_name_prefix="exchange-read")
            return self._pool

    def _read_listed(
        self, folder: str, infos: Iterable[FileInfo], model: type[R], check_run: bool = True, inline: bool = True
    ) -> dict[str, R | None]:
        """Several listed files of ``folder``, validated, by name: the ones new or changed since their last read
        are taken from the listing where it carried their content (:attr:`FileInfo.inline`, unless ``inline`` is
        False) or downloaded together (:data:`READ_CONCURRENCY`), then validated here in order."""
        infos = list(infos)
        out: dict[str, R | None] = {}
        missing: list[FileInfo] = []
        for info in infos:
            hit, record = self._cached(f"{folder}/{info.name}", info)
            if hit:
                out[info.name] = record  # type: ignore[assignment]
            else:
                missing.append(info)
        kind = model.model_fields["kind"].default
        got: dict[str, bytes | OSError] = {i.name: i.inline for i in missing if inline and i.inline is not None}
        self.stats["listed_reads"] += len(got)
        downloads = [i.name for i in missing if i.name not in got]
        got.update(zip(downloads, self._fetch_all([f"{folder}/{n}" for n in downloads], MAX_BYTES[kind]), strict=True))
        for info in missing:
            path, data = f"{folder}/{info.name}", got[info.name]
            if isinstance(data, OSError):
                record = self._unread(path, kind, data)
            else:
                record = self._verify(path, data, model, check_run)
            self._cache[path] = (listing_key(info), record)
            out[info.name] = record
        return {info.name: out[info.name] for info in infos}

    def _verify(self, path: str, data: bytes, model: type[R], check_run: bool = True) -> R | None:
        """Decode and cross-check what was read from ``path``; None (and a logged reason) if invalid."""
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

    def _cached(self, path: str, info: FileInfo) -> tuple[bool, object | None]:
        """(True, record) when ``path`` was read before with the same (size, mtime); (False, None) otherwise."""
        cached = self._cache.get(path)
        if cached is not None and cached[0] == listing_key(info):
            return True, cached[1]
        return False, None

    def _read_cached(self, folder: str, info: FileInfo, model: type[R]) -> R | None:
        """Read a listed file unless the same (size, mtime, version) was read before."""
        return self._read_listed(folder, [info], model)[info.name]

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
        self._write(self.layout.experiment_file, record if self.signer is None else self.signer(record))

    def read_state(self) -> StateRecord | None:
        """The newest state seen so far: an older file (a lagging sync) never wins.

        Raises :class:`RunChangedError` if the state belongs to another run (a reset).
        """
        state = self._read_state()
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
        state = self._read_state()
        if state is not None and state.experiment != self.layout.experiment:
            self._reject(self.layout.state_file, f"experiment {state.experiment!r} is not {self.layout.experiment!r}")
            return None
        return state

    def _read_state(self) -> StateRecord | None:
        """The state file, validated; downloaded only when its listing entry (size, mtime, version) changed since
        the last read, so a poll of an unchanged state costs a listing of ``state/``, not the O(N) bytes of a
        state naming every live worker. Anything but a regular file in the listing is read directly, for the
        reason its read gives."""
        folder, name = self.layout.state_file.rsplit("/", 1)
        entry = next((info for info in self._list(folder) if info.name == name), None)
        if entry is None or entry.is_dir:
            return self._read(self.layout.state_file, StateRecord, check_run=False)
        path = self.layout.state_file
        unchanged = self._cached(path, entry)[0]
        stale = entry.version is None or time.monotonic() - self._state_read_at > STATE_REUSE_S
        if stale:
            # A store whose listing has no version (whole-second mtimes: two quick writes of one size look alike),
            # or a reuse old enough that a listing lagging behind an update may be what kept it: read again, and
            # not from that listing (a changed entry's own copy is newer than the last read: it may be used).
            self._cache.pop(path, None)
        if stale or not unchanged:
            self._state_read_at = time.monotonic()
        return self._read_listed(folder, [entry], StateRecord, check_run=False, inline=not unchanged)[name]

    def write_state(self, record: StateRecord) -> StateRecord:
        """Write the state file (signed by :attr:`signer`, when set); returns the record as written."""
        record = record if self.signer is None else self.signer(record)
        self._write(self.layout.state_file, record)
        self._newest_state = record
        return record

    # -- peers -----------------------------------------------------------------------------

    def write_peer(self, record: PeerRecord) -> None:
        self._write(self.layout.peer_file(record.node_id), record)

    def read_peer(self, node_id: str) -> PeerRecord | None:
        """One node's peer file as it is now (validated; None if absent or rejected)."""
        return self._read(self.layout.peer_file(node_id), PeerRecord)

    def read_peers(self) -> dict[str, Observed]:
        """Every peer file of the folder: its listing entry and its record (re-read only when changed)."""
        return self.read_peer_files(self.peer_files())

    def peer_files(self) -> dict[str, FileInfo]:
        """The listing entry of every ``peers/{node id}.json``, by node id; nothing is downloaded."""
        return {node_id: info for info, node_id in self._files(self.layout.peers_dir)}

    def read_peer_files(self, entries: dict[str, FileInfo]) -> dict[str, Observed]:
        """The records of the listed peer files in ``entries`` (re-read only when changed, several at once)."""
        records = self._read_listed(self.layout.peers_dir, entries.values(), PeerRecord)
        return {node_id: Observed(info, records[info.name]) for node_id, info in entries.items()}

    def registered_workers(self) -> set[str]:
        """Names with a valid peer file of a worker of this run (alive or stopped).

        A name, once registered, stays so for this process: only peer files of names not known yet are read.
        """
        folder = self.layout.peers_dir
        for info, node_id in self._files(folder):
            if node_id not in self._registered:
                record = self._read_cached(folder, info, PeerRecord)
                if record is not None and record.role == "worker":
                    self._registered.add(node_id)
        return set(self._registered)

    # -- round folders ---------------------------------------------------------------------

    def prepare_experiment(self) -> None:
        """Create the experiment's shared folders (:attr:`Layout.shared_dirs`) where the backend can: the
        coordinator, before it writes experiment.json. Best effort, as :meth:`prepare_round`."""
        self._make_folders(self.layout.shared_dirs, "not created ahead of the workers")

    def _make_folders(self, folders: list[str], what: str) -> bool:
        """make_dirs of each folder; something planted in the way is logged, an unavailable store ends it early.
        True when the store answered every call."""
        for folder in folders:
            try:
                make_dirs(self.storage, folder)
            except StorageUnavailableError as exc:
                logger.warning("%s %s: the store is unavailable (%s)", ", ".join(folders), what, exc)
                return False
            except OSError as exc:
                self._reject(folder, f"{what}: {os_reason(exc)}")
        return True

    def prepare_round(self, round_: int, stages: int) -> None:
        """Create the rewards and rollouts folders of every stage of ``round_`` where the backend can (the
        coordinator, ahead of the round; every writer creates what is missing anyway). Best effort: an outage or
        something planted where a folder belongs is logged, never raised."""
        if round_ in self._prepared:
            return
        folders = [
            folder
            for stage in range(stages)
            for folder in (self.layout.rewards_stage_dir(round_, stage), self.layout.rollouts_stage_dir(round_, stage))
        ]
        if not self._make_folders(folders, "not created ahead of its round"):
            return
        self._prepared.add(round_)

    def prepared(self, round_: int) -> bool:
        """Whether this node made ``round_``'s folders (:meth:`prepare_round`)."""
        return round_ in self._prepared

    def prefetch_round(self, round_: int, stages: int) -> None:
        """Let the backend resolve the round's rewards and rollouts folders together (a worker, as a round starts:
        on Drive two queries for both trees instead of two each), on a download thread while the caller goes on
        (generation); the round's first write or rollout listing waits for it. Best effort: a failure only loses
        the gain."""
        if getattr(self.storage, "prefetch_folders", None) is None:
            return  # nothing to gain (a local folder)
        folders = [
            folder
            for stage in range(stages)
            for folder in (self.layout.rollouts_stage_dir(round_, stage), self.layout.rewards_stage_dir(round_, stage))
        ]

        def prefetch() -> None:
            try:
                prefetch_folders(self.storage, folders)
            except OSError as exc:
                logger.info("round %d's folders not looked up ahead (%s); each write looks them up", round_, exc)

        self._prefetching = self._executor().submit(prefetch)

    def _prefetched(self) -> None:
        """Wait for a prefetch under way (:meth:`prefetch_round`), so the caller uses the folders it resolved."""
        pending, self._prefetching = self._prefetching, None
        if pending is None:
            return
        try:
            pending.result(timeout=PREFETCH_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - cancelled at close, or slower than the wait: the caller looks up
            logger.info("folder prefetch not used (%s)", type(exc).__name__)

    # -- rewards ---------------------------------------------------------------------------

    def write_reward(self, record: RewardRecord) -> None:
        self._prefetched()
        self._write(self.layout.reward_file(record.round, record.stage, record.node_id), record)

    def read_rewards(
        self,
        round_: int,
        stage: int,
        only: Collection[str] | None = None,
        entries: Mapping[str, FileInfo] | None = None,
    ) -> dict[str, RewardRecord]:
        """Valid reward submissions of a stage, by node id (of the nodes in ``only``, if given). ``entries``: the
        stage folder's entries by node id from an earlier :meth:`node_entries` (not listed again)."""
        folder = self.layout.rewards_stage_dir(round_, stage)
        out: dict[str, RewardRecord] = {}
        pairs = self._files(folder) if entries is None else ((info, node) for node, info in entries.items())
        listed = [info for info, node_id in pairs if only is None or node_id in only]
        records = self._read_listed(folder, listed, RewardRecord)  # only new or changed files are downloaded
        for info in listed:
            record = records[info.name]
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
        for round_info, round_ in self.numbered_folders(self.layout.evals_dir, parse_round_dir):
            folder = f"{self.layout.evals_dir}/{round_info.name}"
            out += self.read_eval_folder(folder, round_, self.node_entries(folder))
        return out

    def node_entries(self, folder: str) -> dict[str, FileInfo]:
        """The ``{node id}.json`` entries of ``folder`` by node id (one listing; such a name that is a folder is
        rejected)."""
        return {node_id: info for info, node_id in self._files(folder)}

    def read_eval_folder(self, folder: str, round_: int, entries: Mapping[str, FileInfo]) -> list[EvalRecord]:
        """The valid eval records of the listed ``entries`` of the round folder ``folder`` (a reader that bounds
        what it reads picks the entries)."""
        out: list[EvalRecord] = []
        for info in entries.values():
            record = self._read_cached(folder, info, EvalRecord)
            if record is not None and record.round == round_:
                out.append(record)
        return out

    # -- rollouts --------------------------------------------------------------------------

    def write_rollouts(self, batch: RolloutBatch) -> None:
        self._prefetched()
        self._write(self.layout.rollout_file(batch.round, batch.stage, batch.node_id), batch)
        if batch.node_id == self.node_id:  # its age, for retention (cleanup_rollouts), without reading it back
            self._own_created[(batch.round, batch.stage)] = batch.created_at

    def read_rollouts(
        self,
        round_: int,
        stage: int,
        exclude_self: bool = True,
        only: Collection[str] | None = None,
        budget: ReadBudget | None = None,
        skipped: dict[str, str] | None = None,
        first: Collection[str] = (),
        evict_older: bool = True,
        listed: Mapping[str, FileInfo] | None = None,
    ) -> dict[str, RolloutBatch]:
        """Valid rollout batches of a stage by node id; a file is re-read only when it changed.

        ``only``: read only these nodes' files (None: every one). ``budget``: read no more files and bytes than
        it allows, the nodes in ``first`` before the others. ``skipped`` receives, for each listed batch left
        unread, why (:data:`NOT_ASKED`, :data:`OVER_BUDGET`). ``evict_older``: the batches of earlier rounds
        kept from earlier reads are let go (a reader of the rounds in order); False for a reader of several
        rounds at once (the asynchronous pickup), which lets go itself (:meth:`forget_rollouts`). ``listed``: the
        stage folder's entries by node id from an earlier :meth:`rollout_entries` (a reader that lists a folder once
        for several reads); the folder is not listed again.
        """
        folder = self.layout.rollouts_stage_dir(round_, stage)
        self._prefetched()
        if evict_older:  # readers move forward: free older batches
            self.forget_rollouts(before_round=round_)
        entries = self._files(folder) if listed is None else ((info, node) for node, info in listed.items())
        wanted, reserved = self._batches_to_read(entries, folder, round_, exclude_self, only, budget, skipped, first)
        before = self.stats["bytes_read"]
        batches = self._read_listed(folder, [info for info, _ in wanted], RolloutBatch)  # several at once
        if budget is not None:  # reserved by listed size; a file that grew since its listing costs the rest
            budget.bytes -= max(0, self.stats["bytes_read"] - before - reserved)
        out: dict[str, RolloutBatch] = {}
        for info, node_id in wanted:
            batch = batches[info.name]
            if batch is not None and (batch.round, batch.stage) == (round_, stage):
                out[node_id] = batch
            elif batch is not None:
                self._reject(f"{folder}/{info.name}", "round/stage inside do not match the folder")
        return out

    def forget_rollouts(self, before_round: int) -> None:
        """Let go of the batches of rounds before ``before_round`` kept from earlier reads."""
        for old in [r for r in self._cached_rollouts if r < before_round]:
            for path in self._cached_rollouts.pop(old):
                self._cache.pop(path, None)

    def forget_rollout_file(self, round_: int, stage: int, node_id: str) -> None:
        """Let go of one node's batch of a stage kept from an earlier read (a reader of several rounds at once)."""
        path = self.layout.rollout_file(round_, stage, node_id)
        self._cache.pop(path, None)
        held = self._cached_rollouts.get(round_)
        if held is not None:
            held.discard(path)
            if not held:
                del self._cached_rollouts[round_]

    def rollout_entries(self, round_: int, stage: int) -> dict[str, FileInfo]:
        """The listed rollout files of a stage by node id (one listing), for :meth:`read_rollouts`'s ``listed``."""
        self._prefetched()
        return {node_id: info for info, node_id in self._files(self.layout.rollouts_stage_dir(round_, stage))}

    def _batches_to_read(
        self,
        entries: Iterable[tuple[FileInfo, str]],
        folder: str,
        round_: int,
        exclude_self: bool,
        only: Collection[str] | None,
        budget: ReadBudget | None,
        skipped: dict[str, str] | None,
        first: Collection[str],
    ) -> tuple[list[tuple[FileInfo, str]], int]:
        """The listed batches :meth:`read_rollouts` reads (``first`` first), and the budget bytes they reserve."""
        entries = sorted(entries, key=lambda entry: (entry[1] not in first, entry[0].name))
        wanted: list[tuple[FileInfo, str]] = []
        reserved = 0
        for info, node_id in entries:
            if exclude_self and node_id == self.node_id:
                continue
            why = None
            if only is not None and node_id not in only:
                why = NOT_ASKED
            else:
                cost = self._within_budget(f"{folder}/{info.name}", info, round_, budget)
                if cost is None:
                    why = OVER_BUDGET
                else:
                    reserved += cost
                    wanted.append((info, node_id))
            if why is not None and skipped is not None:
                skipped[node_id] = why
        return wanted, reserved

    def _within_budget(self, path: str, info: FileInfo, round_: int, budget: ReadBudget | None) -> int | None:
        """The bytes of ``budget`` the batch at ``path`` reserves (0 when cached or not counted), or None when the
        budget does not allow reading it."""
        if self._cached(path, info)[0]:
            return 0
        # A file over the cap of a batch is refused before a byte of it is read: it costs the budget nothing.
        if budget is not None and info.size <= MAX_BYTES["rollouts"]:
            if not budget.allows(path, info.size):
                return None
            budget.spend(path, info.size)
            self._cached_rollouts.setdefault(round_, set()).add(path)
            return info.size
        self._cached_rollouts.setdefault(round_, set()).add(path)
        return 0

    # -- housekeeping ----------------------------------------------------------------------

    def own_rollout_rounds(self, since: int = 0, before: int | None = None) -> list[tuple[int, int]]:
        """(round, stage) pairs with rounds in ``[since, before)`` for which this node has a rollout file.

        Only the round folders in that range are opened, so a sweep does not re-list every kept round. A name
        in the wrong shape (a file for a round folder, a folder for this node's file) is rejected and skipped.
        """
        return list(self._own_rollout_rounds(since, before))

    def _own_rollout_rounds(self, since: int, before: int | None) -> Iterator[tuple[int, int]]:
        """:meth:`own_rollout_rounds` in round order, each round's stage folders listed only when it is reached."""
        rounds = sorted(
            r
            for _, r in self.numbered_folders(self.layout.rollouts_dir, parse_round_dir)
            if r >= since and (before is None or r < before)
        )
        for round_ in rounds:
            stage_folders = self.numbered_folders(self.layout.rollouts_round_dir(round_), parse_stage_dir)
            for stage in sorted(stage for _, stage in stage_folders):
                folder = self.layout.rollouts_stage_dir(round_, stage)
                if any(node_id == self.node_id for _, node_id in self._files(folder)):
                    yield round_, stage

    def _own_batch_created(self, round_: int, stage: int) -> float | None:
        """The ``created_at`` of this node's batch of the stage (None: the file holds no batch of this node and run).

        On a store where names differ only in case name one file (Drive for desktop on macOS and Windows),
        ``w1.json`` may hold ``W1``'s batch: the content, not the name, says whose the file is.
        """
        # _read's cross-check rejects a batch whose node id is not the file name's (and one of another run).
        batch = self._read(self.layout.rollout_file(round_, stage, self.node_id), RolloutBatch)
        if batch is None:
            return None
        self._own_created[(round_, stage)] = batch.created_at
        return batch.created_at

    def cleanup_rollouts(
        self, current_round: int, keep_last: int, archive: bool, keep_seconds: float = 0.0, now: float | None = None
    ) -> int:
        """Delete (or move to archives/) this node's rollouts of rounds older than the last ``keep_last``, except
        (``keep_seconds`` > 0, :func:`retention_seconds`) those created less than ``keep_seconds`` ago (``now``, this
        node's ``time.time()``): a peer may still take them. A writer's batches are created in round order, so the
        sweep stops at the first one that young.

        Only files that hold this node's own batch of this run are touched (:meth:`_own_batch_created`); a file the
        store refuses to remove or move is logged and left for the next sweep. Returns how many were removed.
        """
        now = time.time() if now is None else now
        oldest_kept = current_round - keep_last + 1
        if keep_seconds:
            young = [r for (r, _), at in self._own_created.items() if now - at < keep_seconds]
            oldest_kept = min([oldest_kept, *young])
            if oldest_kept <= self._cleaned_below:
                return 0  # nothing old enough: not even a listing
        removed = 0
        retry_from = oldest_kept
        # The first sweep of a process looks at every old round; later ones only at rounds new to the window.
        for round_, stage in self._own_rollout_rounds(self._cleaned_below, oldest_kept):
            created = self._own_batch_created(round_, stage)  # read: the content says whose the file is
            if created is None:
                continue
            if keep_seconds and now - created < keep_seconds:
                retry_from = min(retry_from, round_)
                break
            path = self.layout.rollout_file(round_, stage, self.node_id)
            try:
                if archive:
                    self.storage.move(path, self.layout.archived_rollout_file(round_, stage, self.node_id))
                else:
                    self.storage.delete(path)
            except OSError as exc:  # an outage, or the archive's path blocked: try again at the next sweep
                reason = "the store is unavailable" if isinstance(exc, StorageUnavailableError) else os_reason(exc)
                self._reject(path, f"not {'archived' if archive else 'deleted'}: {reason}")
                retry_from = min(retry_from, round_)
                continue
            self.stats["deletes"] += 1
            self._own_created.pop((round_, stage), None)
            removed += 1
        self._cleaned_below = max(self._cleaned_below, retry_from)
        for key in [k for k in self._own_created if k[0] < self._cleaned_below]:
            del self._own_created[key]
        return removed

    def remove_empty_rollout_dirs(self, before_round: int) -> int:
        """Remove the rollout folders of rounds older than ``before_round`` that workers have emptied.

        Best effort, never raising: a name in the wrong shape (a file or FIFO where a round or stage folder
        belongs) is rejected and left, and so is a folder the store refuses to remove (tried again next time).
        Returns how many folders were removed.
        """
        removed = 0
        try:
            for _, round_ in self.numbered_folders(self.layout.rollouts_dir, parse_round_dir):
                if round_ >= before_round:
                    continue
                for _, stage in self.numbered_folders(self.layout.rollouts_round_dir(round_), parse_stage_dir):
                    removed += self._remove_empty_dir(self.layout.rollouts_stage_dir(round_, stage))
                removed += self._remove_empty_dir(self.layout.rollouts_round_dir(round_))
        except StorageUnavailableError as exc:
            logger.warning("pruning the rollout folders stopped: the store is unavailable (%s); next round again", exc)
        return removed

    def _remove_empty_dir(self, folder: str) -> bool:
        try:
            gone = self.storage.remove_empty_dir(folder)
        except StorageUnavailableError:
            raise
        except OSError as exc:
            self._reject(folder, f"not removed: {os_reason(exc)}")
            return False
        self.stats["deletes"] += int(gone)
        return gone

    def remove_own_temporaries(self, own_paths: list[str]) -> int:
        """Delete the temporary files that a killed process left beside files this node owns.

        A temporary-looking name that is a folder is not this node's leftover: it is left alone.
        """
        removed = 0
        by_folder: dict[str, set[str]] = {}
        for path in own_paths:
            folder, name = path.rsplit("/", 1)
            by_folder.setdefault(folder, set()).add(name)
        for folder, names in by_folder.items():
            try:
                listing = self.storage.list(folder, include_hidden=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for info in listing:
                if info.is_dir or not any(is_temp_of(info.name, name) for name in names):
                    continue
                try:
                    self.storage.delete(f"{folder}/{info.name}")
                except OSError as exc:
                    if isinstance(exc, StorageUnavailableError):
                        raise
                    logger.warning("could not remove %s/%s: %s", folder, info.name, os_reason(exc))
                    continue
                removed += 1
        return removed
