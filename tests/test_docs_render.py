"""The manual as a reader sees it: built with mkdocs, every fenced code block renders as a code block, not as a
literal fence or as inline code that starts with the fence's language name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")

ROOT = Path(__file__).resolve().parents[1]
_LANGUAGES = "sh|bash|console|shell|python|py|toml|json|yaml|yml|ini|text|xml|html|diff"
_INLINE_FENCE = re.compile(rf"<p>(?:(?!</p>).)*?<code>(?:{_LANGUAGES})[ \t]*\n", re.DOTALL)
_PARAGRAPH_STARTS_WITH_LANGUAGE = re.compile(rf"<p>\s*(?:<code>)?(?:{_LANGUAGES})\s*\n", re.DOTALL)


def _broken_blocks(html: str) -> list[str]:
    """The places of a built page where a fenced block did not render as a block."""
    found = [html[max(0, m.start() - 40) : m.end() + 60] for m in re.finditer("```", html)]
    found += [m.group(0)[:120] for m in _INLINE_FENCE.finditer(html) if m.group(0).count("<p>") == 1]
    found += [m.group(0) for m in _PARAGRAPH_STARTS_WITH_LANGUAGE.finditer(html)]
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(directory)],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    return directory


def test_every_fenced_block_of_the_manual_renders_as_a_code_block(site: Path):
    pages = sorted(site.rglob("*.html"))
    assert any(page.parent.name == "qualifying" for page in pages), "the build holds no qualifying page"
    broken = {
        str(page.relative_to(site)): found
        for page in pages
        if page.name != "404.html" and (found := _broken_blocks(page.read_text(encoding="utf-8")))
    }
    assert not broken, f"fenced code blocks that render as text (indented in a list without superfences?): {broken}"


def test_the_first_command_a_user_copies_is_a_code_block(site: Path):
    html = (site / "qualifying" / "index.html").read_text(encoding="utf-8")
    blocks = re.findall(r"<pre[^>]*>.*?</pre>", html, re.DOTALL)
    assert any("pytest tests_qual" in re.sub(r"<[^>]+>", "", block) for block in blocks)


def test_the_check_finds_a_fence_indented_in_a_list():
    markdown = pytest.importorskip("markdown")
    text = "1. Run it:\n\n    ```sh\n    pytest tests_qual --drive=x\n    ```\n"
    assert _broken_blocks(markdown.markdown(text, extensions=["tables"]))
    assert not _broken_blocks(markdown.markdown(text, extensions=["tables", "pymdownx.superfences"]))
