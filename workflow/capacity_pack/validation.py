"""pydantic validation errors in one line, for the messages that name a bad field and its fix.

:func:`problems` writes each error of a :class:`pydantic.ValidationError` as ``loc: msg`` (the
field path dotted, ``root`` when the error is about the whole input) and joins them with
``; ``: ``kv_usage_max: Input should be less than or equal to 1; for_s: ...``.
"""

from __future__ import annotations

from pydantic import ValidationError


def problems(err: ValidationError, root: str = "") -> str:
    """``loc: msg; loc: msg`` of every error in ``err``; ``root`` stands for an empty location."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in err.errors()
    )
