"""autotuner installs one import package: `backends/` and `search_spaces/` keep their top-level
folders but import as `autotuner.backends` and `autotuner.search_spaces`. Its subpackages are the
stages of the engine, layered: a module imports only from its own layer and those below."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.helpers import ROOT


@pytest.mark.slow
def test_outside_the_checkout_only_autotuner_imports(tmp_path: Path) -> None:
    script = """
import importlib, importlib.util
for name in ("backends", "search_spaces"):
    assert importlib.util.find_spec(name) is None, name
import autotuner.backends.pytorch.runner, autotuner.backends.jax
import autotuner.search_spaces as presets
assert "pytorch" in presets.available() and presets.load_preset("pytorch")["precision"]
print("one package")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "one package" in done.stdout, done.stderr[-2000:]


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("autotuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "autotuner",
        next(n.split("/")[0] for n in names if ".dist-info/" in n),
    }
    assert "autotuner/backends/pytorch/runner.py" in names and "autotuner/search_spaces/pytorch.yaml" in names
    # every package of the checkout is in it
    installed_as = {"autotuner": "autotuner", "backends": "autotuner/backends"}
    on_disk = {
        f"{under}/{init.relative_to(ROOT / folder).as_posix()}"
        for folder, under in installed_as.items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert on_disk - set(names) == set()
    # which pyproject.toml lists one by one (a build folder left from before can hide one it lacks)
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert {name.removesuffix("/__init__.py").replace("/", ".") for name in on_disk} - listed == set()


@pytest.mark.slow
def test_a_training_loop_that_applies_a_config_does_not_load_the_study_loop(tmp_path: Path) -> None:
    """A user's loop imports `load_config` and a backend's `TunedTraining`; a trial process imports
    the backend's runner. Neither needs Optuna, SQLAlchemy or the study loop, and the package's
    own `__init__` imports none of them."""
    script = (
        "import sys\n"
        "import autotuner.apply, autotuner.backends.pytorch.apply, autotuner.backends.pytorch.runner\n"
        "heavy = [m for m in ('optuna', 'sqlalchemy', 'autotuner.search.loop', 'autotuner.cli') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _package_modules() -> dict[str, Path]:
    """Every module of the installed `autotuner` package, `autotuner.backends...` included, by name:
    the modules of each package that pyproject.toml installs, found where the install put them."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    modules: dict[str, Path] = {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None and spec.submodule_search_locations, package
        modules[package] = Path(spec.origin)
        for info in pkgutil.iter_modules(spec.submodule_search_locations):
            if not info.ispkg:
                found = importlib.util.find_spec(f"{package}.{info.name}")
                assert found is not None and found.origin is not None, info.name
                modules[f"{package}.{info.name}"] = Path(found.origin)
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The `autotuner` modules that module `name` imports at module level (under `if TYPE_CHECKING:`
    too): the import statements outside any function or class body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule, when it is one
            elif isinstance(node, ast.If | ast.Try | ast.With):  # still module level: `if TYPE_CHECKING:`
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return {module for module in found if module in modules and module != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the modules along it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node))), None)


def test_the_package_has_no_import_cycle() -> None:
    """Module-level imports between the modules of `autotuner` (type-only ones included) form no
    cycle; an import inside a function is deferred on purpose and not counted."""
    modules = _package_modules()
    assert {"autotuner.search.loop", "autotuner.backends.pytorch.runner"} <= set(modules)
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    assert "autotuner.backends.pytorch" in graph["autotuner.backends"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


LAYERS = (
    "autotuner.errors",
    "autotuner.config",
    "autotuner.measurement",
    "autotuner.trials",
    "autotuner.search_spaces",
    "autotuner.backends",
    "autotuner.spec",
    "autotuner.study",
    "autotuner.results",
    "autotuner.proposals",
    "autotuner.workers",
    "autotuner.output",
    "autotuner.export",
    "autotuner.backends.pytorch.integrations",
    "autotuner.search",
    "autotuner",
)
"""The engine's layers, lowest first (`docs/architecture.md` draws them). A backend's export formats
(`autotuner export --format`) live in its package but write an exported config, so they sit above
the export layer. The last is the package's public face: `autotuner/__init__.py`, the command line,
`autotuner.apply`."""


def _layer(module: str) -> int:
    """The index in `LAYERS` of the layer `module` belongs to: the longest that names it or a package above it."""
    named = [i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")]
    return max(named, key=lambda i: len(LAYERS[i]))


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every module-level import of `graph` from a lower layer to a higher one."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if _layer(b) > _layer(a))


def _subpackages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between the layers of `graph`'s modules, by layer name (a layer's own left out)."""
    edges: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for a, targets in graph.items():
        edges[LAYERS[_layer(a)]].update(LAYERS[_layer(b)] for b in targets if _layer(b) != _layer(a))
    return edges


def test_the_subpackages_are_layers_and_no_module_imports_upward() -> None:
    """Every module of the package is in one of the `LAYERS`; the imports between layers form no
    cycle, and none goes from a layer to a higher one (type-only imports included: a layer's
    types are read by the layers above it, not below)."""
    modules = _package_modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    assert _layer("autotuner.search.loop") == LAYERS.index("autotuner.search")
    assert _layer("autotuner.cli") == len(LAYERS) - 1
    assert _layer("autotuner.backends.pytorch.apply") == LAYERS.index("autotuner.backends")
    formats = LAYERS.index("autotuner.backends.pytorch.integrations")
    assert _layer("autotuner.backends.pytorch.integrations.transformers") == formats > LAYERS.index("autotuner.export")
    assert _upward({"autotuner.trials.training": {"autotuner.spec.job"}}) == [
        "autotuner.trials.training -> autotuner.spec.job"
    ]
    stray = [name for name in modules if _layer(name) == len(LAYERS) - 1 and name.count(".") > 1]
    assert stray == [], stray  # the public face is top-level modules; packages are layers of their own
    assert _upward(graph) == []
    cycle = _cycle(_subpackages(graph))
    assert cycle is None, "the layers import each other: " + " -> ".join(cycle or [])


ENGINE = (
    "autotuner.errors",
    "autotuner.config",
    "autotuner.measurement",
    "autotuner.trials",
    "autotuner.spec",
    "autotuner.study",
    "autotuner.results",
    "autotuner.proposals",
    "autotuner.workers",
    "autotuner.output",
    "autotuner.export",
    "autotuner.search",
)
"""The engine's layers: every one but the presets, the backends, the export formats and the public face."""
FRAMEWORKS = (
    "torch",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "transformers",
    "peft",
    "onnx",
    "onnxruntime",
    "torchao",
    "lightning",
    "pytorch_lightning",
    "accelerate",
    "autotuner.backends.pytorch",
    "autotuner.backends.jax",
)
"""What only a backend imports: the frameworks, their libraries, and the backends' own packages
(numpy is not one: the engine's statistics use it)."""


def _framework_imports(name: str, path: Path, source: str | None = None) -> list[str]:
    """`path:line name` for each import of a `FRAMEWORKS` module by module `name` (at `path`), anywhere
    in it: function bodies too, since a deferred import still ties the engine to the framework."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        hits = {f for f in FRAMEWORKS for imported in names if imported == f or imported.startswith(f + ".")}
        found += [
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} {hit}"
            for hit in sorted(hits)
        ]
    return found


def test_the_engine_imports_no_framework() -> None:
    """No module of the engine imports a framework, a framework's library or a framework's backend:
    what a framework does is its backend's (reached through `autotuner.backends`' registry), so the
    engine runs where none is installed and adding one changes no engine module."""
    example = "import numpy\ndef f():\n    import torch.nn\n    from ..backends.jax import JAX\n"
    assert _framework_imports("autotuner.search.x", ROOT / "x.py", example) == [
        "x.py:3 torch",
        "x.py:4 autotuner.backends.jax",
    ]
    modules = _package_modules()
    engine = {name: path for name, path in modules.items() if any(_layer(name) == LAYERS.index(e) for e in ENGINE)}
    assert {"autotuner.errors", "autotuner.search.loop", "autotuner.export.reader", "autotuner.trials.serving"} <= set(
        engine
    )
    assert not any(name.startswith(("autotuner.backends", "autotuner.search_spaces")) for name in engine)
    assert [hit for name, path in sorted(engine.items()) for hit in _framework_imports(name, path)] == []
