"""``swarm-gdrive dashboard``: a local web page that follows the experiments of a shared folder.

The page lists every experiment of the folder; for the chosen one it shows the round and status, the workers
with their heartbeat's age, the findings of ``status``, and the figures: reward per node, the SAPO mix
(rollouts published and external groups used), held-out pass@1, live workers and the time split of a round.
It refreshes itself: every ``refresh`` seconds its script fetches the experiment's part of the page again and
swaps it in when it changed. The server reads only (the folder's files, as ``status`` does), listens on
127.0.0.1 unless told otherwise, and renders an experiment at most once per half refresh, however many pages
are open. Its URLs are relative, so it also works behind Colab's port proxy
(:func:`swarm_gdrive.notebook.show_web_dashboard`); the command's parser and entry point are
:mod:`swarm_gdrive.cli.readers`.
"""

from __future__ import annotations

import base64
import html
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from swarm_gdrive.observe.figure_texts import FIGURE_TEXTS
from swarm_gdrive.observe.monitor import _state_summary, findings, list_experiments, load, status_table
from swarm_gdrive.storage import Storage

logger = logging.getLogger(__name__)

REFRESH_S = 10.0
#: The figures on the page, in order, with their captions (the captions: ``figure_texts.FIGURE_TEXTS``).
FIGURES = {
    name: FIGURE_TEXTS[name].page
    for name in ("reward_per_round", "rollouts_exchanged", "eval_pass1", "live_workers", "time_split", "training")
}
#: Asynchronous rounds (ROUND_MODE=async): these figures too, and other captions where a figure shows time.
ASYNC_FIGURES = {name: text.async_page for name, text in FIGURE_TEXTS.items() if text.async_page and not text.page}
ASYNC_CAPTIONS = {name: text.async_page for name, text in FIGURE_TEXTS.items() if text.async_page and text.page}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
nav a { margin-right: 1em; } nav a.current { font-weight: bold; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
.findings li.warning { color: #a60; } .findings li.error { color: #b00; }
figure { display: inline-block; margin: 0.5em; } figure img { max-width: 100%; width: 640px; }
#updated { color: #777; font-size: small; }
"""

_SCRIPT = """
const part = "experiment?name=" + encodeURIComponent(%(experiment)s);
let shown = document.getElementById("content").innerHTML;
async function refresh() {
  const note = document.getElementById("updated");
  try {
    const answer = await fetch(part, {cache: "no-store"});
    if (!answer.ok) { note.textContent = "the dashboard answered " + answer.status; return; }
    const text = await answer.text();
    if (text !== shown) { document.getElementById("content").innerHTML = text; shown = text; }
    note.textContent = "updated " + new Date().toLocaleTimeString() + ", every %(refresh_s)g s";
  } catch (err) {
    note.textContent = "cannot reach the dashboard (" + err + "): is swarm-gdrive dashboard still running?";
  }
}
setInterval(refresh, %(refresh_ms)d);
"""


class Pages:
    """What the server shows: the page and each experiment's part, rendered at most once per ``fresh_s``."""

    def __init__(self, storage: Storage, default: str | None, refresh_s: float, liveness_timeout: float) -> None:
        self.storage = storage
        self.default = default
        self.refresh_s = refresh_s
        self.liveness_timeout = liveness_timeout
        self._cache: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._names: tuple[float, list[str]] | None = None
        self._names_lock = threading.Lock()

    def experiments(self) -> list[str]:
        """The folder's experiments, listed at most once per half refresh: every open page's poll asks."""
        with self._names_lock:
            if self._names is None or time.monotonic() - self._names[0] >= self.refresh_s / 2:
                self._names = (time.monotonic(), list_experiments(self.storage))
            return list(self._names[1])

    def page(self, experiment: str | None) -> tuple[int, str]:
        names = self.experiments()
        chosen = experiment or (self.default if self.default in names else names[0] if names else None)
        nav = " ".join(
            f'<a href="?experiment={html.escape(n)}"{" class=current" if n == chosen else ""}>{html.escape(n)}</a>'
            for n in names
        )
        if chosen is None:
            body, status = "<p>No experiment in this folder yet: a coordinator creates one when it starts.</p>", 200
        elif chosen not in names:
            body, status = f"<p>No experiment {html.escape(chosen)!s} in this folder.</p>", 404
        else:
            body, status = self.part(chosen), 200
        script = _SCRIPT % {
            "experiment": _js_string(chosen or ""),
            "refresh_s": self.refresh_s,
            "refresh_ms": self.refresh_s * 1000,
        }
        text = (
            "<!doctype html><html><head><meta charset=utf-8>"
            f"<title>swarm-gdrive: {html.escape(chosen or 'no experiment')}</title><style>{_STYLE}</style></head>"
            f"<body><nav>experiments: {nav or 'none'}</nav><main id=content>{body}</main>"
            f"<p id=updated>refreshes every {self.refresh_s:g} s</p><script>{script}</script></body></html>"
        )
        return status, text

    def part(self, experiment: str) -> str:
        """The experiment's part of the page (cached for half a refresh)."""
        with self._lock:
            cached = self._cache.get(experiment)
            if cached is not None and time.monotonic() - cached[0] < self.refresh_s / 2:
                return cached[1]
            text = self._render(experiment)
            self._cache[experiment] = (time.monotonic(), text)
            return text

    def _render(self, experiment: str) -> str:
        from swarm_gdrive.observe import plots  # matplotlib: only once a page is asked for

        snapshot = load(self.storage, experiment, liveness_timeout=self.liveness_timeout)
        state = snapshot.state_record or {}
        found = findings(snapshot, self.liveness_timeout)
        items = "".join(
            f"<li class={f.severity}><b>{f.severity}</b> {html.escape(f.code)}: {html.escape(f.message)}</li>"
            for f in found
        )
        figures = []
        shown = {**FIGURES, **ASYNC_FIGURES, **ASYNC_CAPTIONS} if snapshot.is_async else FIGURES
        for name, caption in shown.items():
            figure = getattr(plots, name)(snapshot)
            data = base64.b64encode(plots.to_png(figure, dpi=80)).decode()
            figures.append(
                f'<figure data-figure="{name}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        # Asynchronous, the state's round is no clock (each worker's own round is in the summary and the table).
        where = 'data-round="" data-mode="async"' if snapshot.is_async else f'data-round="{state.get("round", "")}"'
        return (
            f'<section data-experiment="{html.escape(experiment)}" {where} '
            f'data-status="{html.escape(str(state.get("status", "")))}">'
            f"<h1>{html.escape(experiment)}</h1><p>{html.escape(_state_summary(snapshot))}</p>"
            f"<h2>Workers</h2><pre>{html.escape(status_table(snapshot)) or 'no worker yet'}</pre>"
            f"<h2>Findings</h2><ul class=findings>{items or '<li>none</li>'}</ul>"
            f"<h2>Figures</h2>{''.join(figures)}</section>"
        )


def _js_string(text: str) -> str:
    """``text`` as a JavaScript string literal that is also safe inside a <script> element."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("<", "\\u003c").replace(">", "\\u003e")
    return f'"{escaped}"'


def make_server(pages: Pages, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """The HTTP server (not started): ``/`` the page, ``/experiment?name=E`` an experiment's part."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            query = parse_qs(url.query)
            try:
                if url.path.endswith("/experiment"):
                    name = (query.get("name") or [""])[0]
                    if name not in pages.experiments():
                        self._send(HTTPStatus.NOT_FOUND, f"no experiment {html.escape(name)}")
                        return
                    self._send(HTTPStatus.OK, pages.part(name))
                elif url.path in ("/", "") or url.path.endswith("/"):
                    status, text = pages.page((query.get("experiment") or [None])[0])
                    self._send(status, text)
                else:
                    self._send(HTTPStatus.NOT_FOUND, "not found")
            except Exception as exc:  # noqa: BLE001 - a bad file must not end the server; the page says why
                logger.exception("dashboard: %s failed", self.path)
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, f"could not read the folder: {html.escape(str(exc))}")

        def _send(self, status: int, text: str) -> None:
            # A name that is not UTF-8 never reaches a page (the storage leaves it out of its listings); should one
            # come through a message, it is shown escaped (\udcff) instead of failing the answer.
            body = text.encode("utf-8", "backslashreplace")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            logger.debug("dashboard: " + format, *args)

    return ThreadingHTTPServer((host, port), Handler)
