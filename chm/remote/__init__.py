"""Clients of the chm-emu daemon: :func:`connect` and the wire protocol."""

from __future__ import annotations

from chm.remote.client import DaemonGone, RemoteDevice, RemoteHandle, RemoteStore, connect

__all__ = ["DaemonGone", "RemoteDevice", "RemoteHandle", "RemoteStore", "connect"]
