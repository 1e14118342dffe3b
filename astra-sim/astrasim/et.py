"""Chakra .et file framing: varint-length-delimited messages, GlobalMetadata then Nodes.

One file per NPU, named ``<prefix>.<npu_id>.et``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from astrasim import chakra, wire
from astrasim.graph import Graph


class EtFormatError(ValueError):
    """A truncated or garbled .et file (the message names the file)."""


def et_path(prefix, npu_id: int) -> Path:
    return Path(f"{os.fspath(prefix)}.{npu_id}.et")


def encode_varint(n: int) -> bytes:
    if n < 0:
        raise ValueError("varint must be >= 0")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_varint(buf, pos: int) -> tuple[int, int]:
    """(value, new position); raises IndexError past the end, ValueError when too long."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def encode_messages(messages) -> bytes:
    parts = []
    for m in messages:
        data = m.SerializeToString()
        parts.append(encode_varint(len(data)))
        parts.append(data)
    return b"".join(parts)


def split_messages(data: bytes, source: str = "<bytes>") -> list[bytes]:
    """The length-delimited message payloads of ``data``."""
    out = []
    pos, n = 0, len(data)
    mv = memoryview(data)
    while pos < n:
        start = pos
        try:
            size, pos = decode_varint(data, pos)
        except (IndexError, ValueError):
            raise EtFormatError(f"{source}: garbled length prefix at byte {start}") from None
        if pos + size > n:
            raise EtFormatError(f"{source}: truncated message at byte {start} "
                                f"(needs {size} bytes, {n - pos} left)")
        out.append(mv[pos:pos + size].tobytes())
        pos += size
    return out


def decode_graph(data: bytes, npu_id: int, source: str = "<bytes>") -> Graph:
    """One NPU's graph from .et bytes (see ``astrasim.wire``)."""
    payloads = split_messages(data, source)
    if not payloads:
        raise EtFormatError(f"{source}: empty trace (no GlobalMetadata message)")
    try:
        version, metadata = wire.decode_metadata(payloads[0])
    except wire.WireError as e:
        raise EtFormatError(f"{source}: GlobalMetadata does not parse: {e}") from None
    nodes = []
    for i, p in enumerate(payloads[1:]):
        try:
            nodes.append(wire.decode_node(p))
        except wire.WireError as e:
            raise EtFormatError(f"{source}: node message #{i} does not parse: {e}") from None
    return Graph(npu_id, nodes, version, metadata)


def decode_graph_protobuf(data: bytes, npu_id: int, source: str = "<bytes>") -> Graph:
    """The same graph through protobuf message objects (slower; the reference)."""
    payloads = split_messages(data, source)
    if not payloads:
        raise EtFormatError(f"{source}: empty trace (no GlobalMetadata message)")
    try:
        meta = chakra.GlobalMetadata.FromString(payloads[0])
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError (a plain Exception)
        raise EtFormatError(f"{source}: GlobalMetadata does not parse: {e}") from None
    nodes = []
    for i, p in enumerate(payloads[1:]):
        try:
            nodes.append(chakra.Node.FromString(p))
        except Exception as e:  # noqa: BLE001
            raise EtFormatError(f"{source}: node message #{i} does not parse: {e}") from None
    return Graph.from_protos(npu_id, meta, nodes)


def encode_graph(graph: Graph) -> bytes:
    """The .et bytes of one NPU's graph (see ``astrasim.wire``)."""
    return wire.frame([wire.encode_metadata(graph.version, graph.metadata),
                       *map(wire.encode_node, graph.nodes)])


def encode_graph_protobuf(graph: Graph) -> bytes:
    """The same bytes through protobuf message objects (slower; the reference)."""
    return encode_messages([graph.metadata_proto(), *graph.node_protos()])


def write_et(path, graph: Graph) -> Path:
    p = Path(path)
    p.write_bytes(encode_graph(graph))
    return p


def read_et(path, npu_id: int | None = None) -> Graph:
    p = Path(path)
    if npu_id is None:
        try:
            npu_id = int(p.name.rsplit(".", 2)[-2])
        except (IndexError, ValueError):
            npu_id = 0
    try:
        data = p.read_bytes()
    except OSError as e:
        raise EtFormatError(f"{p}: cannot read trace: {e.strerror}") from None
    return decode_graph(data, npu_id, str(p))


def _items(graphs):
    """(npu, Graph) pairs of a dict npu->Graph or a list of Graphs."""
    return graphs.items() if isinstance(graphs, dict) else ((g.npu_id, g) for g in graphs)


def _same_trace(a: Graph, b: Graph) -> bool:
    """Whether two NPUs' graphs encode to the same bytes without encoding them: one node
    list (``Graph.copy_for`` shares it) and the same metadata."""
    return a.nodes is b.nodes and a.version == b.version and a.metadata == b.metadata


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_workload(prefix, graphs) -> list[Path]:
    """Write ``<prefix>.<npu>.et`` for each graph (a dict npu->Graph or list of Graphs),
    creating the folder if needed; the paths written. Graphs sharing one node list are
    encoded once."""
    prefix = os.fspath(prefix)
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    encoded: dict[int, tuple[Graph, bytes]] = {}  # id(nodes) -> (graph, its bytes)
    out = []
    for npu, g in _items(graphs):
        hit = encoded.get(id(g.nodes))
        if hit is not None and _same_trace(hit[0], g):
            data = hit[1]
        else:
            data = encode_graph(g)
            encoded[id(g.nodes)] = (g, data)
        path = f"{prefix}.{npu}.et"
        _write_file(path, data)
        out.append(Path(path))
    return out


class LinkingWriter:
    """Writes workloads again and again under the same prefixes (an interactive
    client's traces), writing each distinct trace once per call: an NPU whose graph is
    the same as an earlier NPU's gets a symbolic link to that file, made once and kept
    while it stays right. Readers see ordinary files. The writer owns the folder: it
    remembers which of its paths are links."""

    def __init__(self) -> None:
        self._links: dict[str, str] = {}  # path -> the name it links to

    def write(self, prefix: str, graphs) -> None:
        written: dict[int, tuple[Graph, str]] = {}  # id(nodes) -> (graph, its file name)
        for npu, g in _items(graphs):
            path = f"{prefix}.{npu}.et"
            hit = written.get(id(g.nodes))
            if hit is not None and _same_trace(hit[0], g):
                target = hit[1]
                if self._links.get(path) != target:
                    if os.path.lexists(path):
                        os.unlink(path)
                    os.symlink(target, path)
                    self._links[path] = target
                continue
            if self._links.pop(path, None) is not None:
                os.unlink(path)  # writing through the link would change its target
            _write_file(path, encode_graph(g))
            written[id(g.nodes)] = (g, os.path.basename(path))


def _read_file(path: str) -> bytes:
    """A whole file's bytes, with plain system calls (no buffered-I/O objects: the
    interactive server reads a few small files per iteration)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                parts.append(chunk)
            # a regular file reads short only at its end, which saves the empty read
            if len(chunk) < 1 << 16:
                break
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)  # b"" for an empty file


def read_workload(prefix, npus, *, required: bool = True,
                  cache: dict | None = None) -> dict[int, Graph]:
    """Read the traces of ``npus`` under ``prefix``. Identical files are parsed once and
    share their node list (which lets the engine take its SPMD fast path). ``cache``
    (file bytes -> Graph, owned by the caller) extends that across calls."""
    out: dict[int, Graph] = {}
    seen: dict[bytes, Graph] = cache if cache is not None else {}
    prefix = os.fspath(prefix)
    folder, stem = os.path.split(prefix)
    present = None  # the folder's file names, listed once the first trace is missing
    for npu in npus:
        p = f"{prefix}.{npu}.et"
        if present is not None and f"{stem}.{npu}.et" not in present:
            continue
        try:
            data = _read_file(p)
        except FileNotFoundError:
            if required:
                raise EtFormatError(f"{p}: trace file not found") from None
            if present is None:
                # a workload for some of the NPUs (one pipeline stage, say): one listing
                # instead of a failed open per NPU without a trace
                with contextlib.suppress(OSError):
                    present = frozenset(os.listdir(folder or "."))
            continue
        except OSError as e:
            raise EtFormatError(f"{p}: cannot read trace: {e.strerror}") from None
        except ValueError:  # a NUL byte in the prefix
            raise EtFormatError(f"{p!r}: not a trace path (it holds a NUL byte)") from None
        g = seen.get(data)
        if g is None:
            g = seen[data] = decode_graph(data, npu, p)
            out[npu] = g
        else:
            out[npu] = g.copy_for(npu)
    return out
