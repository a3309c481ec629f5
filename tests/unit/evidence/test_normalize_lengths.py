"""Normalization of a distribution class: each successful request answers to its own scheduled
output length, not to a class-wide one (the default pack's classes draw their lengths)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from capacity_pack.evidence.normalize import normalize
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.tables import TableValidationError
from tests.paths import DEFAULT
from tests.unit.evidence.test_normalize import fake_records


def pack():
    data = yaml.safe_load(DEFAULT.read_text())
    data["client"].update(
        initial_scheduled_requests=30, warmup_seconds=0.2, minimum_duration_seconds=1
    )
    data["client"].pop("class_schedule_counts")
    return validate_pack(data)


def run(records: list[dict]):
    p = pack()
    fixed = {c.name: c.output_tokens if isinstance(c.output_tokens, int) else None
             for c in p.workload}  # fmt: skip
    assert set(fixed.values()) == {None}  # every default class draws its lengths
    return normalize(
        pd.DataFrame.from_records(records), point="open-r20", cache_state="cold", repeat=0,
        class_names=p.class_names, fixed_output=fixed, source="records.jsonl",
    )  # fmt: skip


@pytest.fixture
def schedule():
    return S.build_schedule(pack(), S.Point(mode="open", rate_rps=20, cache_state="cold", repeat=0))


def test_each_request_keeps_its_own_scheduled_length(schedule):
    requests, _ = run(fake_records(schedule))
    assert requests["output_tokens_expected"].nunique() > 5
    assert (requests["output_tokens"] == requests["output_tokens_expected"]).all()
    assert requests["output_tokens"].tolist() == schedule["output_tokens"].tolist()


def test_a_request_short_of_its_scheduled_length_is_refused(schedule):
    recs = fake_records(schedule)
    target = next(i for i, r in enumerate(recs) if r["output_tokens"] > 2)
    n = recs[target]["output_tokens"] - 1
    r = recs[target]
    r.update(output_tokens=n, chunk_ns=r["chunk_ns"][:n], chunk_tokens=[1] * n)
    r["last_token_ns"] = r["chunk_ns"][-1]
    with pytest.raises(TableValidationError) as err:
        run(recs)
    line = next(x for x in str(err.value).splitlines() if "scheduled output length" in x)
    assert f"row {target}" in line
