"""The simulator's hot modules compiled to C with mypyc, where a C compiler is at hand.

The per-iteration work (the event loop, the scheduler, the KV-cache manager, event
leaping, the request record, the metrics, a stretch's step times) is plain Python, and
those sources stay the reference: mypyc compiles the same files, so the compiled modules
compute the same values operation by operation (``tests/sim/test_native.py`` and
``experiments/sim_digest.py`` compare their outputs byte for byte). Where mypyc's typing
could change a result (a variable's inferred type narrower than its values, a tuple's
identity), the source says what it holds. The compiled build is optional:

- ``llmsim native build`` (``make`` runs it) compiles ``NATIVE_MODULES`` into
  ``sim/_native/``, with a manifest holding the SHA-256 of each source and the
  interpreter's extension suffix. Where there is no compiler (or no mypy), the manifest
  records why, and the simulator runs as pure Python.
- ``activate`` (called by ``sim/__init__.py`` before anything imports those modules)
  loads the compiled modules only where the manifest matches the sources byte for byte:
  an edited source, another interpreter or a failed build means pure Python, never a
  stale binary. ``LLMSIM_PURE_PYTHON=1`` forces pure Python (the test suite sets it:
  its tests patch functions and methods, and compiled callers do not see a patch).
- ``llmsim native status`` says which runs, and why (``sim.native_status()``).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

#: the modules compiled, in the order mypyc is given them
NATIVE_MODULES = ("sim.request", "sim.kv_cache", "sim.scheduler", "sim.leap", "sim.engine",
                  "sim.metrics", "sim.latency.lines", "sim.latency.grid")
#: set (to anything but "" or "0") to run the Python sources even where a build exists
PURE_ENV = "LLMSIM_PURE_PYTHON"
PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"
MANIFEST_NAME = "manifest.json"
#: mypy's checks left off where mypyc compiles (see the header of each compiled module)
MYPYC_FLAGS = ("--follow-imports=silent", "--ignore-missing-imports")

_status = "pure Python (not activated)"


def source_path(module: str, package_dir: Path = PACKAGE_DIR) -> Path:
    return package_dir.parent.joinpath(*module.split(".")).with_suffix(".py")


def fingerprint(package_dir: Path = PACKAGE_DIR) -> dict:
    """What a build must match to be loaded: each source's SHA-256 and the interpreter's
    extension suffix (its version and ABI)."""
    return {"ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "sources": {m: hashlib.sha256(source_path(m, package_dir).read_bytes()).hexdigest()
                        for m in NATIVE_MODULES}}


def plan_activation(native_dir: Path, environ, package_dir: Path = PACKAGE_DIR
                    ) -> tuple[dict[str, Path] | None, str]:
    """The compiled files to load (module name -> file), or None, and a one-line status
    saying which runs and why."""
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return None, f"pure Python ({PURE_ENV} is set)"
    try:
        manifest = json.loads((native_dir / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return None, "pure Python (no compiled build: llmsim native build)"
    except (OSError, ValueError) as e:
        return None, f"pure Python (unreadable {native_dir / MANIFEST_NAME}: {e})"
    if not isinstance(manifest, dict):
        return None, f"pure Python (unreadable {native_dir / MANIFEST_NAME})"
    if manifest.get("error"):
        return None, f"pure Python (the compiled build failed: {manifest['error']})"
    if manifest.get("fingerprint") != fingerprint(package_dir):
        return None, ("pure Python (the compiled build does not match the sources or this "
                      "interpreter: llmsim native build)")
    files = {name: native_dir / fname for name, fname in manifest.get("files", {}).items()}
    if not set(NATIVE_MODULES) <= set(files) or not all(f.is_file() for f in files.values()):
        return None, "pure Python (the compiled build is incomplete: llmsim native build)"
    return files, f"compiled with mypyc {manifest.get('mypyc', '?')}: {', '.join(NATIVE_MODULES)}"


class _NativeFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and mypyc's shared library of the group) in the build
    folder; every other import goes on to the usual finders."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        f = self.files.get(fullname)
        if f is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(f))
        return importlib.util.spec_from_file_location(fullname, f, loader=loader)


def activate(native_dir: Path = NATIVE_DIR) -> str:
    """Load the compiled modules from here on where a matching build exists (a no-op once
    done, or where any of them is already imported); returns ``status()``."""
    global _status
    if any(isinstance(f, _NativeFinder) for f in sys.meta_path):
        return _status
    if any(m in sys.modules for m in NATIVE_MODULES):
        _status = "pure Python (imported before sim.native.activate)"
        return _status
    files, _status = plan_activation(native_dir, os.environ)
    if files is None:
        return _status
    finder = _NativeFinder(files)
    sys.meta_path.insert(0, finder)
    shared = [name for name in files if name not in NATIVE_MODULES]
    try:
        for name in shared:  # (mypyc's library: a build that cannot load fails here)
            importlib.import_module(name)
    except ImportError as e:
        sys.meta_path.remove(finder)
        _status = f"pure Python (the compiled build does not load: {e})"
    return _status


def status() -> str:
    """Which modules run (compiled or pure Python), and why."""
    return _status


def build(native_dir: Path = NATIVE_DIR, package_dir: Path = PACKAGE_DIR) -> int:
    """Compile ``NATIVE_MODULES`` into ``native_dir`` (replaced whole); 0 on success. A
    failure is recorded in the manifest (the simulator then runs pure Python) and 1
    returned."""
    native_dir = Path(native_dir)
    try:
        import mypy.version
    except ImportError:
        return _record_failure(native_dir, package_dir, "mypy (which holds mypyc) is not "
                               "installed: pip install 'llm-serving-dse[native]'")
    with tempfile.TemporaryDirectory(prefix="llmsim-native-") as tmp:
        # A copy of the package (mypy reads the modules they import), built in place there.
        work = Path(tmp)
        shutil.copytree(package_dir, work / package_dir.name,
                        ignore=shutil.ignore_patterns("_native", "__pycache__", "*.so"))
        sources = [str(source_path(m, work / package_dir.name).relative_to(work))
                   for m in NATIVE_MODULES]
        _say(f"compiling {', '.join(NATIVE_MODULES)} with mypyc {mypy.version.__version__}")
        proc = subprocess.run([sys.executable, "-m", "mypyc", *MYPYC_FLAGS, *sources],
                              cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "error" in ln.lower()] or lines
            return _record_failure(native_dir, package_dir,
                                   errors[0] if errors else f"mypyc exited {proc.returncode}",
                                   "\n".join(lines[-60:]))
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = {}
        for so in sorted(work.rglob("*" + suffix)):
            rel = so.relative_to(work)
            if rel.parts[0] == "build":
                continue
            built[".".join(rel.parts[:-1] + (so.name[:-len(suffix)],))] = so
        if not set(NATIVE_MODULES) <= set(built):
            return _record_failure(native_dir, package_dir,
                                   f"mypyc built {sorted(built)}, not {list(NATIVE_MODULES)}")
        staging = Path(tempfile.mkdtemp(prefix="_native-", dir=native_dir.parent))
        files = {}
        for name, so in built.items():
            fname = name + suffix
            shutil.copy2(so, staging / fname)
            files[name] = fname
        manifest = {"fingerprint": fingerprint(package_dir),
                    "mypyc": mypy.version.__version__, "files": files}
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(native_dir, ignore_errors=True)
        staging.rename(native_dir)
    _say(f"compiled modules in {native_dir}")
    return 0


def _record_failure(native_dir: Path, package_dir: Path, reason: str, log: str = "") -> int:
    native_dir.mkdir(parents=True, exist_ok=True)
    for f in native_dir.iterdir():
        if f.is_file():
            f.unlink()
    manifest = {"fingerprint": fingerprint(package_dir), "error": reason}
    (native_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    if log:
        (native_dir / "build.log").write_text(log + "\n")
    _say(f"no compiled build ({reason}); the simulator runs as pure Python")
    return 1


def _say(msg: str) -> None:
    sys.stderr.write(f"sim.native: {msg}\n")


# Imported first by sim/__init__.py, before any of NATIVE_MODULES.
activate()
