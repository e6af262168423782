"""The one headless browser of the report's browser tests: Debian's Chromium driven by Playwright (no browser
download). A test module imports `launched_browser`, and its tests take the fixture `browser`; they skip where either
is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CKPTQUAL_CHROMIUM") or shutil.which("chromium")


@pytest.fixture(scope="module", name="browser")
def launched_browser() -> Iterator[Any]:
    """A launched Chromium for the module's tests; skips without Playwright or Chromium."""
    playwright = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install playwright")
    if CHROMIUM is None or not Path(CHROMIUM).is_file():
        where = CHROMIUM or "chromium on PATH"
        pytest.skip(f"no Chromium at {where} (apt-get install chromium, or set CKPTQUAL_CHROMIUM)")
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()
