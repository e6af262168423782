"""Every reader of a results file (`ckptqual summary`, `report`, `mlperf`, `compare`) checks it against the record's
one schema (report/schema.py): a real record, mutated key by key (null, a string, a list, a number, NaN, removed),
is refused in one line naming the key with exit 2, or, where the schema allows the value, read without a traceback.

The record is a real built-in run's on a loop-mounted ext4 (tests/data/results/loop-ext4-devices.json: `pytest
tests_qual --workload llama3-8b --scale 0.0009 --sweep-file-bytes 64M`), with the device byte counts of every timed
region and the cleanup's account; a mapping of alike entries (the tests by node ID) is mutated through its first
entry, a list through its first item.

The commands run in this process (cli.main: the same exit code and stderr a `ckptqual` process gives, which one
refused mutation per command proves in a real process)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import validators

from ckptqual.cli import main
from ckptqual.documents import checker, key_path
from ckptqual.report.extract import load_run
from ckptqual.report.figures import draw_all
from ckptqual.report.html import render
from ckptqual.report.schema import SCHEMA, shape_problem

RECORD = Path(__file__).parent / "data" / "results" / "loop-ext4-devices.json"
DATA = json.loads(RECORD.read_text())
REMOVED = object()
KINDS: dict[str, Any] = {
    "null": None,
    "a string": "x",
    "a list": [],
    "a number": 7,
    "NaN": math.nan,
    "removed": REMOVED,
}
COMMANDS = ("summary", "report", "mlperf", "compare")
Path_ = tuple[str | int, ...]


def _paths(value: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Every key's path; of a list its first item, of a mapping of alike entries its first entry."""
    if isinstance(value, dict):
        items = list(value.items())
        if len(items) >= 3 and all(isinstance(item, dict) for _, item in items):
            items = items[:1] if len({tuple(item) for _, item in items}) == 1 else items
        for key, item in items:
            yield (*path, key)
            yield from _paths(item, (*path, key))
    elif isinstance(value, list) and value:
        yield (*path, 0)
        yield from _paths(value[0], (*path, 0))


def _mutated(data: Any, mutations: list[tuple[Path_, Any]]) -> Any:
    """`data` with each path set to its value, or removed; the deepest first, so that none hides another. Only the
    objects and lists on the paths are copied: the rest is shared with `data`, which stays as it is."""
    root = _shallow(data)
    copied = {id(root)}
    for path, value in sorted(mutations, key=lambda mutation: -len(mutation[0])):
        node = root
        for part in path[:-1]:
            if id(node[part]) not in copied:
                node[part] = _shallow(node[part])
                copied.add(id(node[part]))
            node = node[part]
        if value is REMOVED:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return root


def _shallow(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value)


def _value(path: Path_) -> Any:
    node = DATA
    for part in path:
        node = node[part]
    return node


def _kinds(path: Path_) -> list[str]:
    """The mutations of a key: NaN only where a number is (elsewhere a number already has the wrong type)."""
    number = isinstance(_value(path), int | float) and not isinstance(_value(path), bool)
    return [kind for kind in KINDS if kind != "NaN" or number]


MUTATIONS = [(path, kind) for path in _paths(DATA) for kind in _kinds(path)]


@functools.cache
def _allowed() -> frozenset[tuple[Path_, str]]:
    """The mutations the schema allows, decided once for both tests below. Both prove the decision with the
    product's own check: the refused ones must be refused by the commands, the allowed ones read by them."""
    accepts = _accepts_beside_data()
    return frozenset((p, kind) for p, kind in MUTATIONS if accepts(_mutated(DATA, [(p, KINDS[kind])])))


def _accepts_beside_data() -> Callable[[Any], bool]:
    """Whether the record's schema accepts a document (as shape_problem's `None`), checked by the record's own
    validator class with each keyword's check skipped on a part of DATA it already passed there: a mutated record
    shares all but the objects on its mutated path with DATA (_mutated), so that only those are checked again."""
    passed: set[tuple[str, int, int]] = set()  # (keyword, id of schema, id of a part of DATA that DATA holds)
    learning = [True]

    def remembered(keyword: str, check: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def remembered_check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
            key = (keyword, id(schema), id(instance))
            if key in passed:
                return
            errors = list(check(validator, value, instance, schema))
            if learning[0] and not errors:
                passed.add(key)
            yield from errors

        return remembered_check

    base = type(checker(SCHEMA))
    checks = {keyword: remembered(keyword, check) for keyword, check in base.VALIDATORS.items()}
    validator = validators.extend(base, checks)(SCHEMA)
    assert validator.is_valid(DATA)
    learning[0] = False  # only DATA's parts, alive and unchanged while the tests run, are remembered
    return validator.is_valid


def _command(name: str, path: Path, out: Path) -> list[str]:
    return {"summary": [name, str(path)], "mlperf": [name, str(path)], "compare": [name, str(RECORD), str(path)],
            "report": [name, str(path), "-o", str(out)]}[name]  # fmt: skip


def _run(arguments: list[str]) -> tuple[int, str]:
    """cli.main in this process: its exit code and what it printed to stderr; a traceback fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(arguments)
    return code, err.getvalue()


def _run_process(arguments: list[str]) -> tuple[int, str]:
    """`ckptqual` in a process of its own: its exit code and what it printed to stderr."""
    command = [sys.executable, "-m", "ckptqual.cli", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ, timeout=300)
    return done.returncode, done.stderr


def _read_by_every_command(path: Path, tmp_path: Path) -> None:
    """The record read as each command reads it: summary, mlperf and compare in full; report's figures and page
    drawn (encoding them as PNG reads nothing of the record, so it is left to test_report)."""
    for name in ("summary", "mlperf", "compare"):
        assert _run(_command(name, path, tmp_path))[0] in ((0, 1, 3) if name == "compare" else (0, 1))
    runs = [load_run(path)]
    drawn = draw_all(runs)
    render(runs, [(figure, None) for figure in drawn])
    for figure in drawn:
        if figure.figure is not None:
            figure.figure.clear()


def test_the_record_as_the_run_wrote_it_is_accepted():
    assert shape_problem(DATA) is None
    assert len(MUTATIONS) > 2500


def test_a_refused_mutation_is_one_line_naming_the_key_with_exit_2_from_each_command(tmp_path):
    """Every mutation the schema refuses, each through one of the four commands in turn (they read a file alike,
    through extract.load_run), so that each command meets every part of the record."""
    refused = 0
    file = tmp_path / "mutated.json"
    for path, kind in MUTATIONS:
        if (path, kind) in _allowed():
            continue
        refused += 1
        file.write_text(json.dumps(_mutated(DATA, [(path, KINDS[kind])])))
        name = COMMANDS[refused % len(COMMANDS)]
        code, err = _run(_command(name, file, tmp_path / "out"))
        where = f"{name} on {key_path(path)} as {kind}"
        assert code == 2, where
        head = f"ckptqual {name}: {file}: not a results record as ckptqual writes it: "
        assert err.startswith(head) and err.count("\n") == 1, (where, err)
        assert err.removeprefix(head).startswith(key_path(path)), (where, err)
    assert refused > 500


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_mutation_the_schema_allows_is_read_without_a_traceback(kind, tmp_path):
    """The allowed mutations of one kind, applied together where no key lies under another (one record per
    depth of key), read by every command; a set refused together is read one by one."""
    allowed = [path for path, mutation_kind in MUTATIONS if mutation_kind == kind and (path, kind) in _allowed()]
    by_depth: dict[int, list[Path_]] = {}
    for path in allowed:
        by_depth.setdefault(len(path), []).append(path)
    file = tmp_path / "mutated.json"
    for paths in by_depth.values():
        together = _mutated(DATA, [(path, KINDS[kind]) for path in paths])
        records = [together] if shape_problem(together) is None else [_mutated(DATA, [(p, KINDS[kind])]) for p in paths]
        for mutated in records:
            file.write_text(json.dumps(mutated))
            _read_by_every_command(file, tmp_path)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_ckptqual_process_refuses_as_the_command_does_in_this_process(name, tmp_path):
    """The tests above call cli.main in this process; a real `ckptqual` process gives the same exit code and stderr."""
    path, kind = next((p, k) for p, k in MUTATIONS if k == "a string" and len(p) == 2 and (p, k) not in _allowed())
    file = tmp_path / "mutated.json"
    file.write_text(json.dumps(_mutated(DATA, [(path, KINDS[kind])])))
    arguments = _command(name, file, tmp_path / "out")
    code, err = _run(arguments)
    assert code == 2 and err.count("\n") == 1 and key_path(path) in err, err
    assert _run_process(arguments) == (code, err)
