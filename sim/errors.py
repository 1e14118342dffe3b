"""User-facing input errors.

Every problem with what a user wrote (a config field, a JSONL line, a model or hardware
name, a configuration that cannot fit) is raised as :class:`InputError`. The CLIs catch
it, print the one-line message to stderr and exit with status 2, with no traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_INPUT_ERROR = 2
#: no number in an input file (cluster, hardware catalogue) is meaningfully this large: a typo
MAX_NUMBER = 1e15


class InputError(Exception):
    """A problem with user input. The message names the file, field or line."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


def unknown_name(kind: str, name: object, known: Iterable[str], source: str | None = None) -> InputError:
    """Error for a name that is not in a registry, listing the valid choices."""
    choices = ", ".join(sorted(known)) or "(none)"
    return InputError(f"unknown {kind} {name!r}; known: {choices}", source=source)


def read_text_input(path, what: str, kind: str) -> str:
    """The text of an input file, or one InputError naming the file: not UTF-8 (``what`` is
    e.g. "a cluster config", ``kind`` e.g. "a JSON or YAML") or unreadable."""
    from pathlib import Path

    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (undecodable byte {exc.object[exc.start]:#04x}); "
                         f"{what} is {kind} text file", source=str(path)) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(f"cannot read {what.split(' ', 1)[1]}: "
                         f"{getattr(exc, 'strerror', None) or exc}", source=str(path)) from None


def unique_keys(pairs: list) -> dict:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict, refusing a key given
    twice (JSON keeps the last silently; a user's duplicate is a mistake). Raises
    ValueError, which the loaders report as malformed JSON."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {dup!r} appears twice in one object; give it once")
    return out
