"""The registries of what a user adds to the report: its plots (:data:`capacity_pack.decide.plots
.PLOTS`), README sections (:data:`capacity_pack.decide.report.README_SECTIONS`) and page sections
(:data:`capacity_pack.decide.html.PAGE_SECTIONS`). A :class:`Registry` holds each name once (a
second is refused) and iterates by ``order``, then registration; :class:`Section` is one section
of the README or the page."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries made by ``make(name, function, *args)``, each with a unique ``name``."""

    def __init__(self, what: str, make: Callable[..., T]):
        self.what, self.make, self._entries = what, make, {}

    def add(self, entry: T) -> T:
        if entry.name in self._entries:
            raise ValueError(f"{self.what} {entry.name!r} is registered already")
        self._entries[entry.name] = entry
        return entry

    def register(self, name: str, *args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        """Decorator: adds ``make(name, function, *args, **kwargs)``; returns the function."""

        def add(function: Callable) -> Callable:
            self.add(self.make(name, function, *args, **kwargs))
            return function

        return add

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def __iter__(self) -> Iterator[T]:
        # sorted() is stable: entries of one order keep their registration order.
        return iter(sorted(self._entries.values(), key=lambda e: getattr(e, "order", 0)))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def names(self) -> list[str]:
        return [e.name for e in self]


@dataclass(frozen=True)
class Section:
    """``name``: its id (the page's ``<section id>``); ``render``: its content from the pack's
    documents (None leaves it out); ``title``: its heading (None: the lines carry their own);
    ``order``: its place; ``nav``: the page's link label (None: no link)."""

    name: str
    render: Callable[[Any], Any]
    title: str | None
    order: int
    nav: str | None = None
