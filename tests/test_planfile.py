"""Plan files: a whole plan as JSON and back exactly, and every unusable one refused in one clear line."""

from __future__ import annotations

import json

import pytest

from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.planfile import PlanFileError, dump_plan, load_plan, save_plan, validate_plan
from ckptqual.plan.workloads import available_workloads, load_workload

SMALL = CheckpointPlan(
    "free",
    (
        RankPlan(0, (FilePlan("sub/a.pt", (TensorSpec("t0", 3, "int8"), TensorSpec("t1", 0, "float16"))),)),
        RankPlan(1, ()),
    ),
    scale=0.25,
    description="two ranks",
    parallelism={"tp": 2, "pp": 1, "dp": 1},
)

SMALL_TEXT = """{
  "format": "ckptqual-plan",
  "version": 1,
  "workload": "free",
  "description": "two ranks",
  "scale": 0.25,
  "parallelism": {"tp": 2, "pp": 1, "dp": 1},
  "ranks": [
    {"rank": 0, "files": [
      {"path": "sub/a.pt", "tensors": [["t0", 3, "int8"], ["t1", 0, "float16"]]}
    ]},
    {"rank": 1, "files": []}
  ]
}
"""


def test_the_format_is_one_line_per_file():
    assert dump_plan(SMALL) == SMALL_TEXT
    assert load_plan(SMALL_TEXT) == SMALL


@pytest.mark.parametrize("name", available_workloads())
@pytest.mark.parametrize("scale", [1, 0.001])
def test_every_shipped_workload_round_trips_exactly(name, scale):
    plan = load_workload(name).plan()
    plan = plan.scaled(scale) if scale != 1 else plan
    assert load_plan(dump_plan(plan)) == plan


def test_save_and_load_by_path(tmp_path):
    path = save_plan(SMALL, tmp_path / "layout.json")
    assert load_plan(path) == SMALL
    assert load_plan(str(path)) == SMALL
    assert json.loads(path.read_text())["ranks"][0]["files"][0]["path"] == "sub/a.pt"


def test_an_integer_scale_reads_as_a_float():
    plan = load_plan(SMALL_TEXT.replace('"scale": 0.25', '"scale": 1'))
    assert plan.scale == 1.0 and isinstance(plan.scale, float)


def _doc() -> dict:
    return json.loads(SMALL_TEXT)


def _with(change) -> str:
    doc = _doc()
    change(doc)
    return json.dumps(doc)


def _file(doc: dict, rank: int = 0, file: int = 0) -> dict:
    return doc["ranks"][rank]["files"][file]


def _second_file(path: str, rank: int = 0):
    def change(doc):
        doc["ranks"][rank]["files"].append({"path": path, "tensors": []})

    return change


BAD = {
    "unknown dtype": (
        lambda d: _file(d)["tensors"][0].__setitem__(2, "float12"),
        "ranks[0].files[0].tensors[0] (t0): unknown dtype 'float12'; use one of float64, float32",
    ),
    "negative numel": (
        lambda d: _file(d)["tensors"][0].__setitem__(1, -1),
        "ranks[0].files[0].tensors[0] (t0): numel must be an integer >= 0, got -1",
    ),
    "fractional numel": (
        lambda d: _file(d)["tensors"][0].__setitem__(1, 2.5),
        "numel must be an integer >= 0, got 2.5",
    ),
    "boolean numel": (lambda d: _file(d)["tensors"][0].__setitem__(1, True), "numel must be an integer"),
    "duplicate path in a rank": (
        _second_file("sub/a.pt"),
        "ranks[0].files[1].path: 'sub/a.pt' appears twice in rank 0 (files[0] and files[1])",
    ),
    "two ranks, one path": (
        _second_file("sub/a.pt", rank=1),
        "ranks[1].files[0].path: 'sub/a.pt' is written by two ranks, 0 and 1",
    ),
    "a file where another needs a directory": (
        _second_file("sub", rank=1),
        "'sub/a.pt' needs directory 'sub', which is a file of rank 1 (files[0])",
    ),
    "absolute path": (lambda d: _file(d).__setitem__("path", "/etc/x.pt"), "must be a relative"),
    "path leaving the checkpoint": (lambda d: _file(d).__setitem__("path", "../x.pt"), "'..'"),
    "empty path part": (lambda d: _file(d).__setitem__("path", "a//x.pt"), "empty"),
    "non-string path": (lambda d: _file(d).__setitem__("path", 7), "path: must be a non-empty string, got 7"),
    "duplicate tensor name": (
        lambda d: _file(d)["tensors"][1].__setitem__(0, "t0"),
        "ranks[0].files[0].tensors[1]: name 't0' appears twice in the file",
    ),
    "tensor not a triple": (lambda d: _file(d)["tensors"].append(["t2", 1]), "must be [name, numel, dtype]"),
    "ranks out of order": (lambda d: d["ranks"][1].__setitem__("rank", 5), "ranks[1].rank: must be 1"),
    "unknown key": (lambda d: d.__setitem__("extra", 1), "plan.extra: unknown key"),
    "missing key": (lambda d: d["ranks"][0].pop("files"), "ranks[0].files: missing"),
    "files not a list": (lambda d: d["ranks"][0].__setitem__("files", {}), "ranks[0].files: must be a list"),
    "wrong format": (lambda d: d.__setitem__("format", "other"), "plan.format: must be 'ckptqual-plan'"),
    "newer version": (
        lambda d: d.__setitem__("version", 2),
        "plan.version: must be 1, got 2; this ckptqual reads version 1",
    ),
    "zero scale": (lambda d: d.__setitem__("scale", 0), "plan.scale: must be a number > 0"),
    "non-integer parallelism": (lambda d: d["parallelism"].__setitem__("tp", "2"), "plan.parallelism.tp"),
    "non-string workload": (lambda d: d.__setitem__("workload", None), "plan.workload: must be a string"),
}


@pytest.mark.parametrize("case", BAD, ids=BAD.keys())
def test_every_problem_is_refused_in_one_line(case):
    change, message = BAD[case]
    with pytest.raises(PlanFileError) as caught:
        load_plan(_with(change))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_json_and_missing_files_name_the_problem(tmp_path):
    with pytest.raises(PlanFileError, match=r"^not valid JSON \(Expecting"):
        load_plan("{ 'ranks': }")
    path = tmp_path / "broken.json"
    path.write_text(SMALL_TEXT.replace('"int8"', '"int9"'))
    with pytest.raises(PlanFileError, match=r"^plan file '.*broken.json': ranks\[0\].files\[0\].tensors\[0\] \(t0\)"):
        load_plan(path)
    with pytest.raises(
        PlanFileError, match=r"^plan file '.*absent.json': cannot be opened \(No such file or directory\)"
    ):
        load_plan(tmp_path / "absent.json")
    with pytest.raises(PlanFileError, match=r"^plan: must be an object \{...\}, got \[\]$"):
        load_plan("[]")
    with pytest.raises(PlanFileError, match=r"^plan.format: missing$"):
        load_plan("{}")


def test_validate_plan_checks_plans_built_in_code():
    two_ranks_one_file = CheckpointPlan(
        "w", (RankPlan(0, (FilePlan("x.pt", ()),)), RankPlan(1, (FilePlan("x.pt", ()),)))
    )
    with pytest.raises(PlanFileError, match=r"'x\.pt' is written by two ranks, 0 and 1"):
        validate_plan(two_ranks_one_file)
    with pytest.raises(PlanFileError, match=r"'x\.pt' is written by two ranks"):
        dump_plan(two_ranks_one_file)
    validate_plan(SMALL)
