"""Loads the ckptqual pytest plugin for the qualification suite and the project's own tests."""

pytest_plugins = ["ckptqual.plugin", "ckptqual.plugin_sweep"]
