"""Chakra .et files: schema, framing, round trip, errors."""

from __future__ import annotations

import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import (
    EtFormatError,
    Graph,
    GraphBuilder,
    Node,
    NodeType,
    chakra,
    read_et,
    read_workload,
    write_et,
    write_workload,
)
from google.protobuf.internal.decoder import _DecodeVarint32


def sample_graph(npu=3) -> Graph:
    b = GraphBuilder(npu)
    a = b.comp(1500, name="qkv", num_ops=0, tensor_size=4096)
    c = b.all_reduce(1 << 20, involved_dim=[True, False], deps=[a], tag=0)
    b.send(npu + 1, 2048, tag=9, deps=[c])
    b.recv(npu - 1, 2048, tag=9, deps=[])
    b.mem_load(1 << 16, deps=[a], ctrl_deps=[c])
    b.comp(10, cpu=True)
    g = b.build()
    g.metadata = {"schema": "astrasim-test", "ranks": 8}
    g.nodes.append(Node(100, "misc", NodeType.COMP_NODE, 7, [0], [1],
                        {"f": 1.5, "s": "x", "ints": [1, -2, 3], "fl": [0.5, 1.0],
                         "strs": ["a", "b"], "neg": -5, "zero": 0, "false": False}))
    return g


def test_enum_numbers_match_chakra():
    assert [(m.name, int(m)) for m in NodeType] == [
        ("INVALID_NODE", 0), ("METADATA_NODE", 1), ("MEM_LOAD_NODE", 2), ("MEM_STORE_NODE", 3),
        ("COMP_NODE", 4), ("COMM_SEND_NODE", 5), ("COMM_RECV_NODE", 6), ("COMM_COLL_NODE", 7)]
    assert (CT.ALL_REDUCE, CT.ALL_GATHER, CT.ALL_TO_ALL, CT.REDUCE_SCATTER) == (0, 2, 6, 7)
    d = chakra.Node.DESCRIPTOR
    assert {f.name: f.number for f in d.fields} == {
        "id": 1, "name": 2, "type": 3, "ctrl_deps": 4, "data_deps": 5, "start_time_micros": 6,
        "duration_micros": 7, "inputs": 8, "outputs": 9, "attr": 10}
    a = chakra.AttributeProto.DESCRIPTOR
    assert a.fields_by_name["int64_val"].number == 9
    assert a.fields_by_name["bool_list"].number == 28
    assert a.fields_by_name["string_val"].number == 29
    assert chakra.GlobalMetadata.DESCRIPTOR.fields_by_name["attr"].number == 2
    assert d.full_name == "ChakraProtoMsg.Node"


def test_round_trip(tmp_path):
    g = sample_graph()
    p = write_et(tmp_path / "w.3.et", g)
    back = read_et(p)
    assert back == g
    assert back.npu_id == 3


def test_plain_protobuf_reader(tmp_path):
    """Parse the file with nothing but protobuf's varint decoder and message parser."""
    g = sample_graph()
    data = write_et(tmp_path / "w.3.et", g).read_bytes()
    pos, msgs = 0, []
    while pos < len(data):
        size, pos = _DecodeVarint32(data, pos)
        msgs.append(data[pos:pos + size])
        pos += size
    assert pos == len(data)
    meta = chakra.GlobalMetadata.FromString(msgs[0])
    assert meta.version == g.version
    nodes = [chakra.Node.FromString(m) for m in msgs[1:]]
    assert [n.id for n in nodes] == [n.id for n in g.nodes]
    coll = nodes[1]
    assert coll.type == NodeType.COMM_COLL_NODE
    attrs = {a.name: a for a in coll.attr}
    assert attrs["comm_type"].WhichOneof("value") in ("int64_val", "uint64_val", "int32_val")
    assert list(attrs["involved_dim"].bool_list.values) == [True, False]
    # a zero value in the oneof is still set and serialized
    assert attrs["comm_type"].HasField(attrs["comm_type"].WhichOneof("value"))
    assert getattr(attrs["comm_type"], attrs["comm_type"].WhichOneof("value")) == 0
    assert attrs["comm_tag"].WhichOneof("value") == "int32_val"
    comp = nodes[0]
    assert comp.duration_micros == 1500
    num_ops = next(a for a in comp.attr if a.name == "num_ops")
    assert num_ops.WhichOneof("value") is not None


def test_zero_scalar_attribute_on_the_wire():
    a = chakra.AttributeProto(name="z")
    a.int64_val = 0
    # field 1 (name) then field 9, varint, value 0: tag byte (9 << 3) | 0 = 0x48
    assert a.SerializeToString() == b"\x0a\x01z\x48\x00"


def test_truncated_and_garbled_files(tmp_path):
    g = sample_graph()
    p = write_et(tmp_path / "w.0.et", g)
    data = p.read_bytes()
    p.write_bytes(data[:-5])
    with pytest.raises(EtFormatError, match="w.0.et.*truncated"):
        read_et(p)
    p.write_bytes(b"\xff" * 12)
    with pytest.raises(EtFormatError, match="w.0.et"):
        read_et(p)
    p.write_bytes(b"\x03\xff\xff\xff")  # a length-3 message that is not protobuf
    with pytest.raises(EtFormatError, match="w.0.et"):
        read_et(p)
    p.write_bytes(b"")
    with pytest.raises(EtFormatError, match="empty"):
        read_et(p)
    assert issubclass(EtFormatError, ValueError)


def test_workload_prefix_files(tmp_path):
    g = sample_graph(0)
    paths = write_workload(tmp_path / "sub" / "wl", {i: g.copy_for(i) for i in range(3)})
    assert [p.name for p in paths] == ["wl.0.et", "wl.1.et", "wl.2.et"]
    gs = read_workload(tmp_path / "sub" / "wl", range(4), required=False)
    assert sorted(gs) == [0, 1, 2]
    assert gs[0].nodes is gs[2].nodes  # identical files parsed once
    assert gs[1].npu_id == 1 and gs[1].nodes == g.nodes
    with pytest.raises(EtFormatError, match="wl.3.et"):
        read_workload(tmp_path / "sub" / "wl", range(4))


def test_workload_for_some_npus_among_other_prefixes(tmp_path):
    """A workload with traces for NPUs 0, 4 and 5 of 8 (one pipeline hop, say), in a folder
    holding other prefixes' traces for the rest: exactly its own files are read."""
    g = sample_graph(0)
    write_workload(tmp_path / "hop", {i: g.copy_for(i) for i in (0, 4, 5)})
    write_workload(tmp_path / "hop2", {i: g.copy_for(i) for i in range(8)})
    write_workload(tmp_path / "block", {i: g.copy_for(i) for i in range(8)})
    assert sorted(read_workload(tmp_path / "hop", range(8), required=False)) == [0, 4, 5]
    assert sorted(read_workload(tmp_path / "hop2", range(8), required=False)) == list(range(8))
