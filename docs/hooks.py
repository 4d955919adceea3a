"""MkDocs hooks: the parts of the site generated from the code and from benchmarks/ at build time.

A page asks for a generated part with a line of its own, `<!-- generate: NAME -->`:

* `spec`: every key of a job spec, from the pydantic models in `autotuner/spec/keys.py` (types,
  defaults and bounds from the fields, the text from each field's attribute docstring);
* `presets`: the search-space presets, read from `search_spaces/*.yaml`;
* `cli`: `autotuner --help` and each subcommand's help, from the argparse parser the command uses;
* `knobs-pytorch`, `knobs-pytorch-parallel`, `knobs-pytorch-inference`, `knobs-jax`,
  `knobs-jax-inference`: a backend's knob table, from its knobs (their values, `description` and
  `not_run_when`: `autotuner.config.knobs.knob_rows`);
* `benchmarks`: the Results tables of `benchmarks/README.md`, which `benchmarks/tables.py` writes
  from `benchmarks/results/`.

`mkdocs build --strict` fails on a marker it does not know, or a part it cannot generate.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import re
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generate: ([a-z-]+) -->$", re.M)
RESULTS = re.compile(r"^<!-- results:.*?-->\n(.*?)^<!-- results end -->", re.M | re.S)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_path}: no generated part {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


# ------------------------------------------------------------------ the job spec


@functools.cache
def _attribute_docstrings(model: type) -> dict[str, str]:
    """Field name -> the docstring written under it, for `model` and its bases."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls.__module__ in ("builtins", "pydantic.main"):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError):
            continue
        for statement, after in zip(body, body[1:], strict=False):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[statement.target.id] = inspect.cleandoc(after.value.value)
    return found


def _models(annotation: Any) -> list[type]:
    from pydantic import BaseModel

    return [a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)]


def _type_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        parts = [_type_text(a) for a in get_args(annotation) if a is not type(None)]
        return " or ".join(parts) + (" or none" if type(None) in get_args(annotation) else "")
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type):
        from pydantic import BaseModel

        if issubclass(annotation, BaseModel):
            return "mapping (below)"
        return {"int": "integer", "float": "number", "str": "string", "bool": "true or false"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _bounds_text(field: Any) -> str:
    symbols = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = []
    for item in field.metadata:
        for attribute, symbol in symbols.items():
            value = getattr(item, attribute, None)
            if value is not None:
                bounds.append(f"{symbol} {value:,}" if isinstance(value, int) else f"{symbol} {value:g}")
    return ", ".join(bounds)


def _default_text(field: Any) -> str:
    from pydantic import BaseModel

    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    return f"default `{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _model_section(model: type, prefix: str) -> list[str]:
    docstrings = _attribute_docstrings(model)
    lines = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        key = f"{prefix}{name}"
        text = docstrings.get(name)
        if not text:
            raise PluginError(f"spec key {key!r}: its field has no docstring in autotuner/spec/keys.py")
        facts = " · ".join(filter(None, [_type_text(field.annotation), _bounds_text(field), _default_text(field)]))
        lines += [f"`{key}`", f":   {facts}", "", textwrap.indent(text, "    "), ""]
    return lines


def spec_reference() -> str:
    from autotuner.spec.keys import JobSpec

    lines = ["## Top level", ""] + _model_section(JobSpec, "")
    for name, field in JobSpec.model_fields.items():
        for model in _models(field.annotation):
            lines += [f"## `{name}`", ""] + _model_section(model, f"{name}.")
    return "\n".join(lines)


def presets() -> str:
    lines = []
    for path in sorted((ROOT / "search_spaces").glob("*.yaml")):
        space = yaml.safe_load(path.read_text()) or {}
        lines += [f"`{path.stem}`", ""]
        lines += [f"- `{knob}`: {', '.join(f'`{v}`' for v in values)}" for knob, values in space.items()]
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ the command line


def cli_reference() -> str:
    import autotuner.cli

    parser = autotuner.cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {action.dest: action.help for action in commands._choices_actions}
    lines = [inspect.cleandoc(autotuner.cli.__doc__ or "").partition("\n\n")[2], "", _help(parser), ""]
    for name, command in commands.choices.items():
        summary = (summaries.get(name) or "").capitalize()
        lines += [f"## `autotuner {name}`", "", f"{summary}.", "", _help(command), ""]
    return "\n".join(lines)


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)  # type: ignore[assignment]
    return f"```text\n{parser.format_help().rstrip()}\n```"


# ------------------------------------------------------------------ benchmarks


def benchmark_tables() -> str:
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    match = RESULTS.search(readme)
    if match is None:
        raise PluginError("benchmarks/README.md has no generated Results section (<!-- results: ... results end -->)")
    return match.group(1).strip()


# ------------------------------------------------------------------ the knobs


def knob_tables() -> dict[str, Callable[[], str]]:
    """Each knob table a guide shows, by its marker's name."""
    from autotuner.backends.jax import JAX
    from autotuner.backends.jax.inference import JAX_INFERENCE
    from autotuner.backends.pytorch import PARALLEL_KNOBS, PYTORCH
    from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE

    parallel = {knob.name for knobs in PARALLEL_KNOBS.values() for knob in knobs}
    tables = {
        "knobs-pytorch": [k for k in PYTORCH.knobs.values() if k.name not in parallel],
        "knobs-pytorch-parallel": [k for k in PYTORCH.knobs.values() if k.name in parallel],
        "knobs-pytorch-inference": list(PYTORCH_INFERENCE.knobs.values()),
        "knobs-jax": list(JAX.knobs.values()),
        "knobs-jax-inference": list(JAX_INFERENCE.knobs.values()),
    }
    return {name: functools.partial(_table, knobs) for name, knobs in tables.items()}


def _table(knobs: list[Any]) -> str:
    from autotuner.config.knobs import knob_rows

    return "\n".join(knob_rows(knobs))


GENERATORS = {
    "spec": spec_reference,
    "presets": presets,
    "cli": cli_reference,
    "benchmarks": benchmark_tables,
    **knob_tables(),
}
