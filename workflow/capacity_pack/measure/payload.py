"""The HTTP requests of one run: URL, headers, and each request's JSON body with its prompt.

Every request is a streamed ``POST /v1/completions`` (``prompt``, ``max_tokens``) or
``POST /v1/chat/completions`` (one user message, ``max_completion_tokens``) with the class's
output length as the limit, ``stream_options.include_usage``, ``ignore_eos`` (the fixed-length
workload contract), the stop sequences and the sampling parameters of the pack, and an
``X-Request-Id`` header naming the scheduled request. The prompt is built to the row's exact
input length: read from the point's prepared prompts (:mod:`capacity_pack.plan.prepared`) where
they hold the request, else built here (:class:`capacity_pack.plan.prompt_fit.PromptFitter`: the
target's tokenizer where the pack names one, else the project's words, exact for the simulated
engine).

The API key (from the environment variable ``api_key_env`` names) goes with every request and
scrape; a key of 8 characters or more is also listed in :attr:`RequestBuilder.secrets`, the
texts no record may carry.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from capacity_pack.measure.settings import LoadSettings
from capacity_pack.plan.prompt_fit import PromptFitter


class RequestBuilder:
    """Builds the requests of one run from its settings and schedule rows."""

    def __init__(self, settings: LoadSettings) -> None:
        self.s = settings
        self._prepared: dict[str, str] = settings.prepared_prompts or {}
        self._fitter: PromptFitter | None = None
        path = "completions" if settings.endpoint == "completions" else "chat/completions"
        self.url = f"{settings.base_url}/v1/{path}"
        key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
        self.headers = {"Content-Type": "application/json"}
        if not settings.keep_alive:
            # One connection per request: for servers that drop a reused connection without
            # answering (llama.cpp's llama-server after a few streamed responses).
            self.headers["Connection"] = "close"
        self.auth: dict[str, str] = {}
        self.secrets: list[str] = []
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
            self.auth["Authorization"] = f"Bearer {key}"
            # A server's error text may quote the key: no record may carry it. (A key under
            # 8 characters would also match inside ordinary numbers and text.)
            if len(key) >= 8:
                self.secrets = [key]

    def payload(self, row: dict[str, Any], prompt: str) -> dict[str, Any]:
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

    def body(self, row: dict[str, Any]) -> bytes:
        return json.dumps(self.payload(row, self.prompt(row)), separators=(",", ":")).encode()

    def request(self, client: httpx.AsyncClient, row: dict[str, Any]) -> httpx.Request:
        return client.build_request(
            "POST",
            self.url,
            content=self.body(row),
            headers={**self.headers, "X-Request-Id": row["request_id"]},
        )

    def session_request(
        self, client: httpx.AsyncClient, row: dict[str, Any], contents: list[str]
    ) -> httpx.Request:
        """A session's later turn: the conversation so far, ``contents`` (turn 0's prompt,
        then each answer and each later user message): one prompt joined by spaces, or
        alternating user and assistant chat messages."""
        body = self.payload(row, " ".join(contents))
        if "messages" in body:
            roles = ("user", "assistant")
            body["messages"] = [
                {"role": roles[i % 2], "content": text} for i, text in enumerate(contents)
            ]
        return client.build_request(
            "POST",
            self.url,
            content=json.dumps(body, separators=(",", ":")).encode(),
            headers={**self.headers, "X-Request-Id": row["request_id"]},
        )

    def fitter(self) -> PromptFitter:
        """The fit for what was not prepared, made on first use (most runs never need it)."""
        if self._fitter is None:
            self._fitter = PromptFitter(self.s.token_counter)
        return self._fitter

    def user_message(self, row: dict[str, Any]) -> str:
        """A session's later turn: its new user message, prepared or fitted here."""
        text = self._prepared.get(row["request_id"])
        if text is not None:
            return text
        return self.fitter().user_message(
            int(row["prompt_seed"]), int(row["user_tokens"]), self.s.corpus_revision
        )

    def prompt(self, row: dict[str, Any]) -> str:
        text = self._prepared.get(row["request_id"])
        if text is not None:
            return text
        # Not prepared (an extension block, a prewarm request, a target counted by /tokenize):
        # fitted here to the target's tokenizer, or the project's words for the simulated one.
        return self.fitter().prompt(
            {
                "input_tokens": int(row["input_tokens"]),
                "prompt_seed": int(row["prompt_seed"]),
                "prefix_id": int(row["prefix_id"]),
                "prefix_tokens": int(row["prefix_tokens"]),
                "prefix_revision": self.s.prefix_revision,
                "cold_unique_prefix_tokens": self.s.cold_unique_prefix_tokens,
                "corpus_revision": self.s.corpus_revision,
                "prefix_blocks": str(row.get("prefix_blocks") or ""),
                "block_tokens": self.s.prefix_block_tokens,
            }
        )
