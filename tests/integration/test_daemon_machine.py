"""The device state machine of chm.testing, run against the daemon.

Every step goes through chm.connect() to a real chm-emu serve process over
the machine's target files; the model's expectations are those of the
embedded device, batch rules included. Few examples by default (each starts a daemon);
HYPOTHESIS_PROFILE=nightly runs more.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any
from unittest import mock

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import chm
from chm.remote import RemoteDevice, RemoteHandle
from chm.testing import device_machine, stateful
from chm.testing.daemon_proc import DaemonProcess
from chm.testing.model import ModelRequest
from chm.testing.stateful import OBJ

_Base: Any = device_machine("pread", "prefetch", name="DaemonPrefetchMachine")


class _WithRemoteHandles:
    """The ``chm`` module as the machine sees it, RemoteHandle a Handle too."""

    Handle = (chm.Handle, RemoteHandle)

    def __getattr__(self, name: str) -> Any:
        return getattr(chm, name)


class DaemonMachine(_Base):  # type: ignore[misc]
    # The daemon client has no session API of its own (each client is one
    # session of the daemon's device): no session rules here.
    max_sessions = 0

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
        # the one client may hold every request entry of the device (the
        # default client quota is half of them), so the embedded device's
        # model holds for it
        g = self.geometry
        quota = str(g.slots + g.refill_queue)
        self._daemon = DaemonProcess(
            ["--config", cfg, "--no-kv", "--client-quota", quota],
            os.path.join(self._sockdir, "chm.sock"),
        ).start()
        return chm.connect(self._daemon.socket)

    def view_info(self, req: ModelRequest) -> tuple[int, int, int]:
        dev = self.d
        assert isinstance(dev, RemoteDevice)
        return dev.view_info(req.handle)

    # The daemon client's batch calls are chm.Device's (a status per element),
    # so the machine's batch rules are rules here too. Its prefetch_batch
    # names chm.Handle as the type of an issued element; here that is a
    # RemoteHandle, so the rule runs with both counted as handles.
    @precondition(lambda self: self.mode != "direct")
    @rule(
        target=_Base.handles,
        objs=st.lists(OBJ, min_size=1, max_size=8),
        noqueue=st.booleans(),
        bad=st.integers(-1, 7),
    )
    def prefetch_batch(self, objs: list[tuple[int, int]], noqueue: bool, bad: int) -> Any:
        with mock.patch.object(stateful, "chm", _WithRemoteHandles()):
            return _Base.prefetch_batch(self, objs, noqueue, bad)

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
