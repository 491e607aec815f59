"""PEP 562 attribute loading for a package's ``__init__``: each public name is imported from its module
when first used, so importing the package (and starting the ``arcfmt`` command) costs only what the
command then uses."""
from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any


def module_attributes(package: str, names: Mapping[str, str], computed: Mapping[str, Callable[[], Any]]
                      ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``names`` maps a public name to the submodule
    defining it, ``computed`` a name to the function making its value; any other public name is a
    submodule. Each value is kept in the package's namespace, so it is looked up once."""
    def __getattr__(name: str) -> Any:
        if name in computed:
            value = computed[name]()
        elif name in names:
            value = getattr(importlib.import_module(f".{names[name]}", package), name)
        elif name.isidentifier() and not name.startswith("_"):   # a submodule (``arcfmt.layout``)
            try:
                value = importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        module = sys.modules[package]
        return sorted((set(vars(module)) | set(module.__all__)) - {"TYPE_CHECKING", "annotations"})

    public = frozenset(names) | frozenset(computed)

    class Package(types.ModuleType):
        """A public name wins over the submodule of the same name (``arcfmt.store.prune``, the
        function): importing a submodule binds it in its package, which an eager ``from .prune import
        prune`` used to undo; here the public value is loaded on first use instead."""

        def __setattr__(self, name: str, value: Any) -> None:
            if name in public and isinstance(value, types.ModuleType):
                return
            super().__setattr__(name, value)

    sys.modules[package].__class__ = Package
    return __getattr__, __dir__
