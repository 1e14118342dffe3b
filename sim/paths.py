"""Where the project's data lives, resolved from this file (never from the cwd)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def profiles_root() -> Path:
    """The project's ``profiles/`` folder (override with LLMSIM_PROFILES_ROOT)."""
    return Path(os.environ.get("LLMSIM_PROFILES_ROOT", REPO_ROOT / "profiles"))


def shared_data_root() -> Path:
    """``../shared/data`` beside the checkout (override with LLMSIM_SHARED_DATA)."""
    return Path(os.environ.get("LLMSIM_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def _probe(path: str | Path, test) -> bool:
    """``test(Path(path))``, but False where nothing can have that name (longer than the file
    system allows, ENAMETOOLONG): a name from an input file that is probed as a path too
    (a model, a hardware's bundle folder, a PIM config) then reads as the unknown name it
    is instead of an OSError naming the probed path."""
    try:
        return test(Path(path))
    except OSError:
        return False


def is_file(path: str | Path) -> bool:
    """``Path.is_file`` (see :func:`_probe`)."""
    return _probe(path, Path.is_file)


def is_dir(path: str | Path) -> bool:
    """``Path.is_dir`` (see :func:`_probe`)."""
    return _probe(path, Path.is_dir)


def exists(path: str | Path) -> bool:
    """``Path.exists`` (see :func:`_probe`)."""
    return _probe(path, Path.exists)


def writable_dir(path: str | Path, flag: str, purpose: str = "") -> Path:
    """Create folder ``path`` or refuse, naming ``flag``: it exists as a file, or it cannot
    be created or written (checked by writing, as permission bits say little to root)."""
    from sim.errors import InputError

    if not str(path):  # Path('') is the working folder
        raise InputError(f"{flag} '' is empty; give a folder{purpose}")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag} {str(p)!r} is a file; give a folder{purpose}")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{flag} {str(p)!r}: cannot write there ({exc.strerror or exc})") \
            from None
    return p


def check_output_file(path: str | Path, flag: str) -> Path:
    """Refuse an output path that cannot be written (a folder, a parent that is a file, no
    permission) before anything runs, by creating it (and its folder) now; returns it."""
    from sim.errors import InputError

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {str(p)!r} is a folder; give a file path")
    existed = p.exists()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a"):
            pass
    except OSError as exc:
        raise InputError(f"{flag} {str(p)!r}: cannot write there ({exc.strerror or exc})") \
            from None
    if not existed:
        p.unlink(missing_ok=True)
    return p


def check_executable(path: str, flag: str) -> str:
    """The executable ``path`` names (a path, or a name found on PATH), or an InputError
    naming ``flag``: no such file, a folder, or not executable."""
    import shutil

    from sim.errors import InputError

    found = shutil.which(path)
    if found:
        return found
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {path!r} is a folder; give an executable file")
    if p.is_file():
        raise InputError(f"{flag} {path!r} is not executable; give an astra-sim executable")
    raise InputError(f"{flag} {path!r}: no such file, and no such program on PATH")


def check_distinct_paths(outputs: list[tuple[str, str | Path]],
                         inputs: list[tuple[str, str | Path]]) -> None:
    """Refuse an output (``(flag, path)``) that is one of the ``inputs`` or an earlier
    output: the same file by its real path (links and ``..`` resolved) or, where both
    exist, by device and inode (a hard link). Writing it would destroy the input or the
    other output."""
    from sim.errors import InputError

    def same(a: Path, b: Path) -> bool:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        try:
            return os.path.samefile(a, b)
        except OSError:  # one of them does not exist (yet)
            return False

    seen = list(inputs)
    for flag, path in outputs:
        for other_flag, other in seen:
            if same(Path(path), Path(other)):
                raise InputError(f"{flag} {str(path)!r} is the same file as {other_flag} "
                                 f"{str(other)!r}; writing it would overwrite that: give "
                                 "another path")
        seen.append((flag, path))
