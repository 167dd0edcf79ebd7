"""chm-emu: host a chm device from the command line (see ``chm-emu --help``)."""

from __future__ import annotations

__all__: list[str] = []
