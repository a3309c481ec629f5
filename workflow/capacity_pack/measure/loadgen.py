"""The load generator: sends a point's schedule to an OpenAI-compatible endpoint, records all.

Open loop (``mode == "open"``/``"exp"``): each request is sent at its scheduled offset regardless
of completions; nothing ever holds a scheduled arrival behind a concurrency cap. An optional
in-flight ceiling (``client.max_in_flight``; in flight = written and not yet ended) answers an
arrival beyond it, at its due time, with a client-side ``rejected`` record. Closed loop
(``mode == "closed"``): N workers, each sending its next request when the previous one ends, in
schedule order.

Client: one ``httpx.AsyncClient`` per run (keep-alive, explicit ``httpx.Timeout``, ``httpx.Limits``
without connection caps, ``Accept-Encoding: identity``, no cookie carried between requests) over
:class:`PlainHTTPTransport` for ``http://`` targets, httpx's default transport for ``https://``
(``LoadSettings.transport`` overrides), verifying an https:// server's certificate unless
``LoadSettings.tls_verify`` is false (``ca_bundle``: a private CA). The API key (from the
environment variable ``api_key_env`` names) goes with every request and scrape, and a record
whose text quotes it (a server's error) has it replaced by ``[redacted]``. The plain-HTTP
transport exists because httpx's own stack costs ~100 us of CPU per SSE chunk and stamps chunks
late; see its docstring.

Timed sends (open loop, our transport). Requests are built before the clock starts. The loop
starts each one ``LEAD_NS`` (5 ms) ahead of its due time: connection taken from the pool (or
opened), bytes ready. The dispatcher thread (:class:`_Dispatcher`) sleeps until the due time and
writes them to the socket itself, stamping the send there, so the loop's backlog and httpx's
request handling never delay the send. The thread sleeps outside the GIL with 1 us timer slack
and SCHED_FIFO priority where the process may (``dispatcher_scheduling`` in the summary); the GIL
switch interval is lowered to 0.2 ms during a run so it gets the GIL promptly. With httpx's
transport the thread hands each arrival to the loop at its due time instead.

Per request, from one monotonic clock (``time.perf_counter_ns``, CLOCK_MONOTONIC on Linux, the
same clock in every process of the machine) plus a realtime stamp (``time.time_ns``) at send and
at end: scheduled offset, actual send time (when the request's bytes were written), every
streamed chunk's arrival and its token count, HTTP status, terminal status (``ok``, ``error``,
``timeout``, ``rejected``, ``cancelled``), error text, usage (prompt, completion, cached tokens).
A chunk's arrival is the kernel's receive time of the socket read that completed it
(``SO_TIMESTAMPNS``, moved onto the monotonic clock), so a busy loop does not blur it; events
read together share it. Derived exactly as the seed defines, with s = send, f = first
non-empty chunk, e = last non-empty chunk, O = output tokens:

    TTFT = f - s        E2E = e - s        TPOT = (E2E - TTFT) / (O - 1)  for O > 1
    ITL_j = t_j - t_(j-1) over chunks (gaps between observed chunks, not invented per token)
    client scheduling delay (dispatch lateness) = s - (t0 + scheduled offset)

A request that is never written (no connection) keeps the later of its start and due time as s.
Timeouts and cancellation deadlines run from the due time (from the start in closed loop).

Records are appended to a JSONL file and flushed as each request ends, so a killed run keeps
every finished request. No automatic retries, ever.

A request counts as ``ok`` only when the stream ended normally with the class's exact output
length (the workload contract of ``ignore_eos`` fixed-length classes); a short or long output is
an ``error`` whose text says so, never silently a success. Streams are read by
:class:`SSEReader` (OpenAI chunk shapes; ``json.loads`` only where its exact byte-template
check cannot vouch for an event).

The client watches itself: dispatch lateness, event-loop lag (a 10 ms ticker's wake-up delay)
and its own CPU time from the clock's start (request building before it is not counted); when
lateness p99 exceeds ``client.lateness_bound_ms`` the summary labels the point ``client_bound``
and the analysis treats it as invalid. Objects alive at the clock's start are frozen out of the
garbage collector (``gc.freeze``), so a full collection cannot pause the loop for tens of
milliseconds. ``/metrics`` is scraped every ``client.metrics_interval_seconds`` into a long time
series (queue depth, running, KV usage, prefix-cache queries/hits, preemptions) through a name
map for vLLM, SGLang, llama.cpp, TGI, TensorRT-LLM and the simulator, with the client's own
backlog series (due but unsent, in flight) alongside.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import heapq
import http.cookiejar
import ipaddress
import json
import math
import os
import re
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from capacity_pack.engines import verify_setting
from capacity_pack.engines.signals import parse_metrics
from capacity_pack.io import atomic_path, write_json_atomic
from capacity_pack.plan.prompts import build_prompt_for
from capacity_pack.sim.tokenizer import count_tokens

STATUSES = ("ok", "error", "timeout", "rejected", "cancelled")
NS = 1_000_000_000
# GIL switch interval during a run: how long the dispatcher thread may wait for the GIL.
SWITCH_INTERVAL_S = 0.0002
# How far ahead of its due time a timed send is handed to the loop to be prepared: above the
# loop's longest usual backlog (a step's burst of chunks at 200 RPS is ~3 ms).
LEAD_NS = 5_000_000
# Idle keep-alive connections httpx's default transport may keep (see Run.run).
HTTPX_MAX_IDLE_CONNECTIONS = 32


class LoadSettings(BaseModel):
    """Everything one measurement run needs besides the schedule."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Endpoint root, e.g. http://127.0.0.1:8000.")
    model: str = Field(description="Model name sent in every request.")
    endpoint: Literal["completions", "chat_completions"] = Field(default="completions")
    api_key_env: str | None = Field(default=None, description="Env var holding the API key.")
    mode: Literal["open", "closed", "exp"] = Field(description="Load mode of the point.")
    concurrency: int | None = Field(default=None, ge=1, description="Closed-loop workers.")
    request_timeout_s: float = Field(gt=0, description="Per-request timeout.")
    max_in_flight: int | None = Field(default=None, ge=1, description="Client-side ceiling.")
    lateness_bound_ms: float = Field(default=5.0, gt=0)
    metrics_interval_s: float = Field(default=1.0, gt=0)
    scrape_metrics: bool = Field(default=True)
    sampling: dict[str, Any] = Field(default_factory=dict, description="temperature, top_p, ...")
    ignore_eos: bool = Field(default=True)
    stop_sequences: list[str] = Field(default_factory=list)
    include_usage: bool = Field(default=True)
    prefix_revision: str | None = Field(default=None)
    corpus_revision: str = Field(default="capacity-pack-text-v1")
    cold_unique_prefix_tokens: int = Field(default=8, ge=1)
    min_successful_per_class: int | None = Field(
        default=None, description="Sample gate: extend the schedule until each class has this."
    )
    maximum_duration_s: float | None = Field(default=None, description="Stop extending after.")
    extension_block: Any = Field(default=None, exclude=True, description="Callable(k) -> rows.")
    side_tasks: Any = Field(
        default=None,
        exclude=True,
        description="Callable(run, stop_event) -> coroutines run beside the load once t0 is set "
        "(a drill's scraper and fault injector); they must return when stop_event is set.",
    )
    token_counter: Any = Field(
        default=None, exclude=True, description="prompts.TokenCounter of a real target, or None."
    )
    progress: bool = Field(default=False, description="Live progress line on stderr.")
    keep_alive: bool = Field(
        default=True, description="Reuse connections (false: Connection: close per request)."
    )
    tls_verify: bool = Field(default=True, description="Verify an https:// server's certificate.")
    ca_bundle: str | None = Field(default=None, description="PEM of the CAs to verify it with.")
    shard: int | None = Field(
        default=None, ge=0, description="This process's shard of a sharded point (records say so)."
    )
    start_at: Any = Field(
        default=None,
        exclude=True,
        description="Callable() -> the start as realtime ns (a sharded point's shared start), "
        "called once the requests are built; None: start now.",
    )
    transport: Literal["auto", "capacity_pack", "httpx"] = Field(
        default="auto",
        description="HTTP transport under the httpx client: auto (ours for http://, httpx's "
        "default for https://), capacity_pack (ours) or httpx (httpx's default).",
    )


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """What the client observed about one request (raw nanoseconds, monotonic unless noted)."""

    request_id: str
    seq: int
    klass: str
    phase: str
    block: int
    input_tokens: int
    output_tokens_expected: int
    scheduled_offset_ns: int
    due_ns: int = 0
    sent_ns: int = 0
    sent_realtime_ns: int = 0
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    end_ns: int = 0
    end_realtime_ns: int = 0
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    http_status: int | None = None
    status: str = "error"
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    def to_json(self, t0_ns: int, t0_realtime_ns: int) -> str:
        out_tokens = sum(self.chunk_tokens)
        rec = {
            "request_id": self.request_id,
            "seq": self.seq,
            "class": self.klass,
            "phase": self.phase,
            "block": self.block,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "input_tokens": self.input_tokens,
            "output_tokens_expected": self.output_tokens_expected,
            "output_tokens": out_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens_mismatch": (
                self.prompt_tokens is not None and self.prompt_tokens != self.input_tokens
            ),
            "scheduled_offset_ns": self.scheduled_offset_ns,
            "t0_ns": t0_ns,
            "t0_realtime_ns": t0_realtime_ns,
            "due_ns": self.due_ns,
            "sent_ns": self.sent_ns,
            "sent_realtime_ns": self.sent_realtime_ns,
            "first_token_ns": self.first_token_ns,
            "last_token_ns": self.last_token_ns,
            "end_ns": self.end_ns,
            "end_realtime_ns": self.end_realtime_ns,
            "chunk_ns": self.chunk_ns,
            "chunk_tokens": self.chunk_tokens,
        }
        return json.dumps(rec, separators=(",", ":"))


class RecordWriter:
    """Append-only JSONL; every record is flushed when its request ends."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self.count = 0
        self.secrets: list[str] = []
        # Appended inside every record's JSON object (a shard's index), e.g. ',"shard":1'.
        self.suffix = ""

    def write(self, line: str) -> None:
        for secret in self.secrets:
            if secret in line:
                line = line.replace(secret, "[redacted]")
        if self.suffix:
            line = line[:-1] + self.suffix + "}"
        self._fh.write(line + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a (possibly killed) run; a torn last line is ignored."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # the writer died mid-line: that request never finished recording
            out.append(json.loads(line))
    return out


# ---------------------------------------------------------------------------------------------
# Server-sent events
# ---------------------------------------------------------------------------------------------

DONE = b"[DONE]"
# A JSON string literal's body needs no unescaping when it holds none of these.
_ESCAPED = re.compile(rb'["\\\x00-\x1f]')


class SSEReader:
    """One response's ``text/event-stream`` body, fed as it arrives, read into an Attempt.

    Events are split as the SSE specification says (``\\n``, ``\\r\\n`` or ``\\r`` line ends,
    a blank line ends an event, ``data:`` lines joined by ``\\n``, ``:`` comments, an ``event:``
    type) across arbitrary read boundaries. Each event's data is an OpenAI-compatible stream
    chunk: completions ``choices[].text`` or chat ``choices[].delta.content`` (every non-empty
    one is a chunk of ``count_tokens(text) or 1`` tokens stamped with its read's arrival time),
    ``finish_reason``, a ``usage`` chunk, an in-stream error (an ``error`` object without
    choices, or an ``event: error``), ``[DONE]``.

    Exact shortcut for the per-token events: engines repeat one byte template per stream (same
    id, model, created, field order) in which only the text changes. After a fully parsed
    single-choice content event with no usage and no finish reason whose text key occurs once,
    the bytes before and after its text literal are kept; a later event made of exactly those
    bytes around a string literal without escapes, quotes or control characters is that same
    JSON with another text, so the text is taken from the bytes without ``json.loads``. Any
    other event is parsed in full.
    """

    __slots__ = ("chat", "key", "buf", "cr", "prefix", "suffix", "done", "failed")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.key = b'"content":' if chat else b'"text":'
        self.buf = b""
        self.cr = False  # the last read ended in "\r": a leading "\n" of the next one belongs to it
        self.prefix: bytes | None = None
        self.suffix = b""
        self.done = False
        self.failed = False

    @property
    def ended(self) -> bool:
        return self.done or self.failed

    def feed(self, data: bytes, now_ns: int, a: Attempt) -> int:
        """Read the events that ``data`` completes; returns the tokens they carried."""
        if not data:
            return 0
        if self.cr or b"\r" in data:
            data = self._lf(data)
        buf = self.buf + data if self.buf else data
        if b"\n\n" not in buf:
            self.buf = buf
            return 0
        blocks = buf.split(b"\n\n")
        self.buf = blocks.pop()
        tokens = 0
        for block in blocks:
            tokens += self._block(block, now_ns, a)
            if self.done or self.failed:
                self.buf = b""
                break
        return tokens

    def close(self, now_ns: int, a: Attempt) -> int:
        """End of the body: an event cut short of its blank line still counts."""
        block, self.buf = self.buf.rstrip(b"\n"), b""
        return self._block(block, now_ns, a) if block and not self.ended else 0

    def _lf(self, data: bytes) -> bytes:
        if self.cr and data[:1] == b"\n":
            data = data[1:]
        self.cr = data[-1:] == b"\r"
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _block(self, block: bytes, now_ns: int, a: Attempt) -> int:
        if block[:5] == b"data:" and b"\n" not in block:
            return self._event(None, block[6:] if block[5:6] == b" " else block[5:], now_ns, a)
        event, lines = None, []
        for line in block.split(b"\n"):
            name, colon, value = line.partition(b":")
            if colon and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                lines.append(value)
            elif name == b"event":
                event = value
        if not lines:
            return 0  # comments, ids and retry hints only
        return self._event(event, b"\n".join(lines), now_ns, a)

    def _event(self, event: bytes | None, payload: bytes, now_ns: int, a: Attempt) -> int:
        if payload == DONE:
            self.done = True
            return 0
        prefix, suffix = self.prefix, self.suffix
        if prefix is not None and event is None and payload.startswith(prefix):
            end = len(payload) - len(suffix)
            start = len(prefix)
            if (
                end - start >= 2
                and payload.endswith(suffix)
                and payload[start] == 34  # '"'
                and payload[end - 1] == 34
                and _ESCAPED.search(payload, start + 1, end - 1) is None
            ):
                try:
                    return self._text(payload[start + 1 : end - 1].decode(), now_ns, a)
                except UnicodeDecodeError:
                    pass  # the full parse reports it
        return self._parse(event, payload, now_ns, a)

    def _text(self, text: str, now_ns: int, a: Attempt) -> int:
        if not text:
            return 0
        n = count_tokens(text) or 1
        if a.first_token_ns is None:
            a.first_token_ns = now_ns
        a.last_token_ns = now_ns
        a.chunk_ns.append(now_ns)
        a.chunk_tokens.append(n)
        return n

    def _parse(self, event: bytes | None, payload: bytes, now_ns: int, a: Attempt) -> int:
        stripped = payload.strip()
        if stripped == DONE:
            self.done = True
            return 0
        if not stripped:
            return 0  # an empty data field carries nothing
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if event == b"error" or (isinstance(chunk, dict) and "error" in chunk):
            err = chunk.get("error", chunk) if isinstance(chunk, dict) else None
            if event == b"error" or not chunk.get("choices"):
                if err is None:
                    err = payload.decode("utf-8", "replace")[:500]
                message = err.get("message", err) if isinstance(err, dict) else err
                a.status, a.error = "error", f"in-stream error: {message}"
                self.failed = True
                return 0
        if not isinstance(chunk, dict):
            text = payload.decode("utf-8", "replace")
            a.status, a.error = "error", f"malformed SSE event: {text[:200]!r}"
            self.failed = True
            return 0
        usage = chunk.get("usage")
        if usage:
            a.prompt_tokens = usage.get("prompt_tokens")
            a.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            a.cached_tokens = details.get("cached_tokens")
        choices = chunk.get("choices") or ()
        tokens = 0
        text = None
        for choice in choices:
            text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            if text and isinstance(text, str):
                tokens += self._text(text, now_ns, a)
            if choice.get("finish_reason"):
                a.finish_reason = choice["finish_reason"]
        if (
            tokens
            and event is None
            and len(choices) == 1
            and not usage
            and choices[0].get("finish_reason") is None
        ):
            self._learn(payload, text)
        return tokens

    def _learn(self, payload: bytes, text: str) -> None:
        """Keep the bytes around the text literal when they make an exact template."""
        key = self.key
        i = payload.find(key)
        if i < 0 or payload.find(key, i + 1) >= 0:
            return  # the key is not unique: no position to trust
        j = i + len(key)
        while payload[j : j + 1] in (b" ", b"\t", b"\n"):
            j += 1
        if payload[j : j + 1] != b'"':
            return
        k = payload.find(b'"', j + 1)
        if k < 0 or _ESCAPED.search(payload, j + 1, k) is not None:
            return
        if payload[j + 1 : k].decode("utf-8", "replace") != text:
            return
        self.prefix, self.suffix = payload[:j], payload[k + 1 :]


# ---------------------------------------------------------------------------------------------
# Plain-HTTP transport
# ---------------------------------------------------------------------------------------------

# Request extension: ``gate(now_ns) -> bool``, called at the instant the request's bytes are to
# be written (``now_ns`` is that instant); False withdraws the request (``RequestWithdrawn``).
SENT_HOOK = "capacity_pack.on_sent"
# Request extension: the ``perf_counter_ns`` instant to write the request at (the transport
# needs a ``scheduler``); everything else (connection, bytes) is made ready before it.
SEND_AT = "capacity_pack.send_at_ns"
# Response extension: the body stream (``_Body``); ``arrival_ns`` is the read time of the bytes
# last yielded.
BODY_EXTENSION = "capacity_pack.body"

# Connection states: between requests, reading a response head, then its body framing.
_IDLE, _HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_EOF, _COMPLETE = (
    range(9)
)
_MAX_HEAD_BYTES = 1 << 16
_PAUSE_READING_BYTES = 1 << 20  # unread body bytes queued before the socket stops being read
_DRAIN_GRACE_S = 1.0  # how long a finished-for-us response may take to end before closing
_TIMED_WRITE_MIN_NS = 20_000  # closer to due than this, the loop writes at once itself
_READ_BYTES = 1 << 16
_ANCILLARY_BYTES = 64
_TIMESPEC = struct.Struct("@qq")  # struct timespec of a 64-bit Linux
_SO_TIMESTAMPNS = 35  # Linux asm-generic (x86-64, arm64); Python's socket module lacks it


def _enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask for the kernel's receive time with every read (Linux, 64-bit); False if not given."""
    if sys.platform != "linux" or _TIMESPEC.size != 16:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class RequestWithdrawn(Exception):
    """The request's gate said no at its send time: nothing was written."""


class PlainHTTPTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` for plain-HTTP/1.1 keep-alive streaming on asyncio.

    Built because httpx's default stack (httpcore, h11, anyio) costs ~100 us of CPU per SSE
    chunk (two reads per event, cancel scopes, context managers) and stamps a chunk only when
    the reading task gets round to it. Here each connection is a non-blocking socket that the
    event loop watches (``add_reader``); a read is one ``recvmsg`` that also returns the
    kernel's receive time (:class:`_Connection`), and the response framing (chunked,
    ``Content-Length`` or close-delimited) is decoded right there. The body stream
    (:class:`_Body`, ``BODY_EXTENSION``) yields one item per read, or hands each read to a
    callback as it arrives (``_Body.feed``), so streaming costs no task switch per chunk.

    Pool: idle keep-alive connections per origin, most recently used first, no cap on their
    number (``limits.keepalive_expiry`` closes those idle longer); a connection goes back only
    after its response ended cleanly and the server allowed reuse. A response abandoned before
    its end closes its connection (the server sees the disconnect), unless the reader marked
    ``reuse_when_complete`` (it has all it wants): then the rest is awaited for up to 1 s.
    Timeouts (``request.extensions["timeout"]``): connect, write (only if the socket's buffer
    is full), read (no byte for that long while a head or body read waits). Errors are the
    exceptions httpx's own transport raises (``ConnectError``, ``ConnectTimeout``,
    ``ReadTimeout``, ``WriteTimeout``, ``WriteError``, ``ReadError``, ``RemoteProtocolError``),
    with h11's wording. No retries. Only ``http://``; TLS targets keep httpx's default one.

    Timed sends (``SEND_AT`` and a ``scheduler``, the run's dispatcher thread): the request is
    prepared early (connection taken or opened, bytes built) and the scheduler's thread writes
    it at the due instant (``socket.send``), calling the ``SENT_HOOK`` gate there, so neither
    the event loop's backlog nor httpx's request handling delays or blurs the send. A lock per
    timed write keeps the socket from being closed between the thread's check and its write.
    """

    def __init__(self, limits: Any = None, *, scheduler: Any = None) -> None:
        self.scheduler = scheduler
        self.keepalive_expiry_s = getattr(limits, "keepalive_expiry", 5.0)
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._all: set[_Connection] = set()

    async def __aenter__(self) -> PlainHTTPTransport:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()

    async def handle_async_request(self, request):
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"PlainHTTPTransport serves http only, not {url}")
        key = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout") or {}
        conn = self._take_idle(key) or await self._connect(key, timeouts.get("connect"))
        try:
            data = await _serialize(request)
            conn.start(request.method == "HEAD", timeouts.get("read"))
            gate = request.extensions.get(SENT_HOOK)
            send_at = request.extensions.get(SEND_AT)
            if send_at is not None and self.scheduler is not None:
                conn.pending = _TimedWrite(conn, data, gate)
                if send_at - time.perf_counter_ns() <= _TIMED_WRITE_MIN_NS or (
                    not self.scheduler.write_at(send_at, conn.pending)
                ):
                    conn.pending.fire(in_loop=True)  # already due: no hand-over
            else:
                if gate is not None and not gate(time.perf_counter_ns()):
                    raise RequestWithdrawn
                await conn.send_all(data, timeouts.get("write"))
            status, reason, headers = await conn.head()
            conn._cancel_pending()  # fired long since (a server answers only what it read)
        except RequestWithdrawn:
            conn.pending = None
            conn.withdrawn()  # nothing was written: the connection is as good as before
            raise
        except BaseException:
            conn.abort()
            raise
        return httpx.Response(
            status,
            headers=headers,
            stream=conn.body,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": reason,
                BODY_EXTENSION: conn.body,
            },
        )

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.lost or conn.closed:
                continue
            if self.keepalive_expiry_s is not None and now - conn.idle_since > (
                self.keepalive_expiry_s
            ):
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, key: tuple[str, int], timeout_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = key
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    version = ipaddress.ip_address(host).version
                    family = socket.AF_INET6 if version == 6 else socket.AF_INET
                    addresses = [(family, (host, port))]
                except ValueError:  # a name: resolve it (in asyncio's executor)
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                    addresses = [(info[0], info[4]) for info in infos]
                error: OSError = OSError(f"no address for {host}")
                for family, address in addresses:
                    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                    try:
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        await loop.sock_connect(sock, address)
                    except OSError as exc:
                        sock.close()
                        error = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    break
                else:
                    raise error
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} within "
                                       f"{timeout_s} s") from exc  # fmt: skip
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        conn = _Connection(self, key, sock)
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)


async def _serialize(request) -> bytes:
    body = await request.aread()
    head = [f"{request.method} ".encode(), request.url.raw_path, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers.raw:
        head += (name, b": ", value, b"\r\n")
        chunked = chunked or (name.lower() == b"transfer-encoding" and b"chunked" in value)
    head.append(b"\r\n")
    if chunked:
        head += (b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n") if body else (b"0\r\n\r\n",)
    else:
        head.append(body)
    return b"".join(head)


class _TimedWrite:
    """A prepared request that a thread (or the loop, when it is already due) writes once."""

    __slots__ = ("conn", "data", "gate", "lock", "state")

    def __init__(self, conn: _Connection, data: bytes, gate: Callable[[int], bool] | None):
        self.conn = conn
        self.data = data
        self.gate = gate
        self.lock = threading.Lock()
        self.state = 0  # 0 pending, 1 fired, 2 cancelled

    def fire(self, in_loop: bool = False) -> None:
        conn = self.conn
        with self.lock:
            if self.state:
                return
            self.state = 1
            call = conn.loop.call_soon if in_loop else conn.loop.call_soon_threadsafe
            if self.gate is not None and not self.gate(time.perf_counter_ns()):
                call(conn.fail_head, RequestWithdrawn())
                return
            data = self.data
            try:
                n = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                call(conn.fail_head, httpx.WriteError(str(exc)))
                return
            if n < len(data):
                call(conn.write_rest, data[n:])

    def cancel(self) -> None:
        """From the loop: the socket is about to close; a write not yet made never will be."""
        with self.lock:
            if not self.state:
                self.state = 2


class _Body(httpx.AsyncByteStream):
    """A response body stream (``httpx.AsyncByteStream``): one item per socket read.

    Besides iteration, :meth:`feed` hands every read, as it arrives, to a callback run inside
    the connection's read callback, so a streamed response costs no task switch per chunk.
    """

    __slots__ = ("conn", "queue", "queued", "done", "exc", "waiter", "arrival_ns",
                 "reuse_when_complete", "sink", "sink_exc")  # fmt: skip

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.queue: deque[tuple[int, bytes]] = deque()
        self.queued = 0
        self.done = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.arrival_ns = 0
        self.reuse_when_complete = False
        self.sink: Callable[[int, bytes], bool] | None = None
        self.sink_exc: BaseException | None = None

    def push(self, now_ns: int, data: bytes) -> None:
        sink = self.sink
        if sink is not None:
            try:
                if sink(now_ns, data):
                    self.sink = None
                    self._wake()
            except Exception as exc:  # the reader's failure, reported to its task
                self.sink, self.sink_exc = None, exc
                self._wake()
            return
        self.queue.append((now_ns, data))
        self.queued += len(data)
        if self.queued > _PAUSE_READING_BYTES and not self.conn.read_paused:
            self.conn.pause_reading()
        self._wake()

    def finish(self, exc: BaseException | None = None) -> None:
        self.done = True
        self.sink = None
        if exc is not None and self.exc is None:
            self.exc = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def __aiter__(self):
        queue, conn = self.queue, self.conn
        while True:
            if queue:
                self.arrival_ns, data = queue.popleft()
                self.queued -= len(data)
                if conn.read_paused and self.queued < _PAUSE_READING_BYTES // 4:
                    conn.resume_reading()
                yield data
            elif self.exc is not None:
                raise self.exc
            elif self.done:
                return
            else:
                self.waiter = asyncio.get_running_loop().create_future()
                conn.waiting()
                try:
                    await self.waiter
                finally:
                    self.waiter = None

    async def feed(self, sink: Callable[[int, bytes], bool]) -> None:
        """Call ``sink(arrival_ns, data)`` for each read until it returns True or the body
        ends (its error raised here); reads already queued go first."""
        queue = self.queue
        while queue:
            self.arrival_ns, data = queue.popleft()
            self.queued -= len(data)
            if sink(self.arrival_ns, data):
                return
        self.conn.resume_reading()
        if not self.done:
            self.sink = sink
            self.waiter = asyncio.get_running_loop().create_future()
            self.conn.waiting()
            try:
                await self.waiter
            finally:
                self.waiter = None
                self.sink = None
        if self.sink_exc is not None:
            raise self.sink_exc
        if self.exc is not None:
            raise self.exc

    async def aclose(self) -> None:
        self.conn.release(self)


class _Connection:
    """One keep-alive HTTP/1.1 connection on a non-blocking socket read by the event loop.

    The loop calls :meth:`_readable` when the socket has data; ``recvmsg`` returns it with the
    kernel's receive time of its last segment (``SO_TIMESTAMPNS``, realtime, turned into the
    monotonic clock with the two clocks' offset read at that moment), so a read's stamp is when
    the bytes reached this host, not when a busy loop got round to them. Without kernel stamps
    (not Linux) the stamp is taken at the read.
    """

    def __init__(self, pool: PlainHTTPTransport, key: tuple[str, int], sock: socket.socket) -> None:
        self.pool = pool
        self.key = key
        self.sock = sock
        self.fd = sock.fileno()
        self.loop = asyncio.get_running_loop()
        self.kernel_stamps = _enable_kernel_stamps(sock)
        self.closed = False
        self.state = _IDLE
        self.buf = b""
        self.left = 0
        self.no_body = False
        self.reusable = True
        self.lost = False
        self.idle_since = 0.0
        self.head_waiter: asyncio.Future | None = None
        self.body: _Body | None = None
        self.read_timeout_s: float | None = None
        self.last_read_ns = 0
        self.wait_ns = 0
        self.timer: asyncio.TimerHandle | None = None
        self.read_paused = False
        self.body_bytes = 0
        self.pending: _TimedWrite | None = None
        self.loop.add_reader(self.fd, self._readable)

    # -- the socket ------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            self.abort()
            return
        if not data:
            self._lost(None)
            self.abort()
            return
        now = time.perf_counter_ns()
        if ancillary and len(ancillary[-1][2]) >= 16:
            # Kernel receive time (CLOCK_REALTIME) moved onto perf_counter's clock; a stamp
            # that cannot be right (clock stepped between the two) falls back to now.
            sec, nsec = _TIMESPEC.unpack_from(ancillary[-1][2])
            stamp = sec * NS + nsec - (time.time_ns() - time.perf_counter_ns())
            if now - NS < stamp <= now:
                now = stamp
        self.last_read_ns = now
        state = self.state
        if _HEAD < state < _COMPLETE:
            self._body_bytes(data, now)
        elif state == _HEAD:
            self._head_bytes(data, now)
        else:
            self.reusable = False  # bytes nobody asked for: never reuse this connection
            self.abort()

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self.loop.remove_reader(self.fd)

    def resume_reading(self) -> None:
        if self.read_paused and not self.closed:
            self.read_paused = False
            self.loop.add_reader(self.fd, self._readable)

    async def send_all(self, data: bytes, timeout_s: float | None) -> None:
        """Write ``data`` now; only a full socket buffer makes this wait (write timeout)."""
        view = memoryview(data)
        try:
            async with asyncio.timeout(timeout_s):
                while view:
                    try:
                        view = view[self.sock.send(view) :]
                    except (BlockingIOError, InterruptedError):
                        await self._writable()
        except TimeoutError as exc:
            raise httpx.WriteTimeout(f"request not written within {timeout_s} s") from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc)) from exc

    async def _writable(self) -> None:
        waiter = self.loop.create_future()
        self.loop.add_writer(self.fd, lambda: waiter.done() or waiter.set_result(None))
        try:
            await waiter
        finally:
            if not self.closed:
                self.loop.remove_writer(self.fd)

    def write_rest(self, data: bytes) -> None:
        """The part of a timed write the socket did not take at once (loop side)."""
        if not self.closed:
            self.loop.create_task(self._write_rest(data))

    async def _write_rest(self, data: bytes) -> None:
        try:
            await self.send_all(data, None)
        except httpx.HTTPError as exc:
            self._fail(exc)
            self.abort()

    def abort(self) -> None:
        """Close the connection (idempotent); a timed write not yet made never will be."""
        self._cancel_pending()
        self.reusable = False
        self.timer_cancel()
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
            self.sock.close()
            if not self.lost:
                # Closed from this side: whoever still waits is told so (a cancelled waiter
                # needs nothing).
                self.lost = True
                head = self.head_waiter
                if head is not None and not head.done():
                    head.cancel()
                if self.body is not None and not self.body.done:
                    self.body.finish(httpx.ReadError("connection closed by the client"))
        self.pool._forget(self)

    # -- the request side ------------------------------------------------------------------

    def start(self, head_only: bool, read_timeout_s: float | None) -> None:
        self.state = _HEAD
        self.no_body = head_only
        self.read_timeout_s = read_timeout_s
        self.buf = b""
        self.body = None
        self.head_waiter = self.loop.create_future()

    async def head(self) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        waiter = self.head_waiter
        assert waiter is not None
        if not waiter.done():
            self.waiting()
        return await waiter

    def waiting(self) -> None:
        """A head or body read starts waiting: the read timeout runs from now or the last byte."""
        self.wait_ns = time.perf_counter_ns()
        if self.read_timeout_s is not None and self.timer is None:
            self.timer = self.loop.call_later(self.read_timeout_s, self._check)

    def _check(self) -> None:
        self.timer = None
        head, body = self.head_waiter, self.body
        waiting = (head is not None and not head.done()) or (
            body is not None and body.waiter is not None and not body.waiter.done()
        )
        if not waiting or self.read_timeout_s is None:
            return
        idle_s = (time.perf_counter_ns() - max(self.last_read_ns, self.wait_ns)) / NS
        if idle_s < self.read_timeout_s:
            self.timer = self.loop.call_later(self.read_timeout_s - idle_s, self._check)
            return
        self._fail(httpx.ReadTimeout(f"no data for {self.read_timeout_s} s"))
        self.abort()

    def release(self, body: _Body) -> None:
        """The body stream was closed: back to the pool, drain, or close."""
        if body is not self.body:
            return
        if self.state == _COMPLETE and self.reusable and not self.lost:
            self._to_pool()
        elif body.reuse_when_complete and self.reusable and not self.lost and not body.exc:
            self.timer_cancel()
            self.timer = self.loop.call_later(_DRAIN_GRACE_S, self.abort)
        else:
            self.abort()

    def _cancel_pending(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def fail_head(self, exc: BaseException) -> None:
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_exception(exc)

    def withdrawn(self) -> None:
        if self.reusable and not self.lost and not self.closed:
            self._to_pool()
        else:
            self.abort()

    def timer_cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _to_pool(self) -> None:
        self.timer_cancel()
        self.state = _IDLE
        self.body = None
        self.head_waiter = None
        self.pool._release(self)

    # -- the response side -----------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_exception(exc)
        elif self.body is not None and not self.body.done:
            self.body.finish(exc)

    def _lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.reusable = False
        self.timer_cancel()
        state = self.state
        if state == _UNTIL_EOF:
            self._complete()
        elif state == _HEAD:
            self._fail(
                httpx.ReadError(str(exc))
                if exc is not None
                else httpx.RemoteProtocolError("Server disconnected without sending a response.")
            )
        elif _HEAD < state < _COMPLETE:
            if exc is not None:
                self._fail(httpx.ReadError(str(exc)))
            else:
                what = (
                    f"received {self.body_bytes} bytes, expected {self.body_bytes + self.left}"
                    if state == _LENGTH
                    else "incomplete chunked read"
                )
                self._fail(httpx.RemoteProtocolError(
                    f"peer closed connection without sending complete message body: {what}"
                ))  # fmt: skip

    def _protocol_error(self, message: str) -> None:
        self._fail(httpx.RemoteProtocolError(message))
        self.abort()

    def _head_bytes(self, data: bytes, now_ns: int) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    self._protocol_error("response head too large")
                else:
                    self.buf = buf
                return
            lines = buf[:end].split(b"\r\n")
            buf = buf[end + 4 :]
            parts = lines[0].split(b" ", 2)
            try:
                status = int(parts[1])
            except (IndexError, ValueError):
                status = 0
            if not parts[0].startswith(b"HTTP/1.") or not 100 <= status <= 999:
                self._protocol_error(f"malformed status line {lines[0][:100]!r}")
                return
            if status < 200 and status != 101:
                continue  # informational (100 Continue, 103 Early Hints): the real head follows
            break
        headers = []
        chunked, length = False, None
        keep_alive = parts[0] != b"HTTP/1.0"
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                self._protocol_error(f"malformed header line {line[:100]!r}")
                return
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"transfer-encoding":
                chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
            elif lower == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    self._protocol_error(f"malformed Content-Length {value[:50]!r}")
                    return
            elif lower == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    keep_alive = False
                elif b"keep-alive" in tokens:
                    keep_alive = True
        self.reusable = self.reusable and keep_alive
        self.buf = b""
        self.body = _Body(self)
        self.body_bytes = 0
        if status == 101:
            self.state, self.reusable = _COMPLETE, False  # another protocol: not ours to read
        elif self.no_body or status in (204, 304):
            self.state = _COMPLETE
        elif chunked:
            self.state = _CHUNK_SIZE
        elif length is not None:
            self.state, self.left = (_LENGTH, length) if length else (_COMPLETE, 0)
        else:
            self.state = _UNTIL_EOF
            self.reusable = False
        reason = parts[2] if len(parts) > 2 else b""
        head = self.head_waiter
        if head is not None and not head.done():
            head.set_result((status, reason, headers))
        if self.state == _COMPLETE:
            self._complete(buf)
        elif buf:
            self._body_bytes(buf, now_ns)

    def _body_bytes(self, data: bytes, now_ns: int) -> None:
        state = self.state
        if state == _UNTIL_EOF:
            self.body.push(now_ns, data)
            return
        if state == _LENGTH:
            take = min(self.left, len(data))
            self.left -= take
            self.body_bytes += take
            self.body.push(now_ns, data[:take] if take < len(data) else data)
            if not self.left:
                self._complete(data[take:])
            return
        buf = self.buf + data if self.buf else data
        self.buf = b""
        pos, n, out = 0, len(buf), []
        while pos < n:
            if state == _CHUNK_DATA:
                take = min(self.left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.left -= take
                if not self.left:
                    state = _CHUNK_END
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > _MAX_HEAD_BYTES:
                    self._protocol_error("chunk header or trailer line too long")
                    return
                self.buf = buf[pos:]
                break
            line, pos = buf[pos:eol], eol + 2
            if state == _CHUNK_SIZE:
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    self._protocol_error(f"malformed chunk size line {line[:50]!r}")
                    return
                if size:
                    self.left, state = size, _CHUNK_DATA
                else:
                    state = _TRAILER
            elif state == _CHUNK_END:
                if line:
                    self._protocol_error("chunk data longer than its declared size")
                    return
                state = _CHUNK_SIZE
            elif not line:  # the blank line that ends the trailer ends the message
                self.state = state
                if out:
                    self.body.push(now_ns, b"".join(out))
                self._complete(buf[pos:])
                return
        self.state = state
        if out:
            self.body.push(now_ns, out[0] if len(out) == 1 else b"".join(out))

    def _complete(self, extra: bytes = b"") -> None:
        if extra:
            self.reusable = False  # bytes after the response's end: never reuse this connection
        self.state = _COMPLETE
        self.timer_cancel()
        body = self.body
        if body is not None:
            draining = body.reuse_when_complete
            body.finish()
            if draining and self.reusable and not self.lost:
                self._to_pool()  # the reader let go before the end; it has come now


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class _State:
    in_flight: int = 0
    sent: int = 0
    finished: int = 0
    failed: int = 0
    due_unsent: int = 0
    streamed_tokens: int = 0
    ok_by_class: dict[str, int] = field(default_factory=dict)
    terminal_by_class: dict[str, int] = field(default_factory=dict)


class _Block:
    """One open-loop block's arrivals, and how many of them have been sent or settled."""

    __slots__ = ("due", "decided")

    def __init__(self, due: list[int]) -> None:
        self.due = due
        self.decided = 0


class Run:
    """One point: the schedule, the client, the records, the series."""

    def __init__(
        self,
        schedule: pd.DataFrame,
        settings: LoadSettings,
        records_path: str | Path,
        *,
        prewarm: pd.DataFrame | None = None,
    ):
        self.schedule = schedule.reset_index(drop=True)
        self.prewarm = prewarm
        self.s = settings
        self.writer = RecordWriter(records_path)
        if settings.shard is not None:
            self.writer.suffix = f',"shard":{int(settings.shard)}'
        self.state = _State()
        self.lateness_ns: list[int] = []
        self.loop_lag_ns: list[int] = []
        self.series: list[tuple[int, int, str, str, float]] = []
        self.t0_ns = 0
        self.t0_realtime_ns = 0
        self.blocks_sent = 0
        self.extension_rebase_ns: list[int] = []
        self._requests: dict[str, httpx.Request] = {}
        self._client: httpx.AsyncClient | None = None
        # Counters the dispatcher thread updates too (at a timed send) are changed under it.
        self._lock = threading.Lock()
        self._dispatcher: _Dispatcher | None = None
        self._own_transport = False
        self._lead_ns = 0
        self._block: _Block | None = None
        path = "completions" if settings.endpoint == "completions" else "chat/completions"
        self._url = f"{settings.base_url}/v1/{path}"
        key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
        self._headers = {"Content-Type": "application/json"}
        if not settings.keep_alive:
            # One connection per request: for servers that drop a reused connection without
            # answering (llama.cpp's llama-server after a few streamed responses).
            self._headers["Connection"] = "close"
        self._auth: dict[str, str] = {}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
            self._auth["Authorization"] = f"Bearer {key}"
            # A server's error text may quote the key: no record may carry it. (A key under
            # 8 characters would also match inside ordinary numbers and text.)
            if len(key) >= 8:
                self.writer.secrets = [key]

    # -- request construction --------------------------------------------------------------

    def _payload(self, row: dict[str, Any], prompt: str) -> dict[str, Any]:
        s = self.s
        body: dict[str, Any] = {"model": s.model, "stream": True}
        n_out = int(row["output_tokens"])
        if s.endpoint == "completions":
            body["prompt"] = prompt
            body["max_tokens"] = n_out
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
            body["max_completion_tokens"] = n_out
        if s.include_usage:
            body["stream_options"] = {"include_usage": True}
        if s.ignore_eos:
            body["ignore_eos"] = True
        if s.stop_sequences:
            body["stop"] = s.stop_sequences
        body.update({k: v for k, v in s.sampling.items() if v is not None})
        return body

    def _body(self, row: dict[str, Any]) -> bytes:
        return json.dumps(self._payload(row, self._prompt(row)), separators=(",", ":")).encode()

    def _request(self, row: dict[str, Any]) -> httpx.Request:
        assert self._client is not None
        return self._client.build_request(
            "POST",
            self._url,
            content=self._body(row),
            headers={**self._headers, "X-Request-Id": row["request_id"]},
        )

    def _prepare(self, rows: list[dict[str, Any]]) -> None:
        """Build the requests (prompt text, JSON body, httpx.Request) before the clock starts,
        so dispatch never waits on them."""
        for row in rows:
            self._requests[row["request_id"]] = self._request(row)

    def _prompt(self, row: dict[str, Any]) -> str:
        # A real target's tokenizer (tokenizer.json or /tokenize) fits the text to the exact
        # count; without one, the project's words are exact for the simulated engine.
        return build_prompt_for(
            self.s.token_counter,
            input_tokens=int(row["input_tokens"]),
            prompt_seed=int(row["prompt_seed"]),
            prefix_id=int(row["prefix_id"]),
            prefix_tokens=int(row["prefix_tokens"]),
            prefix_revision=self.s.prefix_revision,
            cold_unique_prefix_tokens=self.s.cold_unique_prefix_tokens,
            corpus_revision=self.s.corpus_revision,
        )

    # -- one request -----------------------------------------------------------------------

    async def _send(
        self, client, row: dict[str, Any], due_ns: int, block: _Block | None = None
    ) -> None:
        a = Attempt(
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
        st, lock, ceiling = self.state, self._lock, self.s.max_in_flight
        request = self._requests.pop(a.request_id, None) or self._request(row)
        cancel_after = int(row.get("cancel_after_ns", -1))
        # Until the request is written (it may be prepared ahead of its due time): a request
        # that never is (no connection) keeps the later of now and its due time.
        now = time.perf_counter_ns()
        a.sent_ns = max(now, due_ns)
        a.sent_realtime_ns = time.time_ns() + a.sent_ns - now
        gated = sent = False

        def gate(now_ns: int) -> bool:
            # At the send instant, on the dispatcher thread for a timed send: stamp, then the
            # in-flight ceiling (in flight = written and not yet ended).
            nonlocal gated, sent
            a.sent_ns = now_ns
            a.sent_realtime_ns = time.time_ns()
            gated = True
            with lock:
                if block is not None:
                    block.decided += 1
                if ceiling is not None and st.in_flight >= ceiling:
                    return False
                st.in_flight += 1
                st.sent += 1
            sent = True
            return True

        if self._own_transport:
            request.extensions[SENT_HOOK] = gate
            if due_ns and self._lead_ns:
                request.extensions[SEND_AT] = due_ns
        elif not gate(time.perf_counter_ns()):
            self._reject(a)
            return
        limit_s = self.s.request_timeout_s
        cancel_s = cancel_after / NS if cancel_after >= 0 else None
        deadline_s = min(limit_s, cancel_s) if cancel_s is not None else limit_s
        # Both limits count from the send, not from the early preparation of a timed send.
        deadline_s += max(0, due_ns - time.perf_counter_ns()) / NS
        try:
            async with asyncio.timeout(deadline_s):
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
        except RequestWithdrawn:
            self._reject(a)
            return
        except TimeoutError:
            cancelled = cancel_s is not None and cancel_s <= limit_s
            a.status = "cancelled" if cancelled else "timeout"
            a.error = (
                f"cancelled by policy after {cancel_s:.3f} s"
                if cancelled
                else f"no complete response within {limit_s:.3f} s"
            )
        except httpx.HTTPError as exc:
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a failed request is data, never a crash
            a.status = "error"
            a.error = f"{type(exc).__name__}: {exc}"
        finally:
            if a.status != "rejected" or a.http_status is not None:
                a.end_ns = time.perf_counter_ns()
                a.end_realtime_ns = time.time_ns()
                with lock:
                    if sent:
                        st.in_flight -= 1
                    else:
                        st.sent += 1  # attempted, never written (no connection, cancelled)
                        if block is not None and not gated:
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
                    async with asyncio.timeout(_DRAIN_GRACE_S):
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
            a.error = f"output_tokens {got} != the class's {a.output_tokens_expected}"
        else:
            a.status = "ok"

    def _finish(self, a: Attempt) -> None:
        st = self.state
        if a.due_ns:
            self.lateness_ns.append(a.sent_ns - a.due_ns)
        st.finished += 1
        if a.status != "ok":
            st.failed += 1
        if a.phase in ("measure", "extension"):
            st.terminal_by_class[a.klass] = st.terminal_by_class.get(a.klass, 0) + 1
            if a.status == "ok":
                st.ok_by_class[a.klass] = st.ok_by_class.get(a.klass, 0) + 1
        self.writer.write(a.to_json(self.t0_ns, self.t0_realtime_ns))

    # -- load modes ------------------------------------------------------------------------

    async def _open_loop(self, client, rows: list[dict[str, Any]], base_ns: int) -> None:
        """Send ``rows`` at base_ns + scheduled offset; returns when all have terminated."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = set()
        all_handed = loop.create_future()
        due = [base_ns + int(r["scheduled_offset_ns"]) for r in rows]
        block = self._block = _Block(due)

        def start(i: int) -> None:
            task = loop.create_task(self._send(client, rows[i], due[i], block))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if i == len(rows) - 1 and not all_handed.done():
                all_handed.set_result(None)

        dispatcher = self._dispatcher
        assert dispatcher is not None
        feeder = None
        if self._lead_ns:
            # Timed sends: the loop starts each request a lead early (its own timers, to the
            # millisecond, are enough for that); the thread writes it at its due time.
            dispatcher.expect(due)
            feeder = loop.create_task(self._feed([t - self._lead_ns for t in due], start))
        else:
            dispatcher.arrivals(due, start)
        try:
            if rows:
                await all_handed
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            if feeder is not None:
                feeder.cancel()
            dispatcher.arrivals([], None)
            dispatcher.expect([])

    @staticmethod
    async def _feed(times: list[int], start: Callable[[int], None]) -> None:
        for i, t in enumerate(times):
            delay_ns = t - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / NS)
            start(i)

    async def _closed_loop(self, client, rows: list[dict[str, Any]]) -> None:
        it = iter(rows)

        async def worker() -> None:
            for row in it:
                await self._send(client, row, 0)

        n = self.s.concurrency or 1
        await asyncio.gather(*(worker() for _ in range(n)))

    # -- watchers ---------------------------------------------------------------------------

    async def _lag_monitor(self, stop: asyncio.Event) -> None:
        period = 0.010
        while not stop.is_set():
            before = time.perf_counter_ns()
            await asyncio.sleep(period)
            # epoll rounds timeouts up to whole milliseconds: lag beyond that is the loop's.
            self.loop_lag_ns.append(max(0, time.perf_counter_ns() - before - int(period * NS)))

    async def _scraper(self, client, stop: asyncio.Event) -> None:
        url = f"{self.s.base_url}/metrics"
        interval = self.s.metrics_interval_s
        # The clock may start a little ahead (timed sends): the series starts with it.
        await asyncio.sleep(max(0, self.t0_ns - time.perf_counter_ns()) / NS)
        next_t = time.perf_counter()
        while True:
            t_ns = time.perf_counter_ns()
            rt_ns = time.time_ns()
            st = self.state
            rel = t_ns - self.t0_ns
            self.series += [
                (rel, rt_ns, "client", "in_flight", float(st.in_flight)),
                (rel, rt_ns, "client", "due_unsent", float(self._due_unsent(t_ns))),
                (rel, rt_ns, "client", "finished", float(st.finished)),
                (rel, rt_ns, "client", "streamed_tokens", float(st.streamed_tokens)),
            ]
            if self.s.scrape_metrics:
                try:
                    resp = await client.get(url, timeout=max(0.5, interval))
                    if resp.status_code == 200:
                        for key, val in parse_metrics(resp.text).items():
                            self.series.append((rel, rt_ns, "server", key, val))
                except Exception:  # a scrape failure is a gap in the series, not a crash
                    self.series.append((rel, rt_ns, "client", "scrape_failed", 1.0))
            if stop.is_set():
                return
            next_t += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_t - time.perf_counter()))

    def _due_unsent(self, now_ns: int) -> int:
        block = self._block
        if block is None:
            return 0
        return max(0, bisect.bisect_right(block.due, now_ns) - block.decided)

    async def _progress(self, stop: asyncio.Event, total: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            st = self.state
            late = np.percentile(self.lateness_ns[-500:], 99) / 1e6 if self.lateness_ns else 0.0
            line = (
                f"\r  sent {st.sent}/{total}  finished {st.finished}  failed {st.failed}  "
                f"in flight {st.in_flight}  lateness p99 {late:.2f} ms "
            )
            print(line, end="", file=sys.stderr, flush=True)
        print(file=sys.stderr, flush=True)

    # -- extension blocks --------------------------------------------------------------------

    def _short_classes(self, projected: bool) -> list[str]:
        gate = self.s.min_successful_per_class
        if gate is None:
            return []
        st = self.state
        measured = self.schedule[self.schedule["phase"].isin(["measure", "extension"])]
        scheduled = measured["class"].value_counts().to_dict()
        short = []
        for klass, n in scheduled.items():
            ok = st.ok_by_class.get(klass, 0)
            if projected:
                done = st.terminal_by_class.get(klass, 0)
                ok = n * (ok / done) if done else n
            if ok < gate:
                short.append(klass)
        return short

    # -- entry point ---------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        # The dispatcher thread must get the GIL promptly when an arrival is due.
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        choice = self.s.transport
        own = choice == "capacity_pack" or (choice == "auto" and self._url.startswith("http://"))
        limits = httpx.Limits(
            max_connections=None,
            # httpcore's pool scans every connection, and polls every idle one, for each idle
            # one on every request: unbounded, that grows quadratically and melts the client
            # past ~100 RPS. Bounding the idle pool only closes surplus idle connections; new
            # ones still open whenever needed. Our transport keeps every idle connection.
            max_keepalive_connections=None if own else HTTPX_MAX_IDLE_CONNECTIONS,
            # Under the 5 s keep-alive timeout of uvicorn (vLLM, SGLang, the simulator), so an
            # idle connection is dropped here before the server can close it under a request.
            keepalive_expiry=4.0,
        )
        timeout = httpx.Timeout(
            self.s.request_timeout_s, connect=min(10.0, self.s.request_timeout_s)
        )
        self._dispatcher = _Dispatcher(asyncio.get_running_loop())
        self._dispatcher.start()
        transport = PlainHTTPTransport(limits, scheduler=self._dispatcher) if own else None
        # TLS as the target says (the https:// default transport; ours serves http only).
        verify = verify_setting(self.s.tls_verify, self.s.ca_bundle)
        self._own_transport = own
        self._lead_ns = LEAD_NS if self._own_transport and self.s.mode != "closed" else 0
        stop = asyncio.Event()
        watchers: list[asyncio.Task] = []
        frozen = False
        try:
            async with httpx.AsyncClient(
                transport=transport,
                limits=limits,
                timeout=timeout,
                verify=verify,
                # A compressed event stream would hold events back in the server's compressor.
                # The key goes to every request, /metrics scrapes included (llama-server guards
                # /metrics with it).
                headers={"Accept-Encoding": "identity", **self._auth},
                # Requests are independent: no cookie (a load balancer's stickiness) carries over.
                cookies=_NoCookies(),
            ) as client:
                self._client = client
                rows = self.schedule.to_dict("records")
                self._prepare(rows)
                if self.prewarm is not None and len(self.prewarm):
                    await asyncio.gather(
                        *(self._send(client, r, 0) for r in self.prewarm.to_dict("records"))
                    )
                # Everything allocated so far (pandas, the schedule, the bodies) is long-lived:
                # moved out of the collector's sight, a full collection during the run stays
                # cheap instead of pausing the loop for tens of milliseconds.
                gc.collect()
                gc.freeze()
                frozen = True
                if self.s.start_at is not None:
                    # A shared start (realtime) mapped onto this process's monotonic clock.
                    start_rt = int(self.s.start_at())
                    mono, rt = time.perf_counter_ns(), time.time_ns()
                    self.t0_ns = mono + (start_rt - rt)
                    self.t0_realtime_ns = start_rt
                else:
                    # The clock starts one lead ahead, so even the first arrivals are prepared
                    # early.
                    self.t0_ns = time.perf_counter_ns() + self._lead_ns
                    self.t0_realtime_ns = time.time_ns() + self._lead_ns
                # The client's CPU from the start on (a shard's wait for the others excluded).
                cpu0 = time.process_time()
                watchers = [
                    asyncio.create_task(self._lag_monitor(stop)),
                    asyncio.create_task(self._scraper(client, stop)),
                ]
                if self.s.progress:
                    watchers.append(asyncio.create_task(self._progress(stop, len(self.schedule))))
                if self.s.side_tasks is not None:
                    watchers += [asyncio.create_task(c) for c in self.s.side_tasks(self, stop)]
                if self.s.mode == "closed":
                    await self._closed_loop(client, rows)
                else:
                    await self._open_loop(client, rows, self.t0_ns)
                self.blocks_sent = int(self.schedule["block"].max()) if len(rows) else 0
                await self._extend(client)
                stop.set()
                await asyncio.gather(*watchers)
                self.cpu_s = time.process_time() - cpu0
        finally:
            stop.set()
            for w in watchers:
                w.cancel()
            self._dispatcher.stop()
            sys.setswitchinterval(old_switch)
            if frozen:
                gc.unfreeze()
            self.writer.close()
        self.wall_s = (time.perf_counter_ns() - self.t0_ns) / NS
        return self.summary()

    async def _extend(self, client) -> None:
        """Extension blocks while a class is under its sample gate and time remains."""
        make = self.s.extension_block
        if make is None:
            return
        limit_ns = None
        if self.s.maximum_duration_s is not None:
            limit_ns = self.t0_ns + int(self.s.maximum_duration_s * NS)
        while self._short_classes(projected=False):
            if limit_ns is not None and time.perf_counter_ns() >= limit_ns:
                return
            rows = make(self.blocks_sent + 1)
            if rows is None or not len(rows):
                return
            self.blocks_sent += 1
            self.schedule = pd.concat([self.schedule, rows], ignore_index=True)
            records = rows.to_dict("records")
            self._prepare(records)
            if self.s.mode == "closed":
                await self._closed_loop(client, records)
                continue
            # The block continues the seeded process; it starts now, gaps preserved.
            first = int(rows["scheduled_offset_ns"].iloc[0])
            base = time.perf_counter_ns() + self._lead_ns - first
            self.extension_rebase_ns.append(base - self.t0_ns)
            if limit_ns is not None:
                records = [r for r in records if base + int(r["scheduled_offset_ns"]) <= limit_ns]
            await self._open_loop(client, records, base)

    def series_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            self.series, columns=["t_offset_ns", "realtime_ns", "source", "metric", "value"]
        )

    def summary(self) -> dict[str, Any]:
        st = self.state
        late = np.array(self.lateness_ns, dtype=float) / 1e6
        lag = np.array(self.loop_lag_ns, dtype=float) / 1e6

        def pct(x: np.ndarray, q: float) -> float | None:
            return float(np.percentile(x, q)) if x.size else None

        late_p99 = pct(late, 99)
        return {
            "mode": self.s.mode,
            "concurrency": self.s.concurrency,
            "requests_recorded": self.writer.count,
            "sent": st.sent,
            "finished": st.finished,
            "failed": st.failed,
            "ok_by_class": st.ok_by_class,
            "terminal_by_class": st.terminal_by_class,
            "streamed_tokens": st.streamed_tokens,
            "wall_s": self.wall_s,
            "client_cpu_s": self.cpu_s,
            "client_cpu_ms_per_1k_tokens": (
                1000 * self.cpu_s / st.streamed_tokens * 1000 if st.streamed_tokens else None
            ),
            "dispatch_lateness_ms": {
                "p50": pct(late, 50),
                "p99": pct(late, 99),
                "max": pct(late, 100),
            },
            "event_loop_lag_ms": {"p50": pct(lag, 50), "p99": pct(lag, 99), "max": pct(lag, 100)},
            "lateness_bound_ms": self.s.lateness_bound_ms,
            "client_transport": "capacity_pack" if self._own_transport else "httpx",
            "dispatcher_scheduling": (
                self._dispatcher.scheduling if self._dispatcher is not None else None
            ),
            "client_bound": late_p99 is not None and late_p99 > self.s.lateness_bound_ms,
            "extension_blocks": max(0, self.blocks_sent - 1),
            "extension_rebase_offset_ns": self.extension_rebase_ns,
            "under_sampled_classes": self._short_classes(projected=False),
        }


class _Dispatcher(threading.Thread):
    """The dispatcher thread: sleeps until the next deadline, then acts on it.

    Two uses. Timed sends (our transport): the thread wakes once at each expected due time
    (``expect``) and writes the prepared requests due by then (``write_at``, no wake-up needed
    to register one); a request registered after its due time was checked is written by the
    caller at once. Hand-overs (httpx's transport): ``start(i)`` goes to the loop through
    ``call_soon_threadsafe`` at ``times[i]``.

    ``threading.Condition.wait`` sleeps outside the GIL and wakes within tens of microseconds
    (the thread's timer slack is set to 1 us where Linux allows, and it asks for SCHED_FIFO
    where permitted, so a busy machine does not hold its wake-up back); the lowered switch
    interval bounds its wait for the GIL while the loop works.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="capacity-pack-dispatch", daemon=True)
        self.loop = loop
        self.cond = threading.Condition(threading.Lock())
        self.times: list[int] = []
        self.next = 0
        self.start_cb: Callable[[int], None] | None = None
        self.expected: list[int] = []
        self.next_expected = 0
        self.writes: list[tuple[int, int, _TimedWrite]] = []
        self.seq = 0
        self.checked_ns = 0  # every write due by then has been taken
        self.wake_ns = 0  # when the sleeping thread means to wake
        self.stopped = False
        self.scheduling = "normal"

    def arrivals(self, times: list[int], start: Callable[[int], None] | None) -> None:
        """Hand ``start(i)`` to the loop at ``times[i]`` (perf_counter_ns), in order."""
        with self.cond:
            self.times, self.next, self.start_cb = times, 0, start
            self.cond.notify()

    def expect(self, due: list[int]) -> None:
        """The (sorted) due times that timed writes will be registered for."""
        with self.cond:
            self.expected, self.next_expected = due, 0
            self.cond.notify()

    def write_at(self, t_ns: int, write: _TimedWrite) -> bool:
        """Register a timed write; False if ``t_ns`` is already past (write it now yourself)."""
        with self.cond:
            if t_ns <= self.checked_ns:
                return False
            heapq.heappush(self.writes, (t_ns, self.seq, write))
            self.seq += 1
            if t_ns < self.wake_ns:
                self.cond.notify()  # not an expected due time: wake earlier for it
            return True

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.join(timeout=5)

    def run(self) -> None:
        self.scheduling = _dispatcher_priority()
        clock, cond, writes = time.perf_counter_ns, self.cond, self.writes
        while True:
            due: list[_TimedWrite] = []
            start, i = None, 0
            with cond:
                while True:
                    if self.stopped:
                        return
                    now = clock()
                    while writes and writes[0][0] <= now:
                        due.append(heapq.heappop(writes)[2])
                    self.checked_ns = now
                    if self.next < len(self.times) and self.times[self.next] <= now:
                        start, i = self.start_cb, self.next
                        self.next += 1
                    if due or start is not None:
                        break
                    expected, k = self.expected, self.next_expected
                    while k < len(expected) and expected[k] <= now:
                        k += 1
                    self.next_expected = k
                    wake = now + NS
                    if k < len(expected):
                        wake = min(wake, expected[k])
                    if writes:
                        wake = min(wake, writes[0][0])
                    if self.next < len(self.times):
                        wake = min(wake, self.times[self.next])
                    self.wake_ns = wake
                    cond.wait((wake - now) / NS)
                    self.wake_ns = 0
            for write in due:
                write.fire()
            if start is not None:
                try:
                    self.loop.call_soon_threadsafe(start, i)
                except RuntimeError:  # the loop is closed: the run is over
                    return


class _NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: Any) -> None:
        return None


def _dispatcher_priority() -> str:
    """Make the calling thread's wake-ups punctual; returns its scheduling policy's name.

    Timer slack 1 us (Linux's default of 50 us lets a sleep end that much late), then
    SCHED_FIFO at the lowest real-time priority where the process may (root, CAP_SYS_NICE):
    the thread then preempts ordinary work when its deadline comes instead of queueing behind
    it. It runs for tens of microseconds per request, so it takes nothing from anyone.
    """
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in nanoseconds
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (AttributeError, OSError):
        return "normal"
    return "SCHED_FIFO"


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(err)[:500]
    except (ValueError, AttributeError):
        return text[:500]


def run_point(
    schedule: pd.DataFrame,
    settings: LoadSettings,
    records_path: str | Path,
    *,
    metrics_path: str | Path | None = None,
    summary_path: str | Path | None = None,
    prewarm: pd.DataFrame | None = None,
    extra_summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one point to completion; write records (streamed), metrics parquet and summary."""
    run = Run(schedule, settings, records_path, prewarm=prewarm)
    summary = asyncio.run(run.run())
    summary.update(extra_summary or {})
    if metrics_path is not None:
        frame = run.series_frame()
        with atomic_path(metrics_path) as tmp:
            frame.to_parquet(tmp, index=False)
    if summary_path is not None:
        write_json_atomic(summary_path, _finite(summary))
    return summary


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
