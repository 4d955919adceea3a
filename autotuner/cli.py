"""The `autotuner` command: parses arguments and hands each command to its handler
(`autotuner.commands`), which hands it to the module that owns it.

Exit codes: 0 done; 1 no feasible config, or a backend failed; 2 bad input (one line, no
traceback); 130 interrupted (Ctrl-C, or SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from autotuner.commands import cmd_apply, cmd_dashboard, cmd_env, cmd_export, cmd_logs, cmd_report, cmd_search
from autotuner.errors import AutotunerError, shown


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, like every other bad input
        line = message.replace("\r", "\\r").replace("\n", "\\n")  # an argument may hold a line break
        self.exit(2, f"autotuner: error: {line}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _study_name(text: str) -> str:
    from autotuner.spec.keys import NAME, NAME_RULE

    if not NAME.fullmatch(text):  # it names the folder runs/<name>/: never a path
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a study name: it {NAME_RULE}")
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


Commands = argparse._SubParsersAction  # the subcommands' parsers (`_Parser`s)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autotuner", description="Find the fastest training config that keeps the job's numerics.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _search_command(commands)
    _apply_command(commands)
    _export_command(commands)
    _report_command(commands)
    _dashboard_command(commands)
    _logs_command(commands)
    _env_command(commands)
    return parser


def _search_command(commands: Commands) -> None:
    """`autotuner search`: run (or resume) a study."""
    search = commands.add_parser("search", help="run (or resume) the study of a job spec")
    search.add_argument("--spec", required=True, help="the job spec (YAML)")
    search.add_argument(
        "--storage", help="SQLAlchemy URL of the study's storage (default: sqlite:///runs/<name>/study.db)"
    )
    search.add_argument(
        "--trials", type=_positive_int, help="trials to run in the whole study (overrides budget.trials)"
    )
    search.add_argument(
        "--timeout", type=_positive_float, help="seconds of trials for the whole study (overrides budget.timeout)"
    )
    search.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the profile of the best config and the baseline after the search (profile.steps: 0)",
    )
    placement = search.add_mutually_exclusive_group()
    placement.add_argument("--device", help="auto, cpu, cuda or cuda:N for this worker (overrides the spec's device)")
    placement.add_argument(
        "--jobs",
        type=_positive_int,
        help="start N workers on this machine's GPUs, each with a trial's GPUs to itself (1, or the spec's processes)",
    )
    placement.add_argument(
        "--node-rank",
        type=_positive_int,
        metavar="R",
        help="with the spec's nodes: M, run node R's ranks (1 to M-1) of every trial node 0's search hands out; "
        "node 0 is the search run without it",
    )
    search.add_argument(
        "--warm-start",
        metavar="STUDY_DB",
        help="an earlier study (runs/<name>/study.db or a storage URL: another machine, an earlier version of the "
        "job) whose best configs are tried first; nothing it measured counts here",
    )
    search.add_argument(
        "--warm-start-study",
        metavar="NAME",
        type=_study_name,
        help="the study to take, where --warm-start holds several",
    )
    search.set_defaults(handler=cmd_search)


def _apply_command(commands: Commands) -> None:
    """`autotuner apply`: run the job with an exported config and check its promise."""
    apply = commands.add_parser("apply", help="run the job with an exported config; compare its throughput")
    apply.add_argument("config", help="the exported config (runs/<name>/best.yaml or .json)")
    apply.add_argument("--spec", required=True, help="the job spec the config was tuned for")
    apply.add_argument(
        "--steps",
        type=_positive_int,
        help="optimizer steps its timed windows cover (default: 10x a trial's windows, each lengthened as the study's)",
    )
    apply.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: the spec's device)")
    apply.add_argument("--force", action="store_true", help="run it even if tuned for another job or other hardware")
    apply.add_argument(
        "--no-baseline",
        action="store_true",
        help="do not run the baseline (by default it runs the same steps beside it, then rounds of both as the study "
        "re-measured them, to check the export's speedup and its interval)",
    )
    apply.add_argument(
        "--tolerance",
        type=_positive_float,
        help="how far beyond the export's interval the speedup here may be, as a factor either way, for the promise "
        "to be kept (default 0.10: between its low end / 1.10 and its high end x 1.10). "
        "Exit code 0: kept; 1: not kept; 3: undecided after the rounds",
    )
    apply.add_argument(
        "--rounds",
        type=_positive_int,
        help="the most rounds the promise check runs while it cannot decide (default: the spec's "
        "budget.remeasure_runs)",
    )
    apply.set_defaults(handler=cmd_apply)


def _export_command(commands: Commands) -> None:
    """`autotuner export`: the best config and its evidence, or a trainer's arguments."""
    from autotuner.backends import export_formats, formats_help

    formats = export_formats()

    export = commands.add_parser("export", help="write the best config and its evidence from the storage")
    export.add_argument("--spec", help="the job spec (gives the study name and storage)")
    export.add_argument("--study", type=_study_name, help="study name, with --storage, when there is no spec at hand")
    export.add_argument("--storage", help="SQLAlchemy URL of the study's storage")
    export.add_argument(
        "--format",
        choices=("yaml", "json", *formats),
        default="yaml",
        help=f"yaml, json; {formats_help(formats)}",
    )
    export.add_argument("--top", type=_positive_int, help="also list the K best feasible configs (written as `top`)")
    export.add_argument(
        "-o", "--output", help="where to write (default: runs/<name>/best.<format>, best.<format>.py for a trainer)"
    )
    export.set_defaults(handler=cmd_export)


def _report_command(commands: Commands) -> None:
    """`autotuner report`: one page of the study."""
    report = commands.add_parser("report", help="write one self-contained page (HTML or markdown) of the study")
    report.add_argument("--spec", help="the job spec (gives the study name and storage)")
    report.add_argument("--study", type=_study_name, help="study name, with --storage, when there is no spec at hand")
    report.add_argument("--storage", help="SQLAlchemy URL of the study's storage")
    report.add_argument("--format", choices=("html", "md"), default="html", help="md: for a pull-request comment")
    report.add_argument("-o", "--output", help="where to write (default: runs/<name>/report.<format>)")
    report.set_defaults(handler=cmd_report)


def _dashboard_command(commands: Commands) -> None:
    """`autotuner dashboard`: optuna-dashboard on the study."""
    dashboard = commands.add_parser("dashboard", help="serve optuna-dashboard for the study (127.0.0.1 unless --host)")
    dashboard.add_argument("--spec", help="the job spec (gives the storage)")
    dashboard.add_argument("--storage", help="SQLAlchemy URL of the storage")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    dashboard.add_argument("--port", type=_positive_int, default=8080)
    dashboard.set_defaults(handler=cmd_dashboard)


def _logs_command(commands: Commands) -> None:
    """`autotuner logs`: what a trial's processes wrote."""
    logs = commands.add_parser("logs", help="print what a trial's processes wrote (runs/<name>/logs/)")
    logs.add_argument("name", nargs="?", help="a trial's number, or reference, probe, apply; none: list the logs")
    logs.add_argument("--spec", required=True, help="the job spec (gives the study's folder)")
    logs.set_defaults(handler=cmd_logs)


def _env_command(commands: Commands) -> None:
    """`autotuner env`: the device, versions, capabilities and fingerprint."""
    from autotuner.backends import BACKENDS

    env = commands.add_parser("env", help="print the device, versions, capabilities and the study fingerprint")
    env.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    env.add_argument("--backend", default="pytorch", choices=tuple(BACKENDS))
    env.set_defaults(handler=cmd_env)


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # `kill`, a batch scheduler's SIGTERM: stop as Ctrl-C stops


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(args.handler(args))
    except AutotunerError as exc:
        print(f"autotuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autotuner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
