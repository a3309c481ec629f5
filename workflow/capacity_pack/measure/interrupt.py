"""Interrupts of a measurement: SIGINT and SIGTERM end it early, with nothing lost.

While a run (:class:`capacity_pack.measure.run.Run`) is on, both signals are caught
(:func:`catch_signals`): dispatching stops, every request in flight is ended and recorded as
``cancelled`` with the stamps it got so far and an error saying which signal interrupted it,
and the records, series and summary are written as for a finished run. The summary's
``interrupted`` says so: the signal, how many requests were recorded cancelled in flight and
how many scheduled ones were never sent (``scheduled = recorded + never_sent``). A request
counts as in flight once it is due (its bytes written, or its connection being opened at its
due time); one prepared ahead of its due time and not yet written is never sent.

Then the process exits with status 128 + the signal's number (130 for SIGINT, 143 for SIGTERM),
as a shell reports a process the signal ended, by raising :class:`Interrupted` once everything
is written: a ``SystemExit``, so ``except Exception`` handlers let it through, ``finally`` blocks
(a target's shutdown) still run, and Python exits with that status without a traceback. A
pipeline job interrupted so fails, and its outputs count as incomplete (Snakemake removes a
failed job's outputs; normalization refuses a summary that says ``interrupted``).

A sharded point's measurement job forwards either signal to its shard processes
(:func:`forward_signals`), waits for them to record and exit, and merges what they wrote.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signame: str) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signal.Signals[signame])


class Interrupted(SystemExit):
    """SIGINT or SIGTERM ended a measurement; its records and summary are written.

    ``code`` is the exit status (:func:`exit_status`); ``summary`` the run's summary, which each
    caller completes and writes before raising this on.
    """

    def __init__(self, signame: str, summary: dict[str, Any] | None = None) -> None:
        super().__init__(exit_status(signame))
        self.signame = signame
        self.summary: dict[str, Any] = summary if summary is not None else {}

    def __str__(self) -> str:
        facts = self.summary.get("interrupted") or {}
        if not facts:
            return f"measurement interrupted by {self.signame}"
        return (
            f"measurement interrupted by {self.signame}: {facts.get('cancelled_in_flight', 0)} "
            f"requests in flight recorded as cancelled, {facts.get('never_sent', 0)} of "
            f"{facts.get('scheduled', 0)} scheduled never sent"
        )


def interruption(
    signame: str | None, scheduled: int, recorded: int, cancelled: int
) -> dict[str, Any] | None:
    """The summary's ``interrupted`` entry (None: the run was not interrupted)."""
    if signame is None:
        return None
    return {
        "signal": signame,
        "scheduled": scheduled,
        "recorded": recorded,
        "cancelled_in_flight": cancelled,
        "never_sent": max(0, scheduled - recorded),
    }


def merge_interruptions(entries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Several processes' ``interrupted`` entries summed (a sharded point's)."""
    got = [e for e in entries if e]
    if not got:
        return None
    out: dict[str, Any] = {"signal": got[0]["signal"]}
    for key in ("scheduled", "recorded", "cancelled_in_flight", "never_sent"):
        out[key] = sum(int(e.get(key, 0)) for e in got)
    return out


@contextlib.contextmanager
def catch_signals(handler: Callable[[int], None]) -> Iterator[bool]:
    """Call ``handler(signum)`` on SIGINT or SIGTERM instead of the default action, for the
    block; the previous handlers come back after it. Yields whether the handlers were installed
    (only the main thread may install them; elsewhere the block runs without).

    ``handler`` runs in the main thread between two bytecodes, wherever that thread is: it must
    only note the signal or hand it on (``loop.call_soon_threadsafe``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {}
    for sig in SIGNALS:
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, lambda signum, _frame: handler(signum))
    try:
        yield True
    finally:
        for sig, old in previous.items():
            # None: a handler not set from Python; the default is the nearest we can restore.
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextlib.contextmanager
def forward_signals(procs: list[Any]) -> Iterator[list[str]]:
    """For the block, hand SIGINT or SIGTERM on to every process of ``procs`` (``Popen``s)
    instead of acting on it; yields the list of the signals' names received (empty: none)."""
    received: list[str] = []

    def forward(signum: int) -> None:
        received.append(signal.Signals(signum).name)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signum)

    with catch_signals(forward):
        yield received
