"""One way to check a document (ckptqual.documents): the results record, the messages between nodes, and the plan,
workload and drive files all say what is wrong in the same line: the key path, what it must be and what it is."""

from __future__ import annotations

import json
import re

import pytest

from ckptqual.config.drive_file import load_drive_file
from ckptqual.config.values import SettingsError
from ckptqual.documents import checker, key_path, problem
from ckptqual.plan.planfile import PlanFileError, load_plan
from ckptqual.plan.workloads import WorkloadError, load_workload
from ckptqual.report.schema import shape_problem
from ckptqual.runs.wire import Refused, Wire

WORKLOAD = """description = "test"
layout = "deepspeed"
[model]
layers = 2
hidden = 8
ffn_hidden = 16
heads = 2
kv_heads = 1
vocab = 10
[parallelism]
tp = 1
pp = 1
dp = 1
zero_stage = 1
"""
DRIVE = '[drive]\nname = "d"\n'
PLAN = {"format": "ckptqual-plan", "version": 1, "workload": "w", "description": "", "scale": 1.0,
        "parallelism": {"tp": 1}, "ranks": [{"rank": 0, "files": []}]}  # fmt: skip


def wire_line(body: object) -> str:
    """The refusal of a signed "lost" message with `body`."""
    sender = Wire(b"s" * 32, "run1", 1, 4)
    payload = json.dumps({"kind": "lost", "run": "run1", "from": 1, "seq": 1, "body": body}).encode()
    value = sender._mac("ckptqual/events", payload).encode() + b"\n" + payload
    with pytest.raises(Refused) as caught:
        Wire(b"s" * 32, "run1", -1, 4).open("ckptqual/events", value, {"lost"}, range(4))
    return str(caught.value).partition("it is malformed: ")[2]


def workload_line(tmp_path, text: str) -> str:
    (tmp_path / "w.toml").write_text(text)
    with pytest.raises(WorkloadError) as caught:
        load_workload(str(tmp_path / "w.toml"))
    return str(caught.value).partition("w.toml: ")[2]


def drive_line(tmp_path, text: str) -> str:
    (tmp_path / "d.toml").write_text(text)
    with pytest.raises(SettingsError) as caught:
        load_drive_file(str(tmp_path / "d.toml"))
    return str(caught.value).partition("d.toml: ")[2]


def plan_line(change: dict) -> str:
    with pytest.raises(PlanFileError) as caught:
        load_plan(json.dumps(PLAN | change))
    return str(caught.value)


def test_an_unknown_key_a_missing_key_and_a_wrong_type_read_alike_in_every_document(tmp_path):
    unknown = [
        wire_line({"line": "x", "extra": 1}),
        plan_line({"extra": 1}),
        workload_line(tmp_path, WORKLOAD + "[dtypes]\nmaster = 1\n"),
        drive_line(tmp_path, DRIVE + "stray = 1\n"),
    ]
    assert unknown[0] == "lost.extra: unknown key; allowed: line"
    assert unknown[1] == "plan.extra: unknown key; allowed: format, version, workload, description, scale, " + (
        "parallelism, ranks"
    )
    assert unknown[2].startswith("dtypes.master: unknown key; allowed: model, optimizer")
    assert unknown[3] == "drive.stray: unknown key; allowed: name, description, capacity_bytes, source; remove it " + (
        "from [drive]"
    )
    missing = [
        wire_line({}),
        plan_line({"ranks": [{"rank": 0}]}),
        workload_line(tmp_path, WORKLOAD.replace("vocab = 10\n", "")),
        drive_line(tmp_path, '[drive]\ndescription = "no name"\n'),
        shape_problem({}),
    ]
    assert missing[:2] == ["lost.line: missing", "plan.ranks[0].files: missing"]
    assert missing[2] == "model.vocab: missing; add it (the files in fixtures/workloads show the format)"
    assert missing[3:] == ["drive.name: missing; add it to [drive]", "settings: missing"]
    wrong = [
        wire_line({"line": 5}),
        plan_line({"parallelism": {"tp": "2"}}),
        workload_line(tmp_path, WORKLOAD.replace("layers = 2", "layers = 'two'")),
        drive_line(tmp_path, DRIVE + "capacity_bytes = 'big'\n"),
        shape_problem({"settings": {"drives_at_once": "two"}}),
    ]
    assert wrong == [
        "lost.line: must be a string, got 5",
        "plan.parallelism.tp: must be an integer, got '2'",
        "model.layers: must be an integer, got 'two'",
        "drive.capacity_bytes: must be an integer, got 'big'",
        "settings.drives_at_once: must be an integer, got 'two'",
    ]
    for line in unknown + missing + wrong:
        assert re.fullmatch(r"[\w.\[\]\"]+: [^\n]+", str(line)), line


def test_the_one_line_bounds_what_it_shows_and_names_keys_a_reader_can_find():
    validator = checker({"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}})
    assert problem(validator, {"a/b.py::t[1]": "x" * 10_000}) == (
        '["a/b.py::t[1]"]: must be a string of at most 4 characters, got 10,000 characters'
    )
    assert problem(validator, {"k": float("nan")}, "top") == "top.k: must be a string, got NaN"
    assert problem(checker({"type": "integer"}), 2.0) == "the top level: must be an integer, got 2.0"
    assert problem(checker({"type": "number"}), True) == "the top level: must be a number, got true"
    assert key_path(["passes", 0, "seconds"]) == "passes[0].seconds"
    assert problem(checker({"const": 1, "fix": "use 1"}), 2, "version") == "version: must be 1, got 2; use 1"
