"""The report's figures as a reader sees them in a real headless browser (Debian's Chromium driven by Playwright):
in every figure no two text boxes of its titles or legends overlap each other or the plotted data, on the pages of
two and of three recorded runs side by side; and the check itself finds a legend drawn over the data."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from matplotlib.figure import Figure

from chromium import launched_browser  # noqa: F401  (the fixture `browser`)
from ckptqual.report.extract import load_run
from ckptqual.report.figures import Drawn
from ckptqual.report.html import svg, write_report
from ckptqual.report.labels import short_labelled

RESULTS = Path(__file__).parent / "data" / "results"
TWO = ("drive-a.json", "drive-b.json")
THREE = ("loop-ext4-1.json", "loop-ext4-3.json", "loop-ext4-devices.json")

# Per figure: every pair of title/legend text boxes that overlap, and every title or legend box over plotted data.
_OVERLAPS = """() => {
  const box = e => e.getBoundingClientRect();
  const meets = (a, b) => a.width > 0 && b.width > 0 && a.height > 0 && b.height > 0 &&
    a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const name = e => (e.closest('[id*="-title-"],[id*="-legend-"]') || e).id + ' ' + (e.textContent || '').trim();
  const found = [];
  const figures = [...document.querySelectorAll('figure')].filter(f => f.querySelector('svg'));
  for (const figure of figures) {
    const texts = [...figure.querySelectorAll('[id*="-title-"] text, [id*="-legend-"] text')];
    const boxes = [...figure.querySelectorAll('[id*="-title-"], [id*="-legend-"]')];
    const data = [...figure.querySelectorAll('[id*="-data-"]')];
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++)
        if (meets(box(texts[i]), box(texts[j]))) found.push(`${figure.id}: ${name(texts[i])} | ${name(texts[j])}`);
    for (const b of boxes)
      for (const d of data)
        if (meets(box(b), box(d))) found.push(`${figure.id}: ${b.id} over data ${d.id}`);
  }
  return {figures: figures.map(f => f.id), texts: figures.map(f => f.querySelectorAll('text').length), found};
}"""


def _overlaps(browser, page_path: Path) -> dict:
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(page_path.as_uri(), wait_until="load")
    found = page.evaluate(_OVERLAPS)
    context.close()
    return found


@pytest.mark.parametrize("names", [TWO, THREE], ids=["two", "three"])
def test_no_title_or_legend_overlaps_another_or_the_data(browser, names, tmp_path):
    runs = short_labelled([load_run(RESULTS / name) for name in names])
    result = _overlaps(browser, write_report(runs, tmp_path / "report"))
    expected = {"side_pass_seconds", "side_pass_GBps", "side_restore", "sweep_heatmap", "checkpoint_times"}
    assert expected <= set(result["figures"]), result["figures"]
    assert ("trend" in result["figures"]) == (len(names) >= 3)
    assert all(count > 5 for count in result["texts"])  # the browser sees each figure's text as text
    assert result["found"] == []


def test_the_check_finds_a_legend_over_the_data(browser, tmp_path):
    figure = Figure(figsize=(5, 3))
    axes = figure.add_subplot()
    axes.plot([0, 1, 2], [0, 1, 2], label="a line under its legend")
    axes.bar([0, 1, 2], [2, 2, 2], label="bars")
    axes.set_title("drawn wrong")
    axes.legend(loc="center")
    page = tmp_path / "wrong.html"
    page.write_text(f'<!DOCTYPE html><html><body><figure id="wrong">{svg(Drawn("wrong", "wrong", figure))}</figure>')
    assert any("legend" in problem and "over data" in problem for problem in _overlaps(browser, page)["found"])
