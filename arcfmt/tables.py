"""A read-only mapping over a live registry (codecs, encodings): what is registered later shows up."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

_E = TypeVar("_E")
_K = TypeVar("_K")
_V = TypeVar("_V")


class TableView(Mapping[_K, _V], Generic[_E, _K, _V]):
    """``key(entry) → value(entry)`` over ``entries()``, computed at each lookup."""

    def __init__(self, entries: Callable[[], Iterable[_E]], key: Callable[[_E], _K],
                 value: Callable[[_E], _V]) -> None:
        self._entries, self._key, self._value = entries, key, value

    def _items(self) -> dict[_K, _V]:
        return {self._key(e): self._value(e) for e in self._entries()}

    def __getitem__(self, k: _K) -> _V:
        return self._items()[k]

    def __iter__(self) -> Iterator[_K]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __contains__(self, k: object) -> bool:
        return k in self._items()
