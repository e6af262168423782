"""One self-contained HTML page of one or more runs, from their results records alone: verdicts, identity and
health, figures embedded as data: URIs, tables of measurements, limits with their sources, settings. No script,
no external file: it opens offline and from a mail attachment."""

from __future__ import annotations

import io
import time
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import matplotlib

from ckptqual import __version__
from ckptqual.config.outputs import FIGURE_SUFFIX, REPORT_PAGE
from ckptqual.output_file import write_file
from ckptqual.printable import printable_lines
from ckptqual.report.extract import Run
from ckptqual.report.figures import Drawn, draw_all
from ckptqual.report.labels import IDENTITY_HEADERS, identity_rows
from ckptqual.report.side_by_side import draw_side_by_side, headline_table
from ckptqual.report.summary import summary_lines
from ckptqual.report.sweep_table import sweep_lines
from ckptqual.report.trend import one_model, over_time
from ckptqual.report.verdict import recorded_verdict

PAGE = REPORT_PAGE
_DPI = 100
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
pre.summary{white-space:pre-wrap;overflow-wrap:anywhere;overflow-x:visible}
figure svg{max-width:100%;height:auto;border:1px solid #eee}
.verdict{display:inline-block;padding:.25em .8em;border-radius:.3em;font-weight:bold;color:#fff}
.QUALIFIED,.PASS{background:#2e7d32}.MARGINAL{background:#f9a825}.INCOMPLETE,.SKIPPED,.MEASURED,.NOT_RUN{background:#757575}
.FAIL,.NOT_QUALIFIED,.NOT_STEADY,.ERROR,.INTERRUPTED{background:#c62828}.INVALID{background:#6a1b9a}
span.outcome{padding:0 .4em;border-radius:.2em;color:#fff;font-size:.85em}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}.missing{color:#8a6d3b;background:#fcf8e3;padding:.4em .6em}
.runs{display:flex;gap:1.5em;flex-wrap:wrap}.runs>div{flex:1 1 360px;min-width:0;overflow-x:auto}
td{overflow-wrap:break-word}td.num{white-space:nowrap}
"""


def png(drawn: Drawn) -> bytes:
    """The figure as PNG bytes."""
    if drawn.figure is None:
        raise ValueError(f"the figure {drawn.name} was not drawn ({drawn.missing}): there is no PNG of it")
    buffer = io.BytesIO()
    drawn.figure.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()


def write_report(runs: Sequence[Run], directory: Path) -> Path:
    """Draws every figure into `directory` (PNG files) and writes the page beside them, each file never through a
    link nor over anything but a regular file of this user (output_file); returns the page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    images = [(drawn, png(drawn) if drawn.figure is not None else None) for drawn in draw_all(runs)]
    for drawn, image in images:
        if image is not None:
            write_file(directory / f"{drawn.name}{FIGURE_SUFFIX}", image)
    page = directory / PAGE
    write_file(page, render(runs, images).encode())
    return page


def render(runs: Sequence[Run], images: Sequence[tuple[Drawn, bytes | None]]) -> str:
    """The whole page."""
    title = "ckptqual qualification report: " + ", ".join(run.label for run in runs)
    body = [
        f"<h1>{escape(title)}</h1>",
        f"<p>Drawn {escape(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} by ckptqual {escape(__version__)} from "
        + ", ".join(f"<code>{escape(str(run.path))}</code>" for run in runs)
        + ".</p>",
        _section("Verdict", runs, _verdict),
        *_side_by_side(runs),
        *_over_time(runs),
        _section("Drive identity", runs, _identity),
        _section("Drive health before and after the run", runs, _health),
        "<h2>Figures</h2>",
        *(_figure(drawn) for drawn, _ in images),
        _section("Summary", runs, _summary),
        _section("Measurements and verdicts", runs, _measurements, side_by_side=False),
        _section("Limits and their sources", runs, _limits, side_by_side=False),
        _section("Tests", runs, _tests, side_by_side=False),
        _section("Settings and where each came from", runs, _settings),
        _section("Environment", runs, _environment),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _section(title: str, runs: Sequence[Run], part: Any, side_by_side: bool = True) -> str:
    """A heading and one block per run, side by side where they are narrow."""
    blocks = [f"<div><h3>{escape(run.label)}</h3>{part(run.data)}</div>" for run in runs]
    wrapper = '<div class="runs">' if side_by_side else "<div>"
    return f"<h2>{escape(title)}</h2>{wrapper}{''.join(blocks)}</div>"


def _badge(word: str, css: str = "verdict") -> str:
    return f'<span class="{css} {escape(word.replace(" ", "_"))}">{escape(word)}</span>'


def svg(drawn: Drawn) -> str:
    """The figure as inline SVG, its text kept as text (a browser lays it out, a reader can search and copy it),
    with its titles, legends and plotted data tagged by id (`<figure name>-title-`, `-legend-`, `-data-`)."""
    assert drawn.figure is not None
    _tag(drawn)
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": drawn.name}):
        drawn.figure.savefig(buffer, format="svg", dpi=_DPI)
    text = buffer.getvalue()
    start = text.index("<svg")
    return f'<svg role="img" aria-label="{escape(drawn.title)}"' + text[start + len("<svg") :]


def _tag(drawn: Drawn) -> None:
    """Gives the figure's titles, legends and plotted data ids that name what they are."""
    figure, name = drawn.figure, drawn.name
    assert figure is not None
    # matplotlib has no public handle on the Text of a suptitle or of an axes' left and right titles
    texts = [figure._suptitle] if figure._suptitle is not None else []  # type: ignore[attr-defined]
    legends = list(figure.legends)
    for panel, axes in enumerate(figure.axes):
        texts += [axes.title, axes._left_title, axes._right_title]  # type: ignore[attr-defined]
        legend = axes.get_legend()
        legends += [legend] if legend is not None else []
        data = [*axes.lines, *axes.patches, *axes.collections, *axes.images]
        for index, artist in enumerate(data):
            artist.set_gid(f"{name}-data-{panel}-{index}")
    for index, text in enumerate(t for t in texts if t.get_text()):
        text.set_gid(f"{name}-title-{index}")
    for index, legend in enumerate(legends):
        legend.set_gid(f"{name}-legend-{index}")


def _figure(drawn: Drawn) -> str:
    if drawn.figure is None:
        return f'<h3>{escape(drawn.title)}</h3><p class="missing">{escape(drawn.missing or "not drawn")}</p>'
    return f'<figure id="{escape(drawn.name)}">{svg(drawn)}<figcaption>{escape(drawn.title)}</figcaption></figure>'


def _side_by_side(runs: Sequence[Run]) -> list[str]:
    """Two or more runs: their identities, the headline figures with the ratio to the first run, and the bars and
    heatmaps that compare them; nothing for one run."""
    if len(runs) < 2:
        return []
    headers, rows = headline_table(runs)
    figures = [_figure(drawn) for drawn in draw_side_by_side(runs)]
    return [
        '<h2 id="side-by-side">Drives side by side</h2>',
        _table(IDENTITY_HEADERS, identity_rows(runs)),
        "<h3>Headline figures (mean of each; ratio to the first run)</h3>",
        _table(headers, rows),
        *figures,
    ]


def _over_time(runs: Sequence[Run]) -> list[str]:
    """Many runs of one drive model: each headline figure over time; nothing otherwise."""
    if not one_model(runs):
        return []
    drawn = over_time(runs)
    return ['<h2 id="over-time">Results over time</h2>', _figure(drawn)]


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(value) for value in row) + "</tr>" for row in rows)
    return f"<table>{f'<thead><tr>{head}</tr></thead>' if head else ''}<tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, _Html):
        return f"<td>{value}</td>"
    if isinstance(value, bool) or value is None:
        return f"<td>{escape(str(value))}</td>"
    if isinstance(value, int | float):
        return f'<td class="num">{escape(_number(value))}</td>'
    return f"<td>{escape(str(value))}</td>"


class _Html(str):
    """Markup that a table cell keeps as it is."""


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _verdict(data: dict[str, Any]) -> str:
    verdict = recorded_verdict(data)
    if verdict is None:
        return f"<p>{_badge('INCOMPLETE')} no verdict recorded: the run did not finish.</p>"
    reasons = "".join(f"<li>{escape(reason)}</li>" for reason in verdict.reasons)
    basis = "; ".join(verdict.basis)
    rests = f'<p class="basis">This verdict rests on: {escape(basis)}.</p>' if basis else ""
    return f"<p>{_badge(verdict.overall)}</p>{rests}" + (f"<ul>{reasons}</ul>" if reasons else "")


def _identity(data: dict[str, Any]) -> str:
    drive, target = data.get("drive"), data.get("target", {})
    where = f"<p>target <code>{escape(str(target.get('path', data.get('settings', {}).get('target'))))}</code></p>"
    if not drive:
        return where + '<p class="missing">unavailable: the results hold no drive identity</p>'
    return where + _nested(drive)


def _nested(value: Any) -> str:
    """Any JSON value as a table of its keys (nested tables for nested values), "unavailable" where it is None."""
    if isinstance(value, dict):
        if not value:
            return "<em>none</em>"
        return _table([], ([key, _Html(_nested(item))] for key, item in value.items()))
    if isinstance(value, list):
        if value and all(isinstance(item, dict) for item in value):
            return "".join(_nested(item) for item in value)
        return escape(", ".join(str(item) for item in value)) or "<em>none</em>"
    if value is None:
        return "<em>unavailable</em>"
    return escape(_number(value) if isinstance(value, int | float) and not isinstance(value, bool) else str(value))


def _health(data: dict[str, Any]) -> str:
    """Per physical device, each counter before and after the run and its change; what could not be read and why;
    the bytes the drive counted against those the suite wrote; the rest as recorded."""
    health = data.get("health")
    if not health:
        return '<p class="missing">unavailable: the results hold no drive health (the run did not read it)</p>'
    parts = []
    if health.get("outcome"):
        parts.append(f"<p>{_badge(str(health['outcome']), 'outcome')} {escape(str(health.get('message', '')))}</p>")
    before = {d.get("device"): d for d in (health.get("before") or {}).get("devices", [])}
    after = {d.get("device"): d for d in (health.get("after") or {}).get("devices", [])}
    for device in dict.fromkeys([*before, *after]):
        parts.append(_device_health(str(device), before.get(device, {}), after.get(device, {})))
    rest = {key: value for key, value in health.items() if key not in ("before", "after", "outcome", "message")}
    if rest:
        parts.append(_nested(rest))
    return "".join(parts)


def _device_health(device: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    counters_before, counters_after = before.get("counters") or {}, after.get("counters") or {}
    keys = list(dict.fromkeys([*counters_before, *counters_after]))
    rows = [
        [
            key,
            _shown(counters_before.get(key)),
            _shown(counters_after.get(key)),
            _change(counters_before, counters_after, key),
        ]
        for key in keys
    ]
    rows.append(
        [
            "critical warning flags",
            _shown(before.get("critical_warning_flags")),
            _shown(after.get("critical_warning_flags")),
            "",
        ]
    )
    kind = before.get("kind") or after.get("kind") or ""
    html = f"<p><b>{escape(device)}</b> {escape(str(kind))}</p>" + _table(
        ["counter", "before", "after", "change"], rows
    )
    reasons: dict[str, list[str]] = {}
    for key, why in {**(before.get("unavailable") or {}), **(after.get("unavailable") or {})}.items():
        reasons.setdefault(str(why), []).append(key)
    if reasons:
        items = "".join(
            f"<li>{escape(', '.join(keys))}: unavailable: {escape(why)}</li>" for why, keys in reasons.items()
        )
        html += f"<ul>{items}</ul>"
    return html


def _shown(value: Any) -> Any:
    return "unavailable" if value is None else value


def _change(before: dict[str, Any], after: dict[str, Any], key: str) -> Any:
    a, b = before.get(key), after.get(key)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    return b - a if numbers and a is not None and b is not None else ""


def _summary(data: dict[str, Any]) -> str:
    text = "\n".join(printable_lines(summary_lines(data)))
    if "sweep" in data:
        text += "\n\nread sweep:\n" + "\n".join(printable_lines(sweep_lines(data["sweep"])))
    return f'<pre class="summary">{escape(text)}</pre>'


def _context(context: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in context.items())


def _measurements(data: dict[str, Any]) -> str:
    entries = data.get("measurements", [])
    if not entries:
        return "<p>no measurement was recorded</p>"
    rows = [
        [
            entry["measurement"],
            _context(entry.get("context", {})),
            entry["value"],
            entry["unit"],
            entry.get("limit") or "",
            _Html(_badge(entry["outcome"], "outcome")),
            entry.get("message", ""),
        ]
        for entry in entries
    ]
    return _table(["measurement", "where", "value", "unit", "limit", "outcome", "judgement"], rows)


def _limits(data: dict[str, Any]) -> str:
    limits = data.get("limits", [])
    source = data.get("settings", {}).get("thresholds_file", "the drive file")
    if not limits:
        return f"<p>the drive file <code>{escape(str(source))}</code> declares no limit</p>"
    rows = [
        [
            limit.get("number"),
            limit["measurement"],
            f">= {limit['min']}" if limit.get("min") is not None else f"<= {limit.get('max')}",
            limit["unit"] + (f" of {limit['relative_to']}" if limit.get("relative_to") else ""),
            limit.get("marginal") or "",
            _context(limit.get("where") or {}),
            limit.get("source", ""),
        ]
        for limit in limits
    ]
    return f"<p>from <code>{escape(str(source))}</code></p>" + _table(
        ["#", "measurement", "bound", "unit", "marginal", "where", "source of the number"], rows
    )


def _tests(data: dict[str, Any]) -> str:
    tests = data.get("tests", {})
    if not tests:
        return "<p>no test outcome was recorded</p>"
    rows = [[t["subject"], _Html(_badge(t["outcome"], "outcome")), t["message"]] for t in tests.values()]
    return _table(["test", "outcome", "message"], rows)


def _settings(data: dict[str, Any]) -> str:
    settings = dict(data.get("settings", {}))
    sources = settings.pop("sources", {})
    rows = [
        [key, "not set" if value is None else _Html(_nested(value)), sources.get(key, "")]
        for key, value in settings.items()
    ]
    return _table(["setting", "value", "from"], rows)


def _environment(data: dict[str, Any]) -> str:
    environment = data.get("environment", {})
    times = {"started": data.get("started"), "finished": data.get("finished")}
    return _nested({**times, **environment})
