"""The ckptqual pytest plugin (entry point `pytest11: ckptqual`): wiring only, one module per concern."""

pytest_plugins = [
    "ckptqual.pytest_plugin.junit",
    "ckptqual.pytest_plugin.options",
    "ckptqual.pytest_plugin.drives",
    "ckptqual.pytest_plugin.run",
    "ckptqual.pytest_plugin.selection",
    "ckptqual.pytest_plugin.interruption",
    "ckptqual.pytest_plugin.conclusion",
    "ckptqual.pytest_plugin.verdicts",
    "ckptqual.pytest_plugin.sweep",
    "ckptqual.pytest_plugin.benchmarks",
    "ckptqual.pytest_plugin.report",
]
