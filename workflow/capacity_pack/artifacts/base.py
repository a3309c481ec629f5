"""The base of every typed artifact: one model per JSON file, read and written only through it.

:meth:`Artifact.read` validates a file, raising :class:`ArtifactError` in one line naming the
file and the fields at fault; :meth:`Artifact.write` writes the fields the writer set
(``exclude_unset``) through the project's atomic JSON writer, so the bytes on disk are those the
stage wrote from its own dictionary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from capacity_pack.errors import StatedError
from capacity_pack.io import write_json_atomic
from capacity_pack.validation import problems

# A JSON number the file may hold as an integer or a float (a declared 30 RPS stays 30, not 30.0).
Num = int | float


class ArtifactError(StatedError, ValueError):
    """An artifact file that is missing, not JSON, or not what its model says."""


class Part(BaseModel):
    """A nested object of an artifact: every key declared."""

    model_config = ConfigDict(extra="forbid")


class Artifact(Part):
    """One JSON file a stage writes and others read."""

    @classmethod
    def parse(cls, data: Any, where: str | Path) -> Self:
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ArtifactError(
                f"{where}: not a {cls.__name__} file: {problems(err, 'root')}"
            ) from None

    @classmethod
    def read(cls, path: str | Path) -> Self:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ArtifactError(f"{path}: cannot read {cls.__name__}: {err}") from None
        return cls.parse(data, path)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    def write(self, path: str | Path) -> None:
        write_json_atomic(path, self.dump())
