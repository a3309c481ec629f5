"""One request of a measurement run: sent at its instant, its response read, its record written.

A mixin of :class:`capacity_pack.measure.run.Run` (:class:`RequestSending`), whose settings,
counters, client and writer it uses. A request's overall deadline runs from its due time (from
its start in closed loop) through every phase, and ends it as a ``timeout`` that says in which
phase it was; a policy cancellation ends it as ``cancelled``; a transport error is an ``error``
with its cause. At its send instant :class:`SendGate` stamps it and applies the client's
in-flight ceiling; a request counts as ``ok`` only when the stream ended normally with the
class's exact output length. A session's later turns (:mod:`capacity_pack.measure.sessions`)
are sent here too, each its think time after the previous one ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from capacity_pack.measure.arrivals import Arrivals
from capacity_pack.measure.clock import realtime_at
from capacity_pack.measure.collector import unbind
from capacity_pack.measure.connection import DRAIN_GRACE_S, RequestWithdrawn
from capacity_pack.measure.records import Attempt
from capacity_pack.measure.sessions import answer_text, end_reason
from capacity_pack.measure.sse import SSEReader
from capacity_pack.measure.transport import BODY_EXTENSION, SEND_AT, SENT_HOOK
from capacity_pack.vocab.phases import MEASURED_PHASES

NS = 1_000_000_000


@dataclass
class RunState:
    """The run's counters (the dispatcher thread changes some of them, under ``Run._lock``)."""

    in_flight: int = 0
    sent: int = 0
    sent_measured: int = 0  # of them, in the measured window (not warm-up)
    finished: int = 0
    failed: int = 0
    due_unsent: int = 0
    streamed_tokens: int = 0
    ok_by_class: dict[str, int] = field(default_factory=dict)
    terminal_by_class: dict[str, int] = field(default_factory=dict)


class SendGate:
    """Called at a request's send instant (on the dispatcher thread for a timed send): stamps
    the send, then applies the in-flight ceiling (in flight = written and not yet ended)."""

    __slots__ = ("a", "block", "st", "lock", "ceiling", "gated", "sent")

    def __init__(
        self,
        a: Attempt,
        block: Arrivals | None,
        st: RunState,
        lock: threading.Lock,
        ceiling: int | None,
    ) -> None:
        self.a, self.block, self.st, self.lock, self.ceiling = a, block, st, lock, ceiling
        self.gated = self.sent = False

    def __call__(self, now_ns: int) -> bool:
        a, st = self.a, self.st
        a.sent_ns = now_ns
        a.sent_realtime_ns = realtime_at(now_ns)
        self.gated = True
        with self.lock:
            if self.block is not None:
                self.block.decided += 1
            if self.ceiling is not None and st.in_flight >= self.ceiling:
                return False
            st.in_flight += 1
            st.sent += 1
            st.sent_measured += a.phase in MEASURED_PHASES
        self.sent = True
        return True


def attempt_of(row: dict[str, Any], due_ns: int) -> Attempt:
    """The attempt (the record to be) of a schedule row due at ``due_ns``."""
    a = _plain_attempt(row, due_ns)
    turn = row.get("turn")
    if turn is not None and turn == turn and int(turn) >= 0:  # a session class's turn
        a.session, a.turn = int(row["session"]), int(turn)
    return a


def _plain_attempt(row: dict[str, Any], due_ns: int) -> Attempt:
    return Attempt(
        request_id=row["request_id"],
        seq=int(row["seq"]),
        klass=row["class"],
        phase=row["phase"],
        block=int(row["block"]),
        input_tokens=int(row["input_tokens"]),
        output_tokens_expected=int(row["output_tokens"]),
        scheduled_offset_ns=int(row["scheduled_offset_ns"]),
        due_ns=due_ns,
    )


class RequestSending:
    """Sends, reads and records the requests of a :class:`~capacity_pack.measure.run.Run` (a
    mixin: the run holds the state)."""

    # -- one request -----------------------------------------------------------------------

    async def _send(
        self,
        client,
        row: dict[str, Any],
        due_ns: int,
        block: Arrivals | None = None,
        *,
        request: httpx.Request | None = None,
        capture: bool = False,
    ) -> Attempt | None:
        """Send one request and record it; its attempt (None: never sent, interrupted)."""
        if self.interrupted is not None:
            return None  # started after the interrupt: never sent
        a = attempt_of(row, due_ns)
        if capture:
            a.text = []
        request = request or self._requests.pop(a.request_id, None) or self._request(row)
        assert request is not None
        cancel_after = int(row.get("cancel_after_ns", -1))
        # Until the request is written (it may be prepared ahead of its due time): a request
        # that never is (no connection) keeps the later of now and its due time.
        a.sent_ns = max(time.perf_counter_ns(), due_ns)
        a.sent_realtime_ns = realtime_at(a.sent_ns)
        gate = SendGate(a, block, self.state, self._lock, self.s.max_in_flight)
        if self._own_transport:
            request.extensions[SENT_HOOK] = gate
            if due_ns and self._lead_ns:
                request.extensions[SEND_AT] = due_ns
        elif not gate(time.perf_counter_ns()):
            self._reject(a)
            return a
        limit_s = self.s.request_timeout_s
        cancel_s = cancel_after / NS if cancel_after >= 0 else None
        deadline_s = min(limit_s, cancel_s) if cancel_s is not None else limit_s
        # Both limits count from the send, not from the early preparation of a timed send.
        deadline_s += max(0, due_ns - time.perf_counter_ns()) / NS
        # Registered for the interrupt (which cancels it) from here to its end.
        task = asyncio.current_task()
        assert task is not None
        self._active.add(task)
        record = True
        try:
            async with asyncio.timeout(deadline_s):
                await self._exchange(client, request, a)
        except RequestWithdrawn:
            self._reject(a)
            return a
        except asyncio.CancelledError:
            if self.interrupted is None:
                raise  # not the interrupt's: the run is being torn down
            task.uncancel()  # the interrupt's cancellation ends here, with the request
            # In flight once written or due (its connection opening); else never sent.
            record = gate.gated or a.due_ns <= self._interrupt_ns
            if record:
                self.cancelled_in_flight += 1
                a.status = "cancelled"
                a.error = f"interrupted by {self.interrupted} ({_phase(a, gate)})"
        except TimeoutError:
            cancelled = cancel_s is not None and cancel_s <= limit_s
            a.status = "cancelled" if cancelled else "timeout"
            a.error = (
                f"cancelled by policy after {cancel_s:.3f} s"
                if cancelled
                else f"no complete response within {limit_s:.3f} s ({_phase(a, gate)})"
            )
        except httpx.TimeoutException as exc:  # a transport's backstop: a timeout all the same
            a.status = "timeout"
            a.error = f"{type(exc).__name__}: {exc} ({_phase(a, gate)})"
        except httpx.HTTPError as exc:
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a failed request is data, never a crash
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._active.discard(task)
            if record and (a.status != "rejected" or a.http_status is not None):
                self._settle(a, gate, block)
        return a if record else None

    async def _session(
        self, client, row: dict[str, Any], due_ns: int, block: Arrivals | None = None
    ) -> None:
        """Send ``row``; when it starts a session, then each later turn in order, each due its
        think time after the previous turn ended, carrying the conversation so far
        (:mod:`capacity_pack.measure.sessions`). A turn that does not end ``ok`` or an interrupt
        ends the session: the rest are listed as never sent."""
        later = self._sessions.take(row)
        a = await self._send(client, row, due_ns, block, capture=bool(later))
        if not later:
            return
        contents = [self._builder.prompt(row)]
        for k, nxt in enumerate(later):
            held = self._held_back()
            if held is None and (a is None or a.status != "ok"):
                status, error = (a.status, a.error) if a is not None else (None, None)
                held = "session_ended", end_reason(status, error, int(nxt["turn"]) - 1)
            if held is not None:
                self._sessions.skip(later[k:], *held)
                return
            assert a is not None and self._client is not None
            contents += [answer_text(a.text), self._user_message(nxt)]
            request = self._builder.session_request(self._client, nxt, contents)
            due = a.end_ns + int(nxt["think_ns"])
            timed = self.s.mode != "closed"
            if timed:
                nxt = {**nxt, "scheduled_offset_ns": due - self.t0_ns}
            # A timed send is handed to the dispatcher a lead early (as the arrivals are).
            wait_ns = due - (self._lead_ns if timed else 0) - time.perf_counter_ns()
            if wait_ns > 0:
                await asyncio.sleep(wait_ns / NS)
            if (held := self._held_back()) is not None:
                self._sessions.skip(later[k:], *held)
                return
            a = await self._send(
                client, nxt, due if timed else 0, request=request, capture=k + 1 < len(later)
            )

    def _held_back(self) -> tuple[str, str] | None:
        """Why no further turn may be sent now (an interrupt), or None. An early stop of the
        arrivals starts no new session, but the sessions under way go on to their last turn,
        as their users would."""
        if self.interrupted is not None:
            return "interrupted", f"interrupted by {self.interrupted}"
        return None

    def _user_message(self, row: dict[str, Any]) -> str:
        return self._builder.user_message(row)

    async def _exchange(self, client, request: httpx.Request, a: Attempt) -> None:
        """Send the request, read its response into ``a``."""
        resp = await client.send(request, stream=True)
        try:
            a.http_status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                a.status = "rejected" if resp.status_code in (429, 503) else "error"
                a.error = f"HTTP {resp.status_code}: {_error_message(text)}"
            else:
                await self._consume(resp, a)
        finally:
            await resp.aclose()
            unbind(resp)

    def _settle(self, a: Attempt, gate: SendGate, block: Arrivals | None) -> None:
        """The request ended (any way but the ceiling's refusal): stamp, count, record it."""
        st = self.state
        a.end_ns = time.perf_counter_ns()
        a.end_realtime_ns = realtime_at(a.end_ns)
        with self._lock:
            if gate.sent:
                st.in_flight -= 1
            else:
                st.sent += 1  # attempted, never written (no connection, cancelled)
                st.sent_measured += a.phase in MEASURED_PHASES
                if block is not None and not gate.gated:
                    block.decided += 1
        self._finish(a)

    def _reject(self, a: Attempt) -> None:
        """The client's in-flight ceiling refused the request at its send time."""
        a.status = "rejected"
        a.error = f"client in-flight ceiling {self.s.max_in_flight} reached"
        a.end_ns, a.end_realtime_ns = a.sent_ns, a.sent_realtime_ns
        self._finish(a)

    async def _consume(self, resp, a: Attempt) -> None:
        reader = SSEReader(chat=self.s.endpoint == "chat_completions")
        st = self.state
        body = resp.extensions.get(BODY_EXTENSION)
        if body is not None and resp.headers.get("content-encoding", "identity") == "identity":
            # Our transport: each read is parsed in the connection's read callback, stamped
            # with its kernel receive time.
            def sink(now_ns: int, data: bytes) -> bool:
                st.streamed_tokens += reader.feed(data, now_ns, a)
                return reader.ended

            await body.feed(sink)
            if not reader.ended:
                st.streamed_tokens += reader.close(time.perf_counter_ns(), a)
        else:
            chunks = resp.aiter_bytes()
            async for data in chunks:
                st.streamed_tokens += reader.feed(data, time.perf_counter_ns(), a)
                if reader.ended:
                    break
            else:
                st.streamed_tokens += reader.close(time.perf_counter_ns(), a)
            if reader.done:
                # Read the body's end (it follows [DONE] at once): httpcore keeps only a
                # connection whose response was read to the end, else every request reconnects.
                with contextlib.suppress(httpx.HTTPError, TimeoutError):
                    async with asyncio.timeout(DRAIN_GRACE_S):
                        async for _ in chunks:
                            pass
        if reader.failed:
            return
        if reader.done and body is not None:
            # The response is over for us; its last bytes may trail: reuse the connection if
            # they arrive, instead of closing it (a new connection per request costs both sides).
            body.reuse_when_complete = True
        got = sum(a.chunk_tokens)
        if not reader.done:
            a.status, a.error = "error", f"stream ended without [DONE] after {got} tokens"
        elif a.completion_tokens is not None and a.completion_tokens != got:
            a.status = "error"
            a.error = f"usage reports {a.completion_tokens} completion tokens, stream carried {got}"
        elif got != a.output_tokens_expected:
            a.status = "error"
            a.error = f"output_tokens {got} != the scheduled {a.output_tokens_expected}"
        else:
            a.status = "ok"

    def _finish(self, a: Attempt) -> None:
        st = self.state
        if a.due_ns:
            self.lateness_ns.append(a.sent_ns - a.due_ns)
        st.finished += 1
        if a.status != "ok":
            st.failed += 1
        if a.phase in MEASURED_PHASES:
            st.terminal_by_class[a.klass] = st.terminal_by_class.get(a.klass, 0) + 1
            if a.status == "ok":
                st.ok_by_class[a.klass] = st.ok_by_class.get(a.klass, 0) + 1
            if self._decider is not None:
                self._decider.record(a)
        self.writer.write(a.to_json(self.t0_ns, self.t0_realtime_ns))


def _phase(a: Attempt, gate: SendGate) -> str:
    """Where a request was when it ended early, for its error text."""
    if a.http_status is not None:
        return f"reading the body, {sum(a.chunk_tokens)} tokens received"
    if gate.sent:
        return "no response head yet"
    return "connecting, request not written"


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    except (ValueError, AttributeError):
        return text[:500]
