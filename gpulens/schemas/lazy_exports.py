"""Package attributes that import their submodule on first use (PEP 562).

Every GPULens process imports some package's ``settings`` module for its configuration;
a package ``__init__`` that imported all of its modules eagerly would load, say, the
Kubernetes client or gRPC stubs into processes that never use them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: name -> the submodule defining it.

    A name is imported once and then kept in ``namespace`` (the package's globals).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
