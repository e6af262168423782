"""The manual agrees with the code: its options table is the settings table, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptqual.config.table import SETTINGS, Setting

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
OPTIONS_PAGE = DOCS / "qualifying.md"
OPTIONS_HEADER = "| option | drive file | meaning | default |"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row, `\\|` kept inside a cell."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _options_rows() -> list[list[str]]:
    lines = OPTIONS_PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(OPTIONS_HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _documented(setting: Setting) -> tuple[str, str, str]:
    """What the manual's row of `setting` must say in its option, drive-file and default columns."""
    flag = f"`{setting.flag}`" if setting.flag else ""
    key = f"`[{setting.section}] {setting.file_key}`" if setting.section else ""
    default = f"`{setting.default}`" if setting.default is not None else setting.unset
    return flag, key, default


def test_the_options_table_is_the_settings_table():
    rows = [(row[0], row[1], row[3]) for row in _options_rows()]
    expected = [_documented(setting) for setting in SETTINGS]
    missing = [row for row in expected if row not in rows]
    extra = [row for row in rows if row not in expected]
    assert not missing and not extra, (
        f"{OPTIONS_PAGE.relative_to(ROOT)}'s options table disagrees with config/table.py's SETTINGS: "
        f"missing or wrong {missing}, not in the table {extra}; write one row per setting in its order"
    )
    assert rows == expected, "the options table lists the settings in another order than SETTINGS"


def _slug(heading: str) -> str:
    """The anchor MkDocs (and GitHub, for plain headings) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(match) for match in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)}


def _links(page: Path) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    return [first or second for first, second in _LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no file {target})")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading with anchor #{anchor} in {target.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {'; '.join(broken)}"


def test_the_pages_exist():
    assert PAGES[0] == ROOT / "README.md" and len(PAGES) > 5, f"found only {PAGES}"


def test_the_readme_is_short_with_short_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    long = [number for number, line in enumerate(lines, 1) if len(line) > 120]
    assert len(lines) <= 250 and not long, f"README.md: {len(lines)} lines (at most 250), over 120 characters: {long}"
