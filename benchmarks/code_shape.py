"""The code's shape, read from its syntax trees: how much of it is untyped, how large its modules
and functions are, and where the engine branches on a knob's name or a task.

    python benchmarks/code_shape.py [--out code_shape.json]

Reads every module of `autotuner/` and `backends/` with `ast` (nothing is imported) and counts:

- lines (every line of the file, as `wc -l` does) and, per module, its lines;
- `Any`: each use of the name `Any` in code or an annotation (not its import), in all and per
  1,000 lines; `dict[str, Any]`: each such subscript;
- modules over `MODULE_LINES` lines; functions (methods included) over `FUNCTION_LINES` lines,
  from their `def` to their last line, or with more than `PARAMETERS` parameters (`self` and
  `cls` not counted, `*args` and `**kwargs` each one);
- `type: ignore` comments;
- in the engine (`autotuner/`; the backends are `backends/`): the string literals that are a
  knob's name (every backend's tables), docstrings left out; and the comparisons with a knob's
  name, or of a `task` or `runtime` (a name or an attribute) with a string literal: the branches
  that name a knob, a task or a runtime in code that is meant to name none.

Writes benchmarks/results/code_shape.json (or `--out`): the totals and the lists, largest first.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path
from typing import Any

from _harness import write_results

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotuner", "backends")
MODULE_LINES = 400
FUNCTION_LINES = 80
PARAMETERS = 8
TASK_NAMES = ("task", "runtime")
"""A comparison of one of these (a name, or an attribute of that name) with a string literal is a
branch on a task or a runtime."""


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def _is_dict_str_any(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "dict"):
        return False
    key = node.slice
    return (
        isinstance(key, ast.Tuple)
        and len(key.elts) == 2
        and isinstance(key.elts[0], ast.Name)
        and key.elts[0].id == "str"
        and _is_any(key.elts[1])
    )


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    count = len([a for a in named if a.arg not in ("self", "cls")])
    return count + (args.vararg is not None) + (args.kwarg is not None)


def knob_names() -> set[str]:
    """Every backend's knobs' names (the backends' tables, imported: they import no framework)."""
    from autotuner.backends import BACKENDS

    return {name for backend in BACKENDS.values() for name in backend.knobs}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (a module's, a class's, a function's,
    or an attribute's: a bare string statement)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _branch(node: ast.Compare, knobs: set[str]) -> str | None:
    """`knob == "compile"`, `"compile" in config` or `spec.task != "inference"`: what is compared."""
    sides = [node.left, *node.comparators]
    literal = next((s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)), None)
    if literal is None:
        return None
    if literal in knobs:
        return f"knob {literal!r}"
    for side in sides:
        name = side.id if isinstance(side, ast.Name) else side.attr if isinstance(side, ast.Attribute) else None
        if name in TASK_NAMES:
            return f"{name} {literal!r}"
    return None


def _engine(relative: str) -> bool:
    """The engine: `autotuner/` without the backends' code (`backends/` is installed as
    `autotuner.backends`)."""
    return relative.startswith("autotuner/")


def shape_of(path: Path, knobs: set[str], relative: str | None = None) -> dict[str, Any]:
    """One module's figures; `relative`, its path from the repository's root, says whether it is
    the engine's (by default, where `path` is)."""
    text = path.read_text()
    tree = ast.parse(text)
    relative = relative or str(path.relative_to(ROOT))
    lines = text.count("\n")
    functions = []
    branches = []
    literals = 0
    docstrings = _docstrings(tree)
    anys = dict_str_any = 0
    for node in ast.walk(tree):
        if _is_any(node):
            anys += 1
        if _is_dict_str_any(node):
            dict_str_any += 1
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            functions.append(
                {"function": f"{relative}:{node.lineno} {node.name}", "lines": length, "parameters": _parameters(node)}
            )
        if not _engine(relative):
            continue
        if isinstance(node, ast.Compare) and (branch := _branch(node, knobs)):
            branches.append(f"{relative}:{node.lineno} {branch}")
        if isinstance(node, ast.Constant) and node.value in knobs and id(node) not in docstrings:
            literals += 1
    ignores = sum(
        1
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT and "type: ignore" in token.string
    )
    return {
        "module": relative,
        "lines": lines,
        "any": anys,
        "dict_str_any": dict_str_any,
        "functions": functions,
        "branches": branches,
        "knob_literals": literals,
        "type_ignores": ignores,
    }


def measure() -> dict[str, Any]:
    knobs = knob_names()
    shapes = [shape_of(path, knobs) for path in modules()]
    lines = sum(s["lines"] for s in shapes)
    anys = sum(s["any"] for s in shapes)
    functions = [f for s in shapes for f in s["functions"]]
    return {
        "packages": list(PACKAGES),
        "modules": len(shapes),
        "lines": lines,
        "any": anys,
        "any_per_1000_lines": round(1000 * anys / lines, 1),
        "dict_str_any": sum(s["dict_str_any"] for s in shapes),
        "type_ignores": sum(s["type_ignores"] for s in shapes),
        "limits": {"module_lines": MODULE_LINES, "function_lines": FUNCTION_LINES, "parameters": PARAMETERS},
        "modules_over": sorted(
            ({"module": s["module"], "lines": s["lines"]} for s in shapes if s["lines"] > MODULE_LINES),
            key=lambda m: -m["lines"],
        ),
        "functions_over_lines": sorted(
            (f for f in functions if f["lines"] > FUNCTION_LINES), key=lambda f: -f["lines"]
        ),
        "functions_over_parameters": sorted(
            (f for f in functions if f["parameters"] > PARAMETERS), key=lambda f: -f["parameters"]
        ),
        "engine_branches": [b for s in shapes for b in s["branches"]],
        "engine_knob_literals": sum(s["knob_literals"] for s in shapes),
        "by_module": sorted(
            ({"module": s["module"], "lines": s["lines"], "any": s["any"]} for s in shapes),
            key=lambda m: -m["lines"],
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="code_shape.json")
    args = parser.parse_args()
    shape = measure()
    print(
        f"{shape['modules']} modules, {shape['lines']:,} lines; Any {shape['any']} "
        f"({shape['any_per_1000_lines']} per 1,000 lines); dict[str, Any] {shape['dict_str_any']}; "
        f"type: ignore {shape['type_ignores']}; modules over {MODULE_LINES} lines {len(shape['modules_over'])}; "
        f"functions over {FUNCTION_LINES} lines {len(shape['functions_over_lines'])}, over {PARAMETERS} "
        f"parameters {len(shape['functions_over_parameters'])}; in the engine, knob-name literals "
        f"{shape['engine_knob_literals']} and knob, task or runtime branches {len(shape['engine_branches'])}"
    )
    write_results(args.out, shape)


if __name__ == "__main__":
    main()
