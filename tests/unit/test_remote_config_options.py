"""The daemon's configuration, rebuilt on the client from its effective fields."""

from __future__ import annotations

import chm
from chm.remote import protocol


def test_every_config_field_is_carried_or_named_as_derived() -> None:
    # a field added to chm_config must be carried to the client (or named
    # as derived), else a client's Config silently differs from the daemon's
    fields = set(chm.Config().to_dict())
    carried = set(protocol._SAME) | set(protocol._RENAMED) | {"timing"}
    assert fields - carried == set(protocol._DERIVED)


def test_a_rebuilt_config_reads_back_what_the_daemon_was_given() -> None:
    given = chm.Config(
        mode="prefetch",
        dram="256M",
        wbuf="32M",
        slot_size="8M",
        object_size="4M",
        timing="fpga-cxlhm",
        time_dilation=4,
    )
    rebuilt = chm.Config(**protocol.config_options(given.to_dict()))
    assert rebuilt.to_dict() == given.to_dict()
    assert rebuilt["object_size"] == 4 << 20
