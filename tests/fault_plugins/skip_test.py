"""Test-only pytest plugin: skips the test named in CKPTQUAL_SKIP_TEST at its setup, as a conftest's or another
plugin's skip would; load with `-p skip_test`."""

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.name == os.environ["CKPTQUAL_SKIP_TEST"]:
        pytest.skip("skipped by the skip_test plugin")
