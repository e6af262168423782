"""The ckptqual pytest plugin (entry point `pytest11: ckptqual`): one QualificationSession (session.py) holds the
run's state and ends the session; the other modules are wiring, one per concern. Loading it imports none of the run's
own modules (torch, the engines, Hypothesis, matplotlib): they load when a qualification test or its fixture runs."""

pytest_plugins = [
    "ckptqual.pytest_plugin.junit",
    "ckptqual.pytest_plugin.options",
    "ckptqual.pytest_plugin.drives",
    "ckptqual.pytest_plugin.run",
    "ckptqual.pytest_plugin.selection",
    "ckptqual.pytest_plugin.conclusion",
    "ckptqual.pytest_plugin.sweep",
    "ckptqual.pytest_plugin.benchmarks",
    "ckptqual.pytest_plugin.session",
]
