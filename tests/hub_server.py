"""A small Hugging Face Hub for datasets over HTTP, serving repositories from local folders: what `datasets`
(through `huggingface_hub`) asks of the Hub to load a dataset by its id, answered as the Hub answers it (a repo's
info and revision, its tree, a file's ``resolve`` URL with ``X-Repo-Commit`` and ``ETag``, 404 with
``X-Error-Code: EntryNotFound``). Point a process at it with ``HF_ENDPOINT`` (read when ``huggingface_hub`` is
imported, so in a child process). Every request is logged in :attr:`HubServer.requests`."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entries(self, repo: str, sub: str = "", recursive: bool = True) -> list[dict[str, object]]:
        """The Hub's tree entries of ``repo`` under ``sub``."""
        root = self.repos[repo]
        base = root / sub if sub else root
        out: list[dict[str, object]] = []
        for p in sorted(base.rglob("*") if recursive else base.iterdir()):
            rel = p.relative_to(root).as_posix()
            if p.is_dir():
                out.append({"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel})
            else:
                data = p.read_bytes()
                out.append({"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": rel})
        return out

    def answer(self, parts: list[str], query: str, body: bytes) -> tuple[int, object, dict[str, str]]:
        """The Hub's answer to a request for ``/``-joined ``parts``: (status, JSON object or bytes, headers)."""
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            return self._api("/".join(parts[2:4]), parts[4:], query, body)
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            root = self.repos.get("/".join(parts[1:3]))
            path = None if root is None else root / "/".join(parts[5:])
            if path is None or not path.is_file():
                return 404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}
            data = path.read_bytes()
            return 200, data, {"ETag": f'"{hashlib.sha1(data).hexdigest()}"', "X-Repo-Commit": COMMIT}
        return 404, {"error": "not served here"}, {}

    def _api(self, repo: str, rest: list[str], query: str, body: bytes) -> tuple[int, object, dict[str, str]]:
        if repo not in self.repos:
            return 404, {"error": "Repository not found"}, {}
        if not rest or rest[0] == "revision":
            siblings = [{"rfilename": e["path"]} for e in self.entries(repo) if e["type"] == "file"]
            info = {"id": repo, "sha": COMMIT, "private": False, "gated": False, "disabled": False}
            return 200, {**info, "siblings": siblings, "tags": [], "lastModified": "2026-01-01T00:00:00.000Z"}, {}
        if rest[0] == "tree":
            return 200, self.entries(repo, "/".join(rest[2:]), "recursive=true" in query.lower()), {}
        if rest[0] == "paths-info":
            wanted = {p.decode() for p in urllib.parse.parse_qs(body).get(b"paths", [])}
            return 200, [e for e in self.entries(repo) if e["path"] in wanted], {}
        return 404, {"error": "not served here"}, {}

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _route(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                hub.requests.append((self.command, self.path))
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = urllib.parse.unquote(url.path).strip("/").split("/")
                code, payload, headers = hub.answer(parts, url.query, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                for key, value in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(key, value)
                if not isinstance(payload, bytes):
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = _route

            def log_message(self, *args: object) -> None:
                pass

        return Handler
