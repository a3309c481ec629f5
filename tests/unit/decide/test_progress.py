"""The pack's progress lines: the load each point plans, the plan line the run starts with and the
line after each measured point (counts, reuse, load left, a search's open end)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capacity_pack.decide import progress as P
from capacity_pack.decide import search as S
from capacity_pack.plan import schedule as sched
from capacity_pack.plan.manifest import validate_pack
from tests.conftest import pack_data, small_pack_data
from tests.unit.decide.test_search import knee, run


def fixed_pack():
    data = small_pack_data(
        "progress-test",
        requests=60,
        min_samples=10,
        sweep={"open_loop_rps": [10, 20], "closed_loop_concurrency": [1]},
    )
    return validate_pack(data, "pack.yaml")


def open_point(rate: float, cache: str = "cold") -> sched.Point:
    return sched.Point(mode="open", rate_rps=rate, cache_state=cache, repeat=0)


def closed_point(level: int, cache: str = "cold") -> sched.Point:
    return sched.Point(mode="closed", concurrency=level, cache_state=cache, repeat=0)


def status(key: str, load: float | None, done: bool = False, reused: bool = False, mode="open"):
    return P.PointStatus(key, mode, load, done, reused)


# -- a point's load ---------------------------------------------------------------------------


def test_an_unwritten_schedule_plans_the_span_of_the_schedule_built_from_the_pack():
    pack = fixed_pack()
    point = open_point(10)
    frame = sched.build_schedule(pack, point)
    expected = frame["scheduled_offset_ns"].max() / sched.NS_PER_S
    assert P.planned_load_s(pack, point) == pytest.approx(expected)
    # Warm-up and the measured window: 60 requests at 10 RPS after half a second of warm-up.
    assert 3 < P.planned_load_s(pack, point) < 12


def test_a_written_schedule_plans_its_own_duration():
    assert P.planned_load_s(fixed_pack(), open_point(10), {"duration_s": 42.5}) == 42.5


def test_a_closed_loop_point_plans_no_span():
    pack = fixed_pack()
    assert P.planned_load_s(pack, closed_point(1)) is None
    assert P.planned_load_s(pack, closed_point(1), {"duration_s": 0.0}) is None


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0, "0 s"), (40.4, "40 s"), (89, "89 s"), (90, "2 min"), (14 * 60, "14 min"),
     (89 * 60, "89 min"), (90 * 60, "1 h 30 min"), (8.5 * 3600, "8 h 30 min")],
)  # fmt: skip
def test_duration_words(seconds, words):
    assert P.duration_words(seconds) == words


def test_load_left_counts_the_points_not_measured_and_times_closed_loop_ones_once_measured():
    points = [
        status("open-r10/cold/rep0", 10.0, done=True),
        status("open-r20/cold/rep0", 7.0),
        status("closed-c1/cold/rep0", None, mode="closed"),
        status("closed-c8/cold/rep0", None, mode="closed", done=True),
    ]
    assert P.load_left(points) == (7.0, 1)
    assert P.load_left(points, [4.0, 6.0]) == (12.0, 0)


# -- the lines ----------------------------------------------------------------------------------


def test_the_plan_line_of_a_fresh_fixed_pack():
    points = [status(f"open-r{r}/{c}/rep0", 30.0) for r in (10, 20) for c in ("cold", "warm")]
    points += [status(f"closed-c1/{c}/rep0", None, mode="closed") for c in ("cold", "warm")]
    assert P.plan_line(points, searching=False) == (
        "pack plan: 6 measurement points, about 2 min of load and 2 untimed points"
    )


def test_the_plan_line_names_the_reused_points_and_the_load_left():
    points = [status("open-r10/cold/rep0", 30.0, done=True, reused=True)]
    points += [status("open-r15/cold/rep0", 20.0), status("open-r15/warm/rep0", 20.0)]
    assert P.plan_line(points, searching=False) == (
        "pack plan: 3 measurement points, 1 measured before and reused, about 40 s of load left"
    )
    reused = [status("open-r10/cold/rep0", 30.0, done=True, reused=True)]
    assert P.plan_line(reused, searching=False) == (
        "pack plan: 1 measurement point, 1 measured before and reused, nothing to measure"
    )


def test_a_searching_pack_plans_at_least_its_known_points():
    points = [status("open-r30/cold/rep0", 17.0), status("open-r40/cold/rep0", 13.0)]
    assert P.plan_line(points, searching=True) == (
        "pack plan: at least 2 measurement points, about 30 s of load;"
        " the search adds rounds as it goes"
    )
    points[0] = status("open-r30/cold/rep0", None, done=True)
    assert P.pack_line(points, searching=True) == (
        "pack: 1 of at least 2 points measured, about 13 s of load left; the search may add more"
    )


def test_the_pack_line_counts_up_to_all_points_measured():
    points = [status("open-r10/cold/rep0", None, done=True, reused=True)]
    points += [status("open-r20/cold/rep0", None, done=True), status("open-r20/warm/rep0", 600.0)]
    assert P.pack_line(points, searching=False) == (
        "pack: 2 of 3 points measured (1 reused), about 10 min of load left"
    )
    points[-1] = status("open-r20/warm/rep0", None, done=True)
    assert P.pack_line(points, searching=False) == "pack: 3 of 3 points measured (1 reused)"


# -- a search's end -----------------------------------------------------------------------------


def searching_pack():
    data = pack_data()
    data["experiments"] = []
    data["sweep"]["search"]["max_rounds"] = 3
    return validate_pack(data, "pack.yaml")


def write_rounds(folder: Path, pack) -> dict[str, list[dict]]:
    docs = {}
    for cache in pack.sweep.cache_states:
        docs[cache], _, _ = run(
            S.SearchInputs.of(pack), knee(35, 8), pack.sweep.search.max_rounds, cache
        )
        for k, doc in enumerate(docs[cache], start=1):
            path = folder / cache / f"round{k}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc))
    return docs


def test_a_search_is_done_when_every_cache_states_round_files_say_so(tmp_path):
    pack = searching_pack()

    def round_file(cache, k):
        return tmp_path / cache / f"round{k}.json"

    assert P.search_done(fixed_pack(), round_file)
    assert not P.search_done(pack, round_file)
    docs = write_rounds(tmp_path, pack)
    assert P.search_done(pack, round_file)
    round_file("warm", len(docs["warm"])).write_text("{not json")
    assert not P.search_done(pack, round_file)


# -- over Snakemake's jobs ----------------------------------------------------------------------


def test_pack_progress_counts_the_finished_job_and_prefers_the_written_schedule(tmp_path):
    pack = fixed_pack()
    points = [open_point(10), open_point(20), closed_point(1)]
    finished: set[str] = set()

    def jobs():
        return [(p, p.key == "open-r10/cold/rep0", p.key in finished) for p in points]

    def path(stage):
        return lambda p: tmp_path / stage / p.key / "summary.json"

    progress = P.PackProgress(
        pack,
        jobs,
        schedule_summary=path("schedules"),
        sweep_summary=path("raw"),
        round_file=lambda cache, k: tmp_path / "none.json",
    )
    built = P.planned_load_s(pack, open_point(20))
    assert progress.plan_line() == (
        "pack plan: 3 measurement points, 1 measured before and reused, about "
        f"{P.duration_words(built)} of load left and 1 untimed point"
    )
    # The schedule written since, the closed-loop point just finished: Snakemake tells its
    # handlers before it marks the job finished.
    for stage, doc in (("schedules", {"duration_s": 600.0}), ("raw", {"wall_s": 5.0})):
        file = path(stage)(open_point(20) if stage == "schedules" else closed_point(1))
        file.parent.mkdir(parents=True)
        file.write_text(json.dumps(doc))
    assert progress.pack_line(closed_point(1)) == (
        "pack: 2 of 3 points measured (1 reused), about 10 min of load left"
    )
    finished |= {"closed-c1/cold/rep0", "open-r20/cold/rep0"}
    assert progress.pack_line(open_point(20)) == "pack: 3 of 3 points measured (1 reused)"


def test_pack_progress_of_a_search_says_more_may_come_while_a_round_is_pending(tmp_path):
    pack = searching_pack()
    docs = write_rounds(tmp_path, pack)
    pending = [True]
    point = open_point(30)
    progress = P.PackProgress(
        pack,
        lambda: [(point, False, False)],
        schedule_summary=lambda p: tmp_path / "none.json",
        sweep_summary=lambda p: tmp_path / "none.json",
        round_file=lambda cache, k: tmp_path / cache / f"round{k}.json",
        rounds_pending=lambda: pending[0],
    )
    assert progress.pack_line(point).endswith("; the search may add more")
    pending[0] = False
    assert progress.pack_line(point) == "pack: 1 of 1 points measured"
    assert docs["cold"] and docs["warm"]


def test_a_point_measured_in_this_run_is_not_reused_when_the_graph_calls_it_kept(tmp_path):
    """After a search round Snakemake rebuilds its graph: the points this run measured before it
    then read as jobs it need not run."""
    first, second = open_point(30), open_point(40)
    kept = {first.key: False}
    progress = P.PackProgress(
        fixed_pack(),
        lambda: [(first, kept[first.key], False), (second, False, False)],
        schedule_summary=lambda p: tmp_path / "none.json",
        sweep_summary=lambda p: tmp_path / "none.json",
        round_file=lambda cache, k: tmp_path / "none.json",
    )
    assert progress.pack_line(first).startswith("pack: 1 of 2 points measured, about ")
    kept[first.key] = True
    assert progress.pack_line(second) == "pack: 2 of 2 points measured"
