"""vLLM's error format, shared by a simulated replica and the router in front of several.

Errors are ``{"error": {"message", "type", "param", "code"}}`` with vLLM's type names
(:data:`ERROR_NAMES`), written as compact JSON (:func:`dumps`, as the pydantic JSON vLLM sends).
:class:`InjectedDisconnect` is the one exception that ends a response on purpose: raised inside
a stream, it makes the server drop the connection (an injected fault, or the router passing on
a replica that died mid-response).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

log = logging.getLogger("capacity_pack.sim")


class BadRequest(Exception):
    """A request the server refuses (400 unless ``status`` says otherwise), naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


class InjectedDisconnect(Exception):
    """Raised inside a stream to make the server drop the connection (a fault, not a bug)."""


def dumps(obj: Any) -> bytes:
    # Compact, like the pydantic JSON vLLM sends.
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(status: int, err_type: str, message: str, param: str | None = None) -> bytes:
    return dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def error_response(status: int, err_type: str, message: str, param: str | None = None) -> Response:
    return Response(
        error_body(status, err_type, message, param),
        status_code=status,
        media_type="application/json",
    )


ERROR_NAMES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


async def json_object(request: Request) -> dict[str, Any]:
    """A control request's body: a JSON object, ``{}`` when empty, else :class:`BadRequest`."""
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


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own HTTP errors (unknown path, wrong method) in vLLM's format."""
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code, ERROR_NAMES.get(exc.status_code, "HTTPError"), str(exc.detail)
    )


async def internal_error(request: Request, exc: Exception) -> Response:
    """Any other exception: a 500 in vLLM's format, logged unless it was an injected drop."""
    if not isinstance(exc, InjectedDisconnect):
        log.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(500, "InternalServerError", f"{type(exc).__name__}: {exc}")
