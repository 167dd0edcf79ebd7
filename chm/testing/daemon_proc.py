"""A ``chm-emu serve`` process for tests and benchmarks: start, wait, signal.

with DaemonProcess(["--target", img, "--create", "--capacity", "256M"], sock) as d:
    dev = chm.connect(d.socket)
    ...
    d.kill()          # SIGKILL, as a crash
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["DaemonProcess"]


class DaemonProcess:
    def __init__(self, args: list[str], socket: str | os.PathLike[str], log: str | None = None):
        self.socket = os.fspath(socket)
        self.args = [*args, "--socket", self.socket]
        self.log_path = log or self.socket + ".log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self, timeout: float = 30.0) -> DaemonProcess:
        try:
            self._offset = os.path.getsize(self.log_path)  # this run's lines start here
        except OSError:
            self._offset = 0
        logf = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chm_emu.cli", "serve", *self.args],
            stdout=logf,
            stderr=logf,
        )
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"chm-emu serve exited with {self.proc.returncode}:\n{self.log_text()}"
                )
            if any(e.get("event") == "start" for e in self.events()):
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"chm-emu serve did not start within {timeout} s:\n{self.log_text()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text()
        except OSError:
            return ""

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines of this run."""
        out = []
        for line in self.log_text()[self._offset :].splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Sends sig and waits; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def __enter__(self) -> DaemonProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop(timeout=30.0)
            except subprocess.TimeoutExpired:
                self.kill()
