"""A live monitoring dashboard for notebooks (ipywidgets): findings and plots of one experiment.

    from swarm_gdrive.dashboard import Dashboard
    Dashboard("/content/drive/MyDrive/swarm").show()

Reads only, like the monitor. :meth:`Dashboard.refresh` reloads the experiment and redraws; it works
without a frontend (the figures it drew are in :attr:`Dashboard.last_figures`). Auto-refresh runs
:meth:`refresh` from a background thread every ``interval`` seconds (the slider; 0 = off) and stops
with :meth:`stop_auto_refresh`; the notebook's main thread never sleeps.
"""

from __future__ import annotations

import html
import logging
import os
import threading
import time

import ipywidgets as widgets
from IPython.display import HTML, Image
from matplotlib.figure import Figure

from swarm_gdrive import plots
from swarm_gdrive.monitor import Finding, Snapshot, findings, load
from swarm_gdrive.storage import Storage, open_storage

logger = logging.getLogger(__name__)

SEVERITY_COLORS = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}


def list_experiments(storage: Storage) -> list[str]:
    """Names of the folders under ``experiments/``, sorted."""
    return sorted(info.name for info in storage.list("experiments") if info.is_dir)


def findings_html(found: list[Finding]) -> str:
    """The findings as an HTML list, colored by severity."""
    items = [
        f"<li style='color:{SEVERITY_COLORS.get(f.severity, 'black')}'><b>{html.escape(f.severity.upper())}</b> "
        f"{html.escape(f.code)}: {html.escape(f.message)}</li>"
        for f in found
    ]
    return "<ul style='margin:0'>" + "".join(items) + "</ul>"


class Dashboard:
    """Experiment selector, node filter, Refresh button, auto-refresh slider and an Output area."""

    def __init__(
        self, storage_or_path: Storage | str | os.PathLike, experiments: list[str] | None = None, refresh_s: float = 30
    ) -> None:
        if isinstance(storage_or_path, str | os.PathLike):
            storage_or_path = open_storage(os.fspath(storage_or_path))
        self.storage: Storage = storage_or_path
        self._fixed_experiments = list(experiments) if experiments is not None else None
        self.snapshot: Snapshot | None = None
        self.last_findings: list[Finding] = []
        self.last_figures: dict[str, Figure] = {}
        self.last_error: str | None = None
        self.refresh_count = 0
        self._lock = threading.RLock()
        self._quiet = False  # set while options are updated programmatically
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

        names = self._experiment_names()
        self.experiment = widgets.Dropdown(options=names, value=names[0] if names else None, description="experiment")
        self.nodes = widgets.SelectMultiple(options=[], value=(), description="nodes", rows=4)
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.interval = widgets.IntSlider(
            value=max(0, int(refresh_s)), min=0, max=600, step=1, description="auto (s)", continuous_update=False
        )
        self.status = widgets.HTML()
        self.output = widgets.Output()
        self._widget = widgets.VBox(
            [
                widgets.HBox([self.experiment, self.refresh_button, self.interval]),
                widgets.HBox([self.nodes, self.status]),
                self.output,
            ]
        )
        self.experiment.observe(self._on_experiment, names="value")
        self.nodes.observe(self._on_nodes, names="value")
        self.interval.observe(self._on_interval, names="value")
        self.refresh_button.on_click(lambda _button: self.refresh())

    # -- public API -------------------------------------------------------------------------

    @property
    def widget(self) -> widgets.Widget:
        return self._widget

    def show(self) -> None:
        """Display the dashboard, draw it once and start auto-refresh when the slider is above 0."""
        from IPython.display import display

        display(self._widget)
        self.refresh()
        if self.interval.value > 0:
            self.start_auto_refresh()

    def refresh(self) -> dict[str, Figure]:
        """Reload the experiment list and the selected experiment, then redraw; returns the figures."""
        with self._lock:
            self._update_experiments()
            name = self.experiment.value
            self.last_error = None
            try:
                self.snapshot = load(self.storage, name) if name else None
            except Exception as exc:  # a half-synced or unreadable folder must not kill the dashboard
                logger.exception("dashboard: loading %s failed", name)
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.snapshot is not None and self.snapshot.experiment != name:
                    self.snapshot = None  # keep the last good snapshot of the same experiment only
            if self.snapshot is not None:
                self._update_nodes(self.snapshot)
            self.refresh_count += 1
            return self.redraw()

    def redraw(self) -> dict[str, Figure]:
        """Redraw the last snapshot with the current node filter (no reload)."""
        with self._lock:
            snapshot = self.snapshot
            if snapshot is None:
                self.last_findings, self.last_figures = [], {}
            else:
                selected = list(self.nodes.value)
                self.last_findings = findings(snapshot)
                self.last_figures = plots.all_figures(snapshot, selected or None)
            self._render()
            return self.last_figures

    def start_auto_refresh(self, interval: float | None = None) -> None:
        """Refresh every ``interval`` seconds (default: the slider) from a background thread."""
        if interval is not None:
            self._quiet = True
            try:
                self.interval.value = max(0, int(interval))
            finally:
                self._quiet = False
        self.stop_auto_refresh()
        period = float(self.interval.value if interval is None else interval)
        if period <= 0:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(self._stop, period), name="swarm-dashboard-refresh", daemon=True
        )
        self._thread.start()

    def stop_auto_refresh(self, timeout: float = 5.0) -> None:
        """Stop the auto-refresh thread (waits for a refresh in progress, up to ``timeout`` s)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def auto_refreshing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- internals --------------------------------------------------------------------------

    def _loop(self, stop: threading.Event, period: float) -> None:
        while not stop.wait(period):
            try:
                self.refresh()
            except Exception:  # keep refreshing: the next sync may fix it
                logger.exception("dashboard: auto-refresh failed")

    def _experiment_names(self) -> list[str]:
        if self._fixed_experiments is not None:
            return self._fixed_experiments
        try:
            return list_experiments(self.storage)
        except OSError:
            logger.exception("dashboard: listing experiments failed")
            return []

    def _update_experiments(self) -> None:
        names = self._experiment_names()
        if list(self.experiment.options) == names:
            return
        current = self.experiment.value
        self._quiet = True
        try:
            self.experiment.options = names
            self.experiment.value = current if current in names else (names[0] if names else None)
        finally:
            self._quiet = False

    def _update_nodes(self, snapshot: Snapshot) -> None:
        nodes = sorted(set(snapshot.workers()) | set(snapshot.rewards["node"]))
        if list(self.nodes.options) == nodes:
            return
        selected = tuple(n for n in self.nodes.value if n in nodes)
        self._quiet = True
        try:
            self.nodes.options = nodes
            self.nodes.value = selected
        finally:
            self._quiet = False

    def _on_experiment(self, _change) -> None:
        if self._quiet:
            return
        self._quiet = True
        try:
            self.nodes.value = ()
        finally:
            self._quiet = False
        self.refresh()

    def _on_nodes(self, _change) -> None:
        if not self._quiet:
            self.redraw()

    def _on_interval(self, change) -> None:
        if self._quiet:
            return
        if change["new"] > 0:
            self.start_auto_refresh()
        else:
            self.stop_auto_refresh()

    def _render(self) -> None:
        when = time.strftime("%H:%M:%S")
        name = html.escape(str(self.experiment.value))
        error = f" <span style='color:#c62828'>{html.escape(self.last_error)}</span>" if self.last_error else ""
        self.status.value = f"<small>{name}: refreshed at {when} (#{self.refresh_count}){error}</small>"
        # clear_output/append_display_data (not ``with output:``) also work from the refresh thread.
        self.output.clear_output(wait=True)
        if self.snapshot is None:
            self.output.append_display_data(HTML("<i>no experiment selected</i>"))
            return
        self.output.append_display_data(HTML(findings_html(self.last_findings)))
        for fig in self.last_figures.values():
            self.output.append_display_data(Image(data=plots.to_png(fig, dpi=80), format="png"))
