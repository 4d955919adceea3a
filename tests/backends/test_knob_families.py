"""Every knob's rules live in one family (`autotuner.backends._base.Family`), and the knob tables
the guides show are the knobs' own words."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotuner.backends import BACKENDS
from autotuner.backends._base import Backend, Capabilities, Family
from autotuner.backends.jax.inference import JAX_INFERENCE
from autotuner.backends.pytorch.inference import PYTORCH_INFERENCE
from autotuner.config.knobs import COMMON_TABLE, DERIVED, Knob, knob_rows

ALL = [*BACKENDS.values(), PYTORCH_INFERENCE, JAX_INFERENCE]


def _names(backend: Backend) -> str:
    return f"{backend.name} ({type(backend).__name__})"


@pytest.mark.parametrize("backend", ALL, ids=_names)
def test_every_knob_a_backend_has_beyond_the_common_ones_is_in_exactly_one_of_its_families(backend: Backend) -> None:
    owners: dict[str, int] = {}
    for family in backend.families:
        for knob in family.knobs:
            assert knob.name in backend.knobs, f"{knob.name} has a family but is not in the table"
            owners[knob.name] = owners.get(knob.name, 0) + 1
    for name in backend.knobs:
        assert owners.get(name, 0) == (0 if name in COMMON_TABLE else 1), name


@pytest.mark.parametrize("backend", ALL, ids=_names)
def test_every_knob_says_what_it_does_and_a_knob_with_rules_says_when_it_is_not_run(backend: Backend) -> None:
    ruled = {
        knob.name
        for family in backend.families
        for knob in family.knobs
        if family.irrelevant is not Family.irrelevant or family.conflict is not Family.conflict
    }
    for knob in backend.knobs.values():
        assert knob.description, knob.name
        assert knob.name not in ruled or knob.not_run_when, f"{knob.name} has rules its table does not state"


def test_a_knob_table_row_gives_the_values_as_a_spec_spells_them() -> None:
    words = Knob("jit", "XLA jit", ("on", "off"), "off", not_run_when="no XLA")
    flags = Knob("pin", "pinned memory", (False, True), False)
    count = Knob("depth", "how deep", None, 2, maximum=64)
    rows = knob_rows([words, flags, count, Knob(DERIVED[0], "derived", None, 1)])
    assert rows[2:] == [
        '| `jit` | `"on"`, `"off"` | XLA jit | no XLA |',  # bare, YAML would read a boolean
        "| `pin` | `false`, `true` | pinned memory |  |",
        "| `depth` | integers from 1 to 64 | how deep |  |",
    ]


def test_a_backends_rules_are_its_families_asked_in_order() -> None:
    """`irrelevant` asks the knob's family (never for the reference value), `unsupported_reason` the
    precision, then each value, then each family's conflict, first answer first."""
    seen: list[str] = []

    def irrelevant(knob: Knob, value: object, caps: Capabilities) -> str | None:
        seen.append(f"{knob.name}={value}")
        return "too big" if value == 3 else None

    def first(config: dict[str, object], caps: Capabilities) -> str | None:
        return "first conflict" if config.get("b") == 2 else None

    a, b = Knob("a", "a", None, 1), Knob("b", "b", None, 1)

    class Toy(Backend):
        name, runner, knobs, builtin_workloads = "toy", "toy.runner", {"a": a, "b": b}, {}
        families = (Family((a,), irrelevant), Family((b,), conflict=first))

    toy = Toy()
    assert toy.irrelevant("a", 1, Capabilities()) is None and seen == []  # the reference value
    assert toy.irrelevant("a", 3, Capabilities()) == "too big"
    assert toy.unsupported_reason({"a": 3, "b": 2}, Capabilities()) == "too big"
    assert toy.unsupported_reason({"a": 2, "b": 2}, Capabilities()) == "first conflict"
    assert toy.unsupported_reason({"precision": "tf32", "a": 3}, Capabilities()).startswith("tf32")


def test_the_knob_families_import_no_framework() -> None:
    code = (
        "import sys, autotuner.backends.pytorch.knobs, autotuner.backends.jax.knobs\n"
        "print([m for m in ('torch', 'jax', 'numpy') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_config_exported_before_a_knob_existed_reads_as_what_the_study_ran_then() -> None:
    from autotuner.backends._base import with_defaults
    from autotuner.backends.pytorch import PYTORCH

    old = {"precision": "bf16", "batch_size": 16, "accumulation": 4, "workers": 2, "compile": "none"}
    assert with_defaults(PYTORCH, old, "cuda:0")["pin_memory"] is True  # the loader pinned on a GPU then
    assert with_defaults(PYTORCH, old, "cpu")["pin_memory"] is False
    assert with_defaults(PYTORCH, old, "cuda:0")["memory_budget"] == 1.0  # the rest: their reference values
