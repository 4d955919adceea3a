"""Error types, and what each one means for the search.

`SpecError` is bad input (a spec, an argument, a storage URL): the CLI prints its one line and
exits with 2 before anything is run or stored. `HardwareMismatch` refuses a worker on a study tied
to other hardware. `BackendError` means the backend itself could not start (not one config
failing, which is a trial outcome): exit code 1.
"""

from __future__ import annotations

SHOWN_CHARS = 60


def shown(value: object) -> str:
    """`repr(value)` for an error line, cut to SHOWN_CHARS: the line quotes the input, not all of it."""
    try:
        text = repr(value)
    except ValueError:  # an integer too long to print
        text = f"<a {type(value).__name__} too long to print>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class AutotunerError(Exception):
    """Base class of the errors the CLI turns into one line and an exit code."""

    exit_code = 1


class SpecError(AutotunerError):
    """Bad input: names the file, the key and what is allowed."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.source = source
        self.key = key
        prefix = "".join(f"{part}: " for part in (source, key) if part)
        # One line always, even when a key or a value from the file holds a line break.
        super().__init__((prefix + message).replace("\r", "\\r").replace("\n", "\\n"))


class HardwareMismatch(AutotunerError):
    """The study was started on other hardware or software; its numbers would not compare."""

    exit_code = 2


class BackendError(AutotunerError):
    """The backend could not be started at all (not one trial failing)."""

    exit_code = 1


class StorageError(AutotunerError):
    """The study's storage failed in the middle of a search (unreachable, or locked for longer
    than its busy timeout). Everything finished is in it; rerunning the command resumes."""

    exit_code = 1
