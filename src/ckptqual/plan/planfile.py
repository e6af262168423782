"""A whole CheckpointPlan (every rank, file and tensor) as JSON and back, exactly: a layout a user can pass back.

The format, one file per line so that a diff shows which file changed::

    {
      "format": "ckptqual-plan",
      "version": 1,
      "workload": "free",
      "description": "",
      "scale": 1.0,
      "parallelism": {"tp": 2, "pp": 1, "dp": 1},
      "ranks": [
        {"rank": 0, "files": [
          {"path": "sub/rank0_file0.pt", "tensors": [["t0", 3, "int8"], ["t1", 0, "float16"]]}
        ]},
        {"rank": 1, "files": []}
      ]
    }

A tensor is `[name, numel, dtype]`. Ranks are numbered 0, 1, ... in order (rank i is the i-th worker); paths
are relative, '/'-separated, unique over the whole checkpoint, and no file path is another's directory.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ckptqual.bounded import load_json
from ckptqual.documents import checker, problem
from ckptqual.plan.model import DTYPE_BYTES, CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.resources import read_text_file

FORMAT = "ckptqual-plan"
VERSION = 1
MAX_FILE_BYTES = 16 << 20  # the plan of the largest shipped workload (llama3-1t, 1,024 ranks) takes 0.6 MiB


class PlanFileError(ValueError):
    """A plan file or plan that cannot be used; the one-line message says where and what is wrong."""


def dump_plan(plan: CheckpointPlan) -> str:
    """`plan` as JSON text that `load_plan` turns back into an equal plan; raises PlanFileError if invalid."""
    validate_plan(plan)

    def text(value: Any) -> str:
        return json.dumps(value, allow_nan=False)

    lines = [
        "{",
        f'  "format": {text(FORMAT)},',
        f'  "version": {VERSION},',
        f'  "workload": {text(plan.workload)},',
        f'  "description": {text(plan.description)},',
        f'  "scale": {text(float(plan.scale))},',
        f'  "parallelism": {text(plan.parallelism)},',
        '  "ranks": [',
    ]
    for r, rank in enumerate(plan.ranks):
        end = "," if r < len(plan.ranks) - 1 else ""
        if not rank.files:
            lines.append(f'    {{"rank": {rank.rank}, "files": []}}{end}')
            continue
        lines.append(f'    {{"rank": {rank.rank}, "files": [')
        for f, spec in enumerate(rank.files):
            tensors = text([[t.name, t.numel, t.dtype] for t in spec.tensors])
            comma = "," if f < len(rank.files) - 1 else ""
            lines.append(f'      {{"path": {text(spec.path)}, "tensors": {tensors}}}{comma}')
        lines.append(f"    ]}}{end}")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def save_plan(plan: CheckpointPlan, path: str | os.PathLike[str]) -> Path:
    """Writes `dump_plan(plan)` to `path` and returns it."""
    path = Path(path)
    path.write_text(dump_plan(plan), encoding="utf-8")
    return path


def load_plan(text_or_path: str | os.PathLike[str]) -> CheckpointPlan:
    """A plan from JSON text (a string starting with '{' or '[') or a file path; PlanFileError if unusable."""
    if isinstance(text_or_path, str) and text_or_path.lstrip()[:1] in ("{", "["):
        return _parse_text(text_or_path)
    path = Path(text_or_path)
    try:
        text = read_text_file(path, MAX_FILE_BYTES)
    except ValueError as err:
        raise PlanFileError(f"plan file {str(path)!r}: {err}") from None
    try:
        return _parse_text(text)
    except PlanFileError as err:
        raise PlanFileError(f"plan file {str(path)!r}: {err}") from None


def _parse_text(text: str) -> CheckpointPlan:
    try:
        doc = load_json(text)
    except json.JSONDecodeError as err:
        raise PlanFileError(f"not valid JSON ({err}); fix the syntax") from None
    except ValueError as err:
        raise PlanFileError(str(err)) from None
    plan = _parse(doc)
    validate_plan(plan)
    return plan


def _shown(value: Any, limit: int = 60) -> str:
    """repr(value), shortened so an error message stays one readable line."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exactly(properties: dict[str, Any], expected: str) -> dict[str, Any]:
    """An object with exactly these keys."""
    required = list(properties)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False,
            "expected": expected}  # fmt: skip


_TENSOR = {"type": "array", "minItems": 3, "maxItems": 3, "expected": "[name, numel, dtype]"}
_FILE = _exactly({"path": {}, "tensors": {"type": "array", "items": _TENSOR}}, "an object {...}")
_RANK = _exactly({"rank": {}, "files": {"type": "array", "items": _FILE}}, "an object {...}")
# The structure of a plan file; the values (paths, names, counts, dtypes) are validate_plan's, which checks a plan
# built in code the same way.
_SCHEMA = _exactly(
    {
        "format": {"const": FORMAT},
        "version": {"const": VERSION, "type": "integer", "fix": f"this ckptqual reads version {VERSION}"},
        "workload": {"type": "string"},
        "description": {"type": "string"},
        "scale": {"type": "number", "exclusiveMinimum": 0},
        "parallelism": {"type": "object", "additionalProperties": {"type": "integer"}},
        "ranks": {"type": "array", "items": _RANK},
    },
    "an object {...}",
)
_CHECKER = checker(_SCHEMA)


def _parse(doc: Any) -> CheckpointPlan:
    """The plan a parsed JSON document describes, its structure checked; values are checked by validate_plan."""
    wrong = problem(_CHECKER, doc, "plan")
    if wrong:
        raise PlanFileError(wrong)
    ranks = []
    for r, rank in enumerate(doc["ranks"]):
        files = []
        for f, file in enumerate(rank["files"]):
            problem_of_path = _path_problem(file["path"])  # before FilePlan, which refuses some paths itself
            if problem_of_path:
                raise PlanFileError(f"plan.ranks[{r}].files[{f}].path: {problem_of_path}")
            files.append(FilePlan(file["path"], tuple(TensorSpec(*tensor) for tensor in file["tensors"])))
        ranks.append(RankPlan(rank["rank"], tuple(files)))
    return CheckpointPlan(doc["workload"], tuple(ranks), float(doc["scale"]), doc["description"], doc["parallelism"])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _path_problem(path: Any) -> str | None:
    """Why `path` cannot name a file inside a checkpoint directory, or None."""
    if not isinstance(path, str) or not path:
        return f"must be a non-empty string, got {_shown(path)}"
    if not path.isprintable():
        return f"must be printable UTF-8 text (no control characters or lone surrogates), got {_shown(path)}"
    if path.startswith("/") or "\\" in path or "\0" in path:
        return f"must be a relative '/'-separated path, got {_shown(path)}"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"must not hold empty, '.' or '..' parts, got {_shown(path)}"
    return None


def validate_plan(plan: CheckpointPlan) -> None:
    """Raises PlanFileError (one line: where, what, the value) unless `plan` can be written as it says."""
    if not isinstance(plan.workload, str):
        raise PlanFileError(f"plan.workload: must be a string, got {_shown(plan.workload)}")
    if not isinstance(plan.description, str):
        raise PlanFileError(f"plan.description: must be a string, got {_shown(plan.description)}")
    scale = plan.scale
    if not isinstance(scale, float | int) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise PlanFileError(f"plan.scale: must be a number > 0, got {_shown(scale)}")
    for key, value in plan.parallelism.items():
        if not isinstance(key, str) or not _is_int(value):
            raise PlanFileError(f"plan.parallelism.{key}: must be an integer, got {_shown(value)}")
    owner: dict[str, tuple[int, int]] = {}  # path -> (rank, file index)
    for r, rank in enumerate(plan.ranks):
        if rank.rank != r or not _is_int(rank.rank):
            raise PlanFileError(
                f"ranks[{r}].rank: must be {r} (ranks are numbered 0, 1, ... in order), got {_shown(rank.rank)}"
            )
        for f, spec in enumerate(rank.files):
            where = f"ranks[{r}].files[{f}]"
            problem = _path_problem(spec.path)
            if problem:
                raise PlanFileError(f"{where}.path: {problem}")
            if spec.path in owner:
                other_rank, other_file = owner[spec.path]
                if other_rank == r:
                    raise PlanFileError(
                        f"{where}.path: {spec.path!r} appears twice in rank {r} (files[{other_file}] and files[{f}])"
                    )
                raise PlanFileError(f"{where}.path: {spec.path!r} is written by two ranks, {other_rank} and {r}")
            owner[spec.path] = (r, f)
            names: set[str] = set()
            for t, tensor in enumerate(spec.tensors):
                _check_tensor(tensor, f"{where}.tensors[{t}]", names)
    _check_directories(owner)


def _check_tensor(tensor: TensorSpec, where: str, names: set[str]) -> None:
    if not isinstance(tensor.name, str) or not tensor.name:
        raise PlanFileError(f"{where}: name must be a non-empty string, got {_shown(tensor.name)}")
    if tensor.name in names:
        raise PlanFileError(f"{where}: name {tensor.name!r} appears twice in the file (torch.save keeps one)")
    names.add(tensor.name)
    if not _is_int(tensor.numel) or tensor.numel < 0:
        raise PlanFileError(f"{where} ({tensor.name}): numel must be an integer >= 0, got {_shown(tensor.numel)}")
    if not isinstance(tensor.dtype, str) or tensor.dtype not in DTYPE_BYTES:
        raise PlanFileError(
            f"{where} ({tensor.name}): unknown dtype {_shown(tensor.dtype)}; use one of {', '.join(DTYPE_BYTES)}"
        )


def _check_directories(owner: dict[str, tuple[int, int]]) -> None:
    """No file path may also be the directory of another file ('a' beside 'a/b.pt')."""
    for path, (rank, file) in owner.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            if directory in owner:
                other_rank, other_file = owner[directory]
                raise PlanFileError(
                    f"ranks[{rank}].files[{file}].path: {path!r} needs directory {directory!r}, "
                    f"which is a file of rank {other_rank} (files[{other_file}])"
                )
