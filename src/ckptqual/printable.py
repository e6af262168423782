"""Text from outside the code (files, records, labels, paths, tools' output) as it may be printed: every control
character, line break and escape sequence made visible, so that no such string can draw a line of its own or
rewrite one already on the terminal."""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(character: str) -> str:
    """A character Python would not print as itself, as the escape that names it (`\\n`, `\\x1b`, `\\u2028`)."""
    if character in _NAMED:
        return _NAMED[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object) -> str:
    """`text` as one printable line: each character that is not printable (controls, line and paragraph
    separators, format characters such as bidirectional overrides, lone surrogates) shown as its escape."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(character if character.isprintable() else _visible(character) for character in text)


def printable_lines(lines: list[str]) -> list[str]:
    """Each line made `printable`."""
    return [printable(line) for line in lines]
