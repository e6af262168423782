"""The shape of the results record, beside its writer (record.py): one JSON Schema that every reader of a results
file checks it against (extract.load_run), so that a file of the wrong shape is refused in one line naming the key.

It types what the readers read; keys it does not name are free, so a newer record with more keys still reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptqual.documents import checker, problem
from ckptqual.limits.units import UNITS

# Every number and string a view reads is bounded, so that arithmetic on it cannot overflow and printing it stays
# a line: no count, size, rate or time of a run comes near an exabyte, and no text it records near 64 KiB.
MAGNITUDE = {"minimum": -1e18, "maximum": 1e18}
MAX_TEXT = {"maxLength": 1 << 16}
NUMBER: dict[str, Any] = {"type": "number", **MAGNITUDE}
INTEGER: dict[str, Any] = {"type": "integer", **MAGNITUDE}
STRING: dict[str, Any] = {"type": "string", **MAX_TEXT}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
OBJECT: dict[str, Any] = {"type": "object"}
# printed, compared or a dictionary key
SCALAR: dict[str, Any] = {"type": ["string", "number", "boolean", "null"], **MAGNITUDE, **MAX_TEXT}


def nullable(kind: dict[str, Any]) -> dict[str, Any]:
    """`kind`, or null."""
    return {**kind, "type": [kind["type"], "null"]}


def array(items: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **more}


def mapping(values: dict[str, Any], **more: Any) -> dict[str, Any]:
    """An object whose keys are data (test IDs, device names, pass numbers) and whose values are alike."""
    return {"type": "object", "additionalProperties": values, **more}


def record(properties: dict[str, Any], required: Iterable[str] = (), *rules: dict[str, Any]) -> dict[str, Any]:
    """An object with these typed keys, `required` among them, and any other keys; `rules` are if/then clauses."""
    shape: dict[str, Any] = {"type": "object", "properties": properties, "required": list(required)}
    return {**shape, "allOf": list(rules)} if rules else shape


def when(condition: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """A rule: an object whose keys match `condition` (each present) must also match `then`."""
    return {"if": {"properties": condition, "required": list(condition)}, "then": then}


OPTIONAL_TEXT = nullable(STRING)
# What a timed figure's own threads did (host.waits; limits.host_bound judges `wait_share`): seconds on a CPU,
# runnable but waiting for one, the largest share of a process's time its threads waited, blocked on block I/O.
HOST_USE = record(
    {
        "wall_s": NUMBER,
        "work_cpu_s": NUMBER,
        "cpu_busy": NUMBER,
        "threads_run_s": nullable(NUMBER),
        "threads_wait_s": nullable(NUMBER),
        "wait_share": nullable(NUMBER),
        "io_blocked_s": nullable(NUMBER),
    },
    ("wall_s", "work_cpu_s", "cpu_busy"),
)
HOST_FIGURES = {"cpu_s_per_GB": nullable(NUMBER), "host_bound": OPTIONAL_TEXT, "host": nullable(HOST_USE)}
# A rank's share of a checkpoint: a rank that moved bytes took time to do it (its rate divides by it).
# A phase of a checkpoint across its ranks (runs.timing.spread): the ranks' median, 99th percentile and max seconds.
SPREAD = record({"median": NUMBER, "p99": NUMBER, "max": NUMBER}, ("median", "p99", "max"))
RANK = record(
    {"bytes": NUMBER, "done_s": NUMBER, "own_s": NUMBER, "phases": mapping(NUMBER)},
    ("bytes", "done_s"),
    when({"bytes": {"exclusiveMinimum": 0}}, {"properties": {"done_s": {"exclusiveMinimum": 0}}}),
)
RANKS = array(RANK, minItems=1)
SUBJECT = {**STRING, "pattern": r"^(?!pass )|^pass [0-9]+$"}  # "pass N" is a fill pass; the readers sort by N
# What the block devices under the target moved during one timed region, against what the suite moved.
DEVICE = record(
    {
        "direction": STRING,
        "suite_bytes": NUMBER,
        "device_bytes": nullable(NUMBER),
        "devices": array(STRING),
        "not_countable": OPTIONAL_TEXT,
        "layer_below": array(STRING),
    },
    ("direction", "suite_bytes", "device_bytes", "devices", "not_countable", "layer_below"),
)

# The suite's own ceiling on this host (runs.calibration): per phase, cores x GB per CPU-second = GB/s.
PHASE_CEILING = record(
    {"cores": NUMBER, "GB_per_cpu_s": NUMBER, "GBps": NUMBER}, ("phase", "cores", "GB_per_cpu_s", "GBps")
)
CEILING = record(
    {
        "cores": NUMBER,
        "usable_cores": NUMBER,
        "drives_at_once": INTEGER,
        "engine": STRING,
        "rounds": mapping(array(record({"bytes": NUMBER, "cpu_s": NUMBER}, ("bytes", "cpu_s")), minItems=1)),
        "phases": mapping(PHASE_CEILING, minProperties=1),
    },
    ("cores", "usable_cores", "drives_at_once", "engine", "rounds", "phases"),
)
SETTINGS = record(
    {
        "scale": NUMBER,
        "thresholds_file": STRING,
        "workload": SCALAR,
        "sources": OBJECT,
        **{key: nullable(STRING) for key in ("drive", "engine", "target", "results")},
        **{key: SCALAR for key in ("seed", "checkpoints_per_pass", "passes", "layout_seed", "layout_max_total_bytes")},
        "drives_at_once": INTEGER,
        "require_steady_state": nullable(BOOLEAN),
    }
)
TEXTS = mapping(SCALAR)  # an object of printed words: the target's path and run directory
BASELINE = record(
    {
        "write_GBps": array(NUMBER),
        "read_GBps": array(NUMBER),
        "raw_write_GBps": NUMBER,
        "raw_read_GBps": NUMBER,
        "host": mapping(array(record({**HOST_FIGURES, "cpu_s_per_GB": NUMBER}, ("cpu_s_per_GB",)))),
        "device": mapping(array(DEVICE)),
    },
    ("write_GBps", "read_GBps", "raw_write_GBps", "raw_read_GBps"),
)
PASS = record(
    {
        "pass": INTEGER,
        "checkpoints": array(SCALAR),
        "checkpoints_planned": INTEGER,
        "ended_early": nullable(BOOLEAN),
        "seconds_mean": NUMBER,
        "seconds_max": NUMBER,
        "throughput_GBps": NUMBER,
        "mean_checkpoint_GBps": NUMBER,
        **HOST_FIGURES,
        "stall_fraction": NUMBER,
        "stall_s": NUMBER,
        "interval_s": NUMBER,
        "seconds_to_durable_max": NUMBER,
        "min_sustained_interval_s": NUMBER,
    },
    ("pass", "checkpoints", "seconds_mean", "seconds_max", "throughput_GBps", "mean_checkpoint_GBps"),
    when({"ended_early": {"const": True}}, {"required": ["checkpoints_planned"]}),
)
CHECKPOINT = record(
    {
        "pass_number": INTEGER,
        "checkpoint": SCALAR,
        "seconds": NUMBER,
        "GBps": NUMBER,
        "ranks": RANKS,
        "device": DEVICE,
        **HOST_FIGURES,
        "phases": mapping(SPREAD),
        "stall_s": NUMBER,
        "seconds_to_durable": NUMBER,
        "interval_s": nullable(NUMBER),
        "wait_s": NUMBER,
        "stage_s": NUMBER,
        "async_save": BOOLEAN,
        "writes_after_stall_s": NUMBER,
    },
    ("pass_number", "checkpoint", "seconds", "GBps", "ranks"),
)
RESHARD = record(  # a restore onto another layout (--restore-layout): what each new rank read
    {
        "layouts": STRING,
        "reads": STRING,
        "ranks": array(record({"rank": INTEGER, "bytes_read": NUMBER, "files": INTEGER}, ("rank", "bytes_read"))),
        "bytes_read": NUMBER,
        "checkpoint_bytes": NUMBER,
        "read_amplification": NUMBER,
    },
    ("layouts", "ranks", "bytes_read", "read_amplification"),
)
RESTORE = record(
    {
        "checkpoint": SCALAR,
        "bytes": NUMBER,
        "seconds": NUMBER,
        "GBps": NUMBER,
        "cached_fraction_before": NUMBER,
        "ranks": RANKS,
        "device": DEVICE,
        "reshard": nullable(RESHARD),
        **HOST_FIGURES,
    },
    ("checkpoint", "bytes", "seconds", "GBps", "cached_fraction_before", "ranks"),
)
LAYOUT = record(
    {"example": INTEGER, "ratio": NUMBER, "judged": BOOLEAN},
    ("example",),
    when({"judged": {"const": True}}, {"required": ["ratio"]}),
)
STEADY = record(
    {"reached": BOOLEAN, "window": array(NUMBER), "mean": nullable(NUMBER), "reason": SCALAR},
    ("reached", "window", "mean", "reason"),
    when({"mean": NUMBER}, {"properties": {"window": {"minItems": 2}}}),  # a line is fitted through the window
)
CELL = record(
    {
        "id": STRING,
        "transfer": STRING,
        "block_size": STRING,
        "block_bytes": NUMBER,
        "threads": {**INTEGER, "minimum": 1},
        "outcome": STRING,
        "GiBps": NUMBER,
        "settings": record({"direct_io": BOOLEAN}),
        "device": DEVICE,
        **HOST_FIGURES,
    },
    ("id", "transfer", "block_size", "block_bytes", "threads"),
)
SWEEP = record(
    {
        "config": record(
            {"file_bytes": NUMBER, "transfers": array(STRING), "jobs": SCALAR, "batch": SCALAR},
            ("file_bytes", "transfers", "jobs", "batch", "requests_per_job"),
        ),
        "cells": array(CELL),
        "engines": OBJECT,
    },
    ("config", "cells", "engines"),
)
READING = record(
    {
        "devices": array(
            record(
                {"device": SCALAR, "counters": OBJECT, "unavailable": nullable(OBJECT)},
                ("device", "counters"),
            )
        )
    }
)
WRITTEN = record(
    {
        "suite_written_bytes": NUMBER,
        **{key: nullable(NUMBER) for key in ("drive_written_bytes", "ratio")},
        **{key: nullable(NUMBER) for key in ("block_layer_written_bytes", "block_layer_ratio")},
    },
    ("suite_written_bytes",),
)
HEALTH = record(
    {"before": nullable(READING), "after": nullable(READING), "written": WRITTEN},
    (),
    {"dependentSchemas": {"written": {"required": ["after", "message"], "properties": {"after": OBJECT}}}},
)
SAMPLE = record(
    {
        "t_s": NUMBER,
        "devices": mapping(record({"write_MBps": nullable(NUMBER), "read_MBps": nullable(NUMBER)})),
        **{key: nullable(NUMBER) for key in ("cpu_busy", "cpu_iowait", "mem_used_bytes", "dirty_bytes")},
    },
    ("t_s",),
)
MARK = record(
    {"event": OPTIONAL_TEXT, "t_s": NUMBER, "start_s": nullable(NUMBER), "end_s": NUMBER},
    (),
    when({"event": {"const": "checkpoint"}}, {"required": ["t_s"]}),
    when({"start_s": NUMBER}, {"required": ["end_s"]}),
    when({"event": {"const": "pass"}, "start_s": NUMBER}, {"required": ["pass"]}),
)
TIMESERIES = record({"samples": array(SAMPLE), "devices": nullable(array(STRING)), "marks": array(MARK)})
MEASUREMENT = record(
    {
        "measurement": STRING,
        "value": NUMBER,
        "unit": {"enum": list(UNITS)},
        "context": mapping(SCALAR),
        "outcome": STRING,
        "limit_value": nullable(NUMBER),
        "judged_value": nullable(NUMBER),
        "host_bound": OPTIONAL_TEXT,
        "waits": OPTIONAL_TEXT,
        "limit_number": nullable(INTEGER),
    },
    ("measurement", "value", "unit", "outcome"),
)
LIMIT = record(
    {"unit": STRING, "where": nullable(OBJECT), "min": SCALAR, "max": SCALAR, "number": INTEGER,
     "relative_to": OPTIONAL_TEXT},  # number and relative_to: the verdict's basis of an older file (report/verdict.py)
    ("measurement", "unit"),
)  # fmt: skip
TEST = record({"subject": SUBJECT, "outcome": STRING}, ("subject", "outcome", "message"))
# `basis`: what the verdict rests on (limits.verdict.verdict_basis); absent in files written before it existed.
VERDICT = record({"overall": STRING, "reasons": array(STRING), "basis": array(STRING)}, ("overall", "reasons"))
CLEANUP = record(
    {"removed": BOOLEAN, "errors": array(STRING), "planted": array(STRING), "why": OPTIONAL_TEXT}, ("removed",)
)
LEFT = array(record({}, ("path", "why")))

RUN = record(
    {
        "settings": SETTINGS,
        "environment": OBJECT,
        "plan": record({"total_bytes": NUMBER}),
        "target": TEXTS,
        "drive": record({key: SCALAR for key in ("model", "serial", "firmware", "device", "filesystem")}),
        "ceiling": CEILING,
        "baseline": BASELINE,
        "passes": array(PASS),
        "checkpoints": array(CHECKPOINT),
        "steady_state": mapping(STEADY, propertyNames={"pattern": "^[0-9]+$"}),
        "restore": array(RESTORE),
        "layouts": array(LAYOUT),
        "sweep": SWEEP,
        "health": HEALTH,
        "timeseries": TIMESERIES,
        "measurements": array(MEASUREMENT),
        "limits": array(LIMIT),
        "tests": mapping(TEST),
        "errors": array(SCALAR),
        "cleanup": CLEANUP,
        "left_on_target": LEFT,
        "verdict": VERDICT,
    },
    ("settings",),
)
# The index `--results` holds for a run over several drives (report.drives.drives_index).
DRIVE_ROW = record(
    {"outcomes": mapping(STRING, propertyNames=SUBJECT), "verdict": VERDICT},
    ("label", "target", "outcomes", "verdict", "results"),
)
SHARED_HOST = record(
    {
        "usable_cores": NUMBER,
        "payload_cores_needed": mapping(nullable(NUMBER)),
        "payload_cores_needed_at_once": NUMBER,
        "pcie_shared": array(record({"drives": array(STRING)}, ("pci", "is", "drives"))),
        "disks_shared": array(record({"drives": array(STRING)}, ("disk", "drives"))),
    },
    ("usable_cores", "drives_at_once", "payload_cores_needed", "payload_cores_needed_at_once", "pcie_shared"),
)
INDEX = record(
    {"settings": OBJECT, "drives": mapping(DRIVE_ROW), "shared_host": SHARED_HOST, "verdict": VERDICT},
    ("settings", "drives", "shared_host", "verdict"),
)

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ckptqual results record",
    "if": {"type": "object", "required": ["drives"]},
    "then": INDEX,
    "else": RUN,
}


_CHECKER = checker(SCHEMA)


def shape_problem(data: Any) -> str | None:
    """Why `data` is not a results record as ckptqual writes it, in one line naming the key; None when it is."""
    return problem(_CHECKER, data)
