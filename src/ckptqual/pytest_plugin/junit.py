"""What the JUnit XML shows of a qualification, through public pytest API: each test case's one line (value, limit
and unit of each judged figure) as a property that is copied into the case's `<system-out>`, which GitLab and
Jenkins display (they drop properties); the run's suite properties (verdict, its reasons and basis, health); the
verdict test case.

pytest offers no public way to add suite properties or `<system-out>` from a hook, so both are added to the file
after pytest wrote it (`rewrite`, a step of the end of the session); the test cases go through pytest's own reports.
pytest's writer follows a link and blocks on a FIFO: it writes into a private temporary directory instead, and the
XML reaches the --junitxml path through ckptqual's own write (output_file), checked before the run."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest

from ckptqual.config.outputs import JUNIT_FIX, check_file
from ckptqual.config.values import SettingsError
from ckptqual.faults import os_error_line
from ckptqual.output_file import write_file
from ckptqual.printable import printable
from ckptqual.pytest_plugin.held import session_of

if TYPE_CHECKING:
    from ckptqual.limits.verdict import RunVerdict
    from ckptqual.pytest_plugin.held import SessionState

VERDICT_NODEID = "ckptqual::verdict"
LINE_PROPERTY = "ckptqual.line"  # a test case's one line, copied into its <system-out>


@pytest.hookimpl(tryfirst=True)  # before pytest's junitxml plugin reads --junitxml
def pytest_configure(config: pytest.Config) -> None:
    """Where the JUnit XML goes, resolved as pytest resolves it (before any test may change directory) and checked
    (UsageError); pytest writes it into a private temporary directory. An xdist worker writes none."""
    path = _xml_path(config)
    if path is None:
        return
    try:
        check_file("--junitxml", path, [], JUNIT_FIX, make_parent=True)
    except SettingsError as error:
        raise pytest.UsageError(str(error)) from None
    held = session_of(config)
    held.junit_path = path
    held.pytests_junit = Path(tempfile.mkdtemp(prefix="ckptqual-junit-")) / path.name
    config.option.xmlpath = str(held.pytests_junit)


def remove_private_copy(held: SessionState) -> None:
    """Removes the private directory pytest's XML went to (and the XML, if still there)."""
    written = held.pytests_junit
    if written is not None:
        with contextlib.suppress(OSError):
            written.unlink(missing_ok=True)
            written.parent.rmdir()


def junit_path(config: pytest.Config) -> Path | None:
    """Where the run's JUnit XML goes: --junitxml, absolute; None where none is written (none given, a worker)."""
    return session_of(config).junit_path or _xml_path(config)


def _xml_path(config: pytest.Config) -> Path | None:
    """pytest's --junitxml, resolved as pytest resolves it, its last part not followed if a link; None where no XML
    is written (none given, a worker)."""
    path = config.getoption("xmlpath", None)
    if not path or hasattr(config, "workerinput"):
        return None
    given = Path(os.path.abspath(os.path.expanduser(os.path.expandvars(path))))
    return given.parent.resolve() / given.name


def refused_junit(config: pytest.Config, refusal: str) -> None:
    """The JUnit XML of a run refused while pytest starts, before pytest writes any: its one test case, the verdict,
    failed with the refusal and its fix. Written only where it cannot land in a target: not for a refusal of the
    --junitxml path itself, nor when a --target (a directory, or a list file naming them) may hold it."""
    junit = junit_path(config)
    if junit is None or "--junitxml" in refusal:
        return
    given = config.getoption("target", None) or []
    targets = [Path(target).absolute() for target in (given if isinstance(given, list) else [given])]
    if any(not target.is_dir() or junit.is_relative_to(target.resolve()) for target in targets):
        return
    from ckptqual.limits.verdict import Overall, RunVerdict

    reason = f"the run was refused before it started: {refusal}"
    line = RunVerdict(Overall.INCOMPLETE, (reason,)).line()
    root = ElementTree.Element("testsuites", name="pytest tests")
    suite = ElementTree.SubElement(root, "testsuite", name="pytest", errors="0", failures="1", skipped="0", tests="1")
    properties = ElementTree.SubElement(suite, "properties")
    verdict = "ckptqual.limits.verdict"
    for name, value in ((verdict, str(Overall.INCOMPLETE)), (f"{verdict}.reasons", reason), (f"{verdict}.basis", "")):
        ElementTree.SubElement(properties, "property", name=name, value=value)
    case = ElementTree.SubElement(suite, "testcase", classname="ckptqual", name="verdict", time="0")
    ElementTree.SubElement(case, "failure", message=line).text = line
    ElementTree.SubElement(case, "system-out").text = line + "\n"
    with contextlib.suppress(OSError):  # pytest's own refusal, printed next, still says what is wrong
        _write(ElementTree.ElementTree(root), junit)


def suite_property(config: pytest.Config, name: str, value: str) -> None:
    """A property of the JUnit XML's test suite."""
    session_of(config).suite_properties.append((name, value))


def report_health(config: pytest.Config, message: str | None, label: str | None = None) -> None:
    """The drive's health check (its line) as a suite property: `ckptqual.health`, `ckptqual.health[LABEL]`."""
    if message:
        suite_property(config, "ckptqual.health" + (f"[{label}]" if label else ""), message)


def report_verdict(session: pytest.Session, verdict: RunVerdict, label: str | None = None) -> None:
    """The verdict (of the drive `label`, else of the run) as suite properties and as a test case of its own, which
    GitLab and Jenkins read."""
    suffix = f"[{label}]" if label else ""
    name = f"ckptqual.limits.verdict{suffix}"
    suite_property(session.config, name, str(verdict.overall))
    suite_property(session.config, f"{name}.reasons", printable(" | ".join(verdict.reasons)))
    suite_property(session.config, f"{name}.basis", "; ".join(verdict.basis))
    qualified = verdict.overall == "QUALIFIED"
    location = ("ckptqual", None, f"ckptqual verdict{suffix}")
    session.testscollected += 1  # a case of its own: counted, so that the progress counter ends at 100 %
    properties = [(name, str(verdict.overall)), (LINE_PROPERTY, verdict.line())]
    report_case(session, VERDICT_NODEID + suffix, location, "call", None if qualified else verdict.line(), properties)


def report_case(
    session: pytest.Session,
    nodeid: str,
    location: tuple[str, int | None, str],
    when: Literal["setup", "call", "teardown"],
    failure: str | None,
    properties: list[tuple[str, str]],
    skipped: str | None = None,
) -> None:
    """A test case the run reports of its own (the verdict, a test an interruption kept from finishing): the phase
    `when` passed (`failure` None), was skipped for the reason `skipped`, or failed with the one line `failure`, then
    a passed teardown carrying the case's properties, as pytest's own protocol reports a test (its JUnit XML takes
    properties from the teardown)."""
    outcome: Literal["passed", "failed", "skipped"] = "passed" if failure is None else "failed"
    longrepr: str | tuple[str, int, str] | None = failure
    if skipped is not None:
        outcome, longrepr = "skipped", (str(location[0]), location[1] or 0, f"Skipped: {skipped}")
    hook = session.config.hook.pytest_runtest_logreport
    hook(report=pytest.TestReport(nodeid, location, {}, outcome, longrepr, when, [], 0.0))
    teardown = pytest.TestReport(nodeid, location, {}, "passed", None, "teardown", [], 0.0, user_properties=properties)
    hook(report=teardown)


def rewrite(session: pytest.Session) -> None:
    """Once pytest has written the JUnit XML: the suite properties and each case's line as its <system-out>."""
    config = session.config
    held = session_of(config)
    path, written = held.junit_path, held.pytests_junit
    if path is not None and written is not None and written.is_file():
        tree = ElementTree.parse(written)
        amend(tree, held.suite_properties)
        try:
            _write(tree, path)
        except OSError as error:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            sys.stderr.write(f"ckptqual: the JUnit XML was not written: {os_error_line(error, 'write')}\n")
        _name_in_summary(config, written, path)


def _name_in_summary(config: pytest.Config, written: Path, path: Path) -> None:
    """pytest's junitxml plugin names the file it wrote in its summary line; it names the --junitxml path instead."""
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "logfile", None) == str(written):
            plugin.logfile = str(path)


def amend(tree: ElementTree.ElementTree[ElementTree.Element], properties: list[tuple[str, str]]) -> None:
    """Adds `properties` to the JUnit XML's first test suite and copies each case's LINE_PROPERTY into its
    <system-out>, before what pytest captured there."""
    suite = tree.getroot() if tree.getroot().tag == "testsuite" else tree.getroot().find("testsuite")
    if suite is None:
        return
    if properties:
        block = suite.find("properties")
        if block is None:
            block = ElementTree.Element("properties")
            suite.insert(0, block)
        for name, value in properties:
            ElementTree.SubElement(block, "property", name=name, value=value)
    for case in suite.iter("testcase"):
        lines = [p.get("value", "") for p in case.iterfind("properties/property") if p.get("name") == LINE_PROPERTY]
        if lines:
            out = case.find("system-out")
            if out is None:
                out = ElementTree.SubElement(case, "system-out")
            out.text = "".join(f"{line}\n" for line in lines) + (out.text or "")


def _write(tree: ElementTree.ElementTree[ElementTree.Element], path: Path) -> None:
    """Writes the XML whole at `path` (its directories made, as pytest makes them), never through a link nor over
    anything but a regular file of this user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    write_file(path, buffer.getvalue())
