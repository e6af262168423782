"""Loads the ckptqual pytest plugin for the qualification suite and the project's own tests."""

pytest_plugins = ["ckptqual.pytest_plugin.plugin", "ckptqual.pytest_plugin.sweep"]
