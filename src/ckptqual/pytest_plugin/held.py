"""Where the plugin's state lives: the one QualificationSession of a pytest run, registered as a plugin the first time
it is asked for. Not a plugin: every wiring module asks it through `session_of`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ckptqual.pytest_plugin.session import QualificationSession

SESSION_PLUGIN = "ckptqual-session"


def session_of(config: pytest.Config) -> QualificationSession:
    """The run's QualificationSession (pytest's plugin manager holds it as `ckptqual-session`)."""
    held = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if held is None:
        from ckptqual.pytest_plugin.session import QualificationSession  # it imports the wiring modules that ask

        held = QualificationSession(config)
        config.pluginmanager.register(held, SESSION_PLUGIN)
    return held
