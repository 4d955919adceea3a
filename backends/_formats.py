"""A backend's export formats: what `autotuner export --format` writes a tuned config as, for a
library the backend's users train or serve with. A backend lists its formats in a module of its
own package (`FORMATS`: name -> `ExportFormat`) and names that module as `Backend.formats`;
`autotuner.backends.export_formats` gathers every registered backend's for the command line."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotuner.errors import SpecError

if TYPE_CHECKING:
    from pathlib import Path

    from autotuner.backends._base import ExportedConfig


@dataclass(frozen=True)
class ExportFormat:
    """One `autotuner export --format` a backend offers (`Backend.formats`): a module of the backend
    that writes a tuned config for a library its users train or serve with. Naming it imports
    nothing; the module is imported when the format is asked for, after its library is found."""

    name: str
    """The `--format` value."""
    module: str
    """Import path of the module that writes it: `snippet(config) -> str`, or with `files`,
    `write(config, job, path) -> list[Path]`."""
    library: str
    """The import name of the library it is for (or needs)."""
    extra: str | None
    """The autotuner extra that installs it; None for a base dependency."""
    what: str
    """What it writes, as `autotuner export --help` says it."""
    files: bool = False
    """It writes files built from the job (its module's `write`), not Python code to paste (its
    module's `snippet`)."""

    def require(self) -> None:
        """Refuse, in one line saying what to install, a format whose library is not installed
        (found, not imported: a snippet is text, and importing a trainer can take seconds)."""
        if importlib.util.find_spec(self.library) is None:
            install = f"pip install 'autotuner[{self.extra}]'" if self.extra else f"pip install {self.library}"
            raise SpecError(f"{self.library} is not installed: {install}", key=f"--format {self.name}")

    def snippet(self, config: ExportedConfig) -> str:
        """The Python code of this format for `config` (its library must be installed)."""
        if self.files:
            raise ValueError(f"--format {self.name} writes files (`write`), not code")
        self.require()
        text: str = importlib.import_module(self.module).snippet(config)
        return text

    def write(self, config: ExportedConfig, job: object, path: Path) -> list[Path]:
        """The files of this format (`files`) for `config`, a config of `job` (the spec's `Job`),
        written at `path` (and beside it); their paths."""
        self.require()
        written: list[Path] = importlib.import_module(self.module).write(config, job, path)
        return written
