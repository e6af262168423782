"""What the JUnit XML shows of a qualification, through public pytest API: each test case's one line (value, limit
and unit of each judged figure) as a property that is copied into the case's `<system-out>`, which GitLab and
Jenkins display (they drop properties); the run's suite properties (verdict, its reasons and basis, health); the
verdict test case.

pytest offers no public way to add suite properties or `<system-out>` from a hook, so both are added to the file
after pytest wrote it (`pytest_sessionfinish`, wrapped); the test cases themselves go through pytest's own reports."""

from __future__ import annotations

import contextlib
import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Generator
from pathlib import Path

import pytest

from ckptqual.limits.verdict import Overall, RunVerdict

VERDICT_NODEID = "ckptqual::verdict"
LINE_PROPERTY = "ckptqual.line"  # a test case's one line, copied into its <system-out>
_PROPERTIES = pytest.StashKey[list[tuple[str, str]]]()
_XML_PATH = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Where pytest writes the JUnit XML, resolved as pytest resolves it (before any test may change directory);
    an xdist worker writes none."""
    path = _xml_path(config)
    if path is not None:
        config.stash[_XML_PATH] = path
    config.stash[_PROPERTIES] = []


def _xml_path(config: pytest.Config) -> Path | None:
    """pytest's --junitxml, resolved as pytest resolves it; None where no XML is written (none given, a worker)."""
    path = config.getoption("xmlpath", None)
    if not path or hasattr(config, "workerinput"):
        return None
    return Path(os.path.abspath(os.path.expanduser(os.path.expandvars(path)))).resolve()


def refused_junit(config: pytest.Config, refusal: str) -> None:
    """The JUnit XML of a run refused while pytest starts, before pytest writes any: its one test case, the verdict,
    failed with the refusal and its fix. Written only where it cannot land in a target: not for a refusal of the
    --junitxml path itself, nor when a --target (a directory, or a list file naming them) may hold it."""
    junit = _xml_path(config)
    if junit is None or "--junitxml" in refusal:
        return
    given = config.getoption("target", None) or []
    targets = [Path(target).absolute() for target in (given if isinstance(given, list) else [given])]
    if any(not target.is_dir() or junit.is_relative_to(target.resolve()) for target in targets):
        return
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
        junit.parent.mkdir(parents=True, exist_ok=True)
        _write(ElementTree.ElementTree(root), junit)


def suite_property(config: pytest.Config, name: str, value: str) -> None:
    """A property of the JUnit XML's test suite."""
    config.stash[_PROPERTIES].append((name, value))


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
    suite_property(session.config, f"{name}.reasons", " | ".join(verdict.reasons))
    suite_property(session.config, f"{name}.basis", "; ".join(verdict.basis))
    qualified = verdict.overall == "QUALIFIED"
    location = ("ckptqual", None, f"ckptqual verdict{suffix}")
    properties = [(name, str(verdict.overall)), (LINE_PROPERTY, verdict.line())]
    report_case(session, VERDICT_NODEID + suffix, location, "call", None if qualified else verdict.line(), properties)


def report_case(
    session: pytest.Session,
    nodeid: str,
    location: tuple[str, int | None, str],
    when: str,
    failure: str | None,
    properties: list[tuple[str, str]],
    skipped: str | None = None,
) -> None:
    """A test case the run reports of its own (the verdict, a test an interruption kept from finishing): the phase
    `when` passed (`failure` None), was skipped for the reason `skipped`, or failed with the one line `failure`, then
    a passed teardown carrying the case's properties, as pytest's own protocol reports a test (its JUnit XML takes
    properties from the teardown)."""
    outcome, longrepr = ("passed", None) if failure is None else ("failed", failure)
    if skipped is not None:
        outcome, longrepr = "skipped", (str(location[0]), location[1] or 0, f"Skipped: {skipped}")
    hook = session.config.hook.pytest_runtest_logreport
    hook(report=pytest.TestReport(nodeid, location, {}, outcome, longrepr, when, [], 0.0))
    teardown = pytest.TestReport(nodeid, location, {}, "passed", None, "teardown", [], 0.0, user_properties=properties)
    hook(report=teardown)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    """Once pytest has written the JUnit XML: the suite properties and each case's line as its <system-out>."""
    result = yield
    path = session.config.stash.get(_XML_PATH, None)
    if path is not None and path.is_file():
        amend(path, session.config.stash[_PROPERTIES])
    return result


def amend(path: Path, properties: list[tuple[str, str]]) -> None:
    """Adds `properties` to the JUnit XML's first test suite and copies each case's LINE_PROPERTY into its
    <system-out>, before what pytest captured there."""
    tree = ElementTree.parse(path)
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
    _write(tree, path)


def _write(tree: ElementTree.ElementTree, path: Path) -> None:
    """Writes the XML beside its final name, then renames it into place: a reader never sees half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tree.write(temporary, encoding="utf-8", xml_declaration=True)
    os.replace(temporary, path)
