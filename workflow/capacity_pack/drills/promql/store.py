"""The scraped series, indexed once for PromQL evaluation.

Input: a long table ``t_ns, metric, labels, value`` (``labels`` is the sample's label text, e.g.
``{engine="0",model_name="m"}``) plus the times of every successful scrape.

Staleness (https://prometheus.io/docs/prometheus/latest/querying/basics/#staleness): a series
present in one scrape and absent from a later successful scrape gets a staleness marker at that
later scrape, as Prometheus writes one; instant selectors stop seeing it there (lookback
notwithstanding) until it reappears, and range selectors skip markers. Failed scrapes are not in
the list and so mark nothing (Prometheus would mark the target's series stale there as well).
Empty label values mean "no such label", as in Prometheus; different texts of one label set
(order, spacing) are one series; duplicate samples of a series at one time keep the first.

Layout: the series of one metric name form a :class:`Block` in CSR form (series ``i`` is
``t[off[i]:off[i+1]]``). Every sample and marker time is replaced by its rank among the block's
times and keyed ``series * width + rank + 1``; the keys are sorted, so the last sample at or
before ``q`` of many series at once is one ``searchsorted``, and a selector costs a few
vectorized binary searches per metric at each evaluation time. Label matching is done once per
distinct label value and cached per selector (it does not depend on time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from capacity_pack.drills.promql.labels import Labels, parse_labels
from capacity_pack.drills.promql.nodes import LabelMatcher


@dataclass
class Block:
    """All series of one metric name in CSR form: series ``i`` is ``t[off[i]:off[i+1]]``.

    Every sample and staleness marker time is replaced by its rank in ``times`` and keyed
    ``series * width + rank + 1``; the keys of the whole block are then sorted, so the last sample
    at or before ``q`` of many series at once is a single ``searchsorted``.
    """

    name: str
    labelsets: list[Labels]
    bare_labelsets: list[Labels]
    t: np.ndarray
    v: np.ndarray
    off: np.ndarray
    marker_t: np.ndarray
    marker_off: np.ndarray
    times: np.ndarray
    sample_key: np.ndarray
    marker_key: np.ndarray
    resets: np.ndarray
    _columns: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return len(self.times) + 1

    def position(self, keys: np.ndarray, sids: np.ndarray, q: int, side: str) -> np.ndarray:
        """Per series, the index just past its entries at or before ``q`` (side="right") or
        strictly before ``q`` (side="left")."""
        rank = int(np.searchsorted(self.times, q, side=side))
        return np.searchsorted(keys, sids * self.width + rank, side="right")

    def match(self, matcher: LabelMatcher) -> np.ndarray:
        if matcher.name not in self._columns:
            col = np.array([dict(ls).get(matcher.name, "") for ls in self.labelsets], dtype=object)
            uniq, inverse = np.unique(col, return_inverse=True)
            self._columns[matcher.name] = (uniq, inverse)
        uniq, inverse = self._columns[matcher.name]
        hits = np.fromiter((matcher.matches(u) for u in uniq), dtype=bool, count=len(uniq))
        return hits[inverse]


class SeriesStore:
    """Scraped series indexed for PromQL evaluation; build it with :meth:`from_frame`."""

    def __init__(self, blocks: dict[str, Block], scrape_t_ns: np.ndarray):
        self._blocks = blocks
        self.scrape_t_ns = scrape_t_ns
        self._select_cache: dict[tuple[LabelMatcher, ...], list[tuple[Block, np.ndarray]]] = {}

    @classmethod
    def from_frame(
        cls, samples: pd.DataFrame, scrape_t_ns: Sequence[int] | np.ndarray | None = None
    ) -> SeriesStore:
        """Index ``samples`` (``t_ns, metric, labels, value``) once.

        ``scrape_t_ns`` lists every successful scrape; a series absent from one after being
        present is stale from that scrape on. Without it, every distinct sample time counts as a
        scrape.
        """
        missing = {"t_ns", "metric", "labels", "value"} - set(samples.columns)
        if missing:
            raise ValueError(f"samples lack column(s) {sorted(missing)}")
        t = samples["t_ns"].to_numpy(dtype=np.int64)
        v = samples["value"].to_numpy(dtype=np.float64)
        metric = samples["metric"].astype(str).to_numpy(dtype=object)
        label_text = samples["labels"].fillna("").astype(str).to_numpy(dtype=object)
        scrapes = np.unique(
            np.asarray(scrape_t_ns if scrape_t_ns is not None else t, dtype=np.int64)
        )
        if len(t) == 0:
            return cls({}, scrapes)

        row_canon, canon_list = _canonical_labelsets(label_text)
        metric_codes, metric_names = pd.factorize(metric)
        n_canon = len(canon_list)
        series_key = metric_codes.astype(np.int64) * n_canon + row_canon
        uniq_keys, sid = np.unique(series_key, return_inverse=True)
        t, v, sid = _first_per_time(t, v, sid)
        off = np.searchsorted(sid, np.arange(len(uniq_keys) + 1))
        marker_t, marker_sid = _staleness_markers(t, sid, off, scrapes)

        series_metric = uniq_keys // n_canon
        series_canon = uniq_keys % n_canon
        metric_bounds = np.searchsorted(series_metric, np.arange(len(metric_names) + 1))
        blocks: dict[str, Block] = {}
        for m, name in enumerate(metric_names):
            s0, s1 = int(metric_bounds[m]), int(metric_bounds[m + 1])
            a, b = int(off[s0]), int(off[s1])
            ma, mb = np.searchsorted(marker_sid, [s0, s1])
            blocks[name] = _make_block(
                name,
                t[a:b],
                v[a:b],
                sid[a:b] - s0,
                off[s0 : s1 + 1] - a,
                marker_t[ma:mb],
                marker_sid[ma:mb] - s0,
                [canon_list[c] for c in series_canon[s0:s1]],
            )
        return cls(blocks, scrapes)

    @property
    def metric_names(self) -> list[str]:
        return sorted(self._blocks)

    @property
    def series_count(self) -> int:
        return sum(len(b.labelsets) for b in self._blocks.values())

    def select(self, matchers: tuple[LabelMatcher, ...]) -> list[tuple[Block, np.ndarray]]:
        """The series matching all matchers, per metric block (time-independent, cached)."""
        cached = self._select_cache.get(matchers)
        if cached is not None:
            return cached
        exact = [m.value for m in matchers if m.name == "__name__" and m.op == "="]
        if exact:
            block = self._blocks.get(exact[0])
            candidates = [block] if block is not None else []
        else:
            candidates = list(self._blocks.values())
        out = []
        for block in candidates:
            if not all(m.matches(block.name) for m in matchers if m.name == "__name__"):
                continue
            mask = np.ones(len(block.labelsets), dtype=bool)
            for m in matchers:
                if m.name != "__name__":
                    mask &= block.match(m)
            sids = np.nonzero(mask)[0]
            if len(sids):
                out.append((block, sids))
        self._select_cache[matchers] = out
        return out


def _canonical_labelsets(label_text: np.ndarray) -> tuple[np.ndarray, list[Labels]]:
    """Per row, the index of its label set in the returned list.

    Different texts of one label set (order, spacing) must land in one series; ``__name__`` and
    empty values are dropped (an empty value means "no such label").
    """
    text_codes, texts = pd.factorize(label_text)
    canon_index: dict[Labels, int] = {}
    text_to_canon = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        try:
            parsed = parse_labels(text)
        except ValueError as err:
            raise ValueError(f"samples: {err}") from None
        parsed.pop("__name__", None)
        labels = tuple(sorted((k, val) for k, val in parsed.items() if val != ""))
        text_to_canon[i] = canon_index.setdefault(labels, len(canon_index))
    return text_to_canon[text_codes], list(canon_index)


def _first_per_time(
    t: np.ndarray, v: np.ndarray, sid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples sorted by series then time; of duplicates of a series at one time, the first."""
    order = np.lexsort((t, sid))
    t, v, sid = t[order], v[order], sid[order]
    first = np.ones(len(t), dtype=bool)
    first[1:] = (sid[1:] != sid[:-1]) | (t[1:] != t[:-1])
    return t[first], v[first], sid[first]


def _staleness_markers(
    t: np.ndarray, sid: np.ndarray, off: np.ndarray, scrapes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(time, series) of each staleness marker, sorted by series then time.

    A marker goes at the first scrape after a sample unless the series has a sample there.
    """
    nxt = np.searchsorted(scrapes, t, side="right")
    has_next = nxt < len(scrapes)
    nxt_t = scrapes[np.minimum(nxt, len(scrapes) - 1)]
    next_sample_t = np.empty_like(t)
    next_sample_t[:-1] = t[1:]
    last_of_series = np.zeros(len(t), dtype=bool)
    last_of_series[off[1:] - 1] = True
    is_marker = has_next & (last_of_series | (nxt_t < next_sample_t))
    return nxt_t[is_marker], sid[is_marker]


def _make_block(
    name: str,
    t: np.ndarray,
    v: np.ndarray,
    sid: np.ndarray,
    off: np.ndarray,
    marker_t: np.ndarray,
    marker_sid: np.ndarray,
    bare: list[Labels],
) -> Block:
    """One metric's block from its samples and markers (series ids and offsets block-local)."""
    times = np.unique(np.concatenate([t, marker_t]))
    width = len(times) + 1
    same_series = np.zeros(len(t), dtype=bool)
    same_series[1:] = sid[1:] == sid[:-1]
    dropped = np.zeros(len(t), dtype=bool)
    dropped[1:] = v[1:] < v[:-1]
    return Block(
        name=name,
        labelsets=[tuple(sorted((*ls, ("__name__", name)))) for ls in bare],
        bare_labelsets=bare,
        t=t,
        v=v,
        off=off,
        marker_t=marker_t,
        marker_off=np.searchsorted(marker_sid, np.arange(len(bare) + 1)),
        times=times,
        sample_key=sid * width + np.searchsorted(times, t) + 1,
        marker_key=marker_sid * width + np.searchsorted(times, marker_t) + 1,
        resets=np.nonzero(same_series & dropped)[0],
    )
