"""Caller buffers as flat byte arrays: buffer-protocol objects, numpy, torch.

Sources may be anything with the buffer protocol (bytes, bytearray,
memoryview, numpy arrays, ...) or a CPU torch tensor; destinations must be
writable. Both must be C-contiguous: the bytes are copied as they lie.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chm.errors import InvalidArgument

__all__ = ["as_dst", "as_src"]


def _tensor_array(obj: Any, what: str) -> np.ndarray[Any, Any] | None:
    """A numpy array sharing a torch tensor's memory, or None if obj is not one."""
    mod = type(obj).__module__
    if not mod.startswith("torch"):
        return None
    if getattr(obj, "device", None) is not None and str(obj.device) != "cpu":
        raise InvalidArgument(None, f"{what}: a torch tensor on {obj.device}; pass a CPU tensor")
    if not obj.is_contiguous():
        raise InvalidArgument(None, f"{what}: the torch tensor is not contiguous")
    t = obj.detach()
    arr: np.ndarray[Any, Any]
    try:
        arr = np.from_dlpack(t)
    except (TypeError, RuntimeError, BufferError):  # dtypes numpy lacks (bfloat16)
        arr = t.view(-1).view(__import__("torch").uint8).numpy()
    return arr


def _array(obj: Any, what: str) -> np.ndarray[Any, Any]:
    if isinstance(obj, np.ndarray):
        return obj
    arr = _tensor_array(obj, what)
    if arr is not None:
        return arr
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            None, f"{what}: {type(obj).__name__} has no buffer protocol (and is no torch tensor)"
        ) from None
    if not mv.c_contiguous:
        raise InvalidArgument(None, f"{what}: the buffer is not C-contiguous")
    return np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, np.uint8)


def as_src(obj: Any, what: str = "source") -> np.ndarray[Any, Any]:
    """The bytes of a source buffer as a flat uint8 array (no copy)."""
    arr = _array(obj, what)
    if not arr.flags.c_contiguous:
        raise InvalidArgument(None, f"{what}: the array is not C-contiguous")
    return arr.reshape(-1).view(np.uint8)


def as_dst(obj: Any, what: str = "destination") -> np.ndarray[Any, Any]:
    """A writable destination buffer as a flat uint8 array (no copy)."""
    arr = _array(obj, what)
    if not arr.flags.c_contiguous:
        raise InvalidArgument(None, f"{what}: the array is not C-contiguous")
    if not arr.flags.writeable:
        raise InvalidArgument(None, f"{what}: the buffer is read-only")
    return arr.reshape(-1).view(np.uint8)
