"""Token counts from the server's own ``POST /tokenize``, in whichever registered engine's
format it speaks (vLLM and SGLang: ``{"model", "prompt"} -> {"count"}``; llama.cpp:
``{"content", "add_special"} -> {"tokens"}``; each engine module declares its own).

:class:`EndpointCounter` tries the formats in registration order. A format is passed over when
the server refuses it (HTTP 4xx) or answers something that is not that format's count, or no
token for a non-empty text (llama.cpp reads ``content`` and answers an empty token list to a
body without it); the last format's answer stands. The first answer to a non-empty text decides
the format for the rest of the run.
"""

from __future__ import annotations

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
    ):
        self.name = f"{base_url}/tokenize"
        # ``verify``: httpx's verify from the target's tls_verify/ca_bundle
        # (capacity_pack.engines.verify_setting).
        self._client = httpx.Client(
            base_url=base_url, headers=headers or {}, timeout=30, verify=verify
        )
        self.model = model
        self.format: TokenizeFormat | None = None

    @property
    def flavor(self) -> str | None:
        """The name of the format the server speaks, once known."""
        return self.format.name if self.format is not None else None

    def count(self, text: str) -> int:
        formats = [self.format] if self.format is not None else list(tokenize_formats())
        for i, fmt in enumerate(formats):
            trying = self.format is None and i < len(formats) - 1
            resp = self._client.post(fmt.path, json=fmt.body(self.model, text))
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
