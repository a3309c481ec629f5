"""The phases of a point's requests, defined once.

A point's schedule (plan/schedule.py) holds ``warmup`` requests, then the ``measure`` window's,
then the ``extension`` blocks the in-run test may add (measure/inrun.py); the request table
(evidence/normalize.py) may also hold ``prewarm`` requests, sent before the schedule to fill a
warm cache. Only the measured phases count toward any statistic: warm-up and prewarm requests
are sent and recorded, never reported.
"""

from __future__ import annotations

PREWARM = "prewarm"
WARMUP = "warmup"
MEASURE = "measure"
EXTENSION = "extension"
#: A schedule's phases, in the order they are sent.
SCHEDULE_PHASES = (WARMUP, MEASURE, EXTENSION)
#: A request table's phases.
REQUEST_PHASES = (PREWARM, *SCHEDULE_PHASES)
#: The phases every statistic counts.
MEASURED_PHASES = (MEASURE, EXTENSION)
