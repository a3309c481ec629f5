"""The load generator's SSE reader and plain-HTTP transport, against scripted byte streams."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity_pack.measure.connection import RequestWithdrawn
from capacity_pack.measure.dispatcher import Dispatcher
from capacity_pack.measure.records import Attempt
from capacity_pack.measure.sse import SSEReader
from capacity_pack.measure.transport import BODY_EXTENSION, SEND_AT, SENT_HOOK, PlainHTTPTransport
from capacity_pack.sim.tokenizer import count_tokens


def attempt(expected: int = 0) -> Attempt:
    return Attempt("r", 0, "c", "measure", 1, 1, expected, 0)


def completion(text, finish=None, rid="cmpl-1", style=0) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if style:
        choice["stop_reason"] = None
    return {"id": rid, "object": "text_completion", "created": 1, "model": "m",
            "choices": [choice], "usage": None}  # fmt: skip


def chat(content=None, role=None, finish=None) -> dict:
    delta = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}  # fmt: skip


USAGE = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                   "prompt_tokens_details": {"cached_tokens": 3}}}  # fmt: skip


def sse(*events, eol: str = "\n", space: bool = True) -> bytes:
    out = []
    for e in events:
        data = e if isinstance(e, str) else json.dumps(e, separators=(",", ":"))
        out.append(f"data:{' ' if space else ''}{data}{eol}{eol}")
    return "".join(out).encode()


def feed_all(reader: SSEReader, data: bytes, a: Attempt, cuts=(), now: int = 100) -> int:
    tokens, last = 0, 0
    for i, cut in enumerate([*sorted(cuts), len(data)]):
        tokens += reader.feed(data[last:cut], now + i, a)
        last = cut
        if reader.ended:
            break
    return tokens


# ---------------------------------------------------------------------------------------------
# SSE reader
# ---------------------------------------------------------------------------------------------


def test_completion_stream_with_usage():
    a = attempt()
    r = SSEReader(chat=False)
    data = sse(completion(" a"), completion(" b c"), completion(" d", "length"), USAGE, "[DONE]")
    assert r.feed(data, 5, a) == 4
    assert r.done and not r.failed
    assert a.chunk_tokens == [1, 2, 1] and a.chunk_ns == [5, 5, 5]
    assert a.first_token_ns == a.last_token_ns == 5
    assert a.finish_reason == "length"
    assert (a.prompt_tokens, a.completion_tokens, a.cached_tokens) == (7, 5, 3)


def test_chat_deltas_role_chunk_is_not_a_token():
    a = attempt()
    r = SSEReader(chat=True)
    data = sse(chat("", role="assistant"), chat(" hi"), chat(" there you"), chat(finish="stop"),
               "[DONE]")  # fmt: skip
    assert r.feed(data, 1, a) == 3
    assert a.chunk_tokens == [1, 2] and a.finish_reason == "stop" and r.done


def test_whitespace_only_text_counts_one_token_and_empty_text_none():
    a = attempt()
    r = SSEReader(chat=False)
    assert r.feed(sse(completion(" "), completion("")), 1, a) == 1
    assert a.chunk_tokens == [1]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ('{"error": {"message": "engine died", "type": "x"}}', "in-stream error: engine died"),
        ('{"object": "error", "error": "boom"}', "in-stream error: boom"),
    ],
)
def test_in_stream_error_event(event, message):
    a = attempt()
    r = SSEReader(chat=False)
    r.feed(sse(completion(" a"), event, completion(" b"), "[DONE]"), 1, a)
    assert r.failed and not r.done
    assert a.status == "error" and a.error == message
    assert a.chunk_tokens == [1]  # nothing after the error is read


def test_event_typed_error():
    a = attempt()
    r = SSEReader(chat=False)
    r.feed(b'event: error\ndata: {"message": "overloaded"}\n\n', 1, a)
    assert r.failed and a.error == "in-stream error: overloaded"
    a, r = attempt(), SSEReader(chat=False)
    r.feed(b"event: error\ndata: not json\n\n", 1, a)
    assert r.failed and a.error == "in-stream error: not json"


def test_malformed_event():
    a = attempt()
    r = SSEReader(chat=False)
    r.feed(b"data: {not json\n\n", 1, a)
    assert r.failed and a.error.startswith("malformed SSE event: '{not json")


def test_comments_ids_multiline_data_and_no_space_after_colon():
    a = attempt()
    r = SSEReader(chat=False)
    payload = json.dumps(completion(" x y"), indent=1)  # spread over several data lines
    lines = "".join(f"data:{line}\n" for line in payload.split("\n"))
    stream = f": keep-alive\n\nid: 7\nretry: 100\n{lines}\ndata:[DONE]\n\n".encode()
    assert r.feed(stream, 1, a) == 2
    assert r.done and a.chunk_tokens == [2]


def test_event_without_final_blank_line_is_read_at_the_end():
    a = attempt()
    r = SSEReader(chat=False)
    assert r.feed(sse(completion(" a")) + b"data: [DONE]", 1, a) == 1
    assert not r.done
    r.close(2, a)
    assert r.done


def test_template_shortcut_is_exact():
    """After the first plain event, events that only change the text skip json.loads; any
    event whose bytes differ elsewhere, or whose text needs unescaping, is parsed in full."""
    a = attempt()
    r = SSEReader(chat=False)
    events = [
        completion(" one"),  # learns the template
        completion(" two three"),  # template: plain text
        completion(' say "hi"'),  # escapes: full parse
        completion(" caf\u00e9\u00a0ok"),  # non-ASCII; NBSP is whitespace to str.split
        completion(' "text":"x"'),  # a key lookalike inside the text
        completion(" four", rid="cmpl-2"),  # another id: full parse
        completion(" five", "length"),  # finish reason: full parse
        USAGE,
        "[DONE]",
    ]
    total = r.feed(sse(*events), 1, a)
    texts = [e["choices"][0]["text"] for e in events[:-2]]
    assert a.chunk_tokens == [count_tokens(t) or 1 for t in texts]
    assert total == sum(a.chunk_tokens)
    assert r.prefix is not None and a.finish_reason == "length" and r.done


def test_template_needs_a_unique_text_key():
    r = SSEReader(chat=True)
    event = chat(" hi")
    event["choices"][0]["logprobs"] = {"content": [{"token": " hi", "logprob": -0.1}]}
    r.feed(sse(event), 1, attempt())
    assert r.prefix is None  # "content" twice: no position to trust


def reference(events: list[dict | str], chat_mode: bool) -> tuple[list[int], bool, str | None]:
    """Token counts, [DONE] seen and finish reason, by parsing every event in full."""
    counts, done, finish = [], False, None
    for e in events:
        if e == "[DONE]":
            done = True
            break
        for choice in e.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") if chat_mode else choice.get("text")
            if text:
                counts.append(count_tokens(text) or 1)
            finish = choice.get("finish_reason") or finish
    return counts, done, finish


WORDS = st.sampled_from([" a", " bb", " c d", " ", "", ' "q"', " \\", " é", " \u00a0x", " \n"])


@st.composite
def streams(draw):
    chat_mode = draw(st.booleans())
    make = (lambda t, f=None: chat(t, finish=f)) if chat_mode else completion
    events: list[dict | str] = [chat("", role="assistant")] if chat_mode else []
    events += [make(draw(WORDS)) for _ in range(draw(st.integers(0, 12)))]
    events += [make(draw(WORDS), "length"), USAGE, "[DONE]"]
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    indent = draw(st.sampled_from([None, 1]))  # compact events, or one field per data line
    ascii_only = draw(st.booleans())
    chunks = []
    for e in events:
        text = e if isinstance(e, str) else json.dumps(e, indent=indent, ensure_ascii=ascii_only)
        if draw(st.booleans()):
            chunks.append(f":ping{eol}")
        chunks.append("".join(f"data: {line}{eol}" for line in text.split("\n")) + eol)
    data = "".join(chunks).encode()
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=12))
    return chat_mode, events, data, cuts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_any_split_any_line_ending_reads_like_a_full_parse(case):
    chat_mode, events, data, cuts = case
    a = attempt()
    r = SSEReader(chat=chat_mode)
    tokens = feed_all(r, data, a, cuts)
    counts, done, finish = reference(events, chat_mode)
    assert a.chunk_tokens == counts and tokens == sum(counts)
    assert r.done == done and a.finish_reason == finish and not r.failed
    assert (a.prompt_tokens, a.completion_tokens, a.cached_tokens) == (7, 5, 3)
    assert a.chunk_ns == sorted(a.chunk_ns)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(WORDS, st.sampled_from(["cmpl-1", "cmpl-2"]), st.integers(0, 1)),
                max_size=15))  # fmt: skip
def test_template_never_disagrees_with_a_full_parse(items):
    events = [completion(t, rid=rid, style=style) for t, rid, style in items]
    a = attempt()
    r = SSEReader(chat=False)
    r.feed(sse(*events), 1, a)
    assert a.chunk_tokens == reference(events, False)[0]


# ---------------------------------------------------------------------------------------------
# Plain-HTTP transport, against a scripted server on 127.0.0.1
# ---------------------------------------------------------------------------------------------


class Script:
    """A one-port asyncio server; ``respond(request_bytes, writer)`` scripts each response."""

    def __init__(self, respond):
        self.respond = respond
        self.connections = 0
        self.requests: list[tuple[float, bytes]] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append((time.perf_counter_ns(), head + body))
                if await self.respond(head + body, writer) == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(*parts: bytes) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)
    return out + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def client(**kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=PlainHTTPTransport(**kw), timeout=httpx.Timeout(2.0))


def run(coro):
    return asyncio.run(coro)


def test_chunked_body_split_byte_by_byte_and_connection_reused():
    body = sse(completion(" a b"), completion(" c"), "[DONE]")

    async def respond(request, writer):
        for byte in [HEAD + chunked(body[:50], body[50:])][0]:
            writer.write(bytes([byte]))
            await writer.drain()

    async def main():
        async with Script(respond) as s, client() as c:
            for _ in range(3):
                r = await c.post(s.url + "/v1/completions", content=b"{}")
                assert r.status_code == 200 and r.content == body
            assert s.connections == 1
            assert all(
                req.startswith(b"POST /v1/completions HTTP/1.1\r\n") for _, req in s.requests
            )

    run(main())


def test_content_length_and_close_delimited_bodies():
    async def respond(request, writer):
        if b"/length" in request:
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nnope!")
            return None
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()
        return "close"

    async def main():
        async with Script(respond) as s, client() as c:
            r = await c.get(s.url + "/length")
            assert (r.status_code, r.text) == (404, "nope!")
            r = await c.get(s.url + "/length")
            assert s.connections == 1
            r = await c.get(s.url + "/eof")
            assert r.text == "until the end"
            r = await c.get(s.url + "/eof")
            assert r.text == "until the end" and s.connections == 2  # close: not reused

    run(main())


def test_informational_response_is_skipped():
    async def respond(request, writer):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    async def main():
        async with Script(respond) as s, client() as c:
            r = await c.get(s.url)
            assert (r.status_code, r.text) == (200, "ok")

    run(main())


@pytest.mark.parametrize(
    ("script", "error", "text"),
    [
        (HEAD + b"40\r\ndata: {", httpx.RemoteProtocolError, "closed connection"),
        (b"", httpx.RemoteProtocolError, "without sending a response"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345", httpx.RemoteProtocolError,
         "received 5 bytes, expected 10"),
        (b"garbage\r\n\r\n", httpx.RemoteProtocolError, "malformed status line"),
    ],
)  # fmt: skip
def test_protocol_failures_are_httpx_errors(script, error, text):
    async def respond(request, writer):
        writer.write(script)
        await writer.drain()
        return "close"

    async def main():
        async with Script(respond) as s, client() as c:
            with pytest.raises(error, match=text):
                async with c.stream("GET", s.url) as r:
                    await r.aread()

    run(main())


def test_read_timeout_and_refused_connection():
    async def respond(request, writer):
        writer.write(HEAD + b"5\r\nhello\r\n")
        await asyncio.sleep(5)

    async def main():
        async with Script(respond) as s:
            c = httpx.AsyncClient(transport=PlainHTTPTransport(), timeout=httpx.Timeout(0.3))
            async with c:
                t = time.monotonic()
                with pytest.raises(httpx.ReadTimeout):
                    await c.get(s.url)
                assert 0.25 < time.monotonic() - t < 2
        async with client() as c:
            with pytest.raises(httpx.ConnectError):
                await c.get("http://127.0.0.1:9/")

    run(main())


def test_server_closing_an_idle_connection_is_not_an_error():
    async def respond(request, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        return "close" if b"/bye" in request else None

    async def main():
        async with Script(respond) as s, client() as c:
            await c.get(s.url + "/bye")  # keep-alive as far as the client knows; then closed
            await asyncio.sleep(0.05)
            r = await c.get(s.url + "/again")
            assert r.text == "ok" and s.connections == 2

    run(main())


def test_timed_write_goes_out_at_its_due_time_never_before_and_a_withdrawn_one_not_at_all():
    async def respond(request, writer):
        writer.write(HEAD + chunked(sse(completion(" a"), "[DONE]")))

    async def main():
        dispatcher = Dispatcher(asyncio.get_running_loop())
        dispatcher.start()
        try:
            async with Script(respond) as s, client(scheduler=dispatcher) as c:
                await c.get(s.url)  # a connection to reuse
                due = time.perf_counter_ns() + 30_000_000
                dispatcher.expect([due])
                stamps = []

                def gate(now_ns):
                    stamps.append(now_ns)
                    return True

                req = c.build_request("POST", s.url, content=b"{}",
                                      extensions={SEND_AT: due, SENT_HOOK: gate})  # fmt: skip
                r = await c.send(req)
                assert r.status_code == 200 and len(stamps) == 1
                assert due <= stamps[0] < due + 20_000_000
                assert s.requests[-1][0] >= stamps[0]
                req = c.build_request("POST", s.url, content=b"{}",
                                      extensions={SEND_AT: time.perf_counter_ns() + 10_000_000,
                                                  SENT_HOOK: lambda now: False})  # fmt: skip
                with pytest.raises(RequestWithdrawn):
                    await c.send(req)
                await c.get(s.url)
                assert len(s.requests) == 3 and s.connections == 1
                # A send too close to its due time to hand over is written by the loop, never
                # before due: lead times spanning the threshold plus the send path's own cost,
                # so some reach the check inside it whatever this machine's speed.
                for lead_ns in range(0, 300_000, 2_000):
                    stamps.clear()

                    req = c.build_request("POST", s.url, content=b"{}")
                    due = time.perf_counter_ns() + lead_ns
                    req.extensions.update({SEND_AT: due, SENT_HOOK: gate})
                    r = await c.send(req)
                    assert r.status_code == 200 and len(stamps) == 1
                    assert stamps[0] >= due
        finally:
            dispatcher.stop()

    run(main())


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive stamps are Linux-only")
def test_read_stamp_is_when_the_bytes_arrived_not_when_the_loop_read_them():
    listener = socket.create_server(("127.0.0.1", 0))
    sent = []

    def serve():  # a thread, so it can send while the client's loop is blocked
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(HEAD)
            time.sleep(0.02)
            sent.append(time.perf_counter_ns())
            conn.sendall(chunked(sse(completion(" a"), "[DONE]")))
            time.sleep(0.2)

    thread = threading.Thread(target=serve)
    thread.start()

    async def main():
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with client() as c, c.stream("GET", url) as r:
            time.sleep(0.1)  # the loop is busy elsewhere when the chunk arrives
            read_at = time.perf_counter_ns()
            got = []
            await r.extensions[BODY_EXTENSION].feed(lambda now, data: got.append(now) or True)
            return got, read_at

    try:
        (got,), read_at = run(main())
    finally:
        thread.join()
        listener.close()
    assert 0 <= got - sent[0] < 2_000_000 < read_at - got


@pytest.mark.parametrize("transport", ["capacity_pack", "httpx"])
def test_a_run_reuses_its_connections(tmp_path, transport):
    """Keep-alive under either transport: the body is read to its end after [DONE], so the
    connection goes back to the pool instead of being closed (one connection per request)."""
    import numpy as np
    import pandas as pd

    from capacity_pack.measure.records import read_records
    from capacity_pack.measure.run import run_point
    from capacity_pack.measure.settings import LoadSettings

    async def respond(request, writer):
        writer.write(HEAD + chunked(sse(completion(" a"), completion(" b")))[:-5])
        await writer.drain()
        writer.write(chunked(sse("[DONE]")))

    n = 12
    schedule = pd.DataFrame({
        "request_id": [f"k.{i}" for i in range(n)], "seq": np.arange(n), "block": 1,
        "phase": "measure", "class": "c", "input_tokens": 8, "output_tokens": 2,
        "scheduled_offset_ns": np.arange(n) * 20_000_000, "prefix_id": -1, "prefix_tokens": 0,
        "prompt_seed": np.arange(n), "cancel_after_ns": -1,
    })  # fmt: skip

    async def main():
        async with Script(respond) as s:
            settings = LoadSettings(
                base_url=s.url, model="m", mode="open", request_timeout_s=5,
                scrape_metrics=False, include_usage=False, transport=transport,
            )  # fmt: skip
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, run_point, schedule, settings, tmp_path / "r.jsonl")
            return s.connections

    assert run(main()) == 1
    assert {r["status"] for r in read_records(tmp_path / "r.jsonl")} == {"ok"}


def test_a_read_stamp_is_the_kernels_within_a_second_and_never_before_the_previous_read():
    from capacity_pack.measure.connection import NS, receive_stamp

    now = 10 * NS
    assert receive_stamp(now + 500 - 1_000, 500, now, 0) == now - 1_000  # the kernel's
    assert receive_stamp(now + 500 + 1, 500, now, 0) == now  # after now: a step, now
    assert receive_stamp(now - 2 * NS, 0, now, 0) == now  # more than a second old: now
    # Two reads close together, the second's offset read 40 ns later: never in reverse.
    assert receive_stamp(now - 1_040, 0, now, now - 1_000) == now - 1_000
