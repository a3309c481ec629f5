"""The project tokenizer: whitespace words, stable CRC-32 ids, chat prompt text."""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest

from capacity_pack.sim.tokenizer import (
    TOKENIZER_REVISION,
    chat_prompt_text,
    count_tokens,
    encode,
    encode_chat,
    token_id,
    tokenize,
)


def test_tokens_are_whitespace_separated_words():
    assert tokenize("  the quick\tbrown\n\nfox  ") == ["the", "quick", "brown", "fox"]
    assert count_tokens("  the quick\tbrown\n\nfox  ") == 4
    assert count_tokens("") == 0
    assert count_tokens("   \n\t ") == 0
    # Punctuation belongs to its word: this is a word tokenizer, not BPE.
    assert count_tokens("hello, world!") == 2
    # Any Unicode whitespace separates (str.split semantics).
    assert count_tokens("a\u00a0b\u2003c") == 3


def test_ids_are_crc32_of_utf8_words():
    assert token_id("hello") == zlib.crc32(b"hello") == 907060870
    assert encode("hello world") == [907060870, zlib.crc32(b"world")]
    assert token_id("żółw") == zlib.crc32("żółw".encode())
    assert all(0 <= i < 2**32 for i in encode("a b c d e f"))
    assert TOKENIZER_REVISION == "capacity-pack-ws-v1"


def test_ids_are_stable_across_processes_and_hash_seeds():
    code = "from capacity_pack.sim.tokenizer import encode; print(encode('alpha beta gamma'))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {f"{encode('alpha beta gamma')}\n"}


def test_n_words_are_n_tokens():
    text = " ".join(f"w{i}" for i in range(1000))
    assert count_tokens(text) == 1000
    assert len(encode(text)) == 1000


def test_chat_prompt_joins_message_contents():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "two words"}]},
        {"role": "assistant", "content": None},
    ]
    assert chat_prompt_text(messages) == "be brief two words"
    assert encode_chat(messages) == encode("be brief two words")


@pytest.mark.parametrize(
    "messages",
    [["not an object"], [{"role": "user", "content": 3}], [{"content": [{"text": 5}]}]],
)
def test_chat_prompt_rejects_bad_shapes(messages):
    with pytest.raises(ValueError):
        chat_prompt_text(messages)
