"""The base of every model of the pack configuration, and the patterns its names follow.

Every section of a pack (:mod:`capacity_pack.plan.manifest`) and every part of one is a
:class:`Section`: an unknown key is refused, so are NaN and infinity, and every number, in lists
and mappings too, is within the bound of its unit (:func:`capacity_pack.plan.limits.check_bound`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from capacity_pack.plan.limits import check_bound

NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


# A pack's commands (restart_command, managed.prepare, drill commands) run with a timeout of
# their own; a day is beyond any restart or build, and a larger number is a typo.
COMMAND_TIMEOUT_MAX_S = 86_400.0


class Section(BaseModel):
    """The base of every section model (see the module docstring)."""

    model_config = ConfigDict(
        extra="forbid", frozen=False, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        # Every number of every section, in lists and mappings too: no stage then overflows.
        name = info.field_name or ""
        if isinstance(value, dict | list | tuple):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                try:
                    check_bound(name, item)
                except ValueError as err:
                    raise ValueError(f"[{key!r}] = {item!r}: {err}") from None
        else:
            check_bound(name, value)
        return value
