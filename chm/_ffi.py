"""The only importer of the generated cffi module."""

from chm._chm_cffi import ffi, lib

__all__ = ["ffi", "lib"]
