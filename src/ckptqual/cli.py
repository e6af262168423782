"""The `ckptqual` command: plan a workload's space, list workloads, clean a target, print a run's summary again.
pytest stays the main interface."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from ckptqual.config.table import add_options, setting
from ckptqual.config.values import SettingsError
from ckptqual.faults import os_error_line
from ckptqual.printable import printable, printable_lines

if TYPE_CHECKING:  # each command imports what it needs when it runs: --version and --help load none of it
    from ckptqual.host.target import Cleaning, LeftoverRun, Removal
    from ckptqual.plan.model import CheckpointPlan
    from ckptqual.report.extract import Run


def _rank_rows(plan: CheckpointPlan) -> Iterator[tuple[str, int, int]]:
    """(ranks, files, bytes) per run of consecutive ranks that write alike, so a 1024-rank job stays short."""
    for (files, nbytes), group in groupby(plan.ranks, key=lambda rank: (len(rank.files), rank.nbytes)):
        ranks = [rank.rank for rank in group]
        yield (str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"), files, nbytes


def format_plan(plan: CheckpointPlan) -> str:
    """A per-rank table and the totals a user needs to size the target."""
    lines = [
        f"workload {plan.workload} (scale {plan.scale:g}): {plan.description}",
        f"{'rank':>11} {'files':>7} {'bytes per rank':>20} {'GB per rank':>13}",
    ]
    lines += [
        f"{label:>11} {files:>7} {nbytes:>20,} {nbytes / 1e9:>13.3f}" for label, files, nbytes in _rank_rows(plan)
    ]
    total = plan.total_bytes
    lines += [
        f"total: {total:,} bytes = {total / 1e9:,.2f} GB (1e9) = {total / 2**30:,.2f} GiB (2^30)",
        f"files: {plan.file_count:,} over {len(plan.ranks)} ranks; largest {plan.largest_file_bytes:,} bytes",
    ]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    """`ckptqual plan WORKLOAD [--scale S] [--json]`."""
    from ckptqual.config.run_settings import scaled_plan
    from ckptqual.plan.formats import DEFAULT_FORMAT, formatted_plan
    from ckptqual.plan.workloads import load_workload

    row = setting("scale")
    scale = row.from_command_line(args.scale if args.scale is not None else row.default)
    workload = load_workload(args.workload)
    plan = (
        scaled_plan(workload, scale, "command line" if args.scale is not None else "default")
        if scale != 1
        else workload.plan()
    )
    plan = formatted_plan(plan, workload.format or DEFAULT_FORMAT)  # the files the workload's format writes
    lines = [json.dumps(plan.to_dict(), indent=2)] if args.json else printable_lines(format_plan(plan).splitlines())
    print(*lines, sep="\n")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    """`ckptqual workloads`: every shipped workload with its full-scale checkpoint size."""
    from ckptqual.plan.workloads import available_workloads, load_workload

    print(f"{'workload':<24} {'ranks':>6} {'files':>6} {'GB (1e9)':>12} {'GiB (2^30)':>12}")
    for name in available_workloads():
        plan = load_workload(name).plan()
        total = plan.total_bytes
        sizes = f"{total / 1e9:>12,.2f} {total / 2**30:>12,.2f}"
        print(f"{name:<24} {len(plan.ranks):>6} {plan.file_count:>6} {sizes}")
    return 0


def _run_heading(run: LeftoverRun) -> str:
    """'ckptqual-run-... (PID 1234 on host h, 2 h old, did not finish)'."""
    from ckptqual.host.target import KEPT, format_age

    who = f"PID {run.pid} on host {run.host}, " if run.pid is not None else ""
    status = KEPT if run.kept else "did not finish"
    return f"{run.path.name} ({who}{format_age(run.age_s)} old, {status})"


def _removal_lines(run: LeftoverRun, removal: Removal) -> list[str]:
    """What was removed from one run directory, then each entry left and why, and each error."""
    from ckptqual.host.target import format_bytes

    verb, leave = ("would remove", "would leave") if removal.dry_run else ("removed", "left")
    files = f"{removal.removed_files} file{'' if removal.removed_files == 1 else 's'}"
    lines = [f"{_run_heading(run)}: {verb} {files}, {format_bytes(removal.removed_bytes)}"]
    lines += [f"  {leave} {entry.path}: {entry.why}" for entry in removal.left]
    lines += [f"  error: {error}" for error in removal.errors]
    return lines


def format_cleaning(cleaning: Cleaning) -> str:
    """The report of `ckptqual clean`: per run directory, then the lock file, the marker and a total."""
    from ckptqual.host.target import LOCK_FILE, TARGET_MARKER, describe_holder

    verb = "would remove" if cleaning.dry_run else "removed"
    lines = [line for run, removal in cleaning.runs for line in _removal_lines(run, removal)]
    if cleaning.stale_lock is not None:
        lines.append(f"{verb} the stale lock file {LOCK_FILE} ({describe_holder(cleaning.stale_lock)})")
    if cleaning.marker_removed:
        lines.append(f"{verb} the target marker {TARGET_MARKER}")
    run_errors = {error for _, removal in cleaning.runs for error in removal.errors}
    lines += [f"error: {error}" for error in cleaning.errors if error not in run_errors]
    lines.append(_cleaning_summary(cleaning))
    if any(removal.left for _, removal in cleaning.runs) and not cleaning.dry_run:
        lines.append(
            "a run directory keeps its manifest while anything is left in it: remove the entries left above yourself "
            f"(ckptqual never removes what it did not create), then run again: ckptqual clean {cleaning.target}"
        )
    return "\n".join(lines)


def _cleaning_summary(cleaning: Cleaning) -> str:
    """'/mnt/x: removed 1.31 GB from 1 run directory; 1 entry left (see above)'."""
    from ckptqual.host.target import format_bytes

    removed = format_bytes(sum(removal.removed_bytes for _, removal in cleaning.runs))
    runs = len(cleaning.runs)
    left = sum(len(removal.left) for _, removal in cleaning.runs)
    parts = [f"{'would remove' if cleaning.dry_run else 'removed'} {removed} from {runs} run director{_y_ies(runs)}"]
    if left:
        parts.append(f"{'would leave' if cleaning.dry_run else 'left'} {left} entr{_y_ies(left)} (see above)")
    if cleaning.errors:
        parts.append(f"{len(cleaning.errors)} error{'' if len(cleaning.errors) == 1 else 's'}")
    if cleaning.dry_run:
        parts.append("nothing changed (dry run)")
    elif cleaning.complete:
        parts.append("everything of ckptqual's is gone")
    return f"{cleaning.target}: " + "; ".join(parts)


def _y_ies(count: int) -> str:
    return "y" if count == 1 else "ies"


def cmd_clean(args: argparse.Namespace) -> int:
    """`ckptqual clean TARGET [--dry-run]`: 0 when everything of ckptqual's is gone (or there was nothing), 1 when
    something was left."""
    from ckptqual.host.leftovers import NothingToClean
    from ckptqual.host.target import clean_target

    try:
        cleaning = clean_target(Path(args.target), dry_run=args.dry_run)
    except NothingToClean as nothing:
        print(printable(f"nothing to clean: {nothing}"))
        return 0
    print(*printable_lines(format_cleaning(cleaning).splitlines()), sep="\n")
    return 0 if cleaning.complete else 1


def cmd_summary(args: argparse.Namespace) -> int:
    """`ckptqual summary RESULTS.json`: the run's terminal report again, from its record; 0 only if QUALIFIED."""
    from ckptqual.report.terminal import report_sections, verdict_line

    data = _load_results(Path(args.results))
    for title, lines in report_sections(data):
        print(f"== {title} ==", *lines, sep="\n")
    print(verdict_line(data))
    return 0 if data.get("verdict", {}).get("overall") == "QUALIFIED" else 1


def _load_results(path: Path) -> dict:
    from ckptqual.report.extract import load_run

    return load_run(path).data


def _labelled_runs(files: list[str], pairs: list[str] | None) -> list[Run]:
    """The results files' runs, each labelled by --label LABEL=FILE where given, else by its drive and serial."""
    from ckptqual.report.extract import given_labels, labelled, load_run

    paths = [Path(file) for file in files]
    given = given_labels(pairs or [], paths)
    return labelled([load_run(path) for path in paths], given)


def cmd_report(args: argparse.Namespace) -> int:
    """`ckptqual report RESULTS.json [MORE.json ...] -o DIR`: figures and one self-contained HTML page."""
    from ckptqual.config.outputs import check_report_dir, check_report_inputs
    from ckptqual.report.extract import given_labels, load_run
    from ckptqual.report.html import write_report  # matplotlib loads only for this command
    from ckptqual.report.labels import short_labelled

    output = Path(args.output)
    check_report_dir(output, None, "-o")
    check_report_inputs(output, [("the results file", Path(path)) for path in args.results], "-o")
    paths = [Path(file) for file in args.results]
    runs = short_labelled([load_run(path) for path in paths], given_labels(args.label or [], paths))
    try:
        page = write_report(runs, output)
    except OSError as error:  # something put in a file's way since the check (output_file refuses it)
        raise SettingsError(f"-o {output}: {os_error_line(error, 'write')}") from None
    print(printable(f"ckptqual report: wrote {page} and its figures"))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """`ckptqual compare BASE.json NEW.json`: 0 when every required metric was judged and resolved and none regressed,
    1 when a metric regressed beyond its noise band and the allowance, 3 when a required metric was not judged or not
    resolved (report.gate)."""
    from ckptqual.report.compare import compare_runs, parse_percentage

    allowed = parse_percentage(args.max_regression)
    base, new = _labelled_runs([args.base, args.new], args.label)
    comparison = compare_runs(base, new, allowed, args.metric, args.require)
    print(*printable_lines(comparison.lines), sep="\n")
    return comparison.exit_code


def cmd_mlperf(args: argparse.Namespace) -> int:
    """`ckptqual mlperf RESULTS.json [MORE.json ...]`: MLPerf Storage's checkpoint metrics per run and their mean."""
    from ckptqual.report.extract import load_run
    from ckptqual.report.mlperf import runs_lines

    print(*printable_lines(runs_lines([load_run(Path(path)) for path in args.results])), sep="\n")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    """`ckptqual node --controller HOST:PORT`, started by torchrun on every node: one rank worker of a run over several
    nodes, serving the pytest process at HOST:PORT until it ends the run (and the process)."""
    from ckptqual.runs.node import serve  # torch.distributed loads only for this command

    serve(setting("controller").from_command_line(args.controller), Path(args.secret_file))


_LABEL_HELP = "name the run of results file FILE LABEL (repeatable); default: its drive, firmware and serial"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="ckptqual", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('ckptqual')}")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="how much space one checkpoint of a workload needs")
    plan.add_argument("workload", help="a name from `ckptqual workloads` or a path to a .toml file")
    add_options(plan.add_argument, [setting("scale")], drive_file=False)
    plan.add_argument("--json", action="store_true", help="print CheckpointPlan.to_dict() as JSON")
    plan.set_defaults(func=cmd_plan)
    workloads = commands.add_parser("workloads", help="list the shipped workloads and their sizes")
    workloads.set_defaults(func=cmd_workloads)
    clean = commands.add_parser(
        "clean",
        help="remove what earlier runs that did not finish left on a target (only files they recorded as written)",
    )
    clean.add_argument("target", help="the directory given as --target")
    clean.add_argument("--dry-run", action="store_true", help="only print what would be removed and what would be left")
    clean.set_defaults(func=cmd_clean)
    summary = commands.add_parser("summary", help="print a run's summary and verdict again from its results file")
    summary.add_argument("results", help="the JSON file written by --results")
    summary.set_defaults(func=cmd_summary)
    report = commands.add_parser("report", help="draw figures and one HTML page from one or more results files")
    report.add_argument("results", nargs="+", help="JSON files written by --results (several: drawn side by side)")
    report.add_argument("-o", "--output", required=True, help="directory for report.html and the figures")
    report.add_argument("--label", action="append", metavar="LABEL=FILE", help=_LABEL_HELP)
    report.set_defaults(func=cmd_report)
    compare = commands.add_parser(
        "compare",
        help="compare two results files; exit 1 when a metric regressed beyond its noise band, 3 when a required "
        "metric was not judged or not resolved",
    )
    compare.add_argument("base", help="the results file of the reference run (e.g. the old firmware)")
    compare.add_argument("new", help="the results file of the run under test")
    compare.add_argument(
        "--max-regression", default="5%", help="how much worse a metric may be beyond its noise band (default: 5%%)"
    )
    compare.add_argument(
        "--metric", action="append", help="compare only metrics matching this glob, e.g. 'pass*' (repeatable)"
    )
    compare.add_argument(
        "--require",
        action="append",
        metavar="GLOB",
        help="metrics the gate must judge and resolve, e.g. 'steady' (repeatable); default: those of the parts the "
        "drive file's [verdict] requires",
    )
    compare.add_argument("--label", action="append", metavar="LABEL=FILE", help=_LABEL_HELP)
    compare.set_defaults(func=cmd_compare)
    node = commands.add_parser(
        "node", help="a rank worker of a run over several nodes, started by torchrun (docs/many-nodes.md)"
    )
    node.add_argument("--controller", required=True, metavar="HOST:PORT", help="the run's --controller (node 0)")
    node.add_argument("--secret-file", required=True, metavar="PATH", help="the run's --secret-file (mode 0600)")
    node.set_defaults(func=cmd_node)
    mlperf = commands.add_parser("mlperf", help="MLPerf Storage checkpoint metrics of runs and their mean")
    mlperf.add_argument("results", nargs="+", help="JSON files written by --results, runs of one setup")
    mlperf.set_defaults(func=cmd_mlperf)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; a bad value prints one line to stderr and returns 2."""
    args = build_parser().parse_args(argv)
    from ckptqual.host.target import TargetError
    from ckptqual.plan.workloads import WorkloadError
    from ckptqual.report.compare import CompareError
    from ckptqual.report.extract import ResultsError

    try:
        return args.func(args)
    except (SettingsError, WorkloadError, TargetError, ResultsError, CompareError) as err:
        print(printable(f"ckptqual {args.command}: {err}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
