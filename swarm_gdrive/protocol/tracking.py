"""Experiment tracking: a node's metric lines also go to TensorBoard, Weights & Biases or trackio (REPORT_TO).

As TRL's ``report_to``: a comma list of ``tensorboard``, ``wandb`` and ``trackio`` (``none``, the default, is
off; ``all`` is every one installed), each behind its optional extra (``pip install 'swarm-gdrive[wandb]'``).
Every node is one run, named by its NODE_ID and grouped by EXPERIMENT_NAME; its x-axis is the round (with
asynchronous rounds, ROUND_MODE=async, the node's own round: workers at the same step are then not at the same
moment, and the trackers' wall-clock axis, W&B's "Relative Time", TensorBoard's "Relative", compares them). The
metric lines in the shared folder keep their keys (the monitor and ``report`` read them); a tracker gets the
names a TRL user knows (:func:`tracker_key`): ``train/loss``, ``train/reward``, ``train/frac_reward_zero_std``,
``train/completions/mean_length``, ``train/kl``, ``train/clip_ratio/region_mean``, as TRL's trainers appear in
these trackers, and ``swarm/…`` for what only a swarm has (external groups, the storage, the round clock; the
asynchronous pickup's ``swarm/external_age_s_mean``, ``swarm/external_staleness_rounds_max`` … as they are).

The trackers write node-local files (``TRACKING_DIR``), never to the shared folder. W&B without an API key
(``WANDB_API_KEY`` or a ``wandb login``) and without ``WANDB_MODE`` logs offline: ``wandb sync`` uploads it later.
A tracker that fails to start or to log is logged once and dropped: tracking never stops a node.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

from swarm_gdrive.protocol.settings import ProtocolSettings

logger = logging.getLogger(__name__)

#: This package's metric keys -> the key TRL's GRPOTrainer logs (as transformers' tracker callbacks show it,
#: ``train/`` before every training metric).
TRL_KEYS = {
    "train/loss": "train/loss",
    "train/grad_norm": "train/grad_norm",
    "train/lr": "train/learning_rate",
    "train/kl": "train/kl",
    "train/entropy": "train/entropy",
    "train/clip_ratio_low_mean": "train/clip_ratio/low_mean",
    "train/clip_ratio_low_min": "train/clip_ratio/low_min",
    "train/clip_ratio_high_mean": "train/clip_ratio/high_mean",
    "train/clip_ratio_high_max": "train/clip_ratio/high_max",
    "train/clip_ratio_region_mean": "train/clip_ratio/region_mean",
    "reward/local_mean": "train/reward",
    "reward/local_std": "train/reward_std",
    "reward/local_zero_variance_fraction": "train/frac_reward_zero_std",
    "completion/length_mean": "train/completions/mean_length",
    "completion/length_max": "train/completions/max_length",
}
#: What only a swarm has, under ``swarm/`` in the trackers: the groups from other nodes, the shared folder's
#: calls, the round clock.
_SWARM_ONLY = ("reward/external", "external/", "storage/", "round/")


def tracker_key(key: str) -> str:
    """The name a metric key gets in a tracker: TRL's where TRL logs it, ``swarm/…`` where only a swarm has it,
    the rest (``train/…``, ``eval/…``, ``gen/…``, ``time/…``) as it is."""
    if key in TRL_KEYS:
        return TRL_KEYS[key]
    if key.startswith(_SWARM_ONLY) or key == "stage":
        return "swarm/" + key.replace("reward/external", "external_reward", 1)
    if key.startswith("reward/local_"):
        return "train/reward_" + key[len("reward/local_") :]
    if key.startswith("completion/"):
        return "train/completions/" + key[len("completion/") :]
    return key


def _run_name(text: str) -> str:
    """A name every tracker accepts in ids and paths: letters, digits, ``-``, ``_`` and ``.``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


def wandb_id(experiment: str, run_id: str, node_id: str) -> str:
    """The W&B run id of a node in a run of an experiment: readable, at most 64 characters (a hash keeps long
    names unique), the same after a restart so that the run resumes."""
    text = _run_name(f"{experiment}-{run_id}-{node_id}")
    if len(text) <= 64:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[:47]}-{digest}"


def tracking_for(config: ProtocolSettings, node_id: str) -> Tracking:
    """The trackers REPORT_TO names, for this node (none: a Tracking that does nothing)."""
    return Tracking(
        config.trackers,
        config.tracking_dir or str(Path(config.local_dir) / "runs"),
        config.tracking_project,
        config.experiment_name,
        node_id,
        config.node_role,
        config.describe(),  # secrets only as <set>/<unset>
    )


class Tracking:
    """The trackers of one node. :meth:`start` opens them once the run id is known; :meth:`log` takes each metric
    line of :class:`~swarm_gdrive.protocol.metrics.NodeLog`; :meth:`close` finishes them."""

    def __init__(
        self,
        names: tuple[str, ...],
        folder: str,
        project: str,
        experiment: str,
        node_id: str,
        role: str,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.names = names
        self.folder = Path(folder)
        self.project = project
        self.experiment = experiment
        self.node_id = node_id
        self.role = role
        self.settings = dict(settings or {})
        self._open: dict[str, Any] = {}  # name -> its writer or run
        self._started = False

    @property
    def active(self) -> tuple[str, ...]:
        """The trackers open now."""
        return tuple(self._open)

    def start(self, run_id: str) -> None:
        """Open every tracker for this node's run of ``run_id`` (again after a restart: the same run resumes)."""
        if self._started:
            return
        self._started = True
        for name in self.names:
            try:
                self._open[name] = getattr(self, f"_open_{name}")(run_id)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops a node
                logger.warning(
                    "REPORT_TO=%s: could not start (%s: %s); going on without it", name, type(exc).__name__, exc
                )
        if self._open:
            logger.info("tracking %s to %s (project %s)", ", ".join(self._open), self.folder, self.project)

    def log(self, values: dict[str, float | int | None], round_: int | None) -> None:
        """One metric line, under the trackers' names; values that are None are left out."""
        if not self._open:
            return
        step = round_ if round_ is not None else 0
        scalars = {tracker_key(k): float(v) for k, v in values.items() if v is not None and not isinstance(v, bool)}
        if not scalars:
            return
        for name, handle in list(self._open.items()):
            try:
                getattr(self, f"_log_{name}")(handle, scalars, step)
            except Exception as exc:  # noqa: BLE001
                logger.warning("REPORT_TO=%s: logging failed (%s: %s); dropping it", name, type(exc).__name__, exc)
                self._close_one(name)

    def close(self) -> None:
        for name in list(self._open):
            self._close_one(name)

    def _close_one(self, name: str) -> None:
        handle = self._open.pop(name)
        try:
            getattr(self, f"_close_{name}")(handle)
        except Exception as exc:  # noqa: BLE001
            logger.warning("REPORT_TO=%s: could not finish (%s: %s)", name, type(exc).__name__, exc)

    # -- TensorBoard: event files under TRACKING_DIR/tensorboard/{experiment}/{node} -----------------------

    def _open_tensorboard(self, run_id: str) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        folder = self.folder / "tensorboard" / _run_name(self.experiment) / _run_name(self.node_id)
        writer = SummaryWriter(log_dir=str(folder))
        writer.add_text("swarm/run", f"experiment {self.experiment}, run {run_id}, node {self.node_id} ({self.role})")
        return writer

    @staticmethod
    def _log_tensorboard(writer: Any, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            writer.add_scalar(key, value, global_step=step)
        writer.flush()

    @staticmethod
    def _close_tensorboard(writer: Any) -> None:
        writer.close()

    # -- Weights & Biases: a run per node, grouped by experiment; offline without an API key ---------------

    def _open_wandb(self, run_id: str) -> Any:
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key_known(wandb) else "offline")
        if mode == "offline":
            logger.info("W&B: no API key (WANDB_API_KEY or `wandb login`): logging offline; `wandb sync` uploads it")
        folder = self.folder / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=self.project,
            group=self.experiment,
            name=self.node_id,
            job_type=self.role,
            id=wandb_id(self.experiment, run_id, self.node_id),
            resume="allow",
            dir=str(folder),
            mode=mode,
            config=self.settings,
            reinit="create_new",
        )
        run.define_metric("round")
        run.define_metric("*", step_metric="round")
        return run

    @staticmethod
    def _log_wandb(run: Any, scalars: dict[str, float], step: int) -> None:
        run.log({"round": step, **scalars})

    @staticmethod
    def _close_wandb(run: Any) -> None:
        run.finish()

    # -- trackio: a local database under TRACKING_DIR/trackio (its own dashboard: `trackio show`) ----------

    def _open_trackio(self, run_id: str) -> Any:
        os.environ.setdefault("TRACKIO_DIR", str(self.folder / "trackio"))
        import trackio

        return trackio.init(
            project=self.project,
            name=_run_name(f"{self.experiment}-{self.node_id}-{run_id[:8]}"),
            group=self.experiment,
            config=self.settings,
            resume="allow",
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )

    @staticmethod
    def _log_trackio(run: Any, scalars: dict[str, float], step: int) -> None:
        run.log(scalars, step=step)

    @staticmethod
    def _close_trackio(run: Any) -> None:
        run.finish()


def _wandb_key_known(wandb: Any) -> bool:
    """Whether W&B has an API key (the environment, or a ``wandb login`` netrc entry), without prompting."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return bool(wandb.api.api_key)
    except Exception:  # noqa: BLE001 - unknown: offline is the safe side
        return False
