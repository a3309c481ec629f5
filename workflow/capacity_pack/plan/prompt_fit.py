"""Prompts fitted to a real tokenizer from per-word token counts: one tokenization per word form.

With a pre-tokenizer that splits at whitespace, a text's count is the sum of its pieces'
(separator + word) counts, count(s_1 w_1 ... s_k w_k) = sum_i c(s_i, w_i), with
c(s, w) = tokens("x" + s + w) - tokens("x") measured once per tokenizer; so the binary search of
:func:`~capacity_pack.plan.prompts.fit_words` becomes prefix sums and yields the same text.
:meth:`PieceCounts.verify` (and :func:`prepare`'s sample of whole prompts) checks that every
piece owns exactly its predicted tokens; a tokenizer failing it gets the reference fit
(``build_prompt_for``): slower, never different. A ``POST /tokenize`` counter
(``engines.tokenize.EndpointCounter``) requests piece counts eight at a time and checks the
whole text's count. Why and timings: docs/performance.md (``capacity_pack.plan.prompt_fit``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import numpy as np

from capacity_pack.errors import StatedError
from capacity_pack.plan.prompts import (
    CORPUS_REVISION,
    PADS,
    FileTokenizerCounter,
    TokenCounter,
    WhitespaceCounter,
    block_words,
    body,
    build_prompt,
    build_prompt_for,
    cold_words,
    shared_prefix,
)
from capacity_pack.plan.sessions import user_message

ANCHOR = "x"


class PromptFitError(StatedError, ValueError):
    """A request whose prompt cannot have exactly its token count under the tokenizer."""


class NotAdditive(Exception):
    """The tokenizer's counts are not sums over whitespace-separated pieces."""


class PieceCounts:
    """Token counts of pieces (separator + word) under one tokenizer, measured in batches."""

    def __init__(
        self,
        count_batch: Callable[[list[str]], list[int]],
        encode_batch: Callable[[list[str]], list[Any]] | None = None,
    ):
        # count_batch(texts) -> token counts; encode_batch(texts) -> encodings with ``offsets``
        # (Hugging Face tokenizers), for the offsets check where the tokenizer is local.
        self._count = count_batch
        self._encode = encode_batch
        self._anchor = count_batch([ANCHOR])[0]
        self._verified = 0
        # One table per separator: "" (the text's first word), " " and "\n".
        self.table: dict[str, dict[str, int]] = {"": {}, " ": {}, "\n": {}}

    def learn(self, sep: str, words: Iterable[str]) -> None:
        """Count every word of ``words`` not yet counted after separator ``sep``."""
        known = self.table[sep]
        new = sorted({w for w in words if w not in known})
        if not new:
            return
        if sep == "":
            known.update(zip(new, self._count(new), strict=True))
        else:
            counts = self._count([ANCHOR + sep + w for w in new])
            known.update((w, c - self._anchor) for w, c in zip(new, counts, strict=True))

    def piece(self, sep: str, word: str) -> int:
        """The count of ``word`` (no whitespace) after separator ``sep``."""
        table = self.table[sep]
        if word not in table:
            self.learn(sep, [word])
        return table[word]

    def word(self, word: str, first: bool) -> int:
        """The count of ``word`` (which may hold newlines) after a space, or first."""
        parts = word.split("\n")
        total = self.piece("" if first else " ", parts[0])
        for part in parts[1:]:
            total += self.piece("\n", part)
        return total

    def words(self, words: list[str]) -> np.ndarray:
        """Per-word counts of ``" ".join(words)`` (the first word counted as the text's first)."""
        cont = self.table[" "]
        out = np.empty(len(words), dtype=np.int64)
        if not words:
            return out
        out[0] = self.word(words[0], True)
        if len(words) > 1:
            rest = out[1:]
            rest[:] = np.fromiter(map(cont.get, words[1:], repeat(-1)), np.int64, len(rest))
            missing = np.flatnonzero(rest < 0)  # not yet counted, or holding a newline
            if missing.size:
                self.learn(" ", [words[1 + i] for i in missing if "\n" not in words[1 + i]])
                for i in missing:
                    rest[i] = self.word(words[1 + i], False)
        return out

    def count_whole(self, texts: list[str]) -> list[int]:
        """The token counts of whole texts (no piece table)."""
        return self._count(texts)

    @property
    def size(self) -> int:
        return len(self.table[" "]) + len(self.table["\n"])

    def verify_grown(self) -> None:
        """:meth:`verify` again once the counted pieces have doubled since the last check (so
        the checks cost a constant factor of the counting)."""
        if self.size > 2 * self._verified:
            self.verify()

    def verify(self, seed: int = 0) -> None:
        """Tokenize every counted piece once, in a seeded order: with offsets, each piece must
        own exactly the tokens its count says; without (a server's /tokenize), the whole text
        must count their sum. Raises :class:`NotAdditive` otherwise."""
        rng = np.random.default_rng(seed)
        pieces = [(s, w) for s in (" ", "\n") for w in self.table[s]]
        self._verified = len(pieces)
        if not pieces:
            return
        order = rng.permutation(len(pieces))
        firsts = sorted(self.table[""])
        text, bounds, want = firsts[0] if firsts else ANCHOR, [], []
        want_first = self.table[""].get(text, None)
        for i in order:
            sep, w = pieces[i]
            bounds.append(len(text))
            want.append(self.table[sep][w])
            text += sep + w
        bounds.append(len(text))
        if self._encode is None:
            head = want_first if want_first is not None else self._anchor
            if self._count([text])[0] != head + sum(want):
                raise NotAdditive("token counts are not sums over whitespace-separated pieces")
            return
        enc = self._encode([text])[0]
        starts = np.array([a for a, _ in enc.offsets], dtype=np.int64)
        ends = np.array([b for _, b in enc.offsets], dtype=np.int64)
        edges = np.array(bounds, dtype=np.int64)
        before = np.searchsorted(starts, edges, side="left")  # tokens starting before each edge
        # No token may cross a piece boundary, and each piece owns its predicted tokens.
        inner = before[:-1]
        crossing = bool(np.any((inner > 0) & (ends[np.maximum(inner - 1, 0)] > edges[:-1])))
        owned = np.diff(before)
        if crossing or not np.array_equal(owned, want) or want_first not in (None, before[0]):
            raise NotAdditive("token counts are not sums over whitespace-separated pieces")


def fit_counted(words: list[str], n_tokens: int, counts: PieceCounts, name: str = "") -> str:
    """:func:`~capacity_pack.plan.prompts.fit_words` with the counts taken from ``counts``:
    the same binary search over prefix sums, the same padding, the same text."""
    kept, _ = fit_parts(words, counts.words(words), n_tokens, counts, name)
    return " ".join(kept)


def fit_parts(
    words: list[str], per: np.ndarray, n_tokens: int, counts: PieceCounts, name: str = ""
) -> tuple[list[str], list[int]]:
    """The words (pads included) of :func:`fit_counted`'s text and each one's count, given
    ``per``, the count of each of ``words`` in place."""
    prefix = np.concatenate([[0], np.cumsum(per)])
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prefix[mid] <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    kept = list(words[:lo])
    parts = per[:lo].tolist()
    count = int(prefix[lo])
    for _ in range(2 * n_tokens + 8):
        if count == n_tokens:
            return kept, parts
        for pad in PADS:
            c = count + counts.word(pad, not kept)
            if count < c <= n_tokens:
                kept.append(pad)
                parts.append(c - count)
                count = c
                break
        else:
            if not kept:
                break
            kept.pop()
            parts.pop()
            count = sum(parts)
    raise ValueError(f"cannot build a prompt of exactly {n_tokens} tokens with {name}")


class PromptFitter:
    """Builds schedule rows' prompts for one tokenizer: the project tokenizer's words as they
    are, or fitted to a ``tokenizer.json`` from piece counts (falling back to the reference
    fit where the tokenizer is not additive)."""

    def __init__(self, counter: TokenCounter | None):
        self.counter = counter
        self.counts: PieceCounts | None = None
        self.reference = False
        self._heads: dict[tuple[str, int, int], str] = {}
        if isinstance(counter, FileTokenizerCounter):
            tok = counter.tokenizer

            def encode(texts: list[str]) -> list[Any]:
                return tok.encode_batch(texts, add_special_tokens=False)

            self.counts = PieceCounts(lambda texts: [len(e.ids) for e in encode(texts)], encode)
        elif counter is not None and not isinstance(counter, WhitespaceCounter):
            # A server's /tokenize: a request per piece, several at once.
            self.counts = PieceCounts(lambda texts: _concurrently(counter.count, texts))

    @property
    def exact_by_construction(self) -> bool:
        return self.counter is None or isinstance(self.counter, WhitespaceCounter)

    def text(self, row: dict[str, Any]) -> str:
        """A row's text: a session's later user message where the row has ``user_tokens``
        (:func:`capacity_pack.plan.sessions.user_message`), else its prompt."""
        if "user_tokens" in row:
            return self.user_message(
                int(row["prompt_seed"]),
                int(row["user_tokens"]),
                row.get("corpus_revision", CORPUS_REVISION),
            )
        return self.prompt(row)

    def user_message(self, prompt_seed: int, user_tokens: int, corpus_revision: str) -> str:
        if not self.reference and self.counts is not None:
            text = self._fit(body(prompt_seed, user_tokens + 16, corpus_revision), user_tokens)
            if self._checked():
                return text
        return user_message(prompt_seed, user_tokens, self.counter, corpus_revision)

    def prompt(self, row: dict[str, Any]) -> str:
        if self.exact_by_construction:
            return build_prompt(**row)
        if not self.reference and self.counts is not None:
            text = self._fitted(row)
            if self._checked():
                return text
        return build_prompt_for(self.counter, **row)

    def _checked(self) -> bool:
        """Whether the piece counts still hold (checked as they grow); else the reference fit
        from now on."""
        assert self.counts is not None
        try:
            self.counts.verify_grown()
        except NotAdditive:
            self.reference = True
        return not self.reference

    def _fit(self, words: list[str], n: int) -> str:
        assert self.counts is not None and self.counter is not None
        return fit_counted(words, n, self.counts, self.counter.name)

    def _fitted(self, row: dict[str, Any]) -> str:
        # The layouts of build_prompt_for, step for step.
        n = int(row["input_tokens"])
        seed = int(row["prompt_seed"])
        revision = row.get("corpus_revision", CORPUS_REVISION)
        supply = body(seed, n + 16, revision)
        counts = self.counts
        assert counts is not None
        if row.get("prefix_blocks"):
            head = block_words(row["prefix_blocks"], n + 16, int(row["block_tokens"]), revision)
            return self._fit(head + supply, n)
        if int(row["prefix_id"]) >= 0:
            k = int(row["prefix_tokens"])
            return self._warm((row["prefix_revision"], int(row["prefix_id"]), k), supply, n, counts)
        unique = cold_words(
            seed, int(row["cold_unique_prefix_tokens"]), n, lambda w: counts.word(w, True)
        )
        return self._fit(unique + supply, n)

    def _warm(
        self, key: tuple[str, int, int], supply: list[str], n: int, counts: PieceCounts
    ) -> str:
        # The shared prefix fitted to k tokens, a newline, the body fitted to n - k; refitted as
        # one piece when the newline changes the count. The counts of every word are known
        # from the two fits, so the refit looks up none again.
        name = self.counter.name if self.counter is not None else ""
        k = key[2]
        if (head := self._heads.get(key)) is None:
            prefix_words = shared_prefix(key[0], key[1], k + 16).split()
            head = self._heads[key] = fit_parts(
                prefix_words, counts.words(prefix_words), k, counts, name
            )
        head_kept, head_parts = head
        supply_per = counts.words(supply)
        tail_kept, tail_parts = fit_parts(supply, supply_per, n - k, counts, name)
        first = tail_kept[0]
        if counts.piece("\n", first) == counts.piece("", first):
            return " ".join(head_kept) + "\n" + " ".join(tail_kept)
        words = [*head_kept[:-1], head_kept[-1] + "\n" + first, *tail_kept[1:], *supply]
        supply_per = supply_per.copy()
        supply_per[0] = counts.piece(" ", supply[0])
        per = np.concatenate(
            [
                head_parts[:-1],
                [head_parts[-1] + counts.piece("\n", first)],
                tail_parts[1:],
                supply_per,
            ]
        ).astype(np.int64)
        kept, _ = fit_parts(words, per, n, counts, name)
        return " ".join(kept)


def reference_text(counter: TokenCounter | None, row: dict[str, Any]) -> str:
    """:meth:`PromptFitter.text` by the reference fit (a tokenization per probe)."""
    if "user_tokens" in row:
        seed, n = int(row["prompt_seed"]), int(row["user_tokens"])
        return user_message(seed, n, counter, row.get("corpus_revision", CORPUS_REVISION))
    return build_prompt_for(counter, **row)


def expected_tokens(row: dict[str, Any]) -> int:
    return int(row["user_tokens"] if "user_tokens" in row else row["input_tokens"])


def prepare(
    rows: list[dict[str, Any]],
    counter: TokenCounter | None,
    *,
    verify_every: int = 64,
    log: Callable[[str], None] | None = None,
    ids: list[str] | None = None,
) -> list[str]:
    """The text of every row (``build_prompt`` keywords, with ``user_tokens`` for a session's
    later turn: :meth:`PromptFitter.text`), in order.

    Under a ``tokenizer.json``: fitted from piece counts, the pieces verified once with offsets
    and every ``verify_every``-th prompt (seeded choice) tokenized whole; any disagreement
    refits every prompt with the reference fit. A prompt that cannot reach its count raises
    :class:`PromptFitError` naming its request (``ids``, else its index)."""
    fitter = PromptFitter(counter)
    if fitter.counts is None:
        return _each(rows, fitter.text, ids)
    try:
        try:
            texts = _each(rows, fitter.text, ids)
        except PromptFitError:
            fitter.counts.verify()  # a tokenizer that is not additive: the reference fit may
            raise  # reach the count; an additive one cannot either
        fitter.counts.verify()
        sample = _sample(len(texts), verify_every)
        got = fitter.counts.count_whole([texts[i] for i in sample])
        for i, n in zip(sample, got, strict=True):
            if n != expected_tokens(rows[i]):
                raise NotAdditive(f"prompt {i} has {n} tokens, not the fitted count")
    except NotAdditive as err:
        if log is not None:
            log(f"{counter.name}: {err}; fitting every prompt by full tokenization")
        return _each(rows, lambda r: reference_text(counter, r), ids)
    return texts


def _each(
    rows: list[dict[str, Any]], text: Callable[[dict[str, Any]], str], ids: list[str] | None
) -> list[str]:
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(text(row))
        except ValueError as err:
            raise PromptFitError(f"request {ids[i] if ids else i}: {err}") from None
    return out


def _concurrently(count: Callable[[str], int], texts: list[str]) -> list[int]:
    """``count`` over ``texts``, eight requests in flight (a /tokenize endpoint)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(texts) < 2:
        return [count(t) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(count, texts))


def _sample(n: int, every: int) -> list[int]:
    if n == 0:
        return []
    k = max(1, -(-n // max(every, 1)))
    return sorted(np.random.default_rng(n).choice(n, size=k, replace=False).tolist())
