"""The device state machine of chm.testing, run against the daemon.

Every step goes through chm.connect() to a real chm-emu serve process over
the machine's target files; the model's expectations are those of the
embedded device. Few examples by default (each starts a daemon);
HYPOTHESIS_PROFILE=nightly runs more.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from hypothesis import settings

import chm
from chm.remote import RemoteDevice
from chm.testing import device_machine
from chm.testing.model import ModelRequest
from chm_emu.serve_proc import DaemonProcess

_Base: Any = device_machine("pread", "prefetch", name="DaemonPrefetchMachine")


class DaemonMachine(_Base):  # type: ignore[misc]
    def create_device(self, targets: list[str], options: dict[str, Any]) -> RemoteDevice:
        self._sockdir = tempfile.mkdtemp(prefix="chm-machine-sock-")
        cfg = os.path.join(self._sockdir, "serve.toml")
        lines = ["[device]", f"targets = {[str(t) for t in targets]!r}".replace("'", '"')]
        lines += [f"backend = {self.backend!r}".replace("'", '"'), f'mode = "{self.mode}"']
        for k, v in options.items():
            lines.append(f"{k} = {v!r}".replace("'", '"') if not isinstance(v, bool)
                         else f"{k} = {str(v).lower()}")  # fmt: skip
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self._daemon = DaemonProcess(
            ["--config", cfg, "--no-kv"], os.path.join(self._sockdir, "chm.sock")
        ).start()
        return chm.connect(self._daemon.socket)

    def view_info(self, req: ModelRequest) -> tuple[int, int, int]:
        dev = self.d
        assert isinstance(dev, RemoteDevice)
        return dev.view_info(req.handle)

    # The daemon client's batch calls are all or nothing (RemoteDevice.
    # prefetch_many raises at the first refusal and returns RemoteHandles),
    # not a status per element as chm.Device's: the machine's per-element
    # batch rules do not apply to it, so they are not rules of this machine.
    def prefetch_batch(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not a rule of the daemon machine")

    def release_batch(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not a rule of the daemon machine")

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            d = getattr(self, "_daemon", None)
            if d is not None:
                d.stop()


DaemonMachine.TestCase.settings = settings(
    DaemonMachine.TestCase.settings,
    max_examples=int(os.environ.get("CHM_DAEMON_MACHINE_EXAMPLES", "4")),
    stateful_step_count=25,
    deadline=None,
)
TestDaemonMachine = DaemonMachine.TestCase
