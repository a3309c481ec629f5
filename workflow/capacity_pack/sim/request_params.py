"""A completion request's body, checked and read as vLLM reads it (the simulator's subset).

``max_tokens`` / ``max_completion_tokens`` (completions default 16, chat default: the rest of the
context), ``min_tokens``, ``ignore_eos``, ``stop``, ``seed``, ``stream`` and ``stream_options``
(``include_usage``, ``continuous_usage_stats``) are read; the prompt (a string, token ids, or a
list of one of them; chat messages through the chat template) is counted with
:mod:`capacity_pack.sim.tokenizer`. Refused with :class:`~capacity_pack.sim.wire.BadRequest`:
``n > 1``, ``echo``, ``logprobs``, several prompts in one request, an unknown model (404), a
context too long, and malformed fields.
"""

from __future__ import annotations

from typing import Any

from capacity_pack.sim.tokenizer import chat_prompt_text, encode
from capacity_pack.sim.wire import BadRequest

_TOKEN_ID_LIMIT = 1 << 32


class Params:
    """One request's generation settings, as :func:`parse_params` read them."""

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


def parse_params(data: Any, endpoint: str, model_name: str, max_model_len: int) -> Params:
    """The settings of a ``completions`` or ``chat_completions`` body, or :class:`BadRequest`."""
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    model = data.get("model")
    if model is not None and model != model_name:
        raise BadRequest(f"The model `{model}` does not exist.", "model", status=404)
    n = _get_int(data, "n", 1)
    if n is not None and n != 1:
        raise BadRequest("n > 1 is not supported by the simulated engine", "n")
    if data.get("echo"):
        raise BadRequest("echo is not supported by the simulated engine", "echo")
    if data.get("logprobs") not in (None, False) or data.get("top_logprobs"):
        raise BadRequest("logprobs are not supported by the simulated engine", "logprobs")
    p = Params()
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
        max_tokens = 16 if endpoint == "completions" else max_model_len - num_prompt
    if num_prompt + max_tokens > max_model_len or max_tokens < 1:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"you requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "max_tokens",
        )
    p.max_tokens = max_tokens
    min_tokens = _get_int(data, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise BadRequest(
            f"min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
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
