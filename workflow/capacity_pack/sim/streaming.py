"""A simulated replica's responses: the streamed one, token by token, and what both kinds carry.

A stream is ``data: {json}\\n\\n`` server-sent events, one generated token per event (chat
opens with a ``delta.role`` event); the last token's event carries ``finish_reason``; with
``stream_options.include_usage`` a usage-only chunk (``choices: []``, ``usage {prompt_tokens,
total_tokens, completion_tokens}`` and ``prompt_tokens_details.cached_tokens`` when the prefix
cache supplied tokens) follows; ``data: [DONE]`` ends it. The engine writes each step's tokens
itself, straight to the server's ``send`` (:class:`Pusher`); the events are built from byte
templates (:meth:`StreamResponse.body`), so a token costs a concatenation.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.responses import Response

from capacity_pack.sim.engine import Engine
from capacity_pack.sim.engine_report import RequestContext
from capacity_pack.sim.pacing import mono_ns
from capacity_pack.sim.request_params import Params
from capacity_pack.sim.scheduler import FINISHED, OUTPUT_TEXT, SimRequest, output_index
from capacity_pack.sim.wire import InjectedDisconnect, dumps, error_body

OUTPUT_JSON = tuple(json.dumps(t).encode() for t in OUTPUT_TEXT)
# The scope key under which the replica's ASGI entry (capacity_pack.sim.server.Entry) keeps the
# server's own ``send``.
RAW_SEND = "capacity_pack.sim.send"


async def watch_disconnect(receive: Any, req: SimRequest, ctx: RequestContext) -> None:
    """Until the client goes away: then mark ``ctx`` disconnected and wake the request."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ctx.disconnected = True
            Engine._wake(req)
            return


def failure_message(req: SimRequest) -> str:
    """Why a request did not end normally (the error of its 503)."""
    if req.finish_reason == "error":
        return "the request was dropped: it no longer fits in the usable KV cache"
    return "the request was aborted by the server (shutting down or engine failure)"


def request_usage(req: SimRequest) -> dict[str, Any]:
    """The ``usage`` object of a finished request."""
    usage: dict[str, Any] = {
        "prompt_tokens": req.num_prompt,
        "total_tokens": req.num_prompt + req.num_output,
        "completion_tokens": req.num_output,
    }
    if req.num_cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": req.num_cached_tokens}
    return usage


class StreamResponse(Response):
    """A server-sent-event stream fed straight from the engine's per-step wake-ups."""

    def __init__(
        self,
        engine: Engine,
        model_json: str,
        req: SimRequest,
        ctx: RequestContext,
        p: Params,
        endpoint: str,
        arrival: int,
    ) -> None:
        self.engine = engine
        self.model_json = model_json
        self.req = req
        self.ctx = ctx
        self.p = p
        self.endpoint = endpoint
        self.arrival = arrival
        # Routes only call the response; no status/headers attributes are read before that.
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        req, ctx, p = self.req, self.ctx, self.p
        engine = self.engine
        created = int(time.time())
        model = self.model_json
        chat = self.endpoint == "chat_completions"
        if chat:
            prefix = (
                f'data: {{"id":{json.dumps("chatcmpl-" + ctx.client_request_id)},'
                f'"object":"chat.completion.chunk","created":{created},"model":{model},'
                '"choices":[{"index":0,'
            ).encode()
            head = prefix + b'"delta":{"content":'
            mid = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            usage_prefix = prefix.split(b'"choices":')[0] + b'"choices":[],"usage":'
        else:
            prefix = (
                f'data: {{"id":{json.dumps("cmpl-" + ctx.client_request_id)},'
                f'"object":"text_completion","created":{created},"model":{model},'
                '"choices":[{"index":0,'
            ).encode()
            head = prefix + b'"text":'
            mid = b',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'
            usage_prefix = prefix.split(b'"choices":')[0] + b'"choices":[],"usage":'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"x-request-id", ctx.client_request_id.encode("latin-1", "replace")),
                ],
            }
        )
        if chat:
            await send(
                {
                    "type": "http.response.body",
                    "body": prefix + b'"delta":{"role":"assistant","content":""},"logprobs":null,'
                    b'"finish_reason":null}]}\n\n',
                    "more_body": True,
                }
            )
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(watch_disconnect(receive, req, ctx))
        # The engine writes each step's tokens itself (:class:`Pusher`), straight to the
        # server's send: the wrappers in between only watch for http.response.start, sent
        # above through them.
        pusher = Pusher(self, scope.get(RAW_SEND, send), head, mid, chat, loop)
        try:
            req.listener = pusher.on_step
            pusher.on_step()  # tokens made before the listener was set, or an early finish
            await pusher.done
            if ctx.disconnected:
                return
            tail = []
            if req.finish_reason not in ("stop", "length"):
                error = error_body(503, "ServiceUnavailableError", failure_message(req))
                tail.append(b"data: " + error + b"\n\n")
            elif p.include_usage:
                tail.append(usage_prefix + dumps(request_usage(req)) + b"}\n\n")
            tail.append(b"data: [DONE]\n\n")
            await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})
        finally:
            req.listener = None
            watcher.cancel()
            if req.status != FINISHED:
                engine.abort(req)
            if ctx.disconnected and ctx.error is None:
                ctx.error = "client disconnected"
            engine.record(req, ctx, self.arrival)

    def body(self, sent: int, n: int, head: bytes, mid: bytes, chat: bool) -> bytes:
        """The SSE events of tokens ``sent`` to ``n`` (the last one final when the request
        ended normally with it)."""
        req, p = self.req, self.p
        final = (
            req.status == FINISHED
            and n == req.num_output
            and req.finish_reason in ("stop", "length")
        )
        if n == sent + 1 and not final and req.text_limit is None and not p.continuous_usage:
            # One token, the usual case of a decode step: no list, one concatenation.
            return head + OUTPUT_JSON[output_index(req.out_seed, sent)] + mid
        parts = []
        if req.text_limit is None and not p.continuous_usage:
            for k in range(sent, n - 1 if final else n):
                parts += (head, OUTPUT_JSON[output_index(req.out_seed, k)], mid)
        else:
            for k in range(sent, n - 1 if final else n):
                parts += (head, _token_json(req, k), self._tail(chat, mid, req, k))
        if final:
            k = n - 1
            parts += (head, _token_json(req, k), self._final_tail(chat, req, k))
        return b"".join(parts)

    def _tail(self, chat: bool, mid: bytes, req: SimRequest, k: int) -> bytes:
        if not self.p.continuous_usage:
            return mid
        usage = dumps(_running_usage(req, k + 1))
        if chat:
            return b'},"logprobs":null,"finish_reason":null}],"usage":' + usage + b"}\n\n"
        tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":'
        return tail + usage + b"}\n\n"

    def _final_tail(self, chat: bool, req: SimRequest, k: int) -> bytes:
        usage = dumps(_running_usage(req, k + 1)) if self.p.continuous_usage else b"null"
        reason = json.dumps(req.finish_reason).encode()
        stop_reason = json.dumps(req.stop_reason).encode()
        if chat:
            tail = b'},"logprobs":null,"finish_reason":' + reason + b',"stop_reason":'
            tail += stop_reason + b"}]"
            return tail + (b',"usage":' + usage if self.p.continuous_usage else b"") + b"}\n\n"
        return (
            b',"logprobs":null,"finish_reason":'
            + reason
            + b',"stop_reason":'
            + stop_reason
            + b'}],"usage":'
            + usage
            + b"}\n\n"
        )


class Pusher:
    """Writes a stream's new tokens from inside the engine's step, one SSE event per token,
    until the request finishes, the client goes away or an injected disconnect cuts it.

    Why not a task per stream awaiting each step: at hundreds of streams the server's CPU per
    token decides the sustainable rate, and a task costs a future, a wake-up and a pass of the
    event loop per token. Here the engine calls :meth:`on_step` (``SimRequest.listener``) for
    each request that emitted, and the server's ``send`` coroutine is driven in place: it
    returns at once unless the transport is paused for flow control (a slow reader), and only
    then is it resumed from its future's callback, tokens made meanwhile going out together
    when it completes. ``done`` resolves when the stream's token events are over (with
    :class:`InjectedDisconnect` for a cut, or a write's error)."""

    __slots__ = ("resp", "send", "head", "mid", "chat", "loop", "done", "sent", "_coro")

    def __init__(
        self,
        resp: StreamResponse,
        send: Any,
        head: bytes,
        mid: bytes,
        chat: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.resp = resp
        self.send = send
        self.head = head
        self.mid = mid
        self.chat = chat
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.sent = 0
        self._coro: Any = None

    def on_step(self) -> None:
        """Called by the engine (in the loop) after a step that gave the request a token, when
        it finishes, or when the client goes away; never raises."""
        if self.done.done() or self._coro is not None:
            return  # over, or a write is waiting on flow control: it flushes when resumed
        try:
            self._push()
        except BaseException as err:  # handed to the response's own task
            if not self.done.done():
                self.done.set_exception(err)

    def _push(self) -> None:
        resp = self.resp
        req, ctx = resp.req, resp.ctx
        n = req.num_output
        cut = ctx.disconnect_after
        if cut is not None and n >= cut:
            n = cut
        if n > self.sent:
            body = resp.body(self.sent, n, self.head, self.mid, self.chat)
            self.sent = n
            coro = self.send({"type": "http.response.body", "body": body, "more_body": True})
            try:
                waiting = coro.send(None)
            except StopIteration:
                pass
            else:
                self._coro = coro
                self._wait(waiting)
                return
            self._written()
        self._check_end()

    def _wait(self, waiting: Any) -> None:
        if waiting is None:  # a bare yield (sleep(0)): resume on the next pass of the loop
            self.loop.call_soon(self._resume, None)
        else:
            waiting.add_done_callback(self._resume)

    def _resume(self, _: Any) -> None:
        try:
            waiting = self._coro.send(None)
        except StopIteration:
            self._coro = None
            self._written()
            self.on_step()  # what the engine made while the write waited, or the end
        except BaseException as err:
            self._coro = None
            if not self.done.done():
                self.done.set_exception(err)
        else:
            self._wait(waiting)

    def _written(self) -> None:
        ctx = self.resp.ctx
        t = mono_ns()
        if ctx.first_sent_ns is None:
            ctx.first_sent_ns = t
        ctx.last_sent_ns = t

    def _check_end(self) -> None:
        resp = self.resp
        req, ctx = resp.req, resp.ctx
        cut = ctx.disconnect_after
        if cut is not None and self.sent >= cut:
            ctx.error = "injected disconnect"
            ctx.disconnected = True
            resp.engine.faults_injected["disconnect"] += 1
            self.done.set_exception(InjectedDisconnect(f"cut after {self.sent} tokens"))
        elif req.status == FINISHED or ctx.disconnected:
            self.done.set_result(None)


def _running_usage(req: SimRequest, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": req.num_prompt,
        "total_tokens": req.num_prompt + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _token_json(req: SimRequest, k: int) -> bytes:
    if req.text_limit is None:
        return OUTPUT_JSON[output_index(req.out_seed, k)]
    return json.dumps(req.output_text(k, k + 1)).encode()
