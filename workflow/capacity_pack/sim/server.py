"""The simulator's HTTP face: an OpenAI-compatible server in vLLM's wire format.

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streamed one token per event, the
usage chunk with ``stream_options.include_usage``), ``/health``, ``/ping``, ``/version``,
``/v1/models``, ``/metrics``, ``/reset_prefix_cache`` and the control routes under ``/sim/``
(guarded by :mod:`capacity_pack.sim.control`); errors in vLLM's format and type names.
Each route, parameter and error: docs/reference.md, 'The simulated engine's API'.

Module map: :mod:`capacity_pack.sim.request_params` reads a completion request's body,
:mod:`capacity_pack.sim.streaming` writes the streamed responses, :mod:`capacity_pack.sim.wire`
holds the error format (shared with the router) and :mod:`capacity_pack.sim.serving` runs an app
under uvicorn; this module holds the routes (:class:`SimServer`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capacity_pack.sim.engine import Engine, Faults, Rejected
from capacity_pack.sim.engine_report import RequestContext
from capacity_pack.sim.metrics import CONTENT_TYPE
from capacity_pack.sim.pacing import mono_ns
from capacity_pack.sim.request_params import Params, parse_params
from capacity_pack.sim.scheduler import FINISHED, SimRequest
from capacity_pack.sim.streaming import (
    RAW_SEND,
    StreamResponse,
    failure_message,
    request_usage,
    watch_disconnect,
)
from capacity_pack.sim.wire import (
    ERROR_NAMES,
    BadRequest,
    dumps,
    error_response,
    http_error,
    internal_error,
    json_object,
)


class _Entry:
    """The replica's ASGI entry: its Starlette app, with the server's own ``send`` kept in the
    scope (under ``RAW_SEND``) for a stream's per-token body events."""

    __slots__ = ("app",)

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope[RAW_SEND] = send
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
                exception_handlers={HTTPException: http_error, Exception: internal_error},
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
                update = await json_object(request)
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
            data = await json_object(request)
            seconds = data.get("seconds")
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                raise BadRequest("seconds must be a non-negative number", "seconds")
        except BadRequest as err:
            return error_response(400, "BadRequestError", err.message, err.param)
        self.engine.stall(float(seconds))
        return JSONResponse({"stalled_s": float(seconds)})

    async def sim_kill(self, request: Request) -> Response:
        try:
            data = await json_object(request)
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
            p = parse_params(data, endpoint, self.model_name, self.max_model_len)
        except BadRequest as err:
            err_type = ERROR_NAMES.get(err.status, "BadRequestError")
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
            return StreamResponse(self.engine, self._model_json, req, ctx, p, endpoint, arrival)
        return await self._complete(request, req, ctx, p, endpoint, arrival)

    async def _complete(
        self,
        request: Request,
        req: SimRequest,
        ctx: RequestContext,
        p: Params,
        endpoint: str,
        arrival: int,
    ) -> Response:
        engine = self.engine
        watcher = asyncio.get_running_loop().create_task(
            watch_disconnect(request.receive, req, ctx)
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
            return error_response(503, "ServiceUnavailableError", failure_message(req))
        ctx.first_sent_ns = ctx.last_sent_ns = mono_ns()
        engine.record(req, ctx, arrival)
        text = req.output_text(0, req.num_output)
        usage = request_usage(req)
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
            dumps(body),
            media_type="application/json",
            headers={"x-request-id": ctx.client_request_id},
        )
