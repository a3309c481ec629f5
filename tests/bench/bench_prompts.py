"""Benchmark: preparing a point's prompts under a real byte-level BPE tokenizer.json.

Run (from the repository root, in the project's virtualenv, on a quiet machine):

    python tests/bench/bench_prompts.py                       # open-r16, cold and warm
    python tests/bench/bench_prompts.py --cache-state warm --before-per-class 10

Method. A byte-level BPE tokenizer (Hugging Face ``tokenizers``: ByteLevel pre-tokenizer and
decoder, as ``tests/unit/plan/test_real_tokenizers.py`` trains one) is trained here to
``--vocab`` (32,000) tokens on the project's own text, the repository's source and documents
and seeded syllable words, and saved as a ``tokenizer.json``. The tutorial pack
(``config/packs/tutorial-70b.yaml``: 22,000 measured requests per point, 70/20/10 % at 1,024 /
8,192 / 512 input tokens, 64 shared prefixes of 256 tokens) is pointed at it (an
``openai`` target with ``tokenizer_path``) and one point's schedule is built (``--point``,
each ``--cache-state``: cold requests carry a unique head, warm ones a shared prefix).

- *after*: the ``prompts`` stage's own entry (:func:`capacity_pack.stages.prompts.run`, what the
  Snakemake job runs) prepares every row's prompt and writes the prompts file; then the
  sweep's read of it (:func:`capacity_pack.plan.prepared.read_prepared`, with its schedule and
  inputs checks) is timed: what a measurement now spends on prompts.
- *before*: the measurement-time fit (:func:`capacity_pack.plan.prompts.build_prompt_for`, a
  full tokenization per binary-search probe and per padding step) on ``--before-per-class``
  seeded rows of each class, extrapolated to the schedule by class (each class has one fixed
  length, so time per row is per class): an estimate, stated as such.

- *project tokenizer* (the simulated engine's, ``text.split()``): the same schedule's prompts
  built as the measurement built them before the clock (``build_prompt`` per row: *before*),
  then by the stage and the sweep's read of its file (*after*).

Also printed: requests and input tokens prepared, the prompts file's size, and the other load
(CPU seconds every other process of the machine used per second of the timed section, from
/proc/stat less this process's own CPU time).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "workflow"))


def machine_busy_cpu_s() -> float:
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class Timed:
    """Wall time, and the other load: machine CPU less this process's, per wall second."""

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), machine_busy_cpu_s(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t
        own = time.process_time() - self.own
        self.other = max(0.0, (machine_busy_cpu_s() - self.busy - own) / max(self.wall, 1e-9))


def train_tokenizer(path: Path, vocab: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from capacity_pack.plan.prompts import body

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>"], show_progress=False)
    syllables = "ka to ri mel an ost ur pe lin dra ve so qua ix ber nu cha zo gle fi".split()

    def corpus():
        for seed in range(300):
            yield " ".join(body(seed, 300))
        for pattern in ("**/*.py", "**/*.md", "**/*.yaml"):
            for name in sorted(glob.glob(str(ROOT / pattern), recursive=True)):
                if "/.venv/" not in name and "/results/" not in name:
                    yield Path(name).read_text(errors="ignore")
        rng = np.random.default_rng(0)
        for _ in range(2000):
            yield " ".join(
                "".join(rng.choice(syllables, size=rng.integers(1, 5))) for _ in range(200)
            )

    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(path))
    return tok.get_vocab_size()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", default="open-r16")
    ap.add_argument("--cache-state", action="append", choices=["cold", "warm"])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--before-per-class", type=int, default=20)
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()
    caches = args.cache_state or ["cold", "warm"]

    import yaml

    from capacity_pack.plan.manifest import validate_pack
    from capacity_pack.plan.prepared import PromptInputs, read_prepared
    from capacity_pack.plan.prompts import build_prompt_for
    from capacity_pack.plan.schedule import Point, build_schedule
    from capacity_pack.stages.prompts import run as prepare_stage

    work = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    tok_path = work / "tokenizer.json"
    with Timed() as t:
        vocab = train_tokenizer(tok_path, args.vocab)
    print(f"tokenizer: byte-level BPE, {vocab} tokens, trained in {t.wall:.1f} s")

    data = yaml.safe_load((ROOT / "config/packs/tutorial-70b.yaml").read_text())
    data["target"] = {
        "kind": "openai",
        "base_url": "http://127.0.0.1:9",
        "tokenizer_path": str(tok_path),
        "cache_reset": "vllm",
    }
    pack = validate_pack(data, "tutorial-70b (bench)")
    inputs = PromptInputs.of_pack(pack)
    counter = inputs.counter()
    log = logging.getLogger("bench")
    results = []
    for cache in caches:
        point = Point.parse(args.point, cache, 0)
        frame = build_schedule(pack, point)
        out = work / f"{cache}.parquet"
        with Timed() as after:
            prepare_stage(inputs=inputs, schedule=frame, prompts=out, log=log)
        with Timed() as read:
            prepared = read_prepared(out, frame, inputs)
        assert len(prepared) == len(frame)
        # Before: the measurement-time fit on seeded rows of each class, extrapolated by class.
        rng = np.random.default_rng(7)
        before_s, sampled = 0.0, 0
        for _, rows in frame.groupby("class"):
            pick = rows.iloc[rng.choice(len(rows), size=min(args.before_per_class, len(rows)))]
            with Timed() as b:
                for r in pick.to_dict("records"):
                    text = build_prompt_for(counter, **inputs.row(r))
                    assert text == prepared[r["request_id"]], "prepared prompt differs"
            before_s += b.wall / len(pick) * len(rows)
            sampled += len(pick)
        project = inputs.model_copy(
            update={"tokenizer": "project", "tokenizer_path": None, "tokenizer_sha256": None}
        )
        with Timed() as p_before:
            for r in frame.to_dict("records"):
                build_prompt_for(None, **project.row(r))
        p_out = work / f"{cache}-project.parquet"
        with Timed() as p_after:
            prepare_stage(inputs=project, schedule=frame, prompts=p_out, log=log)
        with Timed() as p_read:
            read_prepared(p_out, frame, project)
        row = {
            "point": point.key,
            "requests": len(frame),
            "input_tokens": int(frame["input_tokens"].sum()),
            "after_s": round(after.wall, 2),
            "after_other_load": round(after.other, 2),
            "file_mb": round(out.stat().st_size / 1e6, 1),
            "sweep_read_s": round(read.wall, 2),
            "before_estimate_s": round(before_s, 1),
            "before_rows_timed": sampled,
            "project_before_s": round(p_before.wall, 2),
            "project_after_s": round(p_after.wall, 2),
            "project_file_mb": round(p_out.stat().st_size / 1e6, 1),
            "project_sweep_read_s": round(p_read.wall, 2),
            "project_other_load": round(max(p_before.other, p_after.other), 2),
        }
        results.append(row)
        print(json.dumps(row))
    print(f"loadavg after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
