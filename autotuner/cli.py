"""The `autotuner` command: parses arguments and hands each command to the module that owns it.

Exit codes: 0 done; 1 no feasible config, or a backend failed; 2 bad input (one line, no
traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

from autotuner.errors import AutotunerError, SpecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, like every other bad input
        self.exit(2, f"autotuner: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def cmd_search(args: argparse.Namespace) -> int:
    from autotuner.search import Search
    from autotuner.spec import load_spec

    job = load_spec(args.spec)
    return Search(job, storage=args.storage, trials=args.trials, timeout=args.timeout).run().exit_code


def cmd_export(args: argparse.Namespace) -> int:
    import optuna

    from autotuner.export import export_data, export_path, write_export
    from autotuner.spec import load_spec
    from autotuner.study import open_storage

    if args.spec:
        job = load_spec(args.spec)
        name, url, default = job.name, job.storage_url(args.storage), args.storage is None and job.spec.storage is None
    elif args.study and args.storage:
        name, url, default = args.study, args.storage, False
    else:
        raise SpecError("give --spec, or --study with --storage")
    storage = open_storage(url, default=default)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise SpecError(f"no study {name!r} in {url}", key="name") from None
    path = write_export(
        export_data(study, url), Path(args.output) if args.output else export_path(name, args.format), args.format
    )
    print(path)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from autotuner.environment import describe
    from autotuner.search import make_launcher, probe_environment
    from backends import BACKENDS

    backend = BACKENDS[args.backend]
    workload = backend.resolve_workload(f"builtin:{next(iter(backend.builtin_workloads))}")
    environment = probe_environment(make_launcher(backend), backend, args.device, workload, "--device")
    table = Table(show_header=False, title="autotuner environment")
    for what, value in describe(environment):
        table.add_row(what, value)
    Console(highlight=False).print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autotuner", description="Find the fastest training config that keeps the job's numerics.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    search = commands.add_parser("search", help="run (or resume) the study of a job spec")
    search.add_argument("--spec", required=True, help="the job spec (YAML)")
    search.add_argument(
        "--storage", help="SQLAlchemy URL of the study's storage (default: sqlite:///studies/<name>.db)"
    )
    search.add_argument(
        "--trials", type=_positive_int, help="trials to run in the whole study (overrides budget.trials)"
    )
    search.add_argument(
        "--timeout", type=_positive_float, help="seconds of trials for the whole study (overrides budget.timeout)"
    )
    search.set_defaults(handler=cmd_search)

    export = commands.add_parser("export", help="write the best config and its evidence from the storage")
    export.add_argument("--spec", help="the job spec (gives the study name and storage)")
    export.add_argument("--study", help="study name, with --storage, when there is no spec at hand")
    export.add_argument("--storage", help="SQLAlchemy URL of the study's storage")
    export.add_argument("--format", choices=("yaml", "json"), default="yaml")
    export.add_argument("-o", "--output", help="where to write (default: studies/<name>.best.<format>)")
    export.set_defaults(handler=cmd_export)

    env = commands.add_parser("env", help="print the device, versions, capabilities and the study fingerprint")
    env.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    env.add_argument("--backend", default="pytorch", choices=("pytorch",))
    env.set_defaults(handler=cmd_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
