"""The plugin loads only what is used: loading it, `ckptqual --version` and `--help`, and `pytest --collect-only
tests_qual` import none of the run's own modules (torch, matplotlib, the engines, the calibration), each proven in a
fresh interpreter by what it left in sys.modules; and the session object calls ckptqual's own hook with the verdict."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ckptqual.pytest_plugin

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "matplotlib", "ckptqual.io.engines", "ckptqual.runs.calibration", "ckptqual.runs.qualification")


def loaded_after(code: str, cwd: Path = ROOT) -> dict:
    """Runs `code` in a fresh interpreter, then reports which of HEAVY it left in sys.modules, and which of the
    plugin's modules (proof that the plugin did load)."""
    report = textwrap.dedent("""
        import json, sys
        print("\\nLOADED " + json.dumps({
            "heavy": [name for name in HEAVY if name in sys.modules],
            "plugin": sorted(name for name in sys.modules if name.startswith("ckptqual.pytest_plugin")),
        }))
    """)
    script = f"HEAVY = {HEAVY!r}\n{textwrap.dedent(code)}\n{report}"
    child = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300)
    line = next((line for line in child.stdout.splitlines() if line.startswith("LOADED ")), None)
    assert line is not None, child.stdout + child.stderr
    return json.loads(line.removeprefix("LOADED "))


def test_importing_the_plugin_and_its_modules_loads_none_of_the_run():
    code = "import importlib, ckptqual.pytest_plugin as p\nfor name in p.pytest_plugins: importlib.import_module(name)"
    loaded = loaded_after(code)
    assert loaded["heavy"] == []
    assert set(ckptqual.pytest_plugin.pytest_plugins) <= set(loaded["plugin"])


def test_a_pytest_run_without_a_qualification_test_loads_none_of_the_run(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    code = f"""
        import pytest
        xml = {str(tmp_path / "x.xml")!r}
        code = pytest.main(["-q", "-p", "no:cacheprovider", {str(tmp_path)!r}, "--junitxml", xml])
        assert code == 0, code
    """
    loaded = loaded_after(code, tmp_path)
    assert loaded["heavy"] == []
    assert "ckptqual.pytest_plugin.session" in loaded["plugin"]  # the plugin loaded, and ended the session
    assert "<testcase" in (tmp_path / "x.xml").read_text()  # the JUnit XML reached --junitxml through the session


def test_an_engine_loads_its_module_when_first_made_so_a_torch_save_rank_never_loads_torchs_dcp():
    code = """
        import sys
        from ckptqual.io.engines import make_engine
        import ckptqual.runs.worker  # all a rank process imports before its first task
        assert "torch.distributed.checkpoint" not in sys.modules and "safetensors" not in sys.modules
        make_engine("stream")
        assert "torch.distributed.checkpoint" not in sys.modules and "ckptqual.io.engines.dcp" not in sys.modules
        make_engine("dcp")
        make_engine("safetensors")
        assert "torch.distributed.checkpoint" in sys.modules and "safetensors" in sys.modules
    """
    assert "ckptqual.io.engines" in loaded_after(code)["heavy"]  # the script ran to its end


@pytest.mark.parametrize("argument", ["--version", "--help"])
def test_the_cli_version_and_help_load_none_of_the_run(argument):
    code = f"""
        from ckptqual import cli
        try:
            cli.main([{argument!r}])
        except SystemExit as end:
            assert end.code == 0, end.code
    """
    assert loaded_after(code)["heavy"] == []


def test_collect_only_runs_no_calibration_and_writes_nothing(tmp_path):
    """The calibration's module is never imported (it is what measures the ceiling; the suite's own test files
    import the run's modules, torch among them), no results file is written and the target stays empty."""
    target, results = tmp_path / "target", tmp_path / "results.json"
    target.mkdir()
    code = f"""
        import pytest
        code = pytest.main(["tests_qual", "--collect-only", "-q", "-p", "no:cacheprovider", "--target", {str(target)!r},
                            "--scale", "0.0001", "--results", {str(results)!r}])
        assert code == 1, code  # the verdict: INCOMPLETE, every selected test never reached
    """
    loaded = loaded_after(code)
    assert "ckptqual.runs.calibration" not in loaded["heavy"]
    assert not results.exists()
    assert list(target.iterdir()) == []


VERDICT_HOOK = """
import json, os

def pytest_ckptqual_verdict(session, verdict):
    with open(os.environ["VERDICT_SEEN"], "a") as seen:
        seen.write(json.dumps({"overall": str(verdict.overall), "line": verdict.line()}) + "\\n")
"""
QUALIFICATION_TEST = """
import pytest

@pytest.mark.qualification
def test_restore():
    pass
"""


def test_a_conftest_implementing_the_verdict_hook_is_called_once_with_the_run_verdict(pytester, tmp_path, monkeypatch):
    """In process (pytester): a qualification test that judges nothing; the hook sees the verdict the results file
    keeps and the output's last line gives."""
    seen, results, target = tmp_path / "seen.jsonl", tmp_path / "results.json", tmp_path / "target"
    target.mkdir()
    monkeypatch.setenv("VERDICT_SEEN", str(seen))
    pytester.makeconftest(VERDICT_HOOK)
    pytester.makepyfile(test_qual=QUALIFICATION_TEST)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--target", str(target), "--scale", "0.0001", "--results", str(results)
    )
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    recorded = json.loads(results.read_text())["verdict"]
    assert len(calls) == 1
    assert calls[0]["overall"] == recorded["overall"] != "QUALIFIED"  # no limit was judged
    assert result.outlines[-1] == calls[0]["line"]
    assert result.ret == pytest.ExitCode.TESTS_FAILED
