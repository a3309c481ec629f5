"""Prompts with exact token counts under a real (BPE) tokenizer and under a /tokenize endpoint."""

from __future__ import annotations

import pytest

from capacity_pack.engines.tokenize import EndpointCounter
from capacity_pack.plan.prompts import (
    FileTokenizerCounter,
    build_prompt_for,
    fit_words,
    shared_prefix,
)
from tests.tokenize_server import tokenize_server


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A small byte-level BPE trained here on the project's own text (a real tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from capacity_pack.plan.prompts import body

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>"])
    corpus = [" ".join(body(seed, 200)) for seed in range(200)]
    tok.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def row(**kw):
    base = dict(input_tokens=300, prompt_seed=11, prefix_id=-1, prefix_tokens=0,
                prefix_revision="p-v1", cold_unique_prefix_tokens=8)  # fmt: skip
    base.update(kw)
    return base


@pytest.mark.parametrize("n", [1, 2, 17, 300, 2048])
def test_exact_counts_under_a_bpe_tokenizer(tokenizer_json, n):
    counter = FileTokenizerCounter(tokenizer_json)
    text = build_prompt_for(counter, **row(input_tokens=n))
    assert counter.count(text) == n
    # Real text, not token soup: mostly words from the vocabulary.
    assert len(text.split()) > n / 4


def test_warm_prompts_share_a_prefix_of_exact_length(tokenizer_json):
    counter = FileTokenizerCounter(tokenizer_json)
    a = build_prompt_for(counter, **row(input_tokens=400, prefix_id=3, prefix_tokens=128))
    b = build_prompt_for(counter, **row(input_tokens=400, prefix_id=3, prefix_tokens=128,
                                        prompt_seed=12))  # fmt: skip
    assert counter.count(a) == counter.count(b) == 400
    head_a, head_b = a.split("\n")[0], b.split("\n")[0]
    assert head_a == head_b and counter.count(head_a) == 128
    assert head_a.split()[:5] == shared_prefix("p-v1", 3, 144).split()[:5]


def test_fit_words_reports_the_impossible(tokenizer_json):
    counter = FileTokenizerCounter(tokenizer_json)
    assert counter.count(fit_words(["alpha"] * 50, 10, counter)) == 10
    with pytest.raises(FileNotFoundError):
        FileTokenizerCounter(tokenizer_json.parent / "missing.json")


def test_tokenize_endpoint(tokenizer_json):
    """vLLM's POST /tokenize contract, served on 127.0.0.1 by a real HTTP server."""
    local = FileTokenizerCounter(tokenizer_json)
    seen = []
    with tokenize_server(local.count, 4096, seen.append) as url:
        counter = EndpointCounter(url, "m")
        text = build_prompt_for(counter, **row(input_tokens=64))
        assert local.count(text) == 64
    assert seen and all(d["model"] == "m" and d["add_special_tokens"] is False for d in seen)
