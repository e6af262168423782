"""The one way a document is checked (a results record, a message between nodes, a plan, workload or drive file): a
JSON Schema, and one line for what is wrong: `key path: must be WHAT, got VALUE` (or `: missing`, `: unknown key;
allowed: ...`), then `; FIX` where the schema gives one.

Two annotations of ckptqual's own, which jsonschema passes over: `expected` says in words what a value must be (in
place of the words made from the failed keyword), and `fix` what to do (text, or per failed keyword a mapping)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jsonschema loads when a document is first checked, not with every module that names a key path
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

_KINDS = {"number": "a number", "integer": "an integer", "string": "a string", "boolean": "true or false",
          "object": "an object", "array": "a list", "null": "null"}  # fmt: skip
_SHOWN_CHARACTERS = 60
_COUNTED = {
    "maxLength": "a string of at most {:,} characters",
    "minLength": "a string of at least {:,} characters",
    "maxItems": "a list of at most {:,} items",
    "minItems": "a list of at least {:,} items",
    "maxProperties": "an object of at most {:,} keys",
    "minProperties": "an object of at least {:,} keys",
}


def _is_number(checker: Any, instance: Any) -> bool:
    """A finite number, never a boolean: JSON has no NaN or infinity, but Python's json reads them."""
    return isinstance(instance, int | float) and not isinstance(instance, bool) and math.isfinite(instance)


def _is_integer(checker: Any, instance: Any) -> bool:
    """A whole number written as one (2, not 2.0): what a count, an index or a rank is."""
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator_class() -> Any:
    """JSON Schema 2020-12's validator with finite numbers and int integers."""
    from jsonschema import Draft202012Validator, validators

    types = Draft202012Validator.TYPE_CHECKER.redefine_many({"number": _is_number, "integer": _is_integer})
    return validators.extend(Draft202012Validator, type_checker=types)


def checker(schema: dict[str, Any]) -> Validator:
    """A validator of `schema` (JSON Schema 2020-12) whose numbers are finite and whose integers are ints."""
    return _validator_class()(schema)


def problem(validator: Validator, document: Any, root: str = "") -> str | None:
    """The line of the most telling thing wrong with `document`, its key path under `root`; None when nothing is."""
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(document))
    return None if error is None else line(error, root)


def key_path(parts: Iterable[str | int], root: str = "") -> str:
    """`passes[0].checkpoints[2].seconds`; a key that is not a plain name is quoted: `tests["a/b.py::t[1]"]`."""
    text = root
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text or "the top level"


def shown(value: Any) -> str:
    """`value` as one short line: JSON's words for null, booleans and odd numbers, repr for the rest, shortened."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARACTERS else f"{text[: _SHOWN_CHARACTERS - 3]}..."


def line(error: ValidationError, root: str = "") -> str:
    """`key path: what is wrong; the fix` for one error jsonschema found."""
    path, keyword, schema = list(error.absolute_path), str(error.validator), error.schema
    if keyword == "required":
        missing = next(key for key in error.validator_value if key not in error.instance)
        where, what = key_path([*path, missing], root), "missing"
    elif keyword == "additionalProperties" and error.validator_value is False:
        allowed = schema.get("properties", {})
        unknown = next(key for key in error.instance if key not in allowed)
        where, what = key_path([*path, unknown], root), f"unknown key; allowed: {', '.join(allowed)}"
    else:
        where, what = key_path(path, root), f"must be {_expected(error)}, got {_got(error)}"
    fix = schema.get("fix") if isinstance(schema, dict) else None
    fix = fix.get(keyword) if isinstance(fix, dict) else fix
    return f"{where}: {what}; {fix}" if fix else f"{where}: {what}"


def _expected(error: ValidationError) -> str:
    """What the value must be, in words: the schema's `expected`, else made from the keyword that failed."""
    schema, keyword, bound = error.schema, str(error.validator), error.validator_value
    if isinstance(schema, dict) and "expected" in schema:
        return str(schema["expected"])
    kinds = schema.get("type") if isinstance(schema, dict) else None
    noun = "an integer" if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds) else "a number"
    if keyword == "type":
        return " or ".join(_KINDS[kind] for kind in (bound if isinstance(bound, list) else [bound]))
    if keyword in ("minimum", "maximum") and {"minimum", "maximum"} <= set(schema):
        return f"{noun} from {schema['minimum']:g} to {schema['maximum']:g}"
    signs = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    if keyword in signs:
        return f"{noun} {signs[keyword]} {bound:g}"
    if keyword == "enum":
        return f"one of {', '.join(map(str, bound))}"
    if keyword == "const":
        return shown(bound)
    if keyword in _COUNTED:
        return _COUNTED[keyword].format(bound)
    return f"a value that passes {keyword} ({error.message})"


def _got(error: ValidationError) -> str:
    """The value found; a size where the size is what is wrong (a long string is not printed whole)."""
    keyword, value = str(error.validator), error.instance
    if keyword in ("maxLength", "minLength"):
        return f"{len(value):,} characters"
    if keyword in ("maxItems", "minItems"):
        return f"{len(value):,} items"
    if keyword in ("maxProperties", "minProperties"):
        return f"{len(value):,} keys"
    return shown(value)
