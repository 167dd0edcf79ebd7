"""Fixtures the remote-node tests share: a real redis-server for the
Master and a node secret file of mode 0600."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chm.testing.redisd import RedisServer
from chm.testing.remote import write_secret


@pytest.fixture
def redis_srv() -> Iterator[RedisServer]:
    """A redis-server of its own, stopped after the test."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A fresh shared secret, mode 0600."""
    p = tmp_path / "secret"
    write_secret(p)
    return p
