"""Plain-Python execution graphs (one per NPU) and their Chakra protobuf conversion."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from astrasim import chakra
from astrasim.chakra import CollectiveCommType, NodeType

# attribute names whose upstream encoding is not the generic int64 one
_UINT64_ATTRS = {"tensor_size", "comm_size", "num_ops"}
_INT32_ATTRS = {"comm_src", "comm_dst", "comm_tag", "comm_priority"}
_INT64_MAX = (1 << 63) - 1


@dataclass(slots=True)
class Node:
    """One Chakra node. ``duration_ns`` is the COMP runtime (Chakra's duration_micros,
    which ASTRA-Sim reads as cycles = ns). Other properties live in ``attrs`` by their
    Chakra attribute names: comm_type, comm_size, involved_dim, comm_src, comm_dst,
    comm_tag, num_ops, tensor_size, is_cpu_op, ..."""

    id: int
    name: str = ""
    type: int = NodeType.COMP_NODE
    duration_ns: int = 0
    data_deps: list[int] = field(default_factory=list)
    ctrl_deps: list[int] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    # ---- protobuf conversion ----
    def to_proto(self):
        m = chakra.Node(id=self.id, name=self.name, type=int(self.type),
                        duration_micros=int(self.duration_ns))
        m.data_deps.extend(self.data_deps)
        m.ctrl_deps.extend(self.ctrl_deps)
        for k, v in self.attrs.items():
            _set_attr(m.attr.add(), k, v)
        return m

    @classmethod
    def from_proto(cls, m) -> Node:
        return cls(id=m.id, name=m.name, type=m.type, duration_ns=m.duration_micros,
                   data_deps=list(m.data_deps), ctrl_deps=list(m.ctrl_deps),
                   attrs={a.name: _get_attr(a) for a in m.attr})


@dataclass(slots=True)
class Graph:
    """The execution graph of one NPU."""

    npu_id: int
    nodes: list[Node] = field(default_factory=list)
    version: str = "0.0.4"
    metadata: dict[str, Any] = field(default_factory=dict)

    def metadata_proto(self):
        m = chakra.GlobalMetadata(version=self.version)
        for k, v in self.metadata.items():
            _set_attr(m.attr.add(), k, v)
        return m

    def node_protos(self):
        return [n.to_proto() for n in self.nodes]

    @classmethod
    def from_protos(cls, npu_id: int, meta, nodes: Iterable) -> Graph:
        md = {a.name: _get_attr(a) for a in meta.attr} if meta is not None else {}
        return cls(npu_id=npu_id, nodes=[Node.from_proto(n) for n in nodes],
                   version=meta.version if meta is not None else "", metadata=md)

    def copy_for(self, npu_id: int) -> Graph:
        """The same nodes (shared, not copied) under another NPU id."""
        return Graph(npu_id, self.nodes, self.version, self.metadata)


def _set_attr(a, name: str, v: Any) -> None:
    """Fill an AttributeProto; scalars are always set (so zero values are serialized)."""
    a.name = name
    if isinstance(v, bool):
        a.bool_val = v
    elif isinstance(v, int):
        if name in _INT32_ATTRS and -(1 << 31) <= v < (1 << 31):
            a.int32_val = v
        elif v > _INT64_MAX or (name in _UINT64_ATTRS and v >= 0):
            a.uint64_val = v
        else:
            a.int64_val = v
    elif isinstance(v, float):
        a.double_val = v
    elif isinstance(v, str):
        a.string_val = v
    elif isinstance(v, bytes):
        a.bytes_val = v
    elif isinstance(v, (list, tuple)):
        if v and all(isinstance(x, bool) for x in v):
            a.bool_list.values.extend(v)
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            if any(x > _INT64_MAX for x in v):
                a.uint64_list.values.extend(v)
            else:
                a.int64_list.values.extend(v)
        elif all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            a.double_list.values.extend(float(x) for x in v)
        elif all(isinstance(x, str) for x in v):
            a.string_list.values.extend(v)
        elif all(isinstance(x, bytes) for x in v):
            a.bytes_list.values.extend(v)
        else:
            raise TypeError(f"attribute {name!r}: cannot encode mixed list {v!r}")
    else:
        raise TypeError(f"attribute {name!r}: cannot encode {type(v).__name__}")


def _get_attr(a) -> Any:
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    if which.endswith("_list"):
        return list(v.values)
    return v


_DEFAULT_NAME = {t: t.name.lower() for t in NodeType}


class GraphBuilder:
    """Convenience builder. Every method returns the new node's id.

    ``deps=None`` (the default) makes the node depend on the previously added node
    (a chain); pass ``deps=[]`` for no dependency or an explicit list of ids.
    ``ctrl_deps`` adds control dependencies.
    """

    def __init__(self, npu_id: int = 0) -> None:
        self.graph = Graph(npu_id)
        self._last: int | None = None

    def _add(self, type_, name, deps, ctrl_deps=(), duration_ns=0, **attrs) -> int:
        nid = len(self.graph.nodes)
        if deps is None:
            deps = [] if self._last is None else [self._last]
        for k in [k for k, v in attrs.items() if v is None]:
            del attrs[k]
        self.graph.nodes.append(Node(nid, name or f"{_DEFAULT_NAME[type_]}_{nid}",
                                     int(type_), int(duration_ns), list(deps),
                                     list(ctrl_deps), attrs))
        self._last = nid
        return nid

    def comp(self, duration_ns: int = 0, *, deps=None, name="", num_ops=None,
             tensor_size=None, cpu=False, ctrl_deps=()) -> int:
        return self._add(NodeType.COMP_NODE, name, deps, ctrl_deps, duration_ns,
                         num_ops=num_ops, tensor_size=tensor_size,
                         is_cpu_op=True if cpu else None)

    def coll(self, comm_type: int, size_bytes: int, *, involved_dim=None, deps=None, name="",
             tag=None, ctrl_deps=()) -> int:
        return self._add(NodeType.COMM_COLL_NODE, name, deps, ctrl_deps,
                         comm_type=int(comm_type), comm_size=int(size_bytes),
                         involved_dim=list(involved_dim) if involved_dim is not None else None,
                         comm_tag=tag)

    def all_reduce(self, size_bytes, **kw) -> int:
        return self.coll(CollectiveCommType.ALL_REDUCE, size_bytes, **kw)

    def all_gather(self, size_bytes, **kw) -> int:
        return self.coll(CollectiveCommType.ALL_GATHER, size_bytes, **kw)

    def reduce_scatter(self, size_bytes, **kw) -> int:
        return self.coll(CollectiveCommType.REDUCE_SCATTER, size_bytes, **kw)

    def all_to_all(self, size_bytes, **kw) -> int:
        return self.coll(CollectiveCommType.ALL_TO_ALL, size_bytes, **kw)

    def send(self, dst: int, size_bytes: int, *, tag: int = 0, deps=None, name="",
             ctrl_deps=()) -> int:
        return self._add(NodeType.COMM_SEND_NODE, name, deps, ctrl_deps,
                         comm_src=self.graph.npu_id, comm_dst=int(dst),
                         comm_size=int(size_bytes), comm_tag=int(tag))

    def recv(self, src: int, size_bytes: int, *, tag: int = 0, deps=None, name="",
             ctrl_deps=()) -> int:
        return self._add(NodeType.COMM_RECV_NODE, name, deps, ctrl_deps,
                         comm_src=int(src), comm_dst=self.graph.npu_id,
                         comm_size=int(size_bytes), comm_tag=int(tag))

    def mem_load(self, size_bytes: int, *, deps=None, name="", ctrl_deps=()) -> int:
        return self._add(NodeType.MEM_LOAD_NODE, name, deps, ctrl_deps,
                         tensor_size=int(size_bytes))

    def mem_store(self, size_bytes: int, *, deps=None, name="", ctrl_deps=()) -> int:
        return self._add(NodeType.MEM_STORE_NODE, name, deps, ctrl_deps,
                         tensor_size=int(size_bytes))

    def build(self) -> Graph:
        return self.graph
