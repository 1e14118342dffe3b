"""Chakra execution-trace message classes, built at import time (no protoc needed).

The schema is documented in ``chakra.proto`` next to this file; here the same file
descriptor is assembled programmatically as a ``FileDescriptorProto`` and registered in
a private descriptor pool, and message classes are obtained with
``message_factory.GetMessageClass`` (protobuf >= 4.25; any backend: upb, python, cpp).

Exports the message classes ``GlobalMetadata``, ``Node``, ``AttributeProto``, ``IOInfo``,
``Tensor`` and the list types (``BoolList``, ``Int64List``...), plus the enum values as
plain ints in ``NodeType`` / ``CollectiveCommType``. The enums need nothing else; protobuf
is imported, and the descriptor pool and message classes built, the first time one of the
protobuf names is read (a simulation that never writes or reads a .et file never pays for
it).
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.protobuf import descriptor_pb2

PACKAGE = "ChakraProtoMsg"
FILE_NAME = "astrasim/chakra.proto"
# scalar kinds in AttributeProto's oneof, in field-number order (val = 2k+3, list = 2k+4)
_ATTR_KINDS = ["double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
               "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"]


def _list_name(kind: str) -> str:
    return kind[0].upper() + kind[1:] + "List"


class NodeType(enum.IntEnum):
    INVALID_NODE = 0
    METADATA_NODE = 1
    MEM_LOAD_NODE = 2
    MEM_STORE_NODE = 3
    COMP_NODE = 4
    COMM_SEND_NODE = 5
    COMM_RECV_NODE = 6
    COMM_COLL_NODE = 7


class CollectiveCommType(enum.IntEnum):
    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


def _field(msg, name, number, ftype, *, label=None, type_name=None, oneof_index=None):
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as _F

    f = msg.field.add()
    if label is None:
        label = _F.LABEL_OPTIONAL
    f.name = name
    f.number = number
    f.label = label
    f.type = ftype
    f.json_name = "".join(p if i == 0 else p.capitalize() for i, p in enumerate(name.split("_")))
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof_index is not None:
        f.oneof_index = oneof_index
    return f


def build_file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The Chakra ET schema as a FileDescriptorProto (proto3, package ChakraProtoMsg)."""
    from google.protobuf import descriptor_pb2

    _F = descriptor_pb2.FieldDescriptorProto
    _T = {
        "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int32": _F.TYPE_INT32,
        "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64,
        "sint32": _F.TYPE_SINT32, "sint64": _F.TYPE_SINT64, "fixed32": _F.TYPE_FIXED32,
        "fixed64": _F.TYPE_FIXED64, "sfixed32": _F.TYPE_SFIXED32, "sfixed64": _F.TYPE_SFIXED64,
        "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
    }
    fd = descriptor_pb2.FileDescriptorProto()
    fd.name = FILE_NAME
    fd.package = PACKAGE
    fd.syntax = "proto3"
    rep = _F.LABEL_REPEATED

    attr = fd.message_type.add()
    attr.name = "AttributeProto"
    _field(attr, "name", 1, _F.TYPE_STRING)
    _field(attr, "doc_string", 2, _F.TYPE_STRING)
    attr.oneof_decl.add().name = "value"
    for k, kind in enumerate(_ATTR_KINDS):
        _field(attr, f"{kind}_val", 2 * k + 3, _T[kind], oneof_index=0)
        _field(attr, f"{kind}_list", 2 * k + 4, _F.TYPE_MESSAGE,
               type_name=_list_name(kind), oneof_index=0)

    for kind in _ATTR_KINDS:
        lm = fd.message_type.add()
        lm.name = _list_name(kind)
        _field(lm, "values", 1, _T[kind], label=rep)

    gm = fd.message_type.add()
    gm.name = "GlobalMetadata"
    _field(gm, "version", 1, _F.TYPE_STRING)
    _field(gm, "attr", 2, _F.TYPE_MESSAGE, label=rep, type_name="AttributeProto")

    for ename, ecls in (("NodeType", NodeType), ("CollectiveCommType", CollectiveCommType)):
        e = fd.enum_type.add()
        e.name = ename
        for member in ecls:
            v = e.value.add()
            v.name = member.name
            v.number = int(member)

    node = fd.message_type.add()
    node.name = "Node"
    _field(node, "id", 1, _F.TYPE_UINT64)
    _field(node, "name", 2, _F.TYPE_STRING)
    _field(node, "type", 3, _F.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _F.TYPE_UINT64, label=rep)
    _field(node, "data_deps", 5, _F.TYPE_UINT64, label=rep)
    _field(node, "start_time_micros", 6, _F.TYPE_UINT64)
    _field(node, "duration_micros", 7, _F.TYPE_UINT64)
    _field(node, "inputs", 8, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _F.TYPE_MESSAGE, label=rep, type_name="AttributeProto")

    io = fd.message_type.add()
    io.name = "IOInfo"
    _field(io, "values", 1, _F.TYPE_STRING)
    _field(io, "shapes", 2, _F.TYPE_STRING)
    _field(io, "types", 3, _F.TYPE_STRING)

    t = fd.message_type.add()
    t.name = "Tensor"
    for i, (n, ty) in enumerate([("tensor_id", "uint64"), ("storage_id", "uint64"),
                                 ("offset", "uint64"), ("num_elem", "uint64"),
                                 ("elem_bytes", "uint64"), ("device", "string")], start=1):
        _field(t, n, i, _T[ty])
    return fd


def _build_protobuf() -> dict:
    """The descriptor pool, file descriptor and message classes, by module attribute name."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(build_file_descriptor_proto().SerializeToString())

    def cls(name: str):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))

    lists = {kind: cls(_list_name(kind)) for kind in _ATTR_KINDS}
    return {
        "POOL": pool, "FILE_DESCRIPTOR": pool.FindFileByName(FILE_NAME),
        "AttributeProto": cls("AttributeProto"), "GlobalMetadata": cls("GlobalMetadata"),
        "Node": cls("Node"), "IOInfo": cls("IOInfo"), "Tensor": cls("Tensor"),
        "LIST_CLASSES": lists, "BoolList": lists["bool"], "Int64List": lists["int64"],
        "Uint64List": lists["uint64"], "Int32List": lists["int32"],
        "DoubleList": lists["double"], "StringList": lists["string"],
    }


_PROTOBUF_NAMES = (
    "POOL", "FILE_DESCRIPTOR", "AttributeProto", "GlobalMetadata", "Node", "IOInfo", "Tensor",
    "LIST_CLASSES", "BoolList", "Int64List", "Uint64List", "Int32List", "DoubleList",
    "StringList")


_BUILD_LOCK = threading.Lock()


def __getattr__(name: str):
    """Build the protobuf side on first use of one of its names (PEP 562); afterwards they
    are plain module attributes."""
    if name in _PROTOBUF_NAMES:
        with _BUILD_LOCK:
            if "POOL" not in globals():
                globals().update(_build_protobuf())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the protobuf names are built on first use (``__getattr__`` above)
__all__ = ["CollectiveCommType", "NodeType", "build_file_descriptor_proto", *_PROTOBUF_NAMES]
