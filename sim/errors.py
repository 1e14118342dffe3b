"""User-facing input errors.

Every problem with what a user wrote (a config field, a JSONL line, a model or hardware
name, a configuration that cannot fit) is raised as :class:`InputError`. The CLIs catch
it, print the one-line message to stderr and exit with status 2, with no traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_INPUT_ERROR = 2


class InputError(Exception):
    """A problem with user input. The message names the file, field or line."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


def unknown_name(kind: str, name: object, known: Iterable[str], source: str | None = None) -> InputError:
    """Error for a name that is not in a registry, listing the valid choices."""
    choices = ", ".join(sorted(known)) or "(none)"
    return InputError(f"unknown {kind} {name!r}; known: {choices}", source=source)
