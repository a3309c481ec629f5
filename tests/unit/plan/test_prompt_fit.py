"""Prompts fitted from per-piece token counts are the prompts of the reference fit, and the
prepared-prompts file is refused for another schedule or other inputs."""

from __future__ import annotations

import logging
import random

import pandas as pd
import pytest

from capacity_pack.plan.prepared import (
    PreparedPromptsError,
    PromptInputs,
    read_prepared,
    write_prepared,
)
from capacity_pack.plan.prompt_fit import PromptFitter, prepare, reference_text
from capacity_pack.plan.prompts import FileTokenizerCounter, WhitespaceCounter, body, fit_words
from tests.tokenize_server import tokenize_server


def train(path, *, vocab: int, pre_tokenizer: bool = True) -> FileTokenizerCounter:
    """A byte-level BPE trained on the project's own text and seeded syllable words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pre_tokenizer:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>"], show_progress=False)
    rng = random.Random(0)
    syllables = "ka to ri mel an ost ur pe lin dra ve so qua ix ber nu".split()
    corpus = [" ".join(body(seed, 200)) for seed in range(200)]
    corpus += [
        " ".join("".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(100))
        for _ in range(200)
    ]
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return FileTokenizerCounter(path)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train(tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab=3000)


@pytest.fixture(scope="module")
def small_bpe(tmp_path_factory):
    return train(tmp_path_factory.mktemp("small") / "tokenizer.json", vocab=600)


def rows(count: int, seed: int = 1) -> list[dict]:
    """Seeded rows of every layout: cold heads of several lengths, warm shared prefixes,
    block-hash prompts, and sessions' later user messages."""
    r = random.Random(seed)
    out = []
    for _ in range(count):
        n = r.choice([1, 2, 3, 5, 9, 17, 64, 300, 1024])
        row = dict(
            input_tokens=n, prompt_seed=r.randrange(2**63), prefix_id=-1, prefix_tokens=0,
            prefix_revision="p-v1", cold_unique_prefix_tokens=r.choice([0, 1, 4, 8]),
            prefix_blocks="", block_tokens=r.choice([4, 16]),
        )  # fmt: skip
        layout = r.choice(["cold", "warm", "blocks", "session"])
        if layout == "warm" and n > 1:
            row.update(prefix_id=r.randrange(8), prefix_tokens=r.randrange(1, n))
        elif layout == "blocks":
            row["prefix_blocks"] = " ".join(str(r.randrange(20)) for _ in range(r.randint(1, 5)))
        elif layout == "session":
            row["user_tokens"] = r.choice([1, 7, 40, 200])
        out.append(row)
    return out


@pytest.mark.parametrize("which", ["bpe", "small_bpe"])
def test_the_same_prompts_as_the_reference_fit_under_a_bpe_tokenizer(request, which):
    counter = request.getfixturevalue(which)
    batch = rows(240, seed=hash(which) % 1000)
    got = prepare(batch, counter, verify_every=1)
    want = [reference_text(counter, r) for r in batch]
    assert got == want
    for text, row in zip(got, batch, strict=True):
        assert counter.count(text) == row.get("user_tokens", row["input_tokens"])


def test_short_cold_prompts_stay_unique_when_the_ticket_does_not_fit(bpe):
    # 16 tokens: fewer than the ticket word alone takes under a BPE, so each prompt begins with
    # its head's seeded words instead of padding that every request would share.
    batch = [
        dict(
            input_tokens=16,
            prompt_seed=seed,
            prefix_id=-1,
            prefix_tokens=0,
            prefix_revision="",
            cold_unique_prefix_tokens=8,
            prefix_blocks="",
            block_tokens=16,
        )  # fmt: skip
        for seed in (random.Random(3 + i).randrange(2**63) for i in range(12))
    ]
    got = prepare(batch, bpe, verify_every=1)
    assert got == [reference_text(bpe, r) for r in batch]
    assert all(bpe.count(t) == 16 for t in got)
    assert len(set(got)) == len(got)
    first = {t.split()[0] for t in got}
    assert len(first) >= 6, got  # not one shared opening word


@pytest.mark.parametrize("counter", [None, WhitespaceCounter()])
def test_the_same_prompts_as_the_reference_under_the_project_tokenizer(counter):
    batch = rows(200, seed=5)
    got = prepare(batch, counter)
    assert got == [reference_text(counter, r) for r in batch]
    for text, row in zip(got, batch, strict=True):
        assert len(text.split()) == row.get("user_tokens", row["input_tokens"])


def test_a_tokenizer_that_merges_across_spaces_gets_the_reference_fit(tmp_path):
    """Without a pre-tokenizer a BPE merges across words, so counts are no sums of pieces:
    the piece check refuses them and every prompt is fitted by full tokenization."""
    counter = train(tmp_path / "tokenizer.json", vocab=1500, pre_tokenizer=False)
    batch = rows(30, seed=9)
    said = []
    got = prepare(batch, counter, log=said.append)
    assert got == [reference_text(counter, r) for r in batch]
    assert said and "fitting every prompt by full tokenization" in said[0]


def test_padding_and_dropping_words_as_fit_words_does(small_bpe):
    fitter = PromptFitter(small_bpe)
    assert fitter.counts is not None
    from capacity_pack.plan.prompt_fit import fit_counted

    for words, n in ((["alpha"] * 50, 10), (["Ticket-00ff:", "the"], 3), (["x"], 4)):
        assert fit_counted(words, n, fitter.counts) == fit_words(words, n, small_bpe)


@pytest.mark.slow
def test_a_tokenize_endpoint_gets_the_same_prompts_with_fewer_requests(bpe):
    """vLLM's POST /tokenize served on 127.0.0.1 by a real HTTP server counting with ``bpe``."""
    from capacity_pack.engines.tokenize import EndpointCounter

    served = []
    with tokenize_server(bpe.count, 99999, lambda data: served.append(1)) as url:
        batch = [r for r in rows(80, seed=3) if r["input_tokens"] <= 300]
        counter = EndpointCounter(url, "m")
        fitter = PromptFitter(counter)
        got = [fitter.text(r) for r in batch]
        assert got == [reference_text(counter, r) for r in batch]
        # Once most of the run's pieces are counted, a prompt costs a request for each word
        # not yet seen (a cold head's among them), not one per probe.
        later = [r for r in rows(80, seed=4) if r["input_tokens"] <= 300]
        served.clear()
        got = [fitter.text(r) for r in later]
        fast = len(served)
        served.clear()
        assert got == [reference_text(counter, r) for r in later]
        assert fast < len(served) / 2


@pytest.mark.parametrize("keep_alive", [True, False])
def test_counts_from_eight_threads_survive_a_server_that_drops_reused_connections(keep_alive):
    """Eight threads count at once (as a prompt fit does) against a server that drops every
    third request on a reused connection unanswered: every count comes back right (a dropped
    call is made again on a new connection); without keep-alive each call has its own."""
    from concurrent.futures import ThreadPoolExecutor

    from capacity_pack.engines.tokenize import EndpointCounter

    words = WhitespaceCounter()
    texts = [" ".join(["word"] * (1 + i % 37)) for i in range(240)]
    carried: list[int] = []
    with tokenize_server(words.count, 99999, drop_reused_every=3, connections=carried) as url:
        counter = EndpointCounter(url, "m", keep_alive=keep_alive)
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(counter.count, texts))
        counter.close()
    assert got == [words.count(t) for t in texts]
    if keep_alive:
        assert max(carried) == 3  # reused, and dropped on the third
    else:
        assert set(carried) == {1}


# --- the prepared-prompts file -----------------------------------------------------------------


def inputs(**kw) -> PromptInputs:
    base = dict(corpus_revision="capacity-pack-text-v1", cold_unique_prefix_tokens=8,
                prefix_revision="p-v1", block_tokens=512, tokenizer="project")  # fmt: skip
    return PromptInputs(**{**base, **kw})


def schedule(n: int = 20) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [f"open-r1.cold.rep0.{i:06d}" for i in range(n)],
            "input_tokens": [10 + i for i in range(n)],
            "prompt_seed": list(range(n)),
            "prefix_id": [-1] * n,
            "prefix_tokens": [0] * n,
            "prefix_blocks": [""] * n,
        }
    )


def test_the_prompts_stage_writes_what_the_sweep_reads(tmp_path):
    from capacity_pack.stages.prompts import run

    frame, spec = schedule(), inputs()
    run(inputs=spec.canonical_json(), schedule=frame, prompts=tmp_path / "p.parquet",
        log=logging.getLogger("test"))  # fmt: skip
    got = read_prepared(tmp_path / "p.parquet", frame, spec)
    assert list(got) == frame["request_id"].tolist()
    assert [len(t.split()) for t in got.values()] == frame["input_tokens"].tolist()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f, i: (f.assign(prompt_seed=f["prompt_seed"] + 1), i), "another schedule"),
        (lambda f, i: (f, inputs(cold_unique_prefix_tokens=4)), "other prompt inputs"),
    ],
)
def test_prepared_prompts_are_refused_for_another_schedule_or_inputs(tmp_path, change, message):
    frame, spec = schedule(), inputs()
    path = tmp_path / "p.parquet"
    write_prepared(path, frame, [str(i) for i in range(len(frame))], spec)
    other_frame, other_inputs = change(frame, spec)
    with pytest.raises(PreparedPromptsError, match=message) as err:
        read_prepared(path, other_frame, other_inputs)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_file_that_is_no_prompts_file_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "p.parquet"
    bad.write_text("not parquet")
    with pytest.raises(PreparedPromptsError, match="not a prepared-prompts file"):
        read_prepared(bad, schedule(), inputs())


def test_the_sweep_refuses_prompts_prepared_for_another_schedule(tmp_path):
    """Before its target is started or locked: a one-line error naming the file."""
    from capacity_pack.measure.inputs import SweepInputs
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.plan.schedule import build_schedule, find_point
    from capacity_pack.stages.sweep import run
    from tests.paths import DEFAULT_CONFIG

    pack = load_pack(DEFAULT_CONFIG)
    point = find_point(pack, "closed-c1", "cold", 0)
    frame = build_schedule(pack, point)
    path = tmp_path / "prompts.parquet"
    other = frame.assign(prompt_seed=frame["prompt_seed"] + 1)
    write_prepared(path, other, ["x"] * len(other), PromptInputs.of_pack(pack))
    with pytest.raises(PreparedPromptsError, match="prepared for another schedule") as err:
        run(
            inputs=SweepInputs.for_point(pack, point),
            point="closed-c1",
            cache_state="cold",
            repeat=0,
            schedule=frame,
            records=tmp_path / "raw" / "records.jsonl",
            summary=tmp_path / "summary.json",
            log=logging.getLogger("test"),
            prompts=path,
        )
    assert "\n" not in str(err.value)
    assert not (tmp_path / "raw").exists() and not (tmp_path / "summary.json").exists()
