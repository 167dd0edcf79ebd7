"""Adapters that make a chm KV store a tier of an existing serving stack.

One module per engine, each importable only when that engine is installed
(``pip install 'chm[lmcache]'``, ...); importing it without the engine raises
ImportError naming the extra to install. The adapters translate calls and
keys; what to prefetch, evict or skip is decided in :mod:`chm.kv`.

- :mod:`chm.integrations.lmcache`: an LMCache storage plugin
  (``storage_plugins: [chm]``).
"""

from __future__ import annotations

import importlib.util

__all__ = ["require"]


def require(module: str, extra: str, what: str) -> None:
    """Raises ImportError naming ``chm[extra]`` if ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"{what} needs the {module!r} package, which is not installed: "
            f"pip install 'chm[{extra}]'",
            name=module,
        )
