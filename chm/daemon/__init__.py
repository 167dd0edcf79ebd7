"""The daemon server: one device and one KV store shared by local clients
(a Unix socket) and, optionally, remote ones (TCP with a shared secret).

    from chm.daemon import Daemon, ServeOptions
    d = Daemon(ServeOptions(device={...}, socket="/run/chm/chm.sock"))
    d.start(); d.serve_forever(); d.close()

``chm-emu serve`` parses its flags into :class:`ServeOptions` and runs a
:class:`Daemon`; :mod:`chm.remote` is the client side, and
:mod:`chm.remote.protocol` the wire format both sides speak.

- :mod:`chm.daemon.server`: :class:`Daemon` (start, accept, stop, policy)
- :mod:`chm.daemon.options`: :class:`ServeOptions`, and :class:`Host`, what
  a connection may use of the daemon
- :mod:`chm.daemon.connection`: one client connection (handshake, requests)
- :mod:`chm.daemon.tcp`: the TCP front end (authentication, relay)
- :mod:`chm.daemon.sessions`: per-client scopes of handles and pins
- :mod:`chm.daemon.metrics`: the Prometheus endpoint
- :mod:`chm.daemon.devices`: block devices and the refusal of busy targets
"""

from __future__ import annotations

from .options import Host, ServeError, ServeOptions
from .server import Daemon, setup_logging

__all__ = ["Daemon", "Host", "ServeError", "ServeOptions", "setup_logging"]
