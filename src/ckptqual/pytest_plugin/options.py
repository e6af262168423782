"""The ckptqual options, generated from the settings table; the run's settings, resolved once; the space check."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from ckptqual.config.run_settings import RunSettings, resolve_settings
from ckptqual.config.space import check_space
from ckptqual.config.table import SETTINGS, add_options
from ckptqual.config.values import SettingsError
from ckptqual.host import gpu

_SETTINGS = pytest.StashKey[RunSettings | SettingsError]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser.getgroup("ckptqual", "checkpoint storage qualification (ckptqual)").addoption)


def settings(config: pytest.Config) -> RunSettings:
    """The run's settings, resolved once; a bad option or drive file is a usage error."""
    if _SETTINGS not in config.stash:
        options = {row.name: config.getoption(row.name) for row in SETTINGS if row.flag}
        try:
            config.stash[_SETTINGS] = resolve_settings(options)
        except SettingsError as error:
            config.stash[_SETTINGS] = error
    resolved = config.stash[_SETTINGS]
    if isinstance(resolved, SettingsError):
        raise pytest.UsageError(str(resolved))
    return resolved


def selected_parts(items: Iterable[pytest.Item], can_run: gpu.HostGpu | None = None) -> set[str]:
    """The parts of the run that write to the target, by the selected tests: the sweep only with a cell whose
    transfer type this host can run (`can_run`: the host's GPU probe, made here when needed)."""
    parts, transfers = set(), set()
    for item in items:
        names = getattr(item, "fixturenames", ())
        parts |= {part for part, fixture in (("fill", "fill_pass"), ("layouts", "layout_strategy")) if fixture in names}
        cell = getattr(getattr(item, "callspec", None), "params", {}).get("sweep_cell")
        transfers |= {cell.transfer} if cell is not None else set()
    if transfers:
        host = can_run or gpu.probe()
        parts |= {"sweep"} if any(host.problem(transfer) is None for transfer in transfers) else set()
    return parts


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuses, before any I/O, a run whose selected parts do not fit the target at once."""
    if not any(item.get_closest_marker("qualification") for item in items):
        return
    try:
        check_space(settings(config), selected_parts(items))
    except SettingsError as error:
        raise pytest.UsageError(str(error)) from None
