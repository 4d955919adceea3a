"""Hostile input: whatever a spec, an argument or a storage URL holds, the CLI answers with exit
code 2 and one line that names the problem (no traceback), and writes nothing: no runs/
folder, no database, no export.

Generated specs (Hypothesis) go through the CLI's own `main()` in this process, which is fast;
a handful go through a real `autotuner` process in tests/e2e/test_hostile_input.py. Each
generated spec is a valid one with exactly one thing broken, so the expected key is known, or
random text or bytes, which cannot be a spec.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from autotuner.backends import BACKENDS
from autotuner.cli import main
from autotuner.spec.job import MAX_DECLARED_CONFIGS
from autotuner.spec.keys import NAME, SAMPLERS
from autotuner.trials.factory import is_import_path
from tests.support.helpers import FAULTY
from tests.support.refusals import VALID, assert_refused, files

NEVER = "sqlite:////nonexistent-autotuner-dir/never.db"
"""Given as --storage to every generated spec: were one valid after all, it could still not
write a database, and its error would name the storage instead of the spec (and fail the test)."""


# ---------------------------------------------------------------- running the CLI in this process


def run_main(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """`autotuner ARGV` through `autotuner.cli.main`, from `cwd`: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's errors
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def refuse_spec(folder: Path, content: str | bytes, *fragments: str) -> str:
    """Write `content` as a spec in `folder`, search with it: refused, naming the file, nothing written."""
    path = folder / "job.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    before = files(folder)
    code, out, err = run_main(["search", "--spec", str(path), "--storage", NEVER], folder)
    line = assert_refused(code, out, err, str(path), *fragments)
    assert files(folder) == before, files(folder) - before
    return line


# ---------------------------------------------------------------- what is never valid where

_INT = (int,)
_NUMBER = (int, float)


def _wrong_int(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high


def _wrong_number(low: float, high: float, *, low_open: bool = True, optional: bool = False) -> Callable[[Any], bool]:
    def wrong(v: Any) -> bool:
        if v is None:
            return not optional
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return True
        return not ((low < v if low_open else low <= v) and v <= high)

    return wrong


def _wrong_type(kind: type, optional: bool = False) -> Callable[[Any], bool]:
    return lambda v: not (isinstance(v, kind) or (optional and v is None))


FIELDS: dict[tuple[str, ...], Callable[[Any], bool]] = {
    ("name",): lambda v: not (isinstance(v, str) and NAME.fullmatch(v)),
    ("backend",): lambda v: not (isinstance(v, str) and v in BACKENDS),
    ("task",): lambda v: v not in ("train", "inference"),
    ("workload",): lambda v: not isinstance(v, str) or not (is_import_path(v) or v.startswith("builtin:")),
    ("global_batch",): _wrong_int(1, 2**31),
    ("workload_args",): _wrong_type(dict),
    ("device",): lambda v: v not in ("auto", "cpu", "cuda") and not (isinstance(v, str) and v.startswith("cuda:")),
    ("baseline",): _wrong_type(dict),
    ("space",): lambda v: not isinstance(v, (str, dict)) and v is not None,
    ("objective",): _wrong_type(dict),
    ("objective", "max_drift"): _wrong_number(0, 1e6),
    ("objective", "max_memory_mb"): _wrong_number(0, 2**30, optional=True),
    ("objective", "energy"): lambda v: not isinstance(v, bool),
    ("objective", "max_latency_ms"): _wrong_number(0, 86_400_000, optional=True),
    ("budget",): _wrong_type(dict),
    ("budget", "trials"): _wrong_int(1, 100_000),
    ("budget", "timeout"): _wrong_number(0, math.inf, optional=True),
    ("budget", "remeasure_top"): _wrong_int(0, 1000),
    ("budget", "remeasure_runs"): _wrong_int(1, 100),
    ("budget", "remeasure_width"): _wrong_number(0, 1),
    ("budget", "remeasure_drift"): lambda v: _wrong_number(0, 1, low_open=False)(v) or v == 1,
    ("budget", "remeasure_windows"): _wrong_int(1, 1000),
    ("budget", "remeasure_group"): lambda v: v is not None and _wrong_int(1, 1000)(v),
    ("trial",): _wrong_type(dict),
    ("trial", "warmup_steps"): _wrong_int(0, 10_000),
    ("trial", "steps"): _wrong_int(1, 100_000),
    ("trial", "windows"): _wrong_int(1, 1000),
    ("trial", "min_window_s"): _wrong_number(0, 3600, low_open=False),
    ("trial", "drift_steps"): _wrong_int(1, 10_000),
    ("trial", "timeout"): _wrong_number(0, 7 * 86400, optional=True),  # null: the backend's default
    ("trial", "max_memory_mb"): _wrong_number(64, 2**30, low_open=False, optional=True),
    ("trial", "seed"): _wrong_int(0, 2**32 - 1),
    ("run", "steps"): lambda v: v is not None and _wrong_int(1, 10**12)(v),
    ("run", "epochs"): _wrong_number(0, 10**6, optional=True),
    ("run", "hours"): _wrong_number(0, 10**6, optional=True),
    ("cost", "per_hour"): _wrong_number(0, 10**7),
    ("cost", "currency"): lambda v: not (isinstance(v, str) and re.fullmatch(r"[A-Za-z$€£¥]{1,8}", v)),
    ("profile", "steps"): _wrong_int(0, 10_000),
    ("profile", "artifacts"): lambda v: not isinstance(v, str) and v is not None,
    ("storage",): lambda v: not isinstance(v, str) and v is not None,
    ("sampler",): lambda v: not isinstance(v, dict) and v not in SAMPLERS,
    ("sampler", "name"): lambda v: v not in SAMPLERS,
    ("sampler", "seed"): lambda v: v is not None and _wrong_int(0, 2**32 - 1)(v),
}
"""Each key a spec may hold, and a test for the values that are never valid there (the storage
URL and the device are checked later, by the probe and the storage: any string passes here)."""

SECTIONS = {"objective", "budget", "trial", "sampler", "run", "cost", "profile"}
KNOB_VALUES = {
    "precision": ["fp32", "tf32", "bf16", "fp16"],
    "batch_size": [1, 2, 4, 8],
    "workers": [0, 1, 2],
    "compile": ["none", "default", "reduce-overhead", "max-autotune"],
}

TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.dates(),
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6
)
HUGE = st.one_of(
    st.integers(min_value=20, max_value=4400).map(lambda n: "9" * n),
    st.integers(min_value=20, max_value=4400).map(lambda n: "-" + "9" * n),
    st.integers(min_value=20, max_value=5000).map(lambda n: "0x" + "f" * n),
    st.sampled_from(["1e400", "-1e400", ".inf", "-.inf", ".nan", "1.0e308", "-1.0e308", "99999999999999999:20"]),
)
"""Numbers as YAML text: past every bound, past float, past Python's int-to-text limit."""
TAGS = [
    '!!python/object/apply:os.system ["touch {marker}"]',
    '!!python/object/new:os.system ["touch {marker}"]',
    "!!python/name:os.system",
    "!!python/module:os",
    '!!python/object/apply:subprocess.check_call [["touch", "{marker}"]]',
]
BAD_NAMES = ["../x", "/etc/x", "a/b", "", ".", "..", "a\x00b", "x\n", "\nx", "a\\b", ".hidden", "-x", "x" * 65, "é"]


def _set(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    if len(path) == 2 and not isinstance(spec.get(path[0]), dict):
        spec[path[0]] = {}
    target = spec if len(path) == 1 else spec[path[0]]
    target[path[-1]] = value


@st.composite
def broken_specs(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A valid spec with one thing broken, as YAML text, and what the error line must say."""
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(VALID))
    kind = draw(st.sampled_from(["wrong value", "unknown key", "missing key", "empty choices", "bad knob", "name"]))
    if kind == "wrong value":
        path = draw(st.sampled_from(sorted(FIELDS)))
        value = draw(VALUES.filter(FIELDS[path]))
        _set(spec, path, value)
        return yaml.safe_dump(spec), [".".join(path) if path != ("sampler", "name") else "sampler"]
    if kind == "unknown key":
        section = draw(st.sampled_from([None, *sorted(SECTIONS)]))
        allowed = set(VALID) | {"storage"} if section is None else set(FIELDS_IN[section])
        key = draw(TEXT.filter(lambda k: k not in allowed and k.isprintable()))
        _set(spec, (key,) if section is None else (section, key), draw(SCALARS))
        return yaml.safe_dump(spec), ["unknown key"]
    if kind == "missing key":
        key = draw(st.sampled_from(["name", "backend", "workload", "global_batch"]))
        del spec[key]
        return yaml.safe_dump(spec), [key, "required key is missing"]
    if kind == "empty choices":
        knob = draw(st.sampled_from(sorted(KNOB_VALUES)))
        spec["space"][knob] = []
        return yaml.safe_dump(spec), [f"space.{knob}", "empty"]
    if kind == "bad knob":
        where = draw(st.sampled_from(["space", "baseline"]))
        knob = draw(st.sampled_from(sorted(KNOB_VALUES)))
        value = draw(VALUES.filter(lambda v: not _fits(knob, v, where)))
        spec[where][knob] = value
        return yaml.safe_dump(spec), [f"{where}.{knob}"]
    spec["name"] = draw(st.sampled_from(BAD_NAMES) | TEXT.filter(lambda n: not NAME.fullmatch(n)))
    return yaml.safe_dump(spec), ["name"]


FIELDS_IN = {section: [p[1] for p in FIELDS if len(p) == 2 and p[0] == section] for section in SECTIONS}


def _fits(knob: str, value: Any, where: str) -> bool:
    """Whether `value` would be accepted for `knob` (in the space a single value or a list)."""
    values = value if where == "space" and isinstance(value, list) else [value]
    if where == "space" and isinstance(value, list) and not value:
        return False
    for v in values:
        if knob in ("batch_size", "workers"):
            if isinstance(v, bool) or not isinstance(v, int):
                return False
            if knob == "batch_size" and not (v >= 1 and VALID["global_batch"] % v == 0):
                return False
            if knob == "workers" and not 0 <= v <= 1024:
                return False
        elif v not in KNOB_VALUES[knob]:
            return False
    return True


# ---------------------------------------------------------------- generated specs


def examples(count: int) -> settings:
    """Hypothesis settings: `count` examples, no deadline (the machine is shared), no example
    database written into the repository."""
    return settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.mark.slow
@examples(200)
@given(case=broken_specs())
def test_a_spec_with_one_thing_broken_is_refused(tmp_path_factory: pytest.TempPathFactory, case: tuple) -> None:
    text, fragments = case
    refuse_spec(tmp_path_factory.mktemp("spec"), text, *fragments)


@examples(40)
@given(
    path=st.sampled_from(sorted(p for p in FIELDS if p != ("workload_args",))),
    literal=HUGE,
)
@example(path=("global_batch",), literal="1e400")  # text in YAML 1.1, where a number goes
def test_huge_numbers_are_refused(tmp_path_factory: pytest.TempPathFactory, path: tuple, literal: str) -> None:
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(VALID))
    if path == ("budget", "timeout") and not literal.startswith("-"):
        literal = "-" + literal.lstrip("-")  # a very long time budget is valid: no limit
    # YAML 1.1 reads `1e400` (no dot) as text, and text is valid where a string is (a study name,
    # a storage URL): only literals that are wrong where they are put are refused.
    assume(not _reads_as_text(literal) or FIELDS[path](literal))
    _set(spec, path, "RAWVALUE")
    text = yaml.safe_dump(spec).replace("RAWVALUE", literal, 1)
    refuse_spec(tmp_path_factory.mktemp("spec"), text)


def _reads_as_text(literal: str) -> bool:
    try:
        return isinstance(yaml.safe_load(literal), str)
    except ValueError:  # past Python's int-to-text limit: a number, and refused as one
        return False


@examples(30)
@given(path=st.sampled_from(sorted(FIELDS)), tag=st.sampled_from(TAGS))
def test_yaml_tags_that_build_python_objects_are_refused_and_never_run(
    tmp_path_factory: pytest.TempPathFactory, path: tuple, tag: str
) -> None:
    folder = tmp_path_factory.mktemp("spec")
    marker = folder / "pwned"
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(VALID))
    _set(spec, path, "RAWVALUE")
    text = yaml.safe_dump(spec).replace("RAWVALUE", tag.format(marker=marker), 1)
    refuse_spec(folder, text, "not valid YAML", "python/")
    assert not marker.exists()


@examples(100)
@given(
    text=st.text(max_size=200) | st.sampled_from(["[", "{", "a: [1", "a: 'x", ": :", "\t- x", "&a [*a]", "---\n..."])
)
def test_random_text_is_refused(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    """No random text holds a whole spec: it is broken YAML, not a mapping, or misses keys."""
    refuse_spec(tmp_path_factory.mktemp("spec"), text.encode("utf-8", "surrogatepass"))


@examples(40)
@given(data=st.binary(min_size=1, max_size=64).filter(lambda b: not _decodes(b)))
def test_bytes_that_are_not_utf8_are_refused(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    refuse_spec(tmp_path_factory.mktemp("spec"), b"name: job\n" + data, "cannot read the spec")


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------- specific shapes


VALID_TEXT = yaml.safe_dump({k: v for k, v in VALID.items() if k != "workload_args"})
BOMB = "workload_args:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)
"""Ten lines of anchors that stand for 10**9 values."""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (VALID_TEXT + BOMB, "more than 100,000 values"),
        (VALID_TEXT + "workload_args: &a {inner: *a}\n", "contains itself"),
        (VALID_TEXT + "workload_args: {inner: &a [1, *a]}\n", "contains itself"),
        (VALID_TEXT + "workload_args: {deep: " + "[" * 5000 + "]" * 5000 + "}\n", "not valid YAML"),
        (VALID_TEXT + "workload_args: {day: 2024-13-45}\n", "not valid YAML"),
        (VALID_TEXT + "workload_args: {blob: !!binary 'a'}\n", "not valid YAML"),
        (VALID_TEXT + "workload_args: {<<: 3}\n", "not valid YAML"),
    ],
    ids=["alias bomb", "self reference", "self reference in a list", "nesting", "bad date", "bad binary", "merge"],
)
def test_yaml_that_would_exhaust_the_machine_or_cannot_be_built(tmp_path: Path, text: str, fragment: str) -> None:
    refuse_spec(tmp_path, text, fragment)


def test_a_space_too_large_to_list_is_refused(tmp_path: Path) -> None:
    spec = {**VALID, "global_batch": 720720}  # 240 divisors
    spec["space"] = {"batch_size": [d for d in range(1, 1000) if 720720 % d == 0], "workers": list(range(1000))}
    refuse_spec(tmp_path, yaml.safe_dump(spec), "space", f"at most {MAX_DECLARED_CONFIGS:,}")


def test_more_workers_than_any_machine_has_are_refused(tmp_path: Path) -> None:
    refuse_spec(tmp_path, yaml.safe_dump({**VALID, "space": {"workers": [10**9]}}), "space.workers", "<= 1024")
    refuse_spec(tmp_path, yaml.safe_dump({**VALID, "baseline": {"workers": 2000}}), "baseline.workers", "<= 1024")


def test_a_directory_an_unreadable_file_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    code, out, err = run_main(["search", "--spec", str(folder)], tmp_path)
    assert_refused(code, out, err, str(folder), "cannot read the spec")
    code, out, err = run_main(["search", "--spec", str(tmp_path / "nowhere.yaml")], tmp_path)
    assert_refused(code, out, err, "nowhere.yaml", "no such file")
    locked = tmp_path / "locked.yaml"
    locked.write_text(yaml.safe_dump(VALID))
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root reads it anyway
            pytest.skip("running as root: a file without permissions is still readable")
        code, out, err = run_main(["search", "--spec", str(locked)], tmp_path)
        assert_refused(code, out, err, str(locked), "cannot read the spec", "Permission denied")
    finally:
        locked.chmod(0o644)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "--spec", "job.yaml", "--trials", "-3"],
        ["search", "--spec", "job.yaml", "--trials", "1e999"],
        ["search", "--spec", "job.yaml", "--timeout", "nan"],
        ["search", "--spec", "job.yaml", "--timeout", "-1"],
        ["search"],
        ["search", "--spec", "job.yaml", "--nope\nsecond line"],
        ["export", "--study", "../escape", "--storage", "sqlite:///x.db"],
        ["export", "--study", "a\nb", "--storage", "sqlite:///x.db"],
        ["report", "--study", "/etc/x", "--storage", "sqlite:///x.db"],
        ["export", "--spec", "job.yaml"],  # before any search: no database is made up
        ["export", "--study", "x", "--storage", "sqlite:///x.db"],
        ["dashboard", "--port", "-1"],
        ["nonsense"],
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(VALID))
    before = files(tmp_path)
    code, out, err = run_main(argv, tmp_path)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    assert files(tmp_path) == before


# ---------------------------------------------------------------- past the spec: workload and storage


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"workload": "no_such_module_anywhere:factory"}, ["workload", "no_such_module_anywhere"]),
        ({"workload": f"{FAULTY}:no_such_factory"}, ["workload", "no_such_factory"]),
        ({"workload": f"{FAULTY}:FEATURES"}, ["workload", "not callable"]),
        ({"workload": f"{FAULTY}:wrong_return", "workload_args": {}}, ["workload", "str", "TorchWorkload"]),
        ({"workload": f"{FAULTY}:raises_in_factory", "workload_args": {}}, ["workload", "the factory refuses"]),
        ({"workload_args": {"no_such_argument": 1}}, ["workload", "no_such_argument"]),
    ],
    ids=["no module", "no factory", "not callable", "wrong return", "factory raises", "unknown argument"],
)
def test_a_workload_that_cannot_be_built_is_refused_before_anything_is_stored(
    tmp_path: Path, changes: dict[str, Any], fragments: list[str]
) -> None:
    """The probe imports the factory and builds the workload once: a factory that is missing,
    fails, or returns the wrong thing is bad input, refused before the storage is opened."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**VALID, **changes}))
    before = files(tmp_path)
    code, out, err = run_main(["search", "--spec", str(path)], tmp_path)
    assert_refused(code, out, err, str(path), *fragments)
    assert files(tmp_path) == before


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("not a url", ["not a SQLAlchemy database URL"]),
        ("mysql+nonexistentdriver://u@localhost/x", ["nonexistentdriver"]),
        ("nosuchdb://x/y", ["nosuchdb"]),
        ("sqlite:////nonexistent-autotuner-dir/x.db", ["does not exist"]),
        ("sqlite:///relative/missing/x.db", ["does not exist"]),
        ("postgresql://nobody@127.0.0.1:1/x", ["postgresql://nobody@127.0.0.1:1/x"]),
        ("sqlite://", ["in-memory"]),
        ("sqlite:///:memory:", ["in-memory"]),
    ],
)
def test_bad_storage_urls_and_unreachable_databases_are_refused(tmp_path: Path, url: str, fragments: list[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(VALID))
    before = files(tmp_path)
    code, out, err = run_main(["search", "--spec", str(path), "--storage", url], tmp_path)
    assert_refused(code, out, err, "storage", *fragments)
    assert files(tmp_path) == before
