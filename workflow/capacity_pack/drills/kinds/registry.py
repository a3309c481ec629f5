"""The registry of drill kinds: every question "which drill kinds exist, what does kind X do" is
answered here, from the registered :class:`~capacity_pack.drills.kinds.base.DrillKind` specs in
registration order. A kind module calls :func:`register` once, at import; :func:`unregister`
removes one (a test's toy kind)."""

from __future__ import annotations

from capacity_pack.drills.kinds.base import DrillKind

_KINDS: dict[str, DrillKind] = {}


def register(spec: DrillKind) -> DrillKind:
    """Add ``spec``; returns it (``KIND = register(DrillKind(...))``)."""
    if spec.name in _KINDS:
        raise ValueError(f"drill kind {spec.name!r} is registered already")
    _KINDS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _KINDS.pop(name, None)


def kinds() -> tuple[DrillKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(_KINDS.values())


def kind(name: str) -> DrillKind:
    """The kind named ``name`` (a one-line error naming the registered ones for any other)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise LookupError(
            f"drill kind {name!r} is not registered (kinds: {list(_KINDS)})"
        ) from None
