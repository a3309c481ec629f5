"""Generated prompts: exact token counts, determinism, prefix sharing and uniqueness."""

from __future__ import annotations

import pytest

from capacity_pack.plan.prompts import build_prompt, shared_prefix
from capacity_pack.sim.tokenizer import count_tokens, encode


def prompt(**kw):
    args = dict(
        input_tokens=300,
        prompt_seed=7,
        prefix_id=-1,
        prefix_tokens=0,
        prefix_revision="p-v1",
        cold_unique_prefix_tokens=8,
    )
    args.update(kw)
    return build_prompt(**args)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 97, 1024, 8192])
def test_exact_token_count_cold(n):
    assert count_tokens(prompt(input_tokens=n)) == n


@pytest.mark.parametrize(("n", "k"), [(97, 96), (256, 96), (8192, 256)])
def test_exact_token_count_warm(n, k):
    assert count_tokens(prompt(input_tokens=n, prefix_id=3, prefix_tokens=k)) == n


def test_deterministic_and_natural_looking():
    a, b = prompt(prompt_seed=42), prompt(prompt_seed=42)
    assert a == b
    assert a != prompt(prompt_seed=43)
    words = a.split()
    assert words[1][0].isupper() or words[1][0].islower()
    assert sum(w.endswith(".") for w in words) >= 300 // 22
    assert len(set(words)) > 60  # a vocabulary, not one repeated token


def test_warm_requests_share_the_prefix_tokens():
    a = encode(prompt(prompt_seed=1, prefix_id=2, prefix_tokens=96))
    b = encode(prompt(prompt_seed=2, prefix_id=2, prefix_tokens=96))
    c = encode(prompt(prompt_seed=1, prefix_id=3, prefix_tokens=96))
    assert a[:96] == b[:96] and a[96:] != b[96:]
    assert a[:96] != c[:96]
    assert shared_prefix("p-v1", 2, 96) == shared_prefix("p-v1", 2, 96)
    assert shared_prefix("p-v2", 2, 96) != shared_prefix("p-v1", 2, 96)


def test_cold_requests_share_no_leading_token():
    firsts = {encode(prompt(prompt_seed=s))[0] for s in range(500)}
    assert len(firsts) == 500


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="shorter than its prompt"):
        prompt(input_tokens=50, prefix_id=1, prefix_tokens=50)
    with pytest.raises(ValueError, match="corpus revision"):
        prompt(corpus_revision="other-v9")
