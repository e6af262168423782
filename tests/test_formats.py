"""Choosing a checkpoint format and a restore layout: the format comes from the command line, the drive file or the
workload file, and lays the plan out; a bad format or layout stops the run before any I/O, naming the fix."""

from __future__ import annotations

import pytest

from ckptqual.config.run_settings import Options, SettingsError, resolve_settings
from ckptqual.plan.dcp import METADATA
from ckptqual.plan.formats import shared_files
from ckptqual.plan.safetensors import INDEX
from ckptqual.plan.workloads import WorkloadError, load_workload


def resolve(**options):
    return resolve_settings(Options(**options))


def test_the_dcp_workload_names_its_format_and_its_plan_is_distcp_files():
    settings = resolve(workload="llama3.1-405b-dcp", scale=0.0001)
    assert (settings.format, settings.sources["format"]) == ("dcp", "workload llama3.1-405b-dcp")
    assert settings.checkpoint_engine == "dcp"
    assert [f.path for r in settings.plan.ranks for f in r.files] == [f"__{r}_0.distcp" for r in range(8)]
    assert settings.workload.parallelism.tp == 4 and settings.workload.parallelism.pp == 2


def test_the_command_line_overrides_the_workloads_format():
    settings = resolve(workload="llama3.1-405b-dcp", scale=0.0001, format="torch-save")
    assert (settings.format, settings.checkpoint_engine) == ("torch-save", "stream")
    assert settings.plan.ranks[0].files[0].path.endswith(".pt")


@pytest.mark.parametrize("fmt", ["dcp", "safetensors"])
def test_a_format_keeps_the_payload_bytes(fmt):
    plain = resolve(workload="llama3.1-405b-tp4pp2", scale=0.0001)
    formatted = resolve(workload="llama3.1-405b-tp4pp2", scale=0.0001, format=fmt, dcp_threads=2)
    assert formatted.plan.total_bytes == plain.plan.total_bytes
    assert formatted.checkpoint_engine == fmt


def test_dcp_threads_give_that_many_files_per_rank():
    settings = resolve(workload="llama3.1-405b-dcp", scale=0.0001, dcp_threads=3)
    assert [len(r.files) for r in settings.plan.ranks] == [3] * 8


def test_shared_files_are_declared_per_format():
    assert shared_files("dcp") == (METADATA, ".metadata.tmp")
    assert shared_files("safetensors") == (INDEX,)
    assert shared_files("torch-save") == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "orbax"}, r"--format 'orbax': unknown format; use one of torch-save, dcp, safetensors"),
        ({"dcp_threads": "0"}, r"--dcp-threads '0'"),
        ({"restore_layout": "8by1"}, r"--restore-layout '8by1': must be TPxPP"),
        ({"restore_layout": "3x3"}, r"--restore-layout 3x3: 9 ranks per replica, .* give a TPxPP with that product"),
        ({"workload": "llama3.1-405b-review", "restore_layout": "8x1"}, r"not a whole deepspeed job"),
    ],
)
def test_a_bad_format_or_layout_is_refused_before_any_io(options, message):
    with pytest.raises(SettingsError, match=message):
        resolve(**{"workload": "llama3.1-405b-dcp", "scale": 0.0001, **options})


def test_a_workload_file_with_an_unknown_format_is_refused(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        'description = "x"\nlayout = "deepspeed"\nformat = "orbax"\n[model]\nlayers = 2\nhidden = 8\nffn_hidden = 16\n'
        "heads = 2\nkv_heads = 1\nvocab = 16\n[parallelism]\ntp = 1\npp = 1\ndp = 1\nzero_stage = 1\n"
    )
    with pytest.raises(WorkloadError, match="format: must be one of torch-save, dcp, safetensors, got 'orbax'"):
        load_workload(str(path))
