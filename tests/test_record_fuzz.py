"""Fuzzing every reader of a results file: Hypothesis mutates real recorded records (tests/data/results/*.json),
setting a key the views read, or one the record holds, to a value of the wrong shape or an absurd size, and runs
`ckptqual summary`, `compare`, `mlperf` and `report` on it. Each ends cleanly: exit 0 or 1 (3: an inconclusive
compare), or the refusal (exit 2) in one line naming the key; never a traceback."""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ckptqual.report
from ckptqual.cli import main
from hypothesis_profiles import PROFILE

RECORDS = sorted((Path(__file__).parent / "data" / "results").glob("*.json"))
DATA = {path: json.loads(path.read_text()) for path in RECORDS}
SIZES = [1e308, -1e308, 10**40, -(10**40), 0, -1, 2**63, 5e-324, 1, 0.5]
ATOMS = st.sampled_from(
    [[], {}, None, True, "", "x" * 100_000, "1", [1, "a"], "\n\x1b[2K", "pass 1", "pass 99999999999999999999", *SIZES]
)


@cache
def read_keys() -> tuple[str, ...]:
    """Every string constant of the report package's code that could be a key: what the views may read."""
    keys = set()
    for module in Path(ckptqual.report.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                keys.add(node.value)
    return tuple(sorted(keys))


def hostile() -> st.SearchStrategy[Any]:
    """A value of the wrong shape or an absurd size: an atom, or a list or object of them under keys the views read."""
    return st.recursive(
        ATOMS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(read_keys()), inner, max_size=3),
        max_leaves=6,
    )


def _containers(value: Any, path: tuple = (), seen: set | None = None) -> list[tuple]:
    """The paths of the record's objects and lists, one per shape: of a list its first item, of objects whose
    keys are data (test IDs, pass numbers) the first."""
    found = [path] if isinstance(value, dict | list) else []
    if isinstance(value, dict):
        items = list(value.items())
        if len(items) >= 3 and all(isinstance(item, dict) for _, item in items):
            items = items[:1]
        for key, item in items:
            found += _containers(item, (*path, key))
    elif isinstance(value, list) and value:
        found += _containers(value[0], (*path, 0))
    return found


CONTAINERS = {path: _containers(data) for path, data in DATA.items()}


@st.composite
def mutated_records(draw) -> tuple[Path, dict[str, Any]]:
    """A real record with one to three of its objects or lists given a hostile value at a key (a key the views read,
    or one the object holds) or index."""
    source = draw(st.sampled_from(RECORDS))
    data = copy.deepcopy(DATA[source])
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(CONTAINERS[source]))
        node = data
        with contextlib.suppress(KeyError, IndexError, TypeError):
            for part in where:
                node = node[part]
        if isinstance(node, dict):
            key = draw(st.sampled_from(sorted(node)) if node and draw(st.booleans()) else st.sampled_from(read_keys()))
            node[key] = draw(hostile())
        elif isinstance(node, list) and node:
            node[draw(st.integers(0, len(node) - 1))] = draw(hostile())
    return source, data


def _clean_exit(arguments: list[str]) -> None:
    """cli.main ends with 0 or 1 (3: an inconclusive compare), or refuses in one line with 2; a traceback fails it."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(arguments)
    assert code in (0, 1, 2, 3), (arguments, code)
    if code == 2:
        assert err.getvalue().count("\n") == 1 and "not a results record" in err.getvalue(), err.getvalue()


@PROFILE
@given(mutated_records())
def test_summary_compare_and_mlperf_end_cleanly_on_any_mutated_record(mutated):
    source, data = mutated
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mutated.json"
        path.write_text(json.dumps(data))
        for arguments in (["summary", path], ["mlperf", path], ["compare", source, path], ["compare", path, source]):
            _clean_exit([str(argument) for argument in arguments])


@PROFILE.__class__(PROFILE, max_examples=max(PROFILE.max_examples // 3, 5))
@given(mutated_records())
def test_report_ends_cleanly_on_any_mutated_record(mutated):
    _, data = mutated
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "mutated.json"
        path.write_text(json.dumps(data))
        _clean_exit(["report", str(path), "-o", str(Path(scratch) / "report")])


def _cell_with_settings(data: dict[str, Any], settings: Any) -> None:
    data["sweep"]["cells"][0].update(outcome="PASS", GiBps=1.0, settings=settings)


CASES = {
    "sweep.cells[0].settings.direct_io: a list": (lambda d: _cell_with_settings(d, {"direct_io": []}), "summary"),
    "sweep.cells[0].settings.direct_io: an object": (lambda d: _cell_with_settings(d, {"direct_io": {}}), "report"),
    "layouts[0].ratio: 1e308": (lambda d: d["layouts"][0].update(ratio=1e308), "compare"),
    "settings.drive: a number": (lambda d: (d["settings"].update(drive=5), d["drive"].update(model=None)), "compare"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_record_of_the_wrong_shape_is_refused_in_one_line_naming_the_key(case, tmp_path):
    mutate, command = CASES[case]
    source = RECORDS[-1]
    data = copy.deepcopy(DATA[source])
    mutate(data)
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(data))
    arguments = {"compare": [command, str(source), str(path)], "report": [command, str(path), "-o", str(tmp_path)]}
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(arguments.get(command, [command, str(path)])) == 2
    assert err.getvalue().count("\n") == 1, err.getvalue()
    assert f"not a results record as ckptqual writes it: {case.split(':')[0]}: " in err.getvalue(), err.getvalue()
