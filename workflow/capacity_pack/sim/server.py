"""The simulator's HTTP face: an OpenAI-compatible server in vLLM's wire format.

Endpoints:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: streaming and not. A stream is
  ``data: {json}\\n\\n`` server-sent events, one generated token per event (chat opens with a
  ``delta.role`` event); the last token's event carries ``finish_reason``; with
  ``stream_options.include_usage`` a usage-only chunk (``choices: []``, ``usage {prompt_tokens,
  total_tokens, completion_tokens}`` and ``prompt_tokens_details.cached_tokens`` when the prefix
  cache supplied tokens) follows; ``data: [DONE]`` ends it. ``max_tokens`` /
  ``max_completion_tokens`` (completions default 16, chat default: the rest of the context),
  ``min_tokens``, ``ignore_eos``, ``stop``, ``seed`` are honoured; the prompt is counted with
  :mod:`capacity_pack.sim.tokenizer`. An ``X-Request-Id`` header names the request (echoed back and
  written to the ground-truth log).
- ``GET /health``, ``GET|POST /ping``, ``GET /version``, ``GET /v1/models``, ``GET /metrics``,
  ``POST /reset_prefix_cache`` (200 either way, like vLLM; the body's ``reset`` says whether it
  happened and ``sim:prefix_cache_resets_total{result}`` counts both outcomes).
- ``/metrics`` also carries ``sim:server_info{loop, http}`` (constant 1) and ``/sim/state`` a
  ``server`` object with the same two names: the event loop and HTTP/1.1 parser the server runs
  on (:func:`serving_stack`; uvloop and httptools unless ``--loop``/``--http`` say otherwise).
- Control: ``GET /sim/state``, ``GET|POST /sim/faults`` (partial update of the fault knobs),
  ``POST /sim/stall {"seconds"}``, ``POST /sim/kill {"after_s"}``.

Access (:mod:`capacity_pack.sim.control`, in front of this app in ``sim serve``): a ``Host``
other than the bound address gets 403 on every route (DNS rebinding); the data plane is otherwise
as open as vLLM's. Control routes need ``X-Sim-Control-Token`` (the token file's, 401 without)
and JSON bodies (415). ``/reset_prefix_cache`` needs no token, by choice: vLLM's needs none and
the pack resets vLLM-compatible engines, this one included, with that call; it keeps the
``Host``, ``Origin`` and JSON checks, so no web page reaches it, and a reset is refused while KV
blocks are in use.

Errors are ``{"error": {"message", "type", "param", "code"}}`` with vLLM's type names: 400
``BadRequestError`` (malformed body, context too long), 404 ``NotFoundError`` (unknown model or
path), 429 ``RateLimitError`` (waiting queue full), 503 ``ServiceUnavailableError`` (engine down,
request larger than the usable KV cache), and injected fault statuses. Not supported, and
refused with 400: ``n > 1``, ``echo``, ``logprobs``, and several prompts in one request.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capacity_pack.sim.engine import Engine, Faults, Rejected, RequestContext, mono_ns
from capacity_pack.sim.metrics import CONTENT_TYPE
from capacity_pack.sim.scheduler import FINISHED, OUTPUT_TEXT, SimRequest, output_index
from capacity_pack.sim.tokenizer import chat_prompt_text, encode

log = logging.getLogger("capacity_pack.sim")

OUTPUT_JSON = tuple(json.dumps(t).encode() for t in OUTPUT_TEXT)
# The scope key under which :class:`_Entry` keeps the server's own ``send``.
_RAW_SEND = "capacity_pack.sim.send"
_TOKEN_ID_LIMIT = 1 << 32


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


class InjectedDisconnect(Exception):
    """Raised inside a stream to make the server drop the connection (a fault, not a bug)."""


class _QuietInjected(logging.Filter):
    # uvicorn logs every exception escaping the app; an injected drop is intended behaviour.
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, InjectedDisconnect)


def _dumps(obj: Any) -> bytes:
    # Compact, like the pydantic JSON vLLM sends.
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(status: int, err_type: str, message: str, param: str | None = None) -> bytes:
    return _dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def error_response(status: int, err_type: str, message: str, param: str | None = None) -> Response:
    return Response(
        error_body(status, err_type, message, param),
        status_code=status,
        media_type="application/json",
    )


_ERROR_NAMES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class _Params:
    __slots__ = (
        "prompt_ids",
        "max_tokens",
        "min_tokens",
        "ignore_eos",
        "stop",
        "seed",
        "stream",
        "include_usage",
        "continuous_usage",
    )


def _get_int(data: dict[str, Any], name: str, minimum: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer", name)
    if value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}, got {value}", name)
    return value


def _get_bool(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", name)
    return value


def _token_ids(value: list[Any]) -> list[int]:
    if not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _TOKEN_ID_LIMIT for t in value
    ):
        raise BadRequest("prompt token ids must be integers in [0, 2^32)", "prompt")
    return list(value)


def _completion_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return _token_ids(prompt)
        if len(prompt) == 1:
            only = prompt[0]
            if isinstance(only, str):
                return encode(only)
            if isinstance(only, list):
                return _token_ids(only)
        if len(prompt) > 1:
            raise BadRequest(
                "batched prompts are not supported by the simulated engine; send one prompt "
                "per request",
                "prompt",
            )
    raise BadRequest("prompt must be a string, a list of token ids, or a list of one", "prompt")


class _Entry:
    """The replica's ASGI entry: its Starlette app, with the server's own ``send`` kept in the
    scope (under ``_RAW_SEND``) for a stream's per-token body events."""

    __slots__ = ("app",)

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope[_RAW_SEND] = send
        await self.app(scope, receive, send)


class SimServer:
    """Routes of one simulated replica around an :class:`Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.profile.model.max_model_len
        self._model_json = json.dumps(self.model_name)
        self._created = int(time.time())
        # The event loop and HTTP parser the server runs on (:func:`running_stack`), once
        # started; /metrics shows them as ``sim:server_info`` and /sim/state as ``server``.
        self.stack: dict[str, str] = {}

    # -- app --------------------------------------------------------------------------------

    def app(self) -> _Entry:
        import contextlib

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette):
            await self.engine.start()
            try:
                yield
            finally:
                await self.engine.stop()

        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
            Route("/sim/state", self.sim_state, methods=["GET"]),
            Route("/sim/faults", self.sim_faults, methods=["GET", "POST"]),
            Route("/sim/stall", self.sim_stall, methods=["POST"]),
            Route("/sim/kill", self.sim_kill, methods=["POST"]),
        ]
        return _Entry(
            Starlette(
                routes=routes,
                lifespan=lifespan,
                exception_handlers={HTTPException: _http_error, Exception: _internal_error},
            )
        )

    # -- simple endpoints -------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.engine.healthy:
            return Response(status_code=200)
        return error_response(
            503, "ServiceUnavailableError", f"engine not running: {self.engine.dead or 'stopped'}"
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": self.engine.profile.engine.engine_version})

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(8)}",
                    "object": "model_permission",
                    "created": self._created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(self, request: Request) -> Response:
        x = self.engine.metrics_exposition()
        if self.stack:
            labels = [
                ("model_name", self.model_name),
                ("engine", str(self.engine.engine_index)),
                ("loop", self.stack["loop"]),
                ("http", self.stack["http"]),
            ]
            x.gauge(
                "sim:server_info",
                "Event loop and HTTP/1.1 parser this server runs on, as labels of a constant 1.",
                [(labels, 1.0)],
            )
        return Response(x.text(), media_type=CONTENT_TYPE)

    async def reset_prefix_cache(self, request: Request) -> Response:
        ok = self.engine.reset_prefix_cache()
        return JSONResponse({"reset": ok, "blocks_in_use": self.engine.sched.pool.num_used})

    async def sim_state(self, request: Request) -> Response:
        return JSONResponse({**self.engine.state(), "server": self.stack})

    async def sim_faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                update = await _json_object(request)
                merged = {**self.engine.faults.model_dump(), **update}
                self.engine.set_faults(Faults.model_validate(merged))
            except BadRequest as err:
                return error_response(400, "BadRequestError", err.message, err.param)
            except ValidationError as err:
                first = err.errors()[0]
                return error_response(
                    400,
                    "BadRequestError",
                    f"{'.'.join(map(str, first['loc']))}: {first['msg']}",
                    str(first["loc"][0]),
                )
        return JSONResponse(self.engine.faults.model_dump())

    async def sim_stall(self, request: Request) -> Response:
        try:
            data = await _json_object(request)
            seconds = data.get("seconds")
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                raise BadRequest("seconds must be a non-negative number", "seconds")
        except BadRequest as err:
            return error_response(400, "BadRequestError", err.message, err.param)
        self.engine.stall(float(seconds))
        return JSONResponse({"stalled_s": float(seconds)})

    async def sim_kill(self, request: Request) -> Response:
        try:
            data = await _json_object(request)
            after_s = data.get("after_s", 0.0)
            if isinstance(after_s, bool) or not isinstance(after_s, int | float) or after_s < 0:
                raise BadRequest("after_s must be a non-negative number", "after_s")
        except BadRequest as err:
            return error_response(400, "BadRequestError", err.message, err.param)
        # A small floor lets this response reach the caller before the process dies.
        self.engine.schedule_kill(max(float(after_s), 0.05))
        return JSONResponse({"kill_in_s": max(float(after_s), 0.05)}, status_code=202)

    # -- generation -------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat_completions")

    def _parse(self, data: Any, endpoint: str) -> _Params:
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        model = data.get("model")
        if model is not None and model != self.model_name:
            raise BadRequest(f"The model `{model}` does not exist.", "model", status=404)
        n = _get_int(data, "n", 1)
        if n is not None and n != 1:
            raise BadRequest("n > 1 is not supported by the simulated engine", "n")
        if data.get("echo"):
            raise BadRequest("echo is not supported by the simulated engine", "echo")
        if data.get("logprobs") not in (None, False) or data.get("top_logprobs"):
            raise BadRequest("logprobs are not supported by the simulated engine", "logprobs")
        p = _Params()
        if endpoint == "completions":
            if "prompt" not in data:
                raise BadRequest("prompt is required", "prompt")
            p.prompt_ids = _completion_prompt(data["prompt"])
        else:
            messages = data.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list", "messages")
            try:
                p.prompt_ids = encode(chat_prompt_text(messages))
            except ValueError as err:
                raise BadRequest(str(err), "messages") from None
        num_prompt = len(p.prompt_ids)
        if num_prompt == 0:
            raise BadRequest("the prompt is empty (it has no tokens)", "prompt")
        max_tokens = _get_int(data, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _get_int(data, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = 16 if endpoint == "completions" else self.max_model_len - num_prompt
        if num_prompt + max_tokens > self.max_model_len or max_tokens < 1:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.",
                "max_tokens",
            )
        p.max_tokens = max_tokens
        min_tokens = _get_int(data, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise BadRequest(
                f"min_tokens ({min_tokens}) must be less than or equal to max_tokens "
                f"({max_tokens})",
                "min_tokens",
            )
        p.min_tokens = min_tokens
        p.ignore_eos = _get_bool(data, "ignore_eos", False)
        stop = data.get("stop")
        if stop is None:
            p.stop = ()
        elif isinstance(stop, str):
            p.stop = (stop,) if stop else ()
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            p.stop = tuple(s for s in stop if s)
        else:
            raise BadRequest("stop must be a string or a list of strings", "stop")
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise BadRequest("seed must be an integer", "seed")
        p.seed = seed
        p.stream = _get_bool(data, "stream", False)
        options = data.get("stream_options")
        p.include_usage = p.continuous_usage = False
        if options is not None:
            if not p.stream:
                raise BadRequest(
                    "Stream options can only be defined when `stream=True`.", "stream_options"
                )
            if not isinstance(options, dict):
                raise BadRequest("stream_options must be an object", "stream_options")
            p.include_usage = _get_bool(options, "include_usage", False)
            p.continuous_usage = _get_bool(options, "continuous_usage_stats", False)
        return p

    async def _generate(self, request: Request, endpoint: str) -> Response:
        arrival = mono_ns()
        rid = request.headers.get("x-request-id") or secrets.token_hex(16)
        ctx = RequestContext(rid, endpoint, False)
        engine = self.engine
        try:
            try:
                data = json.loads(await request.body())
            except ValueError:
                raise BadRequest("the request body is not valid JSON") from None
            p = self._parse(data, endpoint)
        except BadRequest as err:
            err_type = _ERROR_NAMES.get(err.status, "BadRequestError")
            ctx.status, ctx.error = err.status, err.message
            engine.reject("not_found" if err.status == 404 else "bad_request")
            engine.record(None, ctx, arrival)
            return error_response(err.status, err_type, err.message, err.param)
        ctx.stream = p.stream
        try:
            req = engine.submit(
                ctx,
                p.prompt_ids,
                max_tokens=p.max_tokens,
                min_tokens=p.min_tokens,
                ignore_eos=p.ignore_eos,
                stop_strings=p.stop,
                seed=p.seed,
                arrival_ns=arrival,
            )
        except Rejected as err:
            ctx.status, ctx.error = err.status, err.message
            engine.record(None, ctx, arrival)
            return error_response(err.status, err.err_type, err.message)
        if p.stream:
            return _StreamResponse(self, req, ctx, p, endpoint, arrival)
        return await self._complete(request, req, ctx, p, endpoint, arrival)

    async def _watch_disconnect(self, receive: Any, req: SimRequest, ctx: RequestContext) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                ctx.disconnected = True
                Engine._wake(req)
                return

    async def _complete(
        self,
        request: Request,
        req: SimRequest,
        ctx: RequestContext,
        p: _Params,
        endpoint: str,
        arrival: int,
    ) -> Response:
        engine = self.engine
        watcher = asyncio.get_running_loop().create_task(
            self._watch_disconnect(request.receive, req, ctx)
        )
        try:
            while req.status != FINISHED and not ctx.disconnected:
                await engine.wait(req)
        finally:
            watcher.cancel()
            if req.status != FINISHED:
                engine.abort(req)
        if req.finish_reason not in ("stop", "length"):
            ctx.status = 499 if ctx.disconnected else 503
            ctx.error = "client disconnected" if ctx.disconnected else "request failed"
            engine.record(req, ctx, arrival)
            return error_response(503, "ServiceUnavailableError", _failure_message(req))
        ctx.first_sent_ns = ctx.last_sent_ns = mono_ns()
        engine.record(req, ctx, arrival)
        text = req.output_text(0, req.num_output)
        usage = _usage(req)
        rid = ("cmpl-" if endpoint == "completions" else "chatcmpl-") + ctx.client_request_id
        if endpoint == "completions":
            body = {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": req.finish_reason,
                        "stop_reason": req.stop_reason,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": usage,
            }
        else:
            body = {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": req.finish_reason,
                        "stop_reason": req.stop_reason,
                    }
                ],
                "usage": usage,
                "prompt_logprobs": None,
            }
        return Response(
            _dumps(body),
            media_type="application/json",
            headers={"x-request-id": ctx.client_request_id},
        )


def _failure_message(req: SimRequest) -> str:
    if req.finish_reason == "error":
        return "the request was dropped: it no longer fits in the usable KV cache"
    return "the request was aborted by the server (shutting down or engine failure)"


def _usage(req: SimRequest) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": req.num_prompt,
        "total_tokens": req.num_prompt + req.num_output,
        "completion_tokens": req.num_output,
    }
    if req.num_cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": req.num_cached_tokens}
    return usage


class _StreamResponse(Response):
    """A server-sent-event stream fed straight from the engine's per-step wake-ups."""

    def __init__(
        self,
        server: SimServer,
        req: SimRequest,
        ctx: RequestContext,
        p: _Params,
        endpoint: str,
        arrival: int,
    ) -> None:
        self.server = server
        self.req = req
        self.ctx = ctx
        self.p = p
        self.endpoint = endpoint
        self.arrival = arrival
        # Routes only call the response; no status/headers attributes are read before that.
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        server, req, ctx, p = self.server, self.req, self.ctx, self.p
        engine = server.engine
        created = int(time.time())
        model = server._model_json
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
        watcher = loop.create_task(server._watch_disconnect(receive, req, ctx))
        # The engine writes each step's tokens itself (:class:`_Pusher`), straight to the
        # server's send: the wrappers in between only watch for http.response.start, sent
        # above through them.
        pusher = _Pusher(self, scope.get(_RAW_SEND, send), head, mid, chat, loop)
        try:
            req.listener = pusher.on_step
            pusher.on_step()  # tokens made before the listener was set, or an early finish
            await pusher.done
            if ctx.disconnected:
                return
            tail = []
            if req.finish_reason not in ("stop", "length"):
                error = error_body(503, "ServiceUnavailableError", _failure_message(req))
                tail.append(b"data: " + error + b"\n\n")
            elif p.include_usage:
                tail.append(usage_prefix + _dumps(_usage(req)) + b"}\n\n")
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
        usage = _dumps(_running_usage(req, k + 1))
        if chat:
            return b'},"logprobs":null,"finish_reason":null}],"usage":' + usage + b"}\n\n"
        tail = b',"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":'
        return tail + usage + b"}\n\n"

    def _final_tail(self, chat: bool, req: SimRequest, k: int) -> bytes:
        usage = _dumps(_running_usage(req, k + 1)) if self.p.continuous_usage else b"null"
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


class _Pusher:
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
        resp: _StreamResponse,
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
            resp.server.engine.faults_injected["disconnect"] += 1
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


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code, _ERROR_NAMES.get(exc.status_code, "HTTPError"), str(exc.detail)
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, InjectedDisconnect):
        log.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(500, "InternalServerError", f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------
# Running a server
# ---------------------------------------------------------------------------------------------


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 picks a free port (read it with ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # An explicit IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it the first token of a reused keep-alive
    # connection can wait up to 40 ms behind the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def install_log_filter() -> None:
    logging.getLogger("uvicorn.error").addFilter(_QuietInjected())


def _write_port_file(path: str | Path, port: int) -> None:
    """Write the bound port atomically (rename), so a reader never sees a torn file; the
    simulator keeps this small helper rather than import the project's io module."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    os.replace(tmp, target)


LOOPS = ("auto", "uvloop", "asyncio")
HTTP_PARSERS = ("auto", "httptools", "h11")


def _importable(name: str) -> bool:
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def serving_stack(loop: str = "auto", http: str = "auto") -> tuple[str, str]:
    """The event loop and HTTP/1.1 parser that ``loop`` and ``http`` name: ``auto`` takes uvloop
    and httptools (uvicorn's standard extras, a dependency) when importable, else asyncio and
    h11 (uvicorn's pure-Python defaults). Naming one that is not installed is a ``ValueError``."""
    if loop not in LOOPS:
        raise ValueError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if http not in HTTP_PARSERS:
        raise ValueError(f"--http must be one of {', '.join(HTTP_PARSERS)}, got {http!r}")
    has_uvloop = _importable("uvloop")
    has_httptools = _importable("httptools")
    if loop == "auto":
        loop = "uvloop" if has_uvloop else "asyncio"
    elif loop == "uvloop" and not has_uvloop:
        raise ValueError("--loop uvloop: uvloop is not installed (pip install 'uvicorn[standard]')")
    if http == "auto":
        http = "httptools" if has_httptools else "h11"
    elif http == "httptools" and not has_httptools:
        raise ValueError(
            "--http httptools: httptools is not installed (pip install 'uvicorn[standard]')"
        )
    return loop, http


def running_stack(config: Any) -> dict[str, str]:
    """What a started uvicorn server actually runs on, read from the running loop's class and
    the HTTP protocol class uvicorn loaded (``...h11_impl`` / ``...httptools_impl``)."""
    loop_module = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    http_module = config.http_protocol_class.__module__.rpartition(".")[2]
    return {"loop": loop_module, "http": http_module.removesuffix("_impl")}


def run_app(
    app: Any,
    sock: socket.socket,
    *,
    port_file: Path | None = None,
    announce: str | None = None,
    log_level: str = "warning",
    graceful_s: float = 2.0,
    loop: str = "auto",
    http: str = "auto",
    on_start: Callable[[dict[str, str]], None] | None = None,
) -> None:
    """Serve ``app`` on ``sock`` with uvicorn until SIGINT/SIGTERM, on the event loop and HTTP
    parser :func:`serving_stack` resolves ``loop`` and ``http`` to. Once the server accepts
    requests: ``on_start`` receives :func:`running_stack`, ``port_file`` gets the bound port
    (atomically) and ``announce`` is printed, formatted with ``port``, ``loop`` and ``http``."""
    import uvicorn

    loop_name, http_name = serving_stack(loop, http)
    install_log_filter()
    config = uvicorn.Config(
        app,
        loop=loop_name,
        http=http_name,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_s,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    port = sock.getsockname()[1]

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            stack = running_stack(config)
            if on_start is not None:
                on_start(stack)
            log.info("serving on event loop %s, HTTP parser %s", stack["loop"], stack["http"])
            # Start-up objects live as long as the server: keep them out of every GC pass, so
            # collections stay short and do not show up as step lateness.
            gc.freeze()
            if port_file is not None:
                _write_port_file(port_file, port)
            if announce:
                print(announce.format(port=port, **stack), flush=True)
        await task

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main())
