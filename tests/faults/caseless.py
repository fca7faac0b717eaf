"""A test double of a case-insensitive, case-preserving store (Drive for desktop on macOS and Windows, where
``w1.json`` and ``W1.json`` name one file): a LocalStorage whose every path component is matched to an
existing name without regard to case, so the first writer's spelling is kept and a later writer of another
spelling replaces that file's content."""

from __future__ import annotations

import os
from pathlib import Path

from swarm_gdrive.storage import LocalStorage
from swarm_gdrive.storage.base import DEFAULT_MAX_READ_BYTES, FileInfo


class CaselessStorage:
    """Every operation of LocalStorage on the path as the folder spells it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.inner = LocalStorage(root, retry_attempts=1)

    def _spelled(self, rel: str) -> str:
        parts, here = [], self.root
        for part in rel.split("/"):
            existing = {p.name.casefold(): p.name for p in here.iterdir()} if here.is_dir() else {}
            part = existing.get(part.casefold(), part)
            parts.append(part)
            here = here / part
        return "/".join(parts)

    def describe(self) -> str:
        return f"case-insensitive folder {self.root}"

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        return self.inner.read_bytes(self._spelled(path), max_bytes)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.inner.write_bytes(self._spelled(path), data)

    def append_bytes(self, path: str, data: bytes) -> None:
        self.inner.append_bytes(self._spelled(path), data)

    def list(self, folder: str, include_hidden: bool = False) -> list[FileInfo]:
        return self.inner.list(self._spelled(folder), include_hidden)

    def delete(self, path: str) -> None:
        self.inner.delete(self._spelled(path))

    def remove_empty_dir(self, folder: str) -> bool:
        return self.inner.remove_empty_dir(self._spelled(folder))

    def move(self, src: str, dst: str) -> None:
        self.inner.move(self._spelled(src), self._spelled(dst))
