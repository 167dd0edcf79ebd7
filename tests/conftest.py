"""Shared pytest setup: hypothesis profiles, device and KV store fixtures.

HYPOTHESIS_PROFILE selects ``default``, ``ci`` (derandomized, no deadline;
the default when CI is set) or ``nightly`` (many more examples and steps).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None)
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    max_examples=5000,
    stateful_step_count=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
)

import chm  # noqa: E402
from chm.errors import ChmError, NotSupported  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``xdist_group("name")`` run on one pytest-xdist worker.

    ``make test`` runs pytest with ``--dist loadgroup``: each worker names a
    grouped test ``<nodeid>@<group>`` and the scheduler sends one group to one
    worker. pytest-xdist 3.8 writes that name into ``item._nodeid``, which
    pytest 9.2's structured node ids no longer read (pytest-xdist issue
    #1386), so the groups were silently spread over the workers. Here the
    name is set where pytest reads it; a pytest-xdist that set it already
    leaves nothing to do.
    """
    if not getattr(config.option, "loadgroup", False):
        return  # not a pytest-xdist worker of a --dist loadgroup run
    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        suffix = "@" + "_".join(names)
        if not names or item.nodeid.endswith(suffix):
            continue
        if hasattr(item, "_id"):  # pytest >= 9.2: a NodeId keeps the string it parsed
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(item.nodeid + suffix)
        else:
            setattr(item, "_nodeid", item.nodeid + suffix)  # noqa: B010 - pytest < 9.2


BACKENDS = ("uring", "pread", "ghost")
DATA_BACKENDS = ("uring", "pread")

# A small device every test can afford: 1 MiB slots, a few of them.
SMALL: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "wbuf": "4M",
    "slot_size": "1M",
}

_probe_cache: dict[str, str | None] = {}


def backend_unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run on this host, or None when it can."""
    if name in _probe_cache:
        return _probe_cache[name]
    reason: str | None = None
    with tempfile.TemporaryDirectory(prefix="chm-probe-", dir=_tmp_parent()) as tmp:
        try:
            chm.Device.open(
                targets=[Path(tmp) / "probe.img"], backend=name, create=True, **SMALL
            ).close()
        except NotSupported as exc:
            reason = f"{name} backend unavailable here: {exc.strerror}"
        except ChmError as exc:
            if name == "uring" and exc.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES):
                reason = f"io_uring unavailable here: {exc.strerror}"
            else:
                raise
    _probe_cache[name] = reason
    return reason


def _tmp_parent() -> str | None:
    return os.environ.get("CHM_TEST_TMPDIR") or None


@pytest.fixture
def tmp_backing(tmp_path: Path) -> Path:
    """A directory for sparse backing files (O_DIRECT-capable filesystem).

    Set CHM_TEST_TMPDIR to put it elsewhere than pytest's tmp_path.
    """
    parent = _tmp_parent()
    if parent:
        d = Path(tempfile.mkdtemp(prefix="chm-test-", dir=parent))
    else:
        d = tmp_path / "backing"
        d.mkdir()
    return d


@pytest.fixture
def small_options() -> dict[str, Any]:
    """The SMALL device geometry (capacity, dram, wbuf, slot_size) as kwargs."""
    return dict(SMALL)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend in turn; skipped (with the reason) where unavailable."""
    name: str = request.param
    reason = backend_unavailable(name)
    if reason:
        pytest.skip(reason)
    return name


@pytest.fixture(params=DATA_BACKENDS)
def data_backend(request: pytest.FixtureRequest) -> str:
    """Each backend that moves real data (not ghost)."""
    name: str = request.param
    reason = backend_unavailable(name)
    if reason:
        pytest.skip(reason)
    return name


@pytest.fixture
def make_device(tmp_backing: Path) -> Iterator[Callable[..., chm.Device]]:
    """Factory: ``make_device(backend="pread", **options)`` -> open Device.

    Defaults to the SMALL geometry and a sparse file in ``tmp_backing``;
    every device is closed at teardown.
    """
    opened: list[chm.Device] = []
    counter = iter(range(1_000_000))

    def make(backend: str = "pread", **options: Any) -> chm.Device:
        kw = dict(SMALL)
        kw.update(options)
        if "targets" not in kw:
            kw["targets"] = [tmp_backing / f"dev{next(counter)}.img"]
            kw.setdefault("create", True)
        dev = chm.Device.open(backend=backend, **kw)
        opened.append(dev)
        return dev

    yield make
    for dev in opened:
        with contextlib.suppress(ChmError):
            dev.close()


# A small KV store every test can afford: 1 MiB slots on a 64 MiB pread device.
KV_SMALL: dict[str, Any] = {"capacity": "64M", "dram": "16M", "slot_size": "1M", "backend": "pread"}


@pytest.fixture
def make_store(tmp_backing: Path) -> Iterator[Callable[..., Any]]:
    """Factory: ``make_store(path=None, *, device_options=None, **options)`` -> open
    ``chm.kv.Store``.

    Defaults to KV_SMALL on a backing file in ``tmp_backing`` and a 4 MiB
    write buffer (``device_options`` replaces that; ``{}`` leaves the
    device's default). Every store is closed at teardown, last opened first;
    a store the test closed, or whose device fails the close, is let be.
    """
    from chm.kv import Store  # here, so the device tests never import the KV layer

    opened: list[Store] = []

    def make(
        path: str | os.PathLike[str] | None = None,
        *,
        device_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Store:
        kw = {**KV_SMALL, **options}
        dev = {"wbuf": "4M"} if device_options is None else device_options
        st = Store.open(tmp_backing if path is None else path, device_options=dev, **kw)
        opened.append(st)
        return st

    yield make
    for st in reversed(opened):
        with contextlib.suppress(ChmError):
            st.close()
