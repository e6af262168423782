"""What the selection did to each part of the run: the qualification tests its files define, those the command
line's node IDs left out, and those that -k, -m, --deselect or another plugin deselected, each with what dropped
it. The verdict reads it (verdicts.py), so that a run which left out a part its drive file requires is never
QUALIFIED."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark import KeywordMatcher, MarkMatcher
from _pytest.mark.expression import Expression

from ckptqual.limits.verdict import PartRun
from ckptqual.pytest_plugin.drives import DRIVE_ARG
from ckptqual.pytest_plugin.held import Collected, session_of
from ckptqual.pytest_plugin.run import subject_of


def _part_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("part")
    return str(marker.args[0]) if marker is not None and marker.args else None


def _label_of(item: pytest.Item) -> str | None:
    return getattr(getattr(item, "callspec", None), "params", {}).get(DRIVE_ARG)


def _note(item: pytest.Item, dropped: str | None) -> None:
    part = _part_of(item)
    if part is not None:
        session_of(item.config).collected[item.nodeid] = Collected(_label_of(item), part, subject_of(item), dropped)


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Generator[None, Any, Any]:
    """Notes every test a collected file defines (each parametrization of it) as left out by the command line's
    node IDs, until pytest collects it (`pytest_itemcollected`)."""
    made = yield
    for item in made if isinstance(made, list) else ():
        if isinstance(item, pytest.Item):
            _note(item, f"not among the tests the arguments name ({_given(item.config)})")
    return made


def pytest_itemcollected(item: pytest.Item) -> None:
    _note(item, None)


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Notes, for each deselected test of a part, which option deselected it."""
    for item in items:
        collected = session_of(item.config).collected
        if item.nodeid in collected:
            known = collected[item.nodeid]
            collected[item.nodeid] = Collected(known.label, known.part, known.subject, deselected_by(item))


def deselected_by(item: pytest.Item) -> str:
    """The option that deselects `item`: --deselect, else -k, else -m, else another plugin."""
    config = item.config
    prefix = next((p for p in config.getoption("deselect", None) or () if item.nodeid.startswith(p)), None)
    if prefix is not None:
        return f"deselected by --deselect {prefix}"
    keyword, markers = config.getoption("keyword", ""), config.getoption("markexpr", "")
    if keyword and not Expression.compile(keyword).evaluate(KeywordMatcher.from_item(item)):
        return f"deselected by -k {keyword!r}"
    if markers and not Expression.compile(markers).evaluate(MarkMatcher.from_markers(item.iter_markers())):
        return f"deselected by -m {markers!r}"
    return "deselected by a plugin (not -k, -m or --deselect; --last-failed, say)"


def part_runs(config: pytest.Config, label: str | None, reported: dict[str, dict], parts: tuple[str, ...]
              ) -> dict[str, PartRun]:  # fmt: skip
    """Each of `parts` of the drive `label`: how its tests were left out, and what those that ran reported
    (`reported`: the record's tests by node ID). A part of which no test was collected was left out by the command
    line's paths; a selected test that reported nothing never ran."""
    collected = {nodeid: test for nodeid, test in session_of(config).collected.items() if test.label == label}
    runs = {}
    for part in parts:
        tests = {nodeid: test for nodeid, test in collected.items() if test.part == part}
        left_out: list[tuple[str | None, str]] = [(None, _not_collected(config))] if not tests else []
        outcomes = []
        for nodeid, test in tests.items():
            if test.dropped is not None:
                left_out.append((test.subject, test.dropped))
            elif nodeid in reported:
                outcomes.append((reported[nodeid]["outcome"], reported[nodeid]["message"]))
            else:
                left_out.append((test.subject, "never reached: the session ended before it"))
        runs[part] = PartRun(tuple(left_out), tuple(outcomes))
    return runs


def _not_collected(config: pytest.Config) -> str:
    """How the command line left a part's tests out of the collection."""
    ignored = [*(config.getoption("ignore", None) or ()), *(config.getoption("ignore_glob", None) or ())]
    also = f" and --ignore {', '.join(map(str, ignored))}" if ignored else ""
    return f"not collected: pytest was given {_given(config)}{also}; give tests_qual to run every part"


def _given(config: pytest.Config) -> str:
    return " ".join(_shown(config, arg) for arg in config.args)


def _shown(config: pytest.Config, arg: str) -> str:
    path = Path(arg)
    return str(path.relative_to(config.rootpath)) if path.is_relative_to(config.rootpath) else arg
