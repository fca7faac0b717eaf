"""Start one node from the environment: ``python -m swarm_gdrive.launcher`` or ``swarm-gdrive run``.

Exit codes: 0 finished or stopped cleanly; 2 bad input (nothing written); 3 gave up
(no coordinator, experiment reset); 1 unexpected error.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from swarm_gdrive import logctx, progress
from swarm_gdrive.config import Config, ConfigError, from_env
from swarm_gdrive.protocol.coordinator import Coordinator, ExperimentMismatchError
from swarm_gdrive.protocol.exchange import Exchange
from swarm_gdrive.protocol.heartbeat import live_twin
from swarm_gdrive.protocol.identity import Identity, IdentityError, claim_identity
from swarm_gdrive.protocol.layout import Layout
from swarm_gdrive.protocol.worker import Worker
from swarm_gdrive.protocol.workload import SyntheticWorkload, Workload
from swarm_gdrive.storage import Storage, StorageError, storage_for
from swarm_gdrive.training.models import ModelNotFoundError

logger = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


def install_signal_handlers(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM and the first Ctrl-C ask for a clean stop; a second Ctrl-C interrupts at once.

    Returns the handlers they replaced, for :func:`restore_signal_handlers`: a node run inside a
    notebook's kernel must leave the kernel's own Ctrl-C handling as it found it.
    """

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        logger.warning(
            "received %s: finishing the current step, saving a checkpoint (a worker, unless one is under "
            "STOP_CHECKPOINT_MIN_SECONDS old), flushing, then stopping; Ctrl-C again interrupts at once",
            signal.Signals(signum).name,
        )
        stop.set()

    return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def make_workload(config: Config, storage: Storage, node_id: str, stop: threading.Event) -> Workload:
    """The workload named by WORKLOAD."""
    if config.workload == "grpo":
        from swarm_gdrive.training.grpo_workload import GRPOWorkload  # torch and transformers: workers only

        return GRPOWorkload(config, storage, node_id, stop)
    if config.workload == "synthetic":
        logger.warning("WORKLOAD=synthetic: a stand-in that trains no model (protocol tests, load benchmarks)")
        return SyntheticWorkload(config.num_train_samples, config.num_generations, config.synthetic_step_seconds, stop)
    raise ConfigError("WORKLOAD", config.workload, "unknown workload")  # pragma: no cover - parse rejects it


def run_node(
    environ: Mapping[str, str] | None = None, stop: threading.Event | None = None, own_process: bool = False
) -> int:
    """Validate the environment, claim an identity and run the node's role; returns the exit code.

    ``own_process``: the process is this node's alone (``swarm-gdrive run``), so its environment may be set
    for the libraries it loads (not so in a notebook's kernel)."""
    try:
        config = from_env(environ)
    except ConfigError as exc:
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logctx.setup(config.log_level, [config.huggingface_access_token or ""])
    progress.configure(config.progress)
    if own_process:
        progress.quiet_libraries()
    try:
        identity = claim_identity(config.local_dir, config.experiment_name, config.node_role, config.node_id)
    except IdentityError as exc:
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logctx.set_node(identity.node_id)
    stop = stop or threading.Event()
    previous_handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous_handlers = install_signal_handlers(stop)
    try:
        return _run_role(config, identity, stop)
    finally:
        restore_signal_handlers(previous_handlers)


def _run_role(config: Config, identity: Identity, stop: threading.Event) -> int:
    try:
        storage = storage_for(config)
    except StorageError as exc:  # no credentials, or a backend refusing the location
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        identity.release()
        return EXIT_BAD_INPUT
    logger.info(
        "%s %s, experiment %s on %s: %s",
        config.node_role,
        identity.node_id,
        config.experiment_name,
        storage.describe(),
        config.summary(),
    )
    # Every setting, secrets as <set>/<unset>: on request, or at DEBUG.
    logger.log(logging.INFO if config.log_settings == "full" else logging.DEBUG, "settings: %s", config.describe())
    twin = _live_twin(config, storage, identity.node_id, stop)
    if twin is not None:
        print(
            f"swarm-gdrive: error: NODE_ID={identity.node_id!r}: another process is already running as this node "
            f"({twin}): stop it first, or give this node another NODE_ID",
            file=sys.stderr,
        )
        identity.release()
        return EXIT_BAD_INPUT
    try:
        if config.is_coordinator:
            return Coordinator(config, storage, identity.node_id, stop).run()
        return Worker(config, storage, identity, make_workload(config, storage, identity.node_id, stop), stop).run()
    except (ExperimentMismatchError, ModelNotFoundError, _device_error()) as exc:
        print(f"swarm-gdrive: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        identity.release()


def _live_twin(config: Config, storage: Storage, node_id: str, stop: threading.Event) -> str | None:
    """Another live process with this NODE_ID, seen in this run's peer file before anything is written (§7)."""
    exchange = Exchange(storage, Layout(config.experiment_name), node_id)
    try:
        experiment = exchange.read_experiment()
    except OSError as exc:  # the node's own first reads will meet it again and say so
        logger.warning("could not read experiment.json to look for another process with this NODE_ID: %s", exc)
        return None
    if experiment is None:  # no run yet: no peer file of it either
        return None
    exchange.run_id = experiment.run_id
    return live_twin(exchange, config.heartbeat_interval, config.sync_lag, stop)


def _device_error() -> type[Exception]:
    """trainer.DeviceError when torch is already loaded (a worker), else a class nothing raises."""
    trainer = sys.modules.get("swarm_gdrive.training.policy")
    return trainer.DeviceError if trainer is not None else ExperimentMismatchError


def main() -> None:
    code = run_node(own_process=True)
    # The node is done and its files are closed: skip the interpreter's last collection, which walks every object
    # torch, transformers and reasoning-gym made (about 1 s of a worker's exit on 2 cores, measured; bench/README §10).
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()
