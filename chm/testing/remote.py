"""Storage-node processes for tests and benchmarks (``python -m chm.remote.node``).

    with NodeProcess(redis_url, "n1", tmp / "n1", secret_file) as node:
        node.info["control"], node.info["data"]   # from its ``ready`` line
        node.kill()                               # SIGKILL
        node.start()                              # a restart: same store, a new epoch

``prefix`` runs the node inside a network namespace (``["ip", "netns",
"exec", NAME]``); ``host`` is the address it listens on there.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chm.errors import ChmError

__all__ = ["NodeProcess", "write_secret"]


def write_secret(path: str | os.PathLike[str]) -> bytes:
    """Writes a fresh random secret (mode 0600) and returns it."""
    secret = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret


class NodeProcess:
    """One ``python -m chm.remote.node`` process (see the module docstring)."""

    def __init__(
        self,
        master_url: str,
        name: str,
        directory: str | os.PathLike[str],
        secret_file: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
        options: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> None:
        self.argv = [
            *prefix,
            sys.executable,
            "-m",
            "chm.remote.node",
            "--master",
            master_url,
            "--name",
            name,
            "--dir",
            os.fspath(directory),
            "--listen",
            f"{host}:0",
            "--secret-file",
            os.fspath(secret_file),
            *options,
        ]
        self.dir = Path(directory)
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}
        self._log: list[str] = []

    def start(self) -> NodeProcess:
        """Starts the node and waits for its ``ready`` line."""
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc = self.proc
        assert proc.stdout is not None and proc.stderr is not None
        err = proc.stderr
        self._log = []
        threading.Thread(target=lambda: self._log.extend(err), daemon=True).start()
        ready: list[str] = []
        out = proc.stdout

        def read_ready() -> None:
            for line in out:
                if line.startswith("ready "):
                    ready.append(line)
                    return

        t = threading.Thread(target=read_ready, daemon=True)
        t.start()
        t.join(self.timeout)
        if not ready:
            self.kill()
            tail = "".join(self._log[-20:])
            raise ChmError(
                None, f"node {self.argv[self.argv.index('--name') + 1]} not ready: {tail}"
            )
        self.info = json.loads(ready[0][len("ready ") :])
        return self

    @property
    def control(self) -> tuple[str, int]:
        host, _, port = str(self.info["control"]).rpartition(":")
        return host, int(port)

    def kill(self) -> None:
        """SIGKILL, then reaps it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM (a clean stop: the lease ends), SIGKILL after 10 s."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log(self) -> str:
        return "".join(self._log)

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
