"""Finding the user's workload factory from its import path.

The path in a spec (`package.module:function`) is trusted code, like a pytest conftest: it is
imported and called in trial processes. Nothing else in a spec is ever executed.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class WorkloadImportError(ImportError):
    """The workload factory named in the spec cannot be found or is not callable."""


def is_import_path(ref: str) -> bool:
    return bool(_PATH.fullmatch(ref))


def load_factory(ref: str) -> Callable[..., Any]:
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


def workload_problem(
    ref: str, args: dict[str, Any] | None, build: Callable[[Callable[..., Any]], object]
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
