"""What each `autotuner` command does, once `autotuner.cli` has parsed its arguments: one handler
a command, each importing what it needs when it runs, so that parsing the command line loads
none of the study loop."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from autotuner.errors import SpecError, shown

if TYPE_CHECKING:
    from autotuner.backends import ExportFormat
    from autotuner.export.file import ExportFile


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
    if args.node_rank:
        from autotuner.workers.nodes import follow

        return follow(job, args.node_rank, note=lambda text: print(f"autotuner: {text}", file=sys.stderr, flush=True))
    if job.spec.nodes > 1 and args.jobs and args.jobs > 1:
        raise SpecError(
            f"--jobs starts workers on this machine's GPUs; with nodes: {job.spec.nodes}, start one "
            "search a node (--node-rank R on the others)",
            key="--jobs",
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
