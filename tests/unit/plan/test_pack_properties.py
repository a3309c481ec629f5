"""Property tests: any mutation of a valid pack either validates or is refused with the project's
error (a :class:`ManifestError` naming the file and a field, line or byte), never another
exception; lint and freeze agree on every example.

Two families, both in-process (a subprocess per example would cost ~1 s each): mutations of the
parsed default pack (wrong types, huge, negative and non-finite numbers, random strings, dates,
missing and extra keys at any depth), and byte-level corruption of its YAML file (bytes and YAML
punctuation inserted, bytes replaced or deleted, the file cut short). One subprocess run checks
the command line's exit status and that it prints no traceback.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity_pack.plan import lint
from capacity_pack.plan.lint import lint_data, lint_file
from capacity_pack.plan.manifest import (
    ManifestError,
    freeze,
    load_pack,
    load_yaml,
    mutable_revision_fields,
    validate_pack,
)
from capacity_pack.plan.schedule import points
from tests.conftest import pack_data
from tests.paths import DEFAULT

BASE = pack_data()
BASE_BYTES = DEFAULT.read_bytes()


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BASE)[1:]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.sampled_from(
        [0, -1, 1, 2, 10**8, 10**12, 2**63, 10**400, 1e308, -1e308, 1e-308, 5e-324, 0.5, -0.0]
        + [float("inf"), float("-inf"), float("nan")]
    ),
    st.text(max_size=24),
    st.sampled_from(
        ["latest", "v2-latest", "nightly-2026", "main", "", "inf", "nan", "1e308", "-1", "0"]
        + ["2026-11-29", "2026-02-30", "true", "none", "cold", "warm", "poisson", "openai"]
    ),
    st.dates(),
    st.datetimes(),
    st.lists(st.one_of(st.integers(-5, 50), st.floats(), st.text(max_size=5)), max_size=4),
    st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(-3, 3), st.text(max_size=4)), max_size=3
    ),  # fmt: skip
)
KEYS = st.one_of(st.text(max_size=12), st.sampled_from(["name", "kind", "rate_rps", "extra"]))
MUTATION = st.tuples(
    st.sampled_from(PATHS), st.sampled_from(["set", "delete", "add"]), VALUES, KEYS
)


def mutate(data: dict, path: tuple, op: str, value: Any, key: Any) -> None:
    """Apply one mutation at ``path``; a path an earlier mutation removed is skipped."""
    parent: Any = data
    for step in path[:-1]:
        try:
            parent = parent[step]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    try:
        if op == "set":
            parent[last] = value
        elif op == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][key] = value
        elif isinstance(parent[last], list):
            parent[last].append(value)
        else:
            parent[last] = {key: value}
    except (KeyError, IndexError, TypeError):
        return


# The project's error: the file first, then what is wrong and where (a field, a line, a byte).
PROBLEM = re.compile(r"^\S[^\n]*?: \S[^\n]*$")


def assert_project_error(message: str, source: str) -> None:
    assert message.startswith(source), message
    rest = message[len(source) :]
    if re.fullmatch(r" is not UTF-8 text \(byte \d+\)", rest):
        return
    assert rest.startswith(": "), message
    rest = rest[2:]
    if rest.startswith("not valid YAML: "):
        assert "\n" not in rest and re.search(r"line \d+", rest), message
    elif rest.startswith("invalid pack configuration: "):
        assert "\n" not in rest and PROBLEM.match(rest.removeprefix("invalid pack configuration: "))
    elif rest.startswith("invalid pack configuration ("):
        lines = rest.splitlines()
        assert re.fullmatch(r"invalid pack configuration \(\d+ problems\):", lines[0]), message
        for line in lines[1:]:
            assert line.startswith("  - ") and PROBLEM.match(line[4:]), message
    else:
        assert rest.startswith("expected a mapping at the top level, got "), message


def check(data: Any, source: str) -> None:
    """Validate, lint and freeze ``data``: only :class:`ManifestError`, and they agree."""
    try:
        pack = validate_pack(data, source)
    except ManifestError as err:
        assert_project_error(str(err), source)
        # Lint refuses it too: with the same message when it reads as a pack, else as a plain
        # benchmark description with an error of its own.
        try:
            lint_data(data, source)
        except ManifestError as again:
            assert_project_error(str(again), source)
            assert str(again) == str(err) or not lint.is_pack_data(data)
        else:
            raise AssertionError(f"lint accepted what validation refused: {err}")
        return
    codes = [f.code for f in lint_data(data, source)]
    try:
        doc = freeze(pack, source)
    except ManifestError as err:
        assert "refusing to freeze mutable revisions" in str(err)
        assert mutable_revision_fields(pack) and "mutable-versions" in codes
        return
    assert "mutable-versions" not in codes
    # The frozen manifest is JSON and validates to the same pack (the pipeline reads it back).
    again = validate_pack(json.loads(json.dumps(doc["manifest"], allow_nan=False)), source)
    assert again.sha256() == doc["sha256"]
    ids = [(p.point_id, p.cache_state, p.repeat) for p in points(pack)]
    assert len(set(ids)) == len(ids)


@pytest.mark.slow
@settings(max_examples=2500, deadline=None)
@given(st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_pack_data_validates_or_names_the_field(mutations):
    data = copy.deepcopy(BASE)
    for m in mutations:
        mutate(data, *m)
    check(data, "pack.yaml")


YAML_PUNCTUATION = st.text(alphabet=list(":-[]{}#&*!|>'\"%@`,? \n\t0123456789.aeEn"), max_size=6)
EDIT = st.tuples(
    st.floats(0, 1, exclude_max=True),
    st.sampled_from(["insert", "replace", "delete", "punctuate", "truncate"]),
    st.binary(min_size=1, max_size=4),
    YAML_PUNCTUATION,
)


def corrupt(data: bytes, edits: list) -> bytes:
    for where, op, blob, text in edits:
        i = int(where * len(data)) if data else 0
        if op == "insert":
            data = data[:i] + blob + data[i:]
        elif op == "replace":
            data = data[:i] + blob + data[i + len(blob) :]
        elif op == "delete":
            data = data[:i] + data[i + len(blob) :]
        elif op == "punctuate":
            data = data[:i] + text.encode() + data[i:]
        else:
            data = data[:i]
    return data


@settings(
    max_examples=800, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(EDIT, min_size=1, max_size=3))
def test_corrupted_pack_file_loads_or_names_line_or_byte(tmp_path, edits):
    path = tmp_path / "pack.yaml"
    path.write_bytes(corrupt(BASE_BYTES, edits))
    try:
        data = load_yaml(path)
    except ManifestError as err:
        assert_project_error(str(err), str(path))
        for read in (load_pack, lint_file):
            try:
                read(path)
            except ManifestError as again:
                assert str(again) == str(err)
            else:
                raise AssertionError("a file that does not load was read")
        return
    check(data, str(path))


def test_cli_exit_status_without_traceback(tmp_path):
    """The command line on a few corrupted files: exit 1 and one line naming the file, never a
    traceback (test_manifest_bounds runs freeze and lint on bad encodings, dates, infinities)."""
    cases = {
        "yaml": (BASE_BYTES.replace(b"\npack:", b"\npack: [", 1), "not valid YAML"),
        # Cut inside a flow mapping: where the cut falls, not how long the file is, decides
        # whether what is left still parses.
        "cut": (BASE_BYTES[: BASE_BYTES.index(b"placement: {") + 18], "not valid YAML"),
        "dupe": (BASE_BYTES + b"cutoff: 2026-11-30\n", "found duplicate key 'cutoff'"),
        "huge": (BASE_BYTES.replace(b"repeats: 2", b"repeats: 1.0e+308", 1), "sweep.repeats"),
    }
    for name, (body, expected) in cases.items():
        config = tmp_path / f"{name}.yaml"
        config.write_bytes(body)
        res = subprocess.run(
            [sys.executable, "-m", "capacity_pack", "lint", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 1, (name, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and str(config) in res.stderr, res.stderr
        assert expected in res.stderr, res.stderr


def test_mutation_helpers_reach_every_depth():
    depths = {len(p) for p in PATHS}
    assert max(depths) >= 4 and len(PATHS) > 150
    data = copy.deepcopy(BASE)
    mutate(data, ("workload", 0, "mix"), "delete", None, None)
    assert "mix" not in data["workload"][0]
    assert corrupt(b"abcdef", [(0.5, "truncate", b"x", "")]) == b"abc"
    assert isinstance(BASE["cutoff"], datetime.date) and Path(DEFAULT).is_file()
