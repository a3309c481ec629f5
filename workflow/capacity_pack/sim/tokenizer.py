"""The project's deterministic tokenizer, shared by the simulated engine and the load generator.

Revision ``capacity-pack-ws-v1`` (the default pack's ``model.tokenizer_revision``):

- tokens of a text = ``text.split()``: the maximal runs of non-whitespace characters, with any
  Unicode whitespace as separator, so leading, trailing and repeated whitespace yield no token;
- id of a token = ``zlib.crc32(token.encode("utf-8"))``, an unsigned 32-bit integer that is the
  same in every process, Python version and machine (the built-in ``hash`` of a ``str`` is salted
  per process, which would break prefix-cache reuse across restarts and replicas);
- ``count_tokens(text) = len(text.split())``, so a prompt of N space-separated words is N tokens
  exactly and a schedule's ``input_tokens`` are honoured exactly;
- a chat request's prompt is the text of its messages' contents, in order, joined by one space
  (no template tokens: the packs' ``chat_template: none``); list contents contribute their
  ``text`` parts;
- generated text: every generated token is emitted as ``" " + word``, so the token count of a
  completion's text equals its ``usage.completion_tokens``.

Ids collide only when two different words have the same CRC-32 (about 1 in 4e9 per pair); a
collision can only merge two prefix-cache entries whose blocks also agree on their other 15
tokens and on every earlier block, which does not happen with the generated corpora.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

TOKENIZER_REVISION = "capacity-pack-ws-v1"


@functools.lru_cache(maxsize=1 << 17)
def token_id(word: str) -> int:
    """Stable 32-bit id of one whitespace-free word (cached: prompts reuse a small vocabulary)."""
    return zlib.crc32(word.encode("utf-8"))


def tokenize(text: str) -> list[str]:
    """The tokens (words) of ``text``."""
    return text.split()


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one stable 32-bit id per whitespace-separated word."""
    return list(map(token_id, text.split()))


def count_tokens(text: str) -> int:
    """Number of tokens in ``text`` (``len(text.split())``)."""
    return len(text.split())


def chat_prompt_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The prompt text of a chat request: message contents joined by a single space.

    Raises ``ValueError`` when a message or content part has the wrong shape, so servers can
    answer 400 rather than 500.
    """
    parts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object")
        content = message.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or not isinstance(part.get("text", ""), str):
                    raise ValueError(f"messages[{i}].content[{j}] must be an object with 'text'")
                if part.get("type", "text") == "text":
                    parts.append(part.get("text", ""))
        else:
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
    return " ".join(parts)


def encode_chat(messages: Iterable[Mapping[str, Any]]) -> list[int]:
    """Token ids of a chat request's prompt (see :func:`chat_prompt_text`)."""
    return encode(chat_prompt_text(messages))
