"""The one kind of error a person running a pack fixes by themselves: stated in one line.

:class:`StatedError` marks an exception whose message already names the file, field, URL or
flag at fault and what was expected (a server that does not answer, a manifest field out of
range, a table row that does not validate). A pipeline job (:func:`capacity_pack.logs.
job_logging`) and the ``capacity-pack`` command print such an error as that one line and exit
non-zero, without a traceback; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class StatedError(Exception):
    """An error whose message is the whole story for the user: printed alone, no traceback."""
