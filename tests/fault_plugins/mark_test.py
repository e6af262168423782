"""Test-only pytest plugin: marks the test named in CKPTQUAL_MARK_TEST with `chosen`, as a conftest's own marker
would, so that `-m "not chosen"` deselects it; load with `-p mark_test`."""

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chosen: the test named in CKPTQUAL_MARK_TEST")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.name == os.environ["CKPTQUAL_MARK_TEST"]:
            item.add_marker(pytest.mark.chosen)
