"""Loads the ckptqual pytest plugin in a checkout where ckptqual is not installed; an installed ckptqual registers
it through its `pytest11` entry point (unless plugin autoload is off), and registering it twice would run every
hook twice."""

import os
from importlib.metadata import entry_points

_autoloaded = not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") and any(
    entry.name == "ckptqual" for entry in entry_points(group="pytest11")
)
pytest_plugins = [] if _autoloaded else ["ckptqual.pytest_plugin"]
