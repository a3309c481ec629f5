"""Server-sent events of an OpenAI-compatible streaming response, read into an Attempt.

A stream is read by :class:`SSEReader` as its bytes arrive (OpenAI completions and chat chunk
shapes; ``json.loads`` only where its exact byte-template check cannot vouch for an event).
Every non-empty text chunk is stamped with the arrival time of the read that completed it and
counted as ``count_tokens(text) or 1`` tokens (:func:`capacity_pack.sim.tokenizer.count_tokens`).
"""

from __future__ import annotations

import json
import re

from capacity_pack.measure.records import Attempt
from capacity_pack.sim.tokenizer import count_tokens

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
        if a.text is not None:
            a.text.append(text)  # a session's next turn carries this answer
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
