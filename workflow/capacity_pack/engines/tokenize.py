"""Token counts from the server's own ``POST /tokenize``, in whichever registered engine's
format it speaks (vLLM and SGLang: ``{"model", "prompt"} -> {"count"}``; llama.cpp:
``{"content", "add_special"} -> {"tokens"}``; each engine module declares its own).

:class:`EndpointCounter` tries the formats in registration order. A format is passed over when
the server refuses it (HTTP 4xx) or answers something that is not that format's count, or no
token for a non-empty text (llama.cpp reads ``content`` and answers an empty token list to a
body without it); the last format's answer stands. The first answer to a non-empty text decides
the format for the rest of the run.

Counting runs from several threads at once (prompt fitting asks eight texts at a time): each
call holds a client of its own (an idle one, or a new one): one client's pool shared by eight
threads failed a prompt fit against llama-server (2026-12-03, ``[Errno 9] Bad file
descriptor`` on a read). A target that drops reused connections
(``keep_alive: false``) gets a fresh connection per call. A call that fails in transport (no
HTTP answer) is made once more on a new connection: a count is a read that changes nothing on
the server, unlike a measured request, which is never retried.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from capacity_pack.engines.base import TokenizeFormat
from capacity_pack.engines.registry import tokenize_formats
from capacity_pack.plan.prompts import TokenCounter


class EndpointCounter(TokenCounter):
    """The server's own ``POST /tokenize`` (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        headers: dict[str, str] | None = None,
        verify: Any = True,
        keep_alive: bool = True,
    ):
        self.name = f"{base_url}/tokenize"
        self.base_url = base_url
        self.headers = headers or {}
        # ``verify``: httpx's verify from the target's tls_verify/ca_bundle
        # (capacity_pack.engines.verify_setting).
        self.verify = verify
        self.keep_alive = keep_alive
        self.model = model
        self.format: TokenizeFormat | None = None
        # Idle clients: a call takes one (or makes one) and gives it back, so at most as many
        # exist as calls ever ran at once, whichever threads make them.
        self._idle: list[httpx.Client] = []
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _new_client(self) -> httpx.Client:
        limits = httpx.Limits(max_keepalive_connections=None if self.keep_alive else 0)
        client = httpx.Client(
            base_url=self.base_url,
            headers=self.headers,
            timeout=30,
            verify=self.verify,
            limits=limits,
        )
        with self._lock:
            self._clients.append(client)
        return client

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        with self._lock:
            client = self._idle.pop() if self._idle else None
        client = client or self._new_client()
        try:
            try:
                return client.post(path, json=body)
            except httpx.TransportError:
                client.close()
                client = self._new_client()
                return client.post(path, json=body)
        finally:
            with self._lock:
                self._idle.append(client)

    def close(self) -> None:
        with self._lock:
            clients, self._clients, self._idle = self._clients, [], []
        for client in clients:
            client.close()

    @property
    def flavor(self) -> str | None:
        """The name of the format the server speaks, once known."""
        return self.format.name if self.format is not None else None

    def count(self, text: str) -> int:
        formats = [self.format] if self.format is not None else list(tokenize_formats())
        for i, fmt in enumerate(formats):
            trying = self.format is None and i < len(formats) - 1
            resp = self._post(fmt.path, fmt.body(self.model, text))
            if resp.status_code >= 400 and trying:
                continue  # not this engine's shape: try the next
            resp.raise_for_status()
            body = resp.json()
            n = fmt.read(body)
            if trying and (n is None or (text and n == 0)):
                continue
            if n is None:
                raise ValueError(f"{self.name}: no {fmt.name} token count in {str(body)[:200]}")
            if text:
                self.format = fmt
            return n
        raise ValueError(f"{self.name}: no /tokenize format is registered")
