"""Deterministic, natural-language-like prompts with an exact token count.

Random token ids tokenize and cache unlike real text, so prompts are generated from a fixed
English vocabulary (``VOCABULARY``, most frequent first) with Zipf word frequencies
(P(rank r) ~ 1 / (r + 2.7)), cut into sentences of 6-22 words that start with a capital and end
with a period. Corpus revision ``capacity-pack-text-v1`` is this vocabulary, these frequencies and
this sentence rule; changing any of them needs a new revision.

A prompt of ``n`` tokens (under the project tokenizer, ``text.split()``) is laid out as:

- warm-cache request (``prefix_id >= 0``): the shared prefix ``prefix_id`` of the versioned prefix
  set (``prefix_tokens`` words, a pure function of the prefix revision and id, so every request
  and every replica sees identical tokens), then a body of ``n - prefix_tokens`` words;
- cold-cache request (``prefix_id == -1``): a unique head of ``cold_unique_prefix_tokens`` words
  whose first word encodes the request's prompt seed (so the very first KV block differs and no
  block of the prompt can be reused), then the body.

- block-hash request (a Mooncake-style trace's ``hash_ids``, ``prefix_blocks`` in the schedule):
  block ``h`` is ``block_tokens`` words that are a pure function of the corpus revision and ``h``
  (:func:`hash_block`), the prompt is its blocks in order cut to ``n`` words (the last block
  partial), then a body for any tokens beyond the blocks. Two requests with the same leading
  hash ids send byte-identical leading text, which a prefix cache reuses block by block.

The body is drawn from the request's ``prompt_seed``. Everything is a pure function of the
schedule row and the manifest, so a rerun sends byte-identical prompts.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

CORPUS_REVISION = "capacity-pack-text-v1"

VOCABULARY = tuple(
    """
    the of and to a in is that for it as was with be by on not he this are or his from at which
    but have an they you were had her all she there would their we him been has when who will no
    more if out so said what up its about into than them can only other new some could time these
    two may then do first any my now such like our over man me even most made after also did many
    before must through back years where much your way well down should because each just those
    people how too little state good very make world still own see men work long get here between
    both life being under never day same another know while last might us great old year off come
    since against go came right used take three states himself few house use during without again
    place american around however home small found thought went say part once general high upon
    school every does got united left number course war until always away something fact though
    water less public put think almost hand enough far took head yet government system better set
    told nothing night end why called didn't eyes find going look asked later knew point next city
    business give group toward young let room president side social given present several order
    national possible rather second face per among form important often things looked early white
    case john become large big need four within felt along children saw best church ever least
    power development light thing seemed family interest want members mind country area others
    done turned although open god service problem certain kind different thus began door help
    means sense whole matter perhaps itself york times law human line above name example action
    company hands local show whether five history gave today either act feet across taken past
    quite anything seen having death experience body word half really week field money words
    already information tell together college shall free gone themselves program firm market
    data model request server token latency memory cache queue batch capacity replica throughput
    schedule measure result report value signal policy network storage compute engine context
    question answer summary document review budget planning customer support release version
    """.split()
)
_RANKS = np.arange(len(VOCABULARY), dtype=float)
_WEIGHTS = 1.0 / (_RANKS + 2.7)
_CDF = np.cumsum(_WEIGHTS / _WEIGHTS.sum())
_VOCAB = np.array(VOCABULARY, dtype=object)
_CAPITAL = np.array([w.capitalize() for w in VOCABULARY], dtype=object)
_PERIOD = np.array([w + "." for w in VOCABULARY], dtype=object)


def _words(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` words in sentences: Zipf draws, capitalised first word, period on the last."""
    if n <= 0:
        return []
    idx = np.minimum(np.searchsorted(_CDF, rng.random(n)), len(VOCABULARY) - 1)
    out = _VOCAB[idx]
    # Sentence boundaries: lengths 6..22, the last sentence cut to fit.
    lengths = rng.integers(6, 23, size=n // 6 + 1)
    ends = np.cumsum(lengths) - 1
    ends = ends[ends < n]
    starts = np.concatenate([[0], ends + 1])
    starts = starts[starts < n]
    out[starts] = _CAPITAL[idx[starts]]
    out[ends] = _PERIOD[idx[ends]]
    words = out.tolist()
    if not words[-1].endswith("."):
        words[-1] += "."
    return words


def _seed(*parts: object) -> np.random.Generator:
    import hashlib

    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "big"))


@functools.lru_cache(maxsize=4096)
def shared_prefix(revision: str, prefix_id: int, n_tokens: int) -> str:
    """Shared prefix ``prefix_id`` of the prefix set ``revision``, ``n_tokens`` words long."""
    return " ".join(_words(_seed("prefix", revision, prefix_id), n_tokens))


def unique_head(prompt_seed: int, n_tokens: int) -> list[str]:
    """A head that no other request shares: its first word encodes the prompt seed."""
    if n_tokens <= 0:
        return []
    tail = _words(_seed("head", prompt_seed), n_tokens - 1)
    return [f"Ticket-{prompt_seed:016x}:", *tail]


def cold_words(prompt_seed: int, unique_tokens: int, n_tokens: int, first_count: Any) -> list[str]:
    """A cold prompt's leading words under a real tokenizer: the unique head, or, when its
    first word (the ticket, one whitespace token but often 15-25 tokens of a BPE) alone exceeds
    the prompt's ``n_tokens``, the head's other (seeded) words. Fitted with the ticket that does
    not fit, a short prompt would be padding alone, the same text for every request, which a
    token-granular prefix cache (llama.cpp's slots) reuses whole: 15 of 16 tokens of each
    "cold" 16-token prompt were cached on 2026-12-03. ``first_count(word)``: the word's token
    count as a text's first word."""
    head = unique_head(prompt_seed, min(unique_tokens, n_tokens))
    if head and first_count(head[0]) > n_tokens:
        return head[1:]
    return head


@functools.lru_cache(maxsize=8192)
def hash_block(corpus_revision: str, hash_id: int, block_tokens: int) -> tuple[str, ...]:
    """The words of a block-hash trace's block ``hash_id``: the same in every request."""
    return tuple(_words(_seed("block", corpus_revision, hash_id), block_tokens))


def block_words(
    blocks: str, n_tokens: int, block_tokens: int, corpus_revision: str = CORPUS_REVISION
) -> list[str]:
    """The leading words of a prompt made of the hash blocks ``blocks`` (space-separated ids),
    at most ``n_tokens`` of them."""
    words: list[str] = []
    for h in blocks.split():
        if len(words) >= n_tokens:
            break
        words.extend(hash_block(corpus_revision, int(h), block_tokens))
    return words[:n_tokens]


def body(prompt_seed: int, n_tokens: int, corpus_revision: str = CORPUS_REVISION) -> list[str]:
    return _words(_seed("body", corpus_revision, prompt_seed), n_tokens)


def build_prompt(
    *,
    input_tokens: int,
    prompt_seed: int,
    prefix_id: int,
    prefix_tokens: int,
    prefix_revision: str | None,
    cold_unique_prefix_tokens: int,
    corpus_revision: str = CORPUS_REVISION,
    prefix_blocks: str = "",
    block_tokens: int = 512,
) -> str:
    """The prompt text of one schedule row: exactly ``input_tokens`` whitespace tokens."""
    if input_tokens < 1:
        raise ValueError("input_tokens must be at least 1")
    if corpus_revision != CORPUS_REVISION:
        raise ValueError(
            f"unknown corpus revision {corpus_revision!r}; this build generates {CORPUS_REVISION!r}"
        )
    if prefix_blocks:
        head = block_words(prefix_blocks, input_tokens, block_tokens, corpus_revision)
        return " ".join(head + body(prompt_seed, input_tokens - len(head), corpus_revision))
    if prefix_id >= 0:
        if prefix_revision is None:
            raise ValueError("a shared prefix needs the prefix-set revision")
        if not 0 < prefix_tokens < input_tokens:
            raise ValueError("a shared prefix must be shorter than its prompt")
        head = shared_prefix(prefix_revision, prefix_id, prefix_tokens)
        rest = body(prompt_seed, input_tokens - prefix_tokens, corpus_revision)
        return head + " " + " ".join(rest)
    unique = min(cold_unique_prefix_tokens, input_tokens)
    words = unique_head(prompt_seed, unique) + body(prompt_seed, input_tokens - unique)
    return " ".join(words)


# ---------------------------------------------------------------------------------------------
# Real targets: exact token counts under the target's own tokenizer
# ---------------------------------------------------------------------------------------------


class TokenCounter:
    """Counts a prompt's tokens the way the target does (the server's own ``POST /tokenize``:
    ``capacity_pack.engines.tokenize.EndpointCounter``, in the engines' formats)."""

    name = "abstract"

    def count(self, text: str) -> int:
        raise NotImplementedError


class WhitespaceCounter(TokenCounter):
    """The project tokenizer (the simulated engine's): one token per whitespace-separated word."""

    name = "capacity-pack-ws-v1"

    def count(self, text: str) -> int:
        return len(text.split())


class FileTokenizerCounter(TokenCounter):
    """A local ``tokenizer.json`` (Hugging Face ``tokenizers``), without special tokens: the
    count a completions endpoint reports for a raw prompt, minus the BOS it may add (measured
    once per run by comparing with the server's usage)."""

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer
        except ImportError as err:  # an optional dependency: say how to get it
            raise RuntimeError(
                "a tokenizer.json target needs the 'tokenizers' package: pip install tokenizers"
            ) from err
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"tokenizer file {self.path} does not exist")
        self._tok = Tokenizer.from_file(str(self.path))
        self.name = f"tokenizer.json:{self.path.name}"

    @property
    def tokenizer(self):
        """The loaded ``tokenizers.Tokenizer`` (batch encoding, offsets)."""
        return self._tok

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


PADS = ("the", "a", "of", "and", ".", ",", "x", "1")


def fit_words(words: list[str], n_tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``words`` with at most ``n_tokens`` tokens, then padded with short
    common words until the count is exactly ``n_tokens``.

    Binary search over the word count (token counts grow with appended words for BPE/unigram
    tokenizers, up to merges at the boundary, which the padding step absorbs), then padding with
    the first of ``PADS`` that does not overshoot. Raises ``ValueError`` when the exact count
    cannot be reached.
    """
    lo, hi = 0, len(words)
    while lo < hi:  # largest k with count(words[:k]) <= n
        mid = (lo + hi + 1) // 2
        if counter.count(" ".join(words[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    count = counter.count(text) if text else 0
    for _ in range(2 * n_tokens + 8):
        if count == n_tokens:
            return text
        for pad in PADS:
            candidate = f"{text} {pad}" if text else pad
            c = counter.count(candidate)
            if count < c <= n_tokens:
                text, count = candidate, c
                break
        else:
            if not text:
                break
            # Every pad overshoots after this word: drop it and pad instead.
            text = text.rsplit(" ", 1)[0] if " " in text else ""
            count = counter.count(text) if text else 0
    raise ValueError(f"cannot build a prompt of exactly {n_tokens} tokens with {counter.name}")


def build_prompt_for(counter: TokenCounter | None, **row: Any) -> str:
    """:func:`build_prompt` under the project tokenizer, or fitted to a target's tokenizer.

    With a real tokenizer the shared prefix is fitted on its own to ``prefix_tokens`` and the
    body after a newline to the remaining count, then the whole prompt is checked (and refitted
    as one piece if the boundary changed the total).
    """
    if counter is None or isinstance(counter, WhitespaceCounter):
        return build_prompt(**row)
    n = int(row["input_tokens"])
    seed = int(row["prompt_seed"])
    # Generous word supply: real tokenizers usually need fewer words than tokens.
    supply = body(seed, n + 16, row.get("corpus_revision", CORPUS_REVISION))
    if row.get("prefix_blocks"):
        # The blocks' words first, fitted as one piece: requests sharing leading blocks share
        # the leading text up to where the shorter one is cut.
        revision = row.get("corpus_revision", CORPUS_REVISION)
        head = block_words(row["prefix_blocks"], n + 16, int(row["block_tokens"]), revision)
        return fit_words(head + supply, n, counter)
    if int(row["prefix_id"]) >= 0:
        k = int(row["prefix_tokens"])
        prefix_words = shared_prefix(row["prefix_revision"], int(row["prefix_id"]), k + 16).split()
        head = fit_words(prefix_words, k, counter)
        tail = fit_words(supply, n - k, counter)
        text = head + "\n" + tail
        if counter.count(text) == n:
            return text
        return fit_words((head + "\n" + tail).split(" ") + supply, n, counter)
    unique = cold_words(seed, int(row["cold_unique_prefix_tokens"]), n, counter.count)
    return fit_words(unique + supply, n, counter)
