"""A live monitoring dashboard for notebooks (ipywidgets 7.7 or 8): findings and plots of an experiment.

    from swarm_gdrive.observe.dashboard import Dashboard
    dashboard = Dashboard(storage, selected="my-run")
    dashboard.show()            # draw once; the controls work whenever the kernel is idle
    dashboard.run(30, 3600)     # redraw every 30 s for an hour, in this cell; the stop button ends it

Reads only, like the monitor. The experiment dropdown lists every experiment of the folder and
is re-listed on each refresh, so experiments started later appear. :meth:`Dashboard.refresh`
reloads and redraws; it works without a frontend (the figures it drew are in
:attr:`Dashboard.last_figures`, the outputs it shows in ``dashboard.output.outputs``).

Auto-refresh is a loop in the foreground (:meth:`Dashboard.run`), not a background thread:
Colab renders no widget update made from another thread, and the same loop works in Jupyter.
While it runs the kernel is busy, so the controls take effect once it has ended.
"""

from __future__ import annotations

import base64
import html
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ipywidgets as widgets
from matplotlib.figure import Figure

from swarm_gdrive.observe import monitor, plots
from swarm_gdrive.observe.monitor import Finding, Snapshot, findings, load, status_table
from swarm_gdrive.storage import Storage, open_storage

logger = logging.getLogger(__name__)

SEVERITY_COLORS = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}


def list_experiments(storage: Storage) -> list[str]:
    """Names of the experiment folders under ``experiments/``, sorted (:func:`monitor.list_experiments
    <swarm_gdrive.observe.monitor.list_experiments>`: a folder no experiment can be named is left out)."""
    return monitor.list_experiments(storage)


def findings_html(found: list[Finding]) -> str:
    """The findings as an HTML list, colored by severity."""
    items = [
        f"<li style='color:{SEVERITY_COLORS.get(f.severity, 'black')}'><b>{html.escape(f.severity.upper())}</b> "
        f"{html.escape(f.code)}: {html.escape(f.message)}</li>"
        for f in found
    ]
    return "<ul style='margin:0'>" + "".join(items) + "</ul>"


def _display_data(data: dict[str, str]) -> dict:
    """One output of an Output widget, as its ``outputs`` trait holds it (the same in ipywidgets 7 and 8)."""
    return {"output_type": "display_data", "data": data, "metadata": {}}


class Dashboard:
    """Experiment selector, node filter, Refresh button, a status line and an Output area."""

    def __init__(
        self,
        storage_or_path: Storage | str | os.PathLike,
        experiments: list[str] | None = None,
        refresh_s: float = 30,
        selected: str | None = None,
    ) -> None:
        """``experiments``: a fixed list for the dropdown (None: every experiment of the folder, re-listed on
        each refresh); ``selected``: the experiment shown first (listed even before its folder exists);
        ``refresh_s``: the default period of :meth:`run`."""
        if isinstance(storage_or_path, str | os.PathLike):
            storage_or_path = open_storage(os.fspath(storage_or_path))
        self.storage: Storage = storage_or_path
        self.refresh_s = float(refresh_s)
        self._fixed_experiments = list(experiments) if experiments is not None else None
        self._selected = selected
        self.snapshot: Snapshot | None = None
        self.last_findings: list[Finding] = []
        self.last_figures: dict[str, Figure] = {}
        self.last_error: str | None = None
        self.refresh_count = 0
        self._quiet = False  # set while options are updated programmatically
        self._shown = False

        names = self._experiment_names()
        first = selected if selected in names else (names[0] if names else None)
        self.experiment = widgets.Dropdown(options=names, value=first, description="experiment")
        self.nodes = widgets.SelectMultiple(options=[], value=(), description="nodes", rows=4)
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.status = widgets.HTML()
        self.output = widgets.Output()
        self._widget = widgets.VBox(
            [
                widgets.HBox([self.experiment, self.refresh_button]),
                widgets.HBox([self.nodes, self.status]),
                self.output,
            ]
        )
        self.experiment.observe(self._on_experiment, names="value")
        self.nodes.observe(self._on_nodes, names="value")
        self.refresh_button.on_click(lambda _button: self.refresh())

    # -- public API -------------------------------------------------------------------------

    @property
    def widget(self) -> widgets.Widget:
        return self._widget

    def show(self) -> None:
        """Display the dashboard and draw it once."""
        from IPython.display import display

        display(self._widget)
        self._shown = True
        self.refresh()

    def run(self, refresh_s: float | None = None, duration_s: float | None = None) -> int:
        """Redraw every ``refresh_s`` seconds (default: the constructor's) in the calling cell, until
        ``duration_s`` seconds have passed (None: until stopped) or the stop button interrupts it;
        returns the number of refreshes. Displays the dashboard first if :meth:`show` was not called."""
        period = self.refresh_s if refresh_s is None else float(refresh_s)
        if period <= 0:
            raise ValueError(f"refresh_s={refresh_s!r}: use a number of seconds > 0")
        if not self._shown:
            self.show()
        started = time.monotonic()
        deadline = None if duration_s is None else started + duration_s
        next_at, count, why = started + period, 0, "after the set duration"
        try:
            with _noting_interrupts() as interrupted:
                while deadline is None or next_at <= deadline:
                    while not interrupted and time.monotonic() < next_at:  # slices: a noted interrupt acts soon
                        time.sleep(min(0.5, max(0.0, next_at - time.monotonic())))
                    if interrupted:  # the KeyboardInterrupt itself was swallowed (see _noting_interrupts)
                        raise KeyboardInterrupt
                    self.refresh()
                    count += 1
                    next_at = max(next_at + period, time.monotonic())  # a slow refresh does not pile up others
        except KeyboardInterrupt:
            why = "by the stop button"
        if interrupted:  # noted during the last refresh before the deadline: the button ended it all the same
            why = "by the stop button"
        print(
            f"dashboard: {count} refreshes in {time.monotonic() - started:.0f} s, ended {why}; "
            "the controls work again (run the cell again to resume auto-refresh)",
            flush=True,
        )
        return count

    def refresh(self) -> dict[str, Figure]:
        """Reload the experiment list and the selected experiment, then redraw; returns the figures."""
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
        snapshot = self.snapshot
        if snapshot is None:
            self.last_findings, self.last_figures = [], {}
        else:
            selected = list(self.nodes.value)
            try:
                self.last_findings = findings(snapshot)
                self.last_figures = plots.all_figures(snapshot, selected or None)
            except Exception as exc:  # noqa: BLE001 - whatever the folder holds, the dashboard stays up and says why
                logger.exception("dashboard: drawing %s failed", snapshot.experiment)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.last_findings, self.last_figures = [], {}
        self._render()
        return self.last_figures

    # -- internals --------------------------------------------------------------------------

    def _experiment_names(self) -> list[str]:
        if self._fixed_experiments is not None:
            names = list(self._fixed_experiments)
        else:
            try:
                names = list_experiments(self.storage)
            except OSError:
                logger.exception("dashboard: listing experiments failed")
                names = []
        if self._selected and self._selected not in names:
            names = sorted([*names, self._selected])
        return names

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

    def _render(self) -> None:
        when = time.strftime("%H:%M:%S")
        name = html.escape(str(self.experiment.value))
        error = f" <span style='color:#c62828'>{html.escape(self.last_error)}</span>" if self.last_error else ""
        self.status.value = f"<small>{name}: refreshed at {when} (#{self.refresh_count}){error}</small>"
        # One assignment of the Output widget's state: no clear/append messages, which ipywidgets 7 and 8
        # route differently and which a frontend may apply out of order.
        if self.snapshot is None:
            self.output.outputs = (_display_data({"text/html": "<i>no experiment selected</i>", "text/plain": ""}),)
            return
        outputs = [_display_data({"text/html": findings_html(self.last_findings), "text/plain": "findings"})]
        if self.snapshot.is_async:  # no round clock: each worker's own round, done or not, in the table
            table = f"<pre>{html.escape(status_table(self.snapshot))}</pre>"
            outputs.append(_display_data({"text/html": table, "text/plain": "workers"}))
        for title, fig in self.last_figures.items():
            png = base64.b64encode(plots.to_png(fig, dpi=80)).decode("ascii")
            outputs.append(_display_data({"image/png": png, "text/plain": f"<{title}>"}))
        self.output.outputs = tuple(outputs)


@contextmanager
def _noting_interrupts() -> Iterator[list[int]]:
    """Note each SIGINT (Colab's stop button) in a list before the kernel's handler raises KeyboardInterrupt.

    Python delivers a signal between bytecodes of the main thread; when that happens inside a finaliser
    (``__del__``, a weakref callback run by the garbage collector during matplotlib drawing), the
    KeyboardInterrupt is printed as "Exception ignored" and lost, and a loop without a deadline would run on.
    The note survives that, so the refresh loop ends within half a second. (A list, not a threading.Event:
    an Event's lock is not reentrant, and a second SIGINT during ``set`` would deadlock.) Outside the main
    thread, or when SIGINT is not handled by Python, nothing is changed."""
    interrupted: list[int] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):
        yield interrupted
        return

    def note(signum, frame):
        interrupted.append(signum)
        return previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
