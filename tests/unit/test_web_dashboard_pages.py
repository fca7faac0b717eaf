"""The web dashboard's pages without a browser: empty folders, unknown names, hostile files, Colab's proxy."""

from __future__ import annotations

import sys
import types
import urllib.error
import urllib.request

import pytest

from swarm_gdrive import notebook
from swarm_gdrive.notebook import show_web_dashboard
from swarm_gdrive.observe.web import FIGURES


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def serve(monkeypatch):
    servers = []

    def start(folder, **kwargs):
        server, url = show_web_dashboard(str(folder), port=0, **kwargs)
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_empty_folder_and_unknown_names_say_so(tmp_path, serve, capsys):
    url = serve(tmp_path)
    assert capsys.readouterr().out.strip() == f"dashboard: {url}"  # outside Colab: a link
    status, page = get(url)
    assert status == 200 and "No experiment in this folder yet" in page
    status, page = get(url + "?experiment=nope")
    assert status == 404 and "No experiment nope in this folder" in page
    status, _ = get(url + "experiment?name=nope")
    assert status == 404
    assert get(url + "elsewhere")[0] == 404


def test_hostile_files_are_findings_not_a_broken_page(tmp_path, serve):
    state = tmp_path / "experiments" / "bad" / "state"
    state.mkdir(parents=True)
    (state / "current_state.json").write_bytes(b"\xff\xfe<script>alert(1)</script>")
    (tmp_path / "experiments" / "bad" / "peers").mkdir()
    (tmp_path / "experiments" / "bad" / "peers" / "w1.json").write_text('{"kind": "peer", "node_id": 7}')
    url = serve(tmp_path, experiment="bad")
    status, page = get(url)
    assert status == 200 and '<section data-experiment="bad"' in page
    assert "<script>alert(1)" not in page  # nothing read is put in the page unescaped
    status, part = get(url + "experiment?name=bad")
    assert status == 200 and part.count("<figure") == len(FIGURES)


def test_in_colab_the_page_is_shown_through_the_kernel_port_proxy(tmp_path, serve, monkeypatch):
    shown = []
    output = types.SimpleNamespace(serve_kernel_port_as_iframe=lambda port, height: shown.append((port, height)))
    colab = types.ModuleType("google.colab")
    colab.output = output  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setattr(notebook, "in_colab", lambda: True)
    url = serve(tmp_path)
    assert shown == [(int(url.rsplit(":", 1)[1].strip("/")), 900)]
