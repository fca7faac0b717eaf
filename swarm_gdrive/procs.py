"""Launch and stop node processes with their output streamed live (demo, notebooks, tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

LineSink = Callable[[str], None]


#: ``-P`` (Python 3.11+): a node started as ``python -m`` does not put the working directory first on its path, so a
#: ``torch.py`` or ``numpy.py`` beside the folder it was started from (the shared folder, if someone ran the command
#: there) is never imported. Python 3.10 has no such flag: start nodes from a folder only you write.
SAFE_PATH: list[str] = ["-P"] if sys.version_info >= (3, 11) else []


class NodeProcess:
    """One node as a child process (``python -m swarm_gdrive.launcher``).

    Its stdout and stderr are read line by line by a thread and handed to ``sink``
    prefixed with ``name``; the pipe is never left unread, so the child never blocks on it.
    """

    def __init__(
        self, name: str, env: Mapping[str, str], sink: LineSink | None = None, argv: Sequence[str] | None = None
    ) -> None:
        """``argv``: the command (default: the launcher under this Python)."""
        self.name = name
        self.lines: list[str] = []
        self._sink = sink
        self.proc = subprocess.Popen(
            list(argv) if argv is not None else [sys.executable, *SAFE_PATH, "-u", "-m", "swarm_gdrive.launcher"],
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._pump, name=f"out-{name}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self._sink is not None:
                self._sink(f"[{self.name}] {line}")

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout=5)
        return code

    def terminate(self, timeout: float = 120.0) -> int:
        """SIGTERM (a clean stop that flushes), then SIGKILL if it has not exited within ``timeout``.

        The default leaves a stopped worker time to save its checkpoint of the last round (a full fine-tune of
        SmolLM2-135M: a GB or more to the shared folder) before it exits.

        Native Windows delivers no SIGTERM: there ``send_signal`` ends the child at once (TerminateProcess), unflushed.
        """
        self.request_stop()
        return self.await_exit(timeout)

    def request_stop(self) -> None:
        """SIGTERM, if it still runs: the node stops cleanly (a worker saves its stop checkpoint first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def await_exit(self, timeout: float) -> int:
        """Its exit code, once it exits; SIGKILL if it has not within ``timeout`` seconds."""
        try:
            return self.wait(max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.wait()

    def kill(self) -> int:
        """SIGKILL: the node dies without cleaning up, as a crashed runtime would."""
        self.proc.kill()
        return self.wait()


def stop_all(processes: list[NodeProcess], timeout: float = 120.0) -> dict[str, int]:
    """Stop every process cleanly: SIGTERM to all at once (no worker trains on while another saves its stop
    checkpoint), then wait for each until one shared deadline ``timeout`` seconds away, SIGKILL for those still
    running then; returns exit codes by name."""
    deadline = time.monotonic() + timeout
    for p in processes:
        p.request_stop()
    return {p.name: p.await_exit(deadline - time.monotonic()) for p in processes}
