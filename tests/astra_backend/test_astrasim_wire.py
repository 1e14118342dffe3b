"""The direct wire codec agrees with protobuf's own, byte for byte and value for value."""

from __future__ import annotations

import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import math

import pytest
from astrasim import Graph, Node, chakra, wire
from astrasim.chakra import _ATTR_KINDS
from astrasim.et import (
    EtFormatError,
    decode_graph,
    decode_graph_protobuf,
    encode_graph,
    encode_graph_protobuf,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
names = st.sampled_from(["comm_type", "comm_size", "involved_dim", "comm_src", "comm_dst",
                         "comm_tag", "num_ops", "tensor_size", "is_cpu_op", "x", ""])
# what GraphBuilder and users put in attrs: everything graph._set_attr accepts
attr_values = st.one_of(
    st.booleans(), i64, st.integers(1 << 63, (1 << 64) - 1),
    st.integers(-(1 << 31), (1 << 31) - 1), st.text(max_size=8),
    st.floats(allow_nan=False), st.binary(max_size=8),
    st.lists(st.booleans(), min_size=1, max_size=4), st.lists(i64, min_size=1, max_size=4),
    st.lists(st.integers(1 << 63, (1 << 64) - 1), min_size=1, max_size=3),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=3),
    st.lists(st.text(max_size=4), min_size=1, max_size=3))
nodes = st.builds(
    Node, id=u64, name=st.text(max_size=12), type=st.integers(0, 7), duration_ns=u64,
    data_deps=st.lists(u64, max_size=4), ctrl_deps=st.lists(u64, max_size=3),
    attrs=st.dictionaries(names, attr_values, max_size=4))
graphs = st.builds(Graph, npu_id=st.integers(0, 7), nodes=st.lists(nodes, max_size=6),
                   version=st.sampled_from(["", "0.0.4"]),
                   metadata=st.dictionaries(st.text(min_size=1, max_size=5), attr_values,
                                            max_size=2))


def _same(a, b) -> bool:
    """Equal, with NaN-free float lists compared by value (0.0 == -0.0 is fine)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs)
def test_encoding_is_byte_identical_to_protobuf(g):
    assert encode_graph(g) == encode_graph_protobuf(g)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs)
def test_decoding_agrees_with_protobuf(g):
    data = encode_graph_protobuf(g)
    fast, ref = decode_graph(data, g.npu_id), decode_graph_protobuf(data, g.npu_id)
    assert fast.version == ref.version
    assert fast.metadata.keys() == ref.metadata.keys()
    assert all(_same(fast.metadata[k], ref.metadata[k]) for k in ref.metadata)
    assert len(fast.nodes) == len(ref.nodes)
    for a, b in zip(fast.nodes, ref.nodes, strict=True):
        assert (a.id, a.name, a.type, a.duration_ns, a.data_deps, a.ctrl_deps) == \
               (b.id, b.name, b.type, b.duration_ns, b.data_deps, b.ctrl_deps)
        assert a.attrs.keys() == b.attrs.keys()
        assert all(_same(a.attrs[k], b.attrs[k]) for k in b.attrs)


@pytest.mark.parametrize("kind", _ATTR_KINDS)
def test_every_attribute_kind_decodes_like_protobuf(kind):
    """Values protobuf writes for every oneof member, scalar and list, including negative
    and zig-zag numbers and unpacked list entries."""
    samples = {"double": [-2.5, 0.0], "float": [1.5, -0.25], "int32": [-7, 1 << 30],
               "int64": [-(1 << 40), 3], "uint32": [(1 << 32) - 1, 0],
               "uint64": [(1 << 64) - 1, 5], "sint32": [-(1 << 31), 12],
               "sint64": [-(1 << 63), 99], "fixed32": [(1 << 32) - 1, 1],
               "fixed64": [(1 << 64) - 1, 2], "sfixed32": [-(1 << 31), 3],
               "sfixed64": [-(1 << 63), 4], "bool": [True, False], "string": ["é", ""],
               "bytes": [b"\x00\xff", b""]}[kind]
    for v in samples:
        a = chakra.AttributeProto(name="k")
        setattr(a, f"{kind}_val", v)
        assert _same(wire.decode_attr(a.SerializeToString()), ("k", v))
    a = chakra.AttributeProto(name="l")
    getattr(a, f"{kind}_list").values.extend(samples)
    assert _same(wire.decode_attr(a.SerializeToString())[1], samples)
    if kind not in ("string", "bytes"):  # the same list written unpacked (one tag per value)
        lst = getattr(a, f"{kind}_list")
        field_type = lst.DESCRIPTOR.fields_by_name["values"].type
        unpacked = b"".join(_unpacked_entry(field_type, x) for x in samples)
        data = b"\x0a\x01l" + wire.varint((2 * _ATTR_KINDS.index(kind) + 4) << 3 | 2) + \
            wire.varint(len(unpacked)) + unpacked
        assert _same(wire.decode_attr(data)[1], samples)


def _unpacked_entry(field_type: int, v) -> bytes:
    import struct

    from google.protobuf.descriptor import FieldDescriptor as F
    fixed = {F.TYPE_DOUBLE: ("<d", 1), F.TYPE_FLOAT: ("<f", 5), F.TYPE_FIXED32: ("<I", 5),
             F.TYPE_FIXED64: ("<Q", 1), F.TYPE_SFIXED32: ("<i", 5), F.TYPE_SFIXED64: ("<q", 1)}
    if field_type in fixed:
        fmt, wt = fixed[field_type]
        return bytes([1 << 3 | wt]) + struct.pack(fmt, v)
    if field_type in (F.TYPE_SINT32, F.TYPE_SINT64):
        v = (v << 1) ^ (v >> 63)
    return b"\x08" + wire.varint(int(v))


def test_garbled_node_is_a_format_error_that_names_the_file():
    g = Graph(0, [Node(1, "a", 4, 10, [0], [], {"comm_size": 5})])
    data = bytearray(encode_graph(g))
    data[-3] = 0xFF  # a length prefix inside the node now runs past its end
    with pytest.raises(EtFormatError, match="w.0.et"):
        decode_graph(bytes(data), 0, "w.0.et")


def test_equal_comparing_values_that_encode_differently_are_not_confused():
    """0.0 == -0.0 and True == 1, but their bytes differ: whichever is written first must
    not decide the bytes of the other (the attribute cache once did)."""
    for first, second in (([1.0, 0.0], [1.0, -0.0]), (0.0, -0.0), ([True, False], [1, 0]),
                          (1, True)):
        for v in (first, second):
            g = Graph(npu_id=0, nodes=[Node(id=1, attrs={"x": v})])
            assert encode_graph(g) == encode_graph_protobuf(g), v
