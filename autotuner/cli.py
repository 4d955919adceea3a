"""The `autotuner` command: parses arguments and hands each command to the module that owns it.

Exit codes: 0 done; 1 no feasible config, or a backend failed; 2 bad input (one line, no
traceback); 130 interrupted (Ctrl-C, or SIGTERM).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console
from rich.table import Table

from autotuner.errors import AutotunerError, SpecError, shown

if TYPE_CHECKING:
    from autotuner.backends import ExportFormat
    from autotuner.export.file import ExportFile


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


def cmd_search(args: argparse.Namespace) -> int:
    from autotuner.search.loop import Search
    from autotuner.search.warm_start import EarlierStudy
    from autotuner.spec.job import load_spec

    job = load_spec(args.spec)
    earlier = job.earlier_default_storage(args.storage)
    if earlier is not None:
        print(
            f"autotuner: note: this study was stored at {earlier.removeprefix('sqlite:///')} before results moved "
            f"to {job.output_dir()}/; a new study starts there. To resume the stored one: --storage {earlier}",
            file=sys.stderr,
        )
    if args.jobs and args.jobs > 1:
        from autotuner.workers.multi_gpu import search_on_gpus

        passthrough = [
            *(["--storage", args.storage] if args.storage else []),
            *(["--trials", str(args.trials)] if args.trials else []),
            *(["--timeout", str(args.timeout)] if args.timeout else []),
            *(["--no-profile"] if args.no_profile else []),
            *(["--warm-start", args.warm_start] if args.warm_start else []),
            *(["--warm-start-study", args.warm_start_study] if args.warm_start_study else []),
        ]
        return search_on_gpus(job, args.jobs, passthrough)
    search = Search(
        job,
        storage=args.storage,
        trials=args.trials,
        timeout=args.timeout,
        device=args.device,
        profile=not args.no_profile,
        warm_start=EarlierStudy(args.warm_start, args.warm_start_study) if args.warm_start else None,
    )
    return search.run().exit_code


def cmd_apply(args: argparse.Namespace) -> int:
    from autotuner.export.reader import load_config
    from autotuner.output.apply_console import print_applied
    from autotuner.results.promise import EXIT_CODES, TOLERANCE
    from autotuner.search.apply_run import ApplyOptions, apply_config
    from autotuner.spec.job import load_spec

    tuned = load_config(args.config)
    job = load_spec(args.spec)
    options = ApplyOptions(
        steps=args.steps,
        device=args.device,
        force=args.force,
        baseline=not args.no_baseline,
        tolerance=TOLERANCE if args.tolerance is None else args.tolerance,
        rounds=args.rounds,
    )
    applied = apply_config(tuned, job, options, note=lambda text: print(f"autotuner: {text}", file=sys.stderr))
    print_applied(applied)
    return EXIT_CODES[applied.verdict] if applied.verdict is not None else 0


def cmd_export(args: argparse.Namespace) -> int:
    import optuna

    from autotuner.backends import export_formats
    from autotuner.export.writer import export_data, export_path, write_export
    from autotuner.output.formatting import format_config
    from autotuner.spec.job import load_spec
    from autotuner.study.storage import open_storage

    if (fmt := export_formats().get(args.format)) is not None:
        fmt.require()  # before any storage is opened: say what to install at once
    if args.spec:
        job = load_spec(args.spec)
        name, url, default = job.name, job.storage_url(args.storage), args.storage is None and job.spec.storage is None
    elif args.study and args.storage:
        name, url, default = args.study, args.storage, False
    else:
        raise SpecError("give --spec, or --study with --storage")
    storage = open_storage(url, default=default, create=False)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise SpecError(f"no study {name!r} in {url}", key="name") from None
    export = export_data(study, url, top=args.top or 0)
    if fmt is not None:
        return _export_files(export, name, fmt, args) if fmt.files else _export_code(export, name, fmt, args)
    path = write_export(export, Path(args.output) if args.output else export_path(name, args.format), args.format)
    for entry in export.top or []:
        print(f"{entry.rank:>3}. #{entry.trial} {format_config(entry.params)}: {entry.throughput:,.0f}/s")
    print(path)
    return 0


def _export_code(export: ExportFile, name: str, fmt: ExportFormat, args: argparse.Namespace) -> int:
    """Print the best config as a trainer's arguments, in Python, and write it to a file."""
    from autotuner.export.reader import parse_config
    from autotuner.export.writer import export_path, write_text

    code = fmt.snippet(parse_config(export.as_data(), f"study {name}"))
    path = write_text(code, Path(args.output) if args.output else export_path(name, f"{args.format}.py"))
    print(code, end="")
    print(path)
    return 0


def _export_files(export: ExportFile, name: str, fmt: ExportFormat, args: argparse.Namespace) -> int:
    """Write the best config in a format of files built from the job (an inference winner on ONNX
    Runtime: its model and session settings)."""
    from autotuner.export.reader import parse_config
    from autotuner.export.writer import export_path
    from autotuner.spec.job import load_spec

    if not args.spec:
        raise SpecError(
            f"--format {args.format} builds the model from the job: give --spec", key=f"--format {args.format}"
        )
    tuned = parse_config(export.as_data(), f"study {name}")
    path = Path(args.output) if args.output else export_path(name, args.format)
    for written in fmt.write(tuned, load_spec(args.spec), path):
        print(written)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotuner.output.pages import report_path, write_report
    from autotuner.output.report import load_report
    from autotuner.spec.job import load_spec

    if args.spec:
        job = load_spec(args.spec)
        name, url = job.name, job.storage_url(args.storage)
    elif args.study and args.storage:
        name, url = args.study, args.storage
    else:
        raise SpecError("give --spec, or --study with --storage")
    report = load_report(url, name)
    print(write_report(report, Path(args.output) if args.output else report_path(name, args.format), args.format))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from autotuner.spec.job import load_spec

    folder = load_spec(args.spec).output_dir() / "logs"
    logs = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime)
    if args.name is None:
        names: dict[str, list[Path]] = {}
        for path in logs:
            names.setdefault(path.name.split(".")[0], []).append(path)
        for name in sorted(names, key=_log_order):
            size = sum(p.stat().st_size for p in names[name])
            print(f"{name:<16} {len(names[name]):>3} processes {size:>10,} bytes")
        if not names:
            print(f"no process wrote anything: {folder} holds no log")
        return 0
    name = f"trial-{args.name}" if args.name.isdigit() else args.name
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise SpecError(
            f"{shown(args.name)} is no log's name: a trial's number, or reference, probe, apply", key="logs"
        )
    found = [path for path in logs if path.name.split(".")[0] == name]
    if not found:
        raise SpecError(
            f"no log of {name} in {folder} (a process that wrote nothing leaves none; a trial run by a worker on "
            "another machine keeps its log there)",
            key="logs",
        )
    for path in found:  # each process's, oldest first
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
        sys.stdout.write(f"--- {path} (last written {when})\n{path.read_text(errors='replace')}")
    return 0


def _log_order(name: str) -> tuple[int, int, str]:
    """Trials by number first, then the others by name."""
    number = name.removeprefix("trial-")
    return (0, int(number), "") if number.isdigit() else (1, 0, name)


def cmd_env(args: argparse.Namespace) -> int:
    from autotuner.backends import BACKENDS
    from autotuner.study.fingerprint import describe
    from autotuner.trials.request import ProbeRequest

    backend = BACKENDS[args.backend]
    missing = backend.missing_requirements()
    if missing:
        raise SpecError(missing, key="--backend")
    workload = backend.resolve_workload(f"builtin:{next(iter(backend.builtin_workloads))}")
    environment = backend.probe(backend.launcher(), ProbeRequest(args.device, workload), "--device")
    table = Table(show_header=False, title="autotuner environment")
    for what, value in describe(environment):
        table.add_row(what, value)
    Console(highlight=False).print(table)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autotuner.output.dashboard import serve
    from autotuner.spec.job import load_spec

    if args.spec:
        url = load_spec(args.spec).storage_url(args.storage)
    elif args.storage:
        url = args.storage
    else:
        raise SpecError("give --spec, or --storage with the study's database URL")
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise SpecError(
            f"no study database at {url.removeprefix('sqlite:///')}; run autotuner search first", key="storage"
        )
    serve(url, args.host, args.port)
    return 0


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
