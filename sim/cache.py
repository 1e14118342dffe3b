"""A small on-disk cache for data derived from input files (parsed profile bundles).

Entries live in a per-user folder, never beside the inputs (``../shared/data`` is read-only
input): ``$LLMSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/llm-serving-dse``, else
``~/.cache/llm-serving-dse``; ``LLMSIM_CACHE_DIR=off`` turns the cache off.

An entry is keyed by what it was derived from: the cache format version, the interpreter's
marshal format, a caller's ``params`` and every source file's path, size and a digest of
its bytes (hashing the few hundred kB of a bundle costs about a millisecond, and unlike a
modification time it cannot miss an edit made within the clock's resolution). Any edit to
a source gives a new key, so a stale entry is never read.
Each file holds that full key and a digest of its payload; a file whose key or digest does
not match (a hash collision, a torn or corrupt file) is ignored and rebuilt. Payloads are
plain data written with ``marshal`` (fast, and loading one runs no code). Writers put the
entry in a temporary file and rename it into place, so processes filling the same entry at
once (Ray actors) each leave a whole file and readers never see a partial one. A cache
that cannot be written is skipped silently; the result is the same, only slower.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

#: bump when the layout of an entry changes
FORMAT_VERSION = 1
_MAGIC = b"LLMSIMC1"
_DIGEST = 32  # blake2b digest size of the payload
T = TypeVar("T")


def cache_dir() -> Path | None:
    """The cache folder, or None when ``LLMSIM_CACHE_DIR`` is ``off``."""
    env = os.environ.get("LLMSIM_CACHE_DIR")
    if env:
        return None if env.strip().lower() in ("off", "none", "0") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "llm-serving-dse"


def _source_sig(path: Path) -> tuple:
    data = Path(path).read_bytes()
    return (str(Path(path).resolve()), len(data), hashlib.blake2b(data, digest_size=20).digest())


def entry_key(kind: str, sources: Iterable[str | os.PathLike], params=()) -> bytes:
    """The full key of an entry (raises OSError when a source cannot be read)."""
    sig = (FORMAT_VERSION, marshal.version, sys.version_info[:2], kind, params,
           tuple(_source_sig(Path(s)) for s in sources))
    return marshal.dumps(sig)


def entry_path(kind: str, key: bytes) -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    return d / f"{kind}-{hashlib.blake2b(key, digest_size=16).hexdigest()}.bin"


def _read(path: Path, key: bytes):
    """The payload stored under ``key`` in ``path``; raises on any mismatch."""
    data = path.read_bytes()
    head = len(_MAGIC) + 8
    if data[:len(_MAGIC)] != _MAGIC:
        raise ValueError("not a cache entry")
    klen = int.from_bytes(data[len(_MAGIC):head], "little")
    stored_key = data[head:head + klen]
    digest = data[head + klen:head + klen + _DIGEST]
    body = data[head + klen + _DIGEST:]
    if stored_key != key:
        raise ValueError("key mismatch")
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
        raise ValueError("payload digest mismatch")
    return marshal.loads(body)


def _write(path: Path, key: bytes, value) -> None:
    body = marshal.dumps(value)  # ValueError for anything but plain data
    blob = b"".join((_MAGIC, len(key).to_bytes(8, "little"), key,
                     hashlib.blake2b(body, digest_size=_DIGEST).digest(), body))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)  # atomic: readers see the old entry or the whole new one
    finally:
        if tmp.exists():
            tmp.unlink()


def cached(kind: str, sources: Iterable[str | os.PathLike], build: Callable[[], T],
           params=()) -> T:
    """``build()``'s value, from the cache when an entry for ``kind``, ``params`` (plain,
    marshal-able data) and the current state of ``sources`` exists, else built and stored.

    ``build()`` must derive its value from those sources and params alone, and return
    plain data (None, bool, int, float, str, bytes, and tuples, lists, dicts and sets of
    them). Errors ``build()`` raises propagate; cache trouble never does."""
    try:
        key = entry_key(kind, sources, params)
        path = entry_path(kind, key)
    except (OSError, ValueError) as exc:  # a source vanished, or params not marshal-able
        log.debug("cache: no key for %s: %s", kind, exc)
        return build()
    if path is None:
        return build()
    try:
        return _read(path, key)
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - corrupt, torn or foreign: rebuild it
        log.debug("cache: rebuilding %s (%s)", path, exc)
    value = build()
    try:
        _write(path, key, value)
    except (OSError, ValueError) as exc:
        log.debug("cache: cannot write %s: %s", path, exc)
    return value
