"""Where the packaged data lives: `fixtures/` and `thresholds/` of a checkout, or their copies in a wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parents[1]


def data_dir(name: str) -> Path:
    """The directory `name` ("fixtures/workloads" or "thresholds") of a checkout, else of the installed wheel."""
    for base in (_CHECKOUT, _PACKAGE / "data"):
        candidate = base / name
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ckptqual data directory {name!r} not found under {_CHECKOUT} or {_PACKAGE / 'data'}")


def named_files(name: str) -> dict[str, Path]:
    """The `*.toml` files of data directory `name`, by stem."""
    return {p.stem: p for p in sorted(data_dir(name).glob("*.toml"))}


def resolve(name_or_path: str, directory: str, what: str) -> Path:
    """A file given by its name in `directory` or by a path; an unknown name lists the available ones."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.parent != Path("."):
        if not path.is_file():
            raise FileNotFoundError(f"{what} file {name_or_path!r} does not exist")
        return path
    available = named_files(directory)
    if name_or_path not in available:
        names = ", ".join(available) or "(none)"
        raise LookupError(f"unknown {what} {name_or_path!r}; available: {names} (or give a path to a .toml file)")
    return available[name_or_path]
