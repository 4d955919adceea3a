"""Finding the user's workload factory from its import path.

The path in a spec (`package.module:function`) is trusted code, like a pytest conftest: it is
imported and called in trial processes. Nothing else in a spec is ever executed.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class WorkloadImportError(ImportError):
    """The workload factory named in the spec cannot be found or is not callable."""


def is_import_path(ref: str) -> bool:
    return bool(_PATH.fullmatch(ref))


def load_factory(ref: str) -> Callable[..., object]:
    """Import `package.module:function` and return the function."""
    if not is_import_path(ref):
        raise WorkloadImportError(f"{ref!r} is not of the form package.module:function")
    module_name, _, attribute = ref.partition(":")
    if "" not in sys.path:  # a factory next to the spec, run from its folder, must import
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise WorkloadImportError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise WorkloadImportError(f"module {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise WorkloadImportError(f"{ref!r} is not callable")
    return factory


PRELOADABLE = frozenset(
    {"transformers", "peft", "datasets", "accelerate", "timm", "diffusers", "torchao", "flax", "optax", "equinox"}
)
"""Libraries a trial fork server may import once for all the trials it starts, when a workload
factory's module imports them: importing them initialises no device (no CUDA context, no JAX
backend), so the processes forked after it are as fresh as before, and each trial is spared the
import (transformers takes seconds). A job's own modules are never imported outside its trials."""


def preloadable_imports(ref: str) -> list[str]:
    """The `PRELOADABLE` libraries that the module of the factory `ref` imports anywhere in it,
    read from its source (found on `sys.path` as `load_factory` would find it, not imported), in
    the order found; none where it cannot be found or read."""
    if not is_import_path(ref):
        return []
    parts = ref.partition(":")[0].split(".")
    for folder in ("", *sys.path):
        base = Path(folder or ".").joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"))
                except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                    return []
                return list(dict.fromkeys(_in_order(tree)))
    return []


def _in_order(tree: ast.AST) -> list[str]:
    """The `PRELOADABLE` top-level packages `tree` imports (absolute imports, at any depth)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module.split(".")[0])
    return [name for name in names if name in PRELOADABLE]


def workload_problem(
    ref: str, args: Mapping[str, object] | None, build: Callable[[Callable[..., object]], object]
) -> str | None:
    """Why the workload `ref` cannot be used, in one line, or None: its factory does not import,
    or, given its `args`, `build(factory)` (the backend's own check of what the factory returns)
    raises."""
    try:
        factory = load_factory(ref)
        if args is not None:
            build(factory)
    except WorkloadImportError as exc:
        return str(exc)
    except Exception as exc:  # the factory's own error, or what it returned
        problem = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return f"{ref} does not build a workload: {problem}"
    return None
