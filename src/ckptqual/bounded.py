"""Data files (a plan's JSON, a drive's or a workload's TOML) parsed within bounds, before any arithmetic on them:
nesting at most MAX_DEPTH deep, numbers of at most MAX_DIGITS digits and at most MAX_MAGNITUDE in size. What
breaks a bound is a ValueError of one line naming the key (or the line) and the fix."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from typing import Any

from ckptqual.documents import key_path

MAX_DEPTH = 32  # the shipped files nest 6 deep at most
MAX_DIGITS = 30  # of an integer or a float's digits: more than any count of bytes or seconds needs
MAX_MAGNITUDE = 1e18  # an exabyte; no count, size, rate or time a run uses comes near it
_OPENERS, _CLOSERS = "[{", "]}"
_TOML_KEY = re.compile(r"^\s*\[*\s*([\w.\-\"' ]+?)\s*\]*\s*(=|$)")
_JSON_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


def _where(text: str, offset: int) -> str:
    """`line N (key)`: the line of `offset` and the key it sets, as a reader of the file finds it."""
    start = text.rfind("\n", 0, offset) + 1
    number = text.count("\n", 0, offset) + 1
    json_keys = _JSON_KEY.findall(text[max(0, offset - 200) : offset])
    toml_key = _TOML_KEY.match(text[start:offset])
    key = json_keys[-1] if json_keys else toml_key.group(1) if toml_key else None
    return f"line {number}" + (f" ({key})" if key else "")


# What the scan looks at, outside quoted strings and comments (which it skips whole): brackets and digit runs.
_TOKENS = re.compile(
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[{]|[\]}]|[0-9][0-9_]*',
    re.DOTALL,
)


def _scan(text: str) -> None:
    """Refuses nesting deeper than MAX_DEPTH and a number longer than MAX_DIGITS digits, outside quoted strings
    (JSON's and TOML's: "...", '...', and the triple-quoted) and comments, before a parser recurses or converts them."""
    depth = 0
    for token in _TOKENS.finditer(text):
        first = token.group()[0]
        if first in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                where = _where(text, token.start())
                raise ValueError(f"{where}: nests deeper than {MAX_DEPTH} levels; no such file needs it")
        elif first in _CLOSERS:
            depth -= 1
        elif first.isdigit() and len(token.group()) > MAX_DIGITS:
            where, digits = _where(text, token.start()), len(token.group())
            raise ValueError(f"{where}: a number of {digits} digits; give one of at most {MAX_DIGITS}")


def check_values(value: Any, path: tuple[str | int, ...] = ()) -> None:
    """Refuses a number larger than MAX_MAGNITUDE, and keys nested deeper than MAX_DEPTH
    (TOML's dotted keys nest without brackets), naming the key path."""
    if len(path) > MAX_DEPTH:
        raise ValueError(f"{key_path(path[:MAX_DEPTH])}...: nests deeper than {MAX_DEPTH} levels; no file needs it")
    if isinstance(value, dict):
        for key, item in value.items():
            check_values(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_values(item, (*path, index))
    elif isinstance(value, int | float) and not isinstance(value, bool) and not _bounded(value):
        shown = f"{value:.3g}" if isinstance(value, float) else f"{value:.3e}"
        where = key_path(path)
        raise ValueError(f"{where}: {shown} is beyond {MAX_MAGNITUDE:.0e}; give a real value")


def _bounded(number: float) -> bool:
    """Within MAX_MAGNITUDE; NaN and infinity are left to the checks of each value, which name what it must be."""
    return not math.isfinite(number) or abs(number) <= MAX_MAGNITUDE


def _parsed(text: str, parse: Callable[[str], Any]) -> Any:
    _scan(text)
    try:
        document = parse(text)
    except RecursionError:  # the scan bounds nesting; this is only a fallback
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels; no such file needs it") from None
    check_values(document)
    return document


def load_toml(text: str) -> dict[str, Any]:
    """TOML text within the bounds; tomllib.TOMLDecodeError for bad syntax, ValueError for a bound."""
    return _parsed(text, tomllib.loads)


def load_json(text: str) -> Any:
    """JSON text within the bounds; json.JSONDecodeError for bad syntax, ValueError for a bound."""
    return _parsed(text, json.loads)
