"""Drive health: nvme-cli and smartctl JSON captured from real drives (tests/data/health/PROVENANCE.md), the
kernel's sysfs counters, every counter that cannot be read named with the reason, and the judging of before
against after, with the bytes the drive counted written against the suite's."""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptqual.config.drive_file import load_drive_file
from ckptqual.host.health import read_device, snapshot
from ckptqual.host.health.nvme import parse_id_ctrl, parse_ocp, parse_smart_log
from ckptqual.host.health.reading import Reading
from ckptqual.host.health.smartctl import parse
from ckptqual.host.health.tools import Output, Tools
from ckptqual.host.identity import PhysicalDevice, block_dir, identify, physical_devices
from ckptqual.limits.health import DATA_UNIT_BYTES, MEASURED, check_health, health_measurements
from ckptqual.limits.limits import Limit
from ckptqual.limits.measurements import MEASUREMENTS, recorded
from ckptqual.report.summary import summary_lines
from ckptqual.runs.written import SuiteWrites
from replay_runs import replay_suite
from suite_runs import lenient_drive, results, suite_properties

pytest_plugins = ("pytester",)

DATA = Path(__file__).parent / "data"
NVME_CLI, SMARTCTL, TREES = DATA / "health" / "nvme-cli", DATA / "health" / "smartctl", DATA / "identity"


def output(path: Path, command: str = "nvme smart-log /dev/nvme0 -o json", status: int = 0) -> Output:
    return Output(command, path.read_text(), status)


def smart_log(name: str) -> Reading:
    reading = Reading("nvme0n1", "nvme")
    parse_smart_log(reading, output(NVME_CLI / name))
    return reading


def device(tree: str, dev: str):
    root = TREES / tree / "sys"
    return physical_devices(block_dir(dev, root), root)


# nvme-cli


SEAGATE = {
    "critical_warning": 0,
    "temperature_C": 51,  # 324 K
    "available_spare_percent": 100,
    "available_spare_threshold_percent": 5,
    "percentage_used": 30,
    "data_units_written": 1928683480,
    "data_units_read": 178037231,
    "host_write_commands": 24273507789,
    "host_read_commands": 5808178366,
    "media_errors": 0,
    "error_log_entries": 212,
    "unsafe_shutdowns": 49,
    "power_on_hours": 24424,
    "warning_temperature_minutes": 0,
    "critical_temperature_minutes": 0,
}


def test_nvme_cli_2_11_smart_log_with_the_critical_warning_as_an_object():
    reading = smart_log("seagate-firecuda530-smart-log-v2.11.json")
    assert reading.counters == SEAGATE
    assert reading.critical_warning_flags == []
    assert set(reading.sources.values()) == {"nvme smart-log /dev/nvme0 -o json"}


def test_nvme_cli_2_3_numbers_and_strings_read_alike():
    numbers = smart_log("seagate-firecuda530-smart-log-v2.3.json").counters
    strings = smart_log("seagate-firecuda530-smart-log-v2.3-strings.json").counters
    assert numbers == strings
    assert (numbers["data_units_written"], numbers["temperature_C"], numbers["error_log_entries"]) == (
        136157684,
        37,
        110,
    )


def test_an_older_nvme_cli_on_an_intel_p3700():
    counters = smart_log("intel-p3700-smart-log.json").counters
    assert (counters["temperature_C"], counters["percentage_used"], counters["data_units_written"]) == (
        38,
        3,
        464403132,
    )


def test_a_key_that_is_absent_is_unavailable_never_zero():
    reading = smart_log("autoval-smart-log.json")  # it spells "critical_warrning"
    assert "critical_warning" not in reading.counters and reading.critical_warning_flags is None
    assert "gave no critical_warning" in reading.unavailable["critical_warning"]
    assert "critical_warrning" in reading.unavailable["critical_warning"]  # the keys it did give are named
    assert reading.counters["data_units_written"] == 47217872


def test_id_ctrl_gives_the_temperature_thresholds_in_celsius():
    reading = Reading("nvme0n1", "nvme")
    parse_id_ctrl(reading, output(NVME_CLI / "samsung-pm983-id-ctrl.json", "nvme id-ctrl /dev/nvme0 -o json"))
    assert reading.counters == {"warning_temperature_threshold_C": 80, "critical_temperature_threshold_C": 92}


def test_the_ocp_cloud_ssd_log_gives_nand_bytes():
    reading = Reading("nvme0n1", "nvme")
    parse_ocp(reading, output(NVME_CLI / "autoval-ocp-smart-add-log.json", "nvme ocp smart-add-log /dev/nvme0 -o json"))
    assert reading.counters == {
        "physical_media_written_bytes": 39074645999616,
        "physical_media_read_bytes": 36265469677568,
    }


def test_nvme_cli_on_a_virtio_disk_and_without_permission_says_why():
    for name, words in (
        ("virtio-vda-smart-log.txt", "Operation not permitted"),
        ("vda-smart-log-as-nobody.txt", "Permission denied"),
    ):
        reading = Reading("vda", "nvme")
        parse_smart_log(reading, output(NVME_CLI / name, "nvme smart-log /dev/vda -o json", status=1))
        assert reading.counters == {}
        why = reading.unavailable["data_units_written"]
        assert why.startswith("nvme smart-log /dev/vda -o json failed (exit 1): /dev/vda: ") and words in why
        assert "Usage" not in why  # the usage text nvme-cli prints after the error is not the reason


# smartctl


def smartctl(name: str, kind: str) -> Reading:
    reading = Reading("sdx", kind)
    parse(reading, output(SMARTCTL / name, "smartctl --json -a /dev/sdx"))
    reading.close()
    return reading


def test_smartctl_on_a_sata_disk():
    reading = smartctl("wdc-wd140edfz-sata.json", "ata")
    assert reading.counters == {
        "smart_passed": 1,
        "temperature_C": 32,
        "reallocated_sectors": 0,
        "pending_sectors": 0,
        "offline_uncorrectable": 0,
    }
    assert reading.unavailable == {}


def test_smartctl_on_a_sas_disk_counts_its_writes():
    reading = smartctl("seagate-st4000nm0043-sas.json", "scsi")
    assert reading.counters["media_errors"] == 0
    assert reading.counters["scsi_written_bytes"] == 86472611000000  # 86472.611 GB processed for writes
    assert "temperature_C" in reading.counters and "smart_passed" in reading.counters


def test_smartctl_reads_an_nvme_health_log_where_nvme_cli_is_missing():
    counters = smartctl("intel-ssdpeknw010t8-nvme.json", "nvme").counters
    assert (counters["data_units_written"], counters["host_write_commands"], counters["temperature_C"]) == (
        7773431,
        83170961,
        36,
    )


def test_smartctl_that_cannot_read_the_device_gives_its_message():
    for name, words in (
        ("virtio-vda.json", "(exit 1): /dev/vda: Unable to detect device type"),
        ("vda-sat-as-nobody.json", "(exit 2): Smartctl open device: /dev/vda [SAT] failed: Permission denied"),
    ):
        reading = smartctl(name, "ata")
        assert reading.counters == {}
        assert all(words in why for why in reading.unavailable.values()) and len(reading.unavailable) == 5


def mutated(path: Path, change: Callable[[Any], Any]) -> str:
    """A real capture with one field changed to a shape its tool does not print; `change` returns the new document."""
    return json.dumps(change(json.loads(path.read_text())))


def put(value: Any, *keys: str | int) -> Callable[[Any], Any]:
    """A change that sets data[keys...] = value."""

    def change(data: Any) -> Any:
        inner = data
        for key in keys[:-1]:
            inner = inner[key]
        inner[keys[-1]] = value
        return data

    return change


SATA, SAS, SMARTCTL_NVME = "wdc-wd140edfz-sata.json", "seagate-st4000nm0043-sas.json", "intel-ssdpeknw010t8-nvme.json"


@pytest.mark.parametrize(
    ("capture", "kind", "change", "counter", "words", "still_read"),
    [
        (
            SATA,
            "ata",
            put(5, "temperature"),
            "temperature_C",
            "temperature = 5 (int) where smartctl prints an object",
            "reallocated_sectors",
        ),
        (
            SATA,
            "ata",
            put("hot", "temperature", "current"),
            "temperature_C",
            'temperature.current = "hot" (str) where smartctl prints a whole number',
            "smart_passed",
        ),
        (
            SATA,
            "ata",
            put([], "ata_smart_attributes"),
            "reallocated_sectors",
            "ata_smart_attributes = [] (list) where smartctl prints an object",
            "temperature_C",
        ),
        (
            SATA,
            "ata",
            put({"id": 5}, "ata_smart_attributes", "table"),
            "pending_sectors",
            'ata_smart_attributes.table = {"id": 5} (dict) where smartctl prints a list',
            "temperature_C",
        ),
        (
            SATA,
            "ata",
            put(7, "ata_smart_attributes", "table", 0),
            "offline_uncorrectable",
            "ata_smart_attributes.table.0 = 7 (int) where smartctl prints an object",
            "smart_passed",
        ),
        (
            SAS,
            "scsi",
            put(7, "scsi_error_counter_log", "read"),
            "media_errors",
            "scsi_error_counter_log.read = 7 (int) where smartctl prints an object",
            "temperature_C",
        ),
        (
            SAS,
            "scsi",
            put([1], "scsi_error_counter_log", "write", "gigabytes_processed"),
            "scsi_written_bytes",
            "scsi_error_counter_log.write.gigabytes_processed = [1] (list) where smartctl prints a number",
            "smart_passed",
        ),
        (
            SMARTCTL_NVME,
            "nvme",
            put("many", "nvme_smart_health_information_log", "data_units_written"),
            "data_units_written",
            'nvme_smart_health_information_log.data_units_written = "many" (str) where smartctl prints a whole number',
            "temperature_C",
        ),
        (
            SMARTCTL_NVME,
            "nvme",
            put(True, "nvme_smart_health_information_log", "media_errors"),
            "media_errors",
            "nvme_smart_health_information_log.media_errors = true (bool) where smartctl prints a whole number",
            "temperature_C",
        ),
    ],
)
def test_smartctl_json_of_an_unexpected_shape_makes_its_counters_unavailable_naming_the_field(
    capture, kind, change, counter, words, still_read
):
    reading = Reading("sdx", kind)
    parse(reading, Output("smartctl --json -a /dev/sdx", mutated(SMARTCTL / capture, change), 0))
    reading.close()
    assert counter not in reading.counters
    assert reading.unavailable[counter] == f"smartctl --json -a /dev/sdx printed {words}"
    assert still_read in reading.counters  # the rest of the output is still read


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ("[1, 2]", "printed the output = [1, 2] (list) where smartctl prints an object"),
        ('{"smartctl": 3}', "printed smartctl = 3 (int) where smartctl prints an object"),
        ('{"smartctl": {"exit_status": "2"}}', 'printed smartctl.exit_status = "2" (str) where smartctl prints a'),
        ('{"smartctl": {"exit_status": 2, "messages": [4]}}', "printed smartctl.messages.0 = 4 (int) where smartctl"),
    ],
)
def test_smartctl_json_that_is_no_report_at_all_is_unavailable_with_the_reason(document, words):
    reading = Reading("sdx", "ata")
    parse(reading, Output("smartctl --json -a /dev/sdx", document, 0))
    reading.close()
    assert reading.counters == {} and len(reading.unavailable) == 5
    assert all(why.startswith(f"smartctl --json -a /dev/sdx {words}") for why in reading.unavailable.values())


def test_a_real_smartctl_printing_an_unexpected_shape_gives_unavailable_not_an_error(tmp_path):
    printed = tmp_path / "printed.json"
    printed.write_text(mutated(SMARTCTL / SATA, put(5, "temperature")))
    tool = tmp_path / "smartctl"
    tool.write_text(f"#!/bin/sh\ncat {printed}\n")
    tool.chmod(0o755)
    reading = read_device(
        PhysicalDevice("sdx", "ata"), sys_root=tmp_path, dev_root=Path("/dev"), tools=Tools(smartctl=str(tool))
    )
    assert reading.counters["smart_passed"] == 1 and reading.counters["reallocated_sectors"] == 0
    assert reading.unavailable["temperature_C"] == (
        "smartctl --json -a /dev/sdx printed temperature = 5 (int) where smartctl prints an object"
    )


@pytest.mark.parametrize(
    ("capture", "command", "parser", "change", "counter", "words"),
    [
        (
            "seagate-firecuda530-smart-log-v2.11.json",
            "nvme smart-log /dev/nvme0 -o json",
            parse_smart_log,
            put([324], "temperature"),
            "temperature_C",
            "temperature = [324] (list)",
        ),
        (
            "seagate-firecuda530-smart-log-v2.11.json",
            "nvme smart-log /dev/nvme0 -o json",
            parse_smart_log,
            put({"value": "x"}, "critical_warning"),
            "critical_warning",
            'critical_warning = {"value": "x"} (dict)',
        ),
        (
            "samsung-pm983-id-ctrl.json",
            "nvme id-ctrl /dev/nvme0 -o json",
            parse_id_ctrl,
            put("hot", "wctemp"),
            "warning_temperature_threshold_C",
            'wctemp = "hot" (str)',
        ),
        (
            "autoval-ocp-smart-add-log.json",
            "nvme ocp smart-add-log /dev/nvme0 -o json",
            parse_ocp,
            put([1, 2], "Physical media units written"),
            "physical_media_written_bytes",
            "Physical media units written = [1, 2] (list)",
        ),
    ],
)
def test_nvme_cli_fields_of_the_wrong_type_are_unavailable_naming_the_field(
    capture, command, parser, change, counter, words
):
    reading = Reading("nvme0n1", "nvme")
    parser(reading, Output(command, mutated(NVME_CLI / capture, change), 0))
    assert counter not in reading.counters and reading.counters  # the other fields are still read
    assert reading.unavailable[counter] == f"{command} printed {words} where nvme-cli prints a number"


# The tools and sysfs


def test_without_nvme_cli_the_kernel_gives_the_temperature_and_the_rest_says_so():
    (nvme0n1,) = device("nvme", "259:3")
    reading = read_device(nvme0n1, sys_root=TREES / "nvme" / "sys", dev_root=Path("/dev"), tools=Tools())
    hwmon = "nvme/sys/class/nvme/nvme0/hwmon0"
    assert reading.counters["temperature_C"] == 41 and hwmon in reading.sources["temperature_C"]
    assert (
        reading.counters["warning_temperature_threshold_C"]
        == reading.counters["critical_temperature_threshold_C"]
        == 85
    )
    assert (
        reading.counters["block_layer_written_bytes"] == 0 and reading.counters["block_layer_read_bytes"] == 5856 * 512
    )
    assert reading.unavailable["data_units_written"] == "nvme-cli is not installed (apt-get install nvme-cli)"
    assert reading.unavailable["critical_warning"] == "nvme-cli is not installed (apt-get install nvme-cli)"


def test_tools_are_found_on_the_path_or_named_as_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    tools = Tools.find()
    assert (tools.nvme, tools.smartctl) == (None, None)
    assert tools.to_dict() == {
        "nvme": "nvme-cli is not installed (apt-get install nvme-cli)",
        "smartctl": "smartctl is not installed (apt-get install smartmontools)",
    }


def test_a_tool_that_does_not_answer_is_left_and_named():
    tools = Tools(nvme=shutil.which("sleep"), timeout_s=0.2)  # a drive that hangs holds its tool the same way
    result = tools.run("nvme", "30")
    assert result.text is None and result.reason == "nvme 30 did not answer within 0.2 s (left running)"


@pytest.mark.parametrize("smartctl_on_path", [True, False])
def test_a_virtio_disk_is_unavailable_with_the_reason_and_what_smartctl_says(smartctl_on_path, tmp_path, monkeypatch):
    if not smartctl_on_path:
        monkeypatch.setenv("PATH", str(tmp_path))  # a machine without smartmontools
    elif shutil.which("smartctl") is None:
        pytest.skip("smartctl is not installed (apt-get install smartmontools)")
    (vda,) = device("virtio", "254:0")
    reading = read_device(vda, sys_root=TREES / "virtio" / "sys", dev_root=Path("/dev"), tools=Tools.find())
    assert set(reading.unavailable) == {"critical_warning", "temperature_C", "media_errors", "data_units_written"}
    said = "smartctl --json -a /dev/vda" if smartctl_on_path else "smartctl is not installed (apt-get install smartm"
    for why in reading.unavailable.values():
        assert why.startswith("vda is a virtio disk: the hypervisor gives the guest no SMART or health log; ")
        assert said in why
    assert "block_layer_written_bytes" in reading.counters


def test_a_loop_device_is_not_a_drive_and_a_missing_stat_file_is_named(tmp_path):
    reading = read_device(PhysicalDevice("loop0", "virtual"), sys_root=tmp_path, dev_root=Path("/dev"), tools=Tools())
    assert reading.counters == {}
    assert reading.unavailable["media_errors"] == "loop0 is a virtual block device, not a drive: it has no health log"
    assert reading.unavailable["block_layer_written_bytes"].endswith(
        "class/block/loop0/stat: No such file or directory"
    )


@pytest.mark.skipif(shutil.which("nvme") is None, reason="nvme-cli is not installed (apt-get install nvme-cli)")
def test_real_nvme_cli_on_a_device_without_a_health_log_gives_no_number():
    reading = Reading("null", "nvme")
    parse_smart_log(reading, Tools.find().run("nvme", "smart-log", "/dev/null", "-o", "json"))
    assert reading.counters == {}
    assert reading.unavailable["media_errors"].startswith("nvme smart-log /dev/null -o json failed")


def test_a_snapshot_of_this_machine_is_json_and_never_invents_a_counter(tmp_path):
    taken = snapshot(identify(tmp_path))
    data = json.loads(json.dumps(taken))
    for reading in data["devices"]:
        assert not set(reading["counters"]) & set(reading["unavailable"])
        assert all(isinstance(value, int) for value in reading["counters"].values())
    if os.geteuid() != 0 or not data["devices"]:
        return
    assert all(reading["counters"] or reading["unavailable"] for reading in data["devices"])


# Judging


def seagate_pair(**changes: int) -> tuple[dict, dict]:
    """The captured log as the "before", and the same drive after a run that changed the given counters."""
    before = Reading("nvme0n1", "nvme")
    parse_smart_log(before, output(NVME_CLI / "seagate-firecuda530-smart-log-v2.3.json"))
    parse_id_ctrl(before, output(NVME_CLI / "samsung-pm983-id-ctrl.json", "nvme id-ctrl /dev/nvme0 -o json"))
    before.put("block_layer_written_bytes", 10**12, "stat")
    after = Reading("nvme0n1", "nvme", dict(before.counters), dict(before.sources))
    for name, change in changes.items():
        after.counters[name] = after.counters.get(name, 0) + change
    return {"devices": [before.to_dict()]}, {"devices": [after.to_dict()]}


def check(limits=(), suite_bytes: int = 10**9, **changes: int):
    before, after = seagate_pair(**changes)
    return check_health(limits, before, after, {"total_bytes": suite_bytes})


def test_a_healthy_run_passes_and_compares_bytes_written_two_ways():
    checked = check(data_units_written=2000, block_layer_written_bytes=1_100_000_000)
    assert (checked.record["outcome"], checked.record["message"]) == ("PASS", "drive health PASS")
    written = checked.record["written"]
    assert written["drive_written_bytes"] == 2000 * DATA_UNIT_BYTES == 1_024_000_000
    assert written["ratio"] == pytest.approx(1.024)
    assert written["block_layer_written_bytes"] == 1_100_000_000 and written["block_layer_ratio"] == pytest.approx(1.1)
    assert "write amplification" in written["note"]
    assert written["devices"][0]["write_amplification"] is None


def test_a_critical_warning_new_media_errors_and_heat_fail_the_run():
    checked = check(critical_warning=0b100, media_errors=2, warning_temperature_minutes=3, temperature_C=45)
    assert checked.record["outcome"] == "FAIL"
    assert checked.record["message"] == (
        "drive health FAIL: nvme0n1: critical warning appeared during the run: reliability degraded"
        " | nvme0n1: 2 new media and data-integrity errors during the run (0 -> 2)"
        " | nvme0n1: temperature 82 C after the run, at or past the drive's warning threshold 80 C"
        " | nvme0n1: 3 min at or past the drive's warning temperature threshold during the run"
    )


def test_a_warning_set_before_the_run_is_marginal_not_a_failure():
    before, after = seagate_pair()
    before["devices"][0]["counters"]["critical_warning"] = after["devices"][0]["counters"]["critical_warning"] = 1
    checked = check_health((), before, after, {"total_bytes": 1})
    assert checked.record["outcome"] == "MARGINAL"
    assert "set before the run already: available spare below threshold" in checked.record["message"]


def test_the_drive_files_health_limits_are_judged(tmp_path):
    path = tmp_path / "drive.toml"
    path.write_text(
        '[drive]\nname = "d"\n'
        '[[limit]]\nname = "drive_temperature"\nmax = 40\nunit = "C"\nsource = "the lab\'s rule"\n'
        '[[limit]]\nname = "drive_written_ratio"\nmax = 1.1\nunit = "ratio"\nsource = "the lab\'s rule"\n'
    )
    limits = load_drive_file(str(path)).limits
    checked = check(limits, data_units_written=2000, temperature_C=4)
    assert [(j.measurement, j.outcome) for j in checked.judgements] == [
        ("drive_temperature", "FAIL"),
        ("drive_written_ratio", "PASS"),
    ]
    assert checked.judgements[0].context == {"device": "nvme0n1"} and checked.judgements[0].value == 41.0
    assert checked.record["outcome"] == "FAIL" and "drive_temperature 41 C > max 40 C" in checked.record["message"]


def test_every_health_measurement_is_one_a_drive_file_may_limit():
    assert set(MEASURED) <= set(MEASUREMENTS)
    before, after = seagate_pair(data_units_written=2000, physical_media_written_bytes=10**9)
    before["devices"][0]["counters"]["physical_media_written_bytes"] = 0
    written = check_health((), before, after, {"total_bytes": 10**9}).record["written"]
    pairs = list(zip(before["devices"], after["devices"], strict=True))
    measured = health_measurements(pairs, written)
    assert {name for name, *_ in measured} == set(MEASURED)
    record = {"health": {"before": before, "after": after, "written": written}}  # as the run records it
    for name, value, unit, _ in measured:  # in the table's unit, where the table says the record keeps it
        assert unit == MEASUREMENTS[name].unit and value in recorded(record, MEASUREMENTS[name])


def test_nand_writes_give_the_write_amplification():
    before, after = seagate_pair(data_units_written=2000)
    before["devices"][0]["counters"]["physical_media_written_bytes"] = 5 * 10**12
    after["devices"][0]["counters"]["physical_media_written_bytes"] = 5 * 10**12 + 2_048_000_000
    limit = Limit("drive_write_amplification", "ratio", "test", max=1.5)
    checked = check_health([limit], before, after, {"total_bytes": 10**9})
    assert checked.record["written"]["devices"][0]["write_amplification"] == pytest.approx(2.0)
    assert [(j.measurement, j.outcome) for j in checked.judgements] == [
        ("drive_temperature", "MEASURED"),  # measured, reported, not limited
        ("drive_written_ratio", "MEASURED"),
        ("drive_write_amplification", "FAIL"),
    ]


def test_a_drive_that_gives_nothing_is_skipped_with_every_reason():
    (vda,) = device("virtio", "254:0")
    tools = Tools()
    taken = [
        {"devices": [read_device(vda, sys_root=TREES / "virtio" / "sys", dev_root=Path("/dev"), tools=tools).to_dict()]}
        for _ in "ab"
    ]
    checked = check_health((), *taken, {"total_bytes": 10**9})
    assert checked.record["outcome"] == "SKIPPED"
    assert checked.record["message"] == (
        "drive health SKIPPED: unavailable: vda: vda is a virtio disk: the hypervisor gives the guest no SMART or "
        "health log; smartctl is not installed (apt-get install smartmontools)"
    )
    written = checked.record["written"]
    assert written["drive_written_bytes"] is None and written["ratio"] is None
    assert written["unavailable"].startswith("vda: vda is a virtio disk")
    assert written["block_layer_ratio"] == 0.0  # the captured stat twice: nothing between the two readings


def test_the_suite_counts_what_its_writers_wrote_from_the_events():
    writes = SuiteWrites()
    writes.baseline({"bytes_per_round": 100, "write_GBps": [1.0, 2.0, 3.0]})
    writes.checkpoint({"bytes": 1000}, 3)
    writes.checkpoint({"bytes": 1000}, 3)
    writes.layout({"bytes": 50, "odd_seconds": 1.0})
    writes.layout({"example": 1, "error": "rank 0 failed"})
    sweep = {"files": {"jobs": 4, "file_bytes": 10}}
    writes.sweep(sweep)
    sweep["files"]["write_s"] = 0.5
    writes.sweep(sweep)
    writes.sweep(sweep)  # the same write told again
    sweep["files"]["write_s"] = 0.7  # written again after a removal
    writes.sweep(sweep)
    assert writes.to_dict() == {
        "total_bytes": 300 + 2000 + 100 + 80,
        "baseline_bytes": 300,
        "checkpoints_bytes": 2000,
        "layouts_bytes": 100,
        "sweep_bytes": 80,
    }


def test_the_summary_prints_the_check_and_the_bytes_two_ways():
    before, after = seagate_pair(data_units_written=2000, block_layer_written_bytes=1_100_000_000)
    checked = check_health((), before, after, {"total_bytes": 10**9})
    lines = summary_lines({"health": {"before": before, "after": after, **checked.record}})
    assert "drive health PASS; after the run: nvme0n1 37 C (warning 80 C)" in lines
    assert (
        "bytes written: suite 1.000 GB; drives counted 1.024 GB (x1.024); block layer 1.100 GB (x1.100), all writers"
        in lines
    )


# The run


def test_a_run_reads_health_before_and_after_and_a_health_limit_it_cannot_judge_leaves_it_incomplete(
    pytester, tmp_path
):
    """The whole path through a run, in process, on a replayed run (stand_in/replay.py) of a loop device: identity
    and both readings in the results, the suite's bytes counted, the check in the JUnit XML; a drive-file limit on
    the temperature, which the recorded drive does not give, leaves the run INCOMPLETE with the reason."""
    limit = '\n[[limit]]\nname = "drive_temperature"\nmax = 200\nunit = "C"\nsource = "test: any working drive"\n'
    drive = lenient_drive(tmp_path / "drive.toml", "health drive", limit)
    args = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "1", "--passes", "1"]
    done = replay_suite(pytester, *args, "--drive", str(drive), "--benchmark-disable")
    tmp_path = done.out
    data = results(tmp_path / "r.json")
    health = data["health"]
    assert health["before"]["taken"] <= health["after"]["taken"]
    assert [r["device"] for r in health["after"]["devices"]] == [d["name"] for d in data["drive"]["physical"]]
    parts = health["written"]["suite_parts"]
    assert parts["checkpoints_bytes"] == sum(c["bytes"] for c in data["checkpoints"]) > 0
    assert parts["baseline_bytes"] == data["baseline"]["bytes_per_round"] * 3
    assert suite_properties(tmp_path / "q.xml")["ckptqual.health"] == health["message"]
    assert not [m for m in data["measurements"] if m["measurement"] == "drive_temperature"]
    assert health["outcome"] == "SKIPPED" and done.ret == 1
    verdict = data["verdict"]
    assert verdict["overall"] == "INCOMPLETE"
    [reason] = verdict["reasons"]
    assert reason.startswith("limit 2 (drive_temperature <= 200 C) was never judged: no test measured it; skipped: ")
    assert health["message"] in reason
