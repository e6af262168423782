"""Kinds of values a setting holds: the one check of each, and how command-line text becomes one (a data file's
structure is checked by its JSON Schema, ckptqual.documents).

A check returns the value to use or raises ValueError saying what the value must be; the caller says where the value
came from (`--scale 0.0: ...`, `d5.toml: run.scale = 0: ...`), so every origin gets the same message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptqual.limits.units import format_size, parse_size


class SettingsError(ValueError):
    """A value or file the run cannot use; the one-line message names the value and the fix."""


@dataclass(frozen=True)
class Kind:
    """A kind of value: what a value must be (`ok`, else `problem`), its form once checked, its parser of
    command-line text (text it cannot parse goes to the check as it is), and for a list the kind of its items."""

    ok: Callable[[Any], bool]
    problem: str | Callable[[], str]
    convert: Callable[[Any], Any] = lambda value: value
    parse: Callable[[str], Any] = str
    item: Kind | None = None

    def check(self, value: Any) -> Any:
        if not self.ok(value):
            raise ValueError(self.problem if isinstance(self.problem, str) else self.problem())
        return self.convert(value) if self.item is None else _checked_items(self.item, value)

    def from_text(self, value: Any) -> Any:
        """A command-line value, checked: text is parsed first."""
        return self.check(_parsed(self, value) if isinstance(value, str) else value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def whole(minimum: int, maximum: int | None = None) -> Kind:
    top = math.inf if maximum is None else maximum
    bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    return Kind(lambda v: _is_int(v) and minimum <= v <= top, f"must be a whole number {bound}", parse=int)


def number(ok: Callable[[float], bool], expected: str) -> Kind:
    """A finite number for which `ok` holds, as a float."""
    return Kind(lambda v: _is_number(v) and ok(v), f"must be {expected}", float, float)


def fraction(noun: str) -> Kind:
    return number(lambda v: 0 < v <= 1, f"a number with 0 < {noun} <= 1")


def choice(options: Collection[str] | Callable[[], Collection[str]], noun: str) -> Kind:
    """One of `options` (or of what the callable gives, for a registry loaded only when needed)."""
    names = options if callable(options) else lambda: options
    return Kind(
        lambda v: isinstance(v, str) and v in names(), lambda: f"unknown {noun}; use one of {', '.join(names())}"
    )


def _is_utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8 (a file name that is not holds lone surrogates once decoded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


TEXT = Kind(
    lambda v: isinstance(v, str) and bool(v.strip()) and _is_utf8(v),
    "must be a non-empty string of valid UTF-8 (rename a file whose name is not)",
)
FLAG = Kind(
    lambda v: isinstance(v, bool), "must be true or false", parse=lambda text: {"true": True, "false": False}[text]
)
PATH = Kind(
    lambda v: isinstance(v, str | Path) and bool(str(v)) and _is_utf8(str(v)),
    "must be a path of valid UTF-8 (rename a file or directory whose name is not)",
    Path,
    Path,
)


def _is_address(value: Any) -> bool:
    """Whether `value` is "host:port" with a host and a port from 1 to 65535."""
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


ADDRESS = Kind(_is_address, "must be HOST:PORT with a port from 1 to 65535, e.g. 10.0.0.1:29410")


def _bytes(value: Any) -> int | None:
    """Bytes of an integer or a size string such as '256M', or None."""
    if isinstance(value, str):
        with suppress(ValueError):
            return parse_size(value)
    return value if _is_int(value) and value > 0 else None


def size(multiple: int = 1) -> Kind:
    """Bytes, as an integer or a size string (binary K, M or G), a multiple of `multiple`."""
    of = f", a multiple of {format_size(multiple)}" if multiple > 1 else ""

    def ok(value: Any) -> bool:
        amount = _bytes(value)
        return amount is not None and amount % multiple == 0

    return Kind(ok, f"must be a size in bytes{of}, written like 1048576 or '1M' (binary K, M or G)", _bytes)


def list_of(item: Kind) -> Kind:
    """A non-empty list of one kind, each value listed once; on the command line, comma-separated."""
    parse = lambda text: [_parsed(item, part.strip()) for part in text.split(",")]  # noqa: E731
    return Kind(lambda v: isinstance(v, list | tuple) and bool(v), "must be a non-empty list", parse=parse, item=item)


def _checked_items(item: Kind, values: list | tuple) -> tuple[Any, ...]:
    checked = []
    for index, value in enumerate(values, 1):
        try:
            checked.append(item.check(value))
        except ValueError as error:
            raise ValueError(f"item {index}: {error}") from None
    if len(set(checked)) != len(checked):
        raise ValueError("lists a value twice; list each once")
    return tuple(checked)


def _parsed(kind: Kind, text: str) -> Any:
    with suppress(ValueError, KeyError):
        return kind.parse(text)
    return text
