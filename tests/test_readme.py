"""The README's promises that a newcomer copies: the set-up commands and the workload example."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from backends.pytorch.workload import TorchWorkload, as_workload
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second_verbatim() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None and README.index("```bash") < README.index("\n## ")
    commands = first_block.group(1).strip().splitlines()
    assert len(commands) == 2
    assert "autotuner search --spec studies/quickstart.yaml" in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_readme_workload_example_builds_a_workload(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README, re.S)
    assert code is not None
    module_path = tmp_path / "readme_workload.py"
    module_path.write_text(code.group(1))
    spec = importlib.util.spec_from_file_location("readme_workload", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workload = as_workload(module.make_workload(hidden=8), "readme_workload:make_workload")
    assert isinstance(workload, TorchWorkload)
    inputs, target = workload.dataset[0]
    loss = workload.loss_fn(workload.model(inputs.unsqueeze(0)), target.unsqueeze(0))
    loss.backward()
    workload.optimizer(workload.model.parameters()).step()
