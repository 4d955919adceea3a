"""What optuna-dashboard shows of a study: checked in the storage and in a real browser."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna_dashboard import get_note

from autotuner.study.optuna_adapter import study_id, study_storage
from tests.support.studies import ROOT, dashboard_server, load_study, run_cli, write_spec

SCREENSHOT = ROOT / "test-output" / "dashboard.png"


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study with feasible trials, bf16 ones over a tight drift tolerance (infeasible,
    with values the dashboard can plot: the small mlp's bf16 drift is about 7e-7) and unsupported
    tf32 ones."""
    workdir = tmp_path_factory.mktemp("dashboard")
    spec = write_spec(
        workdir,
        name="board",
        space={"precision": ["fp32", "bf16", "tf32"], "batch_size": [16, 64], "workers": [0], "compile": ["none"]},
        objective={"max_drift": 1.0e-7},
        # More than the 4 configs a CPU can run: once they are spent the search proposes the tf32
        # ones too (the default sampler's guided start skips configs the device cannot run).
        budget={"trials": 5},
    )
    done = run_cli("search", "--spec", str(spec), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir


def test_the_study_carries_a_note_and_charts_for_the_dashboard(study_dir: Path) -> None:
    study = load_study(study_dir, "board")
    note = get_note(study)
    assert "## autotuner: board" in note and "**Best:**" in note and "x** the baseline" in note
    assert "drift tolerance | 1e-05%" in note and "reference noise floor" in note and "fingerprint" in note
    keys = study_storage(study).get_study_system_attrs(study_id(study))
    for chart in ("throughput-by-knob", "pareto-front"):
        assert any(k.startswith(f"dashboard:plot_data:{chart}:") for k in keys), chart
    infeasible = [t for t in study.get_trials() if any(c > 0 for c in t.system_attrs["constraints"])]
    outcomes = {t.user_attrs["outcome"] for t in infeasible}
    assert {"ok", "unsupported"} <= outcomes  # ok: ran, but drifted past the tolerance


@pytest.fixture
def dashboard(study_dir: Path) -> Iterator[str]:
    with dashboard_server("--spec", "board.yaml", cwd=study_dir) as (url, _):
        yield url


def _browser():  # type: ignore[no-untyped-def]
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium and chromium-driver (.ci/run installs them)")
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,2000",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


INFEASIBLE_GREY = "#cccccc"  # how optuna-dashboard draws an infeasible trial


def test_dashboard_in_a_browser_shows_the_pareto_front_and_the_note(study_dir: Path, dashboard: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    study = load_study(study_dir, "board")
    finite = [t for t in study.get_trials() if all(abs(v) != float("inf") for v in t.values)]
    feasible = [t for t in finite if t.user_attrs["feasible"]]
    infeasible = [t for t in finite if not t.user_attrs["feasible"]]
    assert feasible and infeasible
    browser = _browser()
    try:
        browser.get(f"{dashboard}/dashboard/studies/{study_id(study)}")
        wait = WebDriverWait(browser, 60)
        pareto = wait.until(lambda b: b.find_element(By.ID, "graph-pareto-front"))
        wait.until(lambda b: pareto.find_elements(By.CSS_SELECTOR, "path.point"))
        # The dashboard's own Pareto front: the study's trials, infeasible ones in its infeasible grey.
        traces = browser.execute_script(
            "return arguments[0].data.map(t => [String(t.marker && t.marker.color), (t.x || []).length])", pareto
        )
        grey = sum(n for color, n in traces if color == INFEASIBLE_GREY)
        coloured = sum(n for color, n in traces if color and not color.startswith("#"))  # per-trial colours
        assert grey >= len(infeasible) and coloured == len(feasible), traces
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "Pareto Front" in body and "throughput" in body and "drift" in body  # axes named after the objectives
        for chart in ("throughput-by-knob", "pareto-front"):  # the charts autotuner saved into the study
            wait.until(lambda b, c=chart: b.find_elements(By.ID, f"user-defined-plot:{c}"))
        SCREENSHOT.parent.mkdir(exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
        browser.get(f"{dashboard}/dashboard/studies/{study_id(study)}/note")
        wait.until(expected_conditions.text_to_be_present_in_element((By.TAG_NAME, "body"), "autotuner: board"))
        note = browser.find_element(By.TAG_NAME, "body").text
        assert "Best:" in note and "the baseline" in note and "reference noise floor" in note
        browser.save_screenshot(str(SCREENSHOT.with_name("dashboard-note.png")))
        print(f"dashboard screenshots: {SCREENSHOT} {SCREENSHOT.with_name('dashboard-note.png')}")
    finally:
        browser.quit()
