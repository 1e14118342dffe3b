"""Direct protobuf wire encoding of Chakra nodes, without building message objects.

Building a ``chakra.Node`` message per node and serializing it costs tens of microseconds
per node in Python; an iteration's graphs are written every few hundred microseconds, so
the common node shapes are encoded here field by field. The bytes are the ones protobuf
itself produces (proto3: fields in number order, zero scalars of the node omitted, packed
repeated ints, every attribute's oneof value written even when zero); a test checks this
against ``SerializeToString`` on generated graphs. Attribute values this module does not
know how to write (floats, lists other than bool/int, very large ints) go through the
protobuf message classes instead, one attribute at a time.
"""

from __future__ import annotations

import struct
from typing import Any

from astrasim import chakra
from astrasim.graph import Node as _Node
from astrasim.graph import _set_attr

_INT32_ATTRS = frozenset({"comm_src", "comm_dst", "comm_tag", "comm_priority"})
_UINT64_ATTRS = frozenset({"tensor_size", "comm_size", "num_ops"})
_U64 = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1

# field tags (field number << 3 | wire type), already varint-encoded
_NODE_ID, _NODE_NAME, _NODE_TYPE = b"\x08", b"\x12", b"\x18"
_NODE_CTRL, _NODE_DATA, _NODE_DURATION, _NODE_ATTR = b"\x22", b"\x2a", b"\x38", b"\x52"
_ATTR_NAME = b"\x0a"
_INT32_VAL, _INT64_VAL, _UINT64_VAL = b"\x38", b"\x48", b"\x68"
_BOOL_VAL, _BOOL_LIST, _STRING_VAL = b"\xd8\x01", b"\xe2\x01", b"\xea\x01"
_INT64_LIST = b"\x52"
_META_VERSION, _META_ATTR = b"\x0a", b"\x12"


def varint(n: int) -> bytes:
    """Unsigned varint; negative numbers as their 64-bit two's complement (10 bytes)."""
    if n < 0:
        n &= _U64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def _packed(values) -> bytes:
    return b"".join(varint(v) for v in values)


def _attr_value(name: str, v: Any) -> bytes | None:
    """The oneof value of an AttributeProto (tag and payload), or None when this module
    leaves the value to protobuf."""
    if v is True or v is False:
        return _BOOL_VAL + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        if name in _INT32_ATTRS and -(1 << 31) <= v < (1 << 31):
            return _INT32_VAL + varint(v)
        if v > _U64:
            return None
        if v > _INT64_MAX or (name in _UINT64_ATTRS and v >= 0):
            return _UINT64_VAL + varint(v)
        if v < -(1 << 63):
            return None
        return _INT64_VAL + varint(v)
    if isinstance(v, str):
        return _len_delimited(_STRING_VAL, v.encode())
    if isinstance(v, (list, tuple)) and v:
        if all(x is True or x is False for x in v):
            return _len_delimited(_BOOL_LIST, _len_delimited(
                b"\x0a", bytes(1 if x else 0 for x in v)))
        if all(type(x) is int and -(1 << 63) <= x <= _INT64_MAX for x in v):
            return _len_delimited(_INT64_LIST, _len_delimited(b"\x0a", _packed(v)))
    return None


_ATTR_CACHE: dict = {}
_ATTR_CACHE_MAX = 1 << 14


def encode_attr(name: str, v: Any) -> bytes:
    """One serialized AttributeProto (without its field tag in the parent)."""
    # Keys must tell apart values that compare equal but encode differently: bools and
    # ints (True == 1; a list's key records which items are bools), and 0.0 and -0.0
    # (floats are not cached at all).
    if isinstance(v, list):
        key = (None if any(type(x) is float for x in v)
               else (name, list, tuple(v), tuple(x is True or x is False for x in v)))
    else:
        key = None if type(v) is float else (name, type(v), v)
    try:
        hit = _ATTR_CACHE.get(key) if key is not None else None
    except TypeError:  # unhashable inside a list: encode without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    value = _attr_value(name, v)
    if value is None:
        msg = chakra.AttributeProto()
        _set_attr(msg, name, v)
        data = msg.SerializeToString()
    else:
        data = (_len_delimited(_ATTR_NAME, name.encode()) if name else b"") + value
    if key is not None:
        if len(_ATTR_CACHE) >= _ATTR_CACHE_MAX:
            _ATTR_CACHE.clear()
        _ATTR_CACHE[key] = data
    return data


def encode_node(node) -> bytes:
    """A ``graph.Node`` as the bytes of a serialized ``chakra.Node``."""
    parts = []
    if node.id:
        parts.append(_NODE_ID + varint(node.id))
    if node.name:
        parts.append(_len_delimited(_NODE_NAME, node.name.encode()))
    if node.type:
        parts.append(_NODE_TYPE + varint(int(node.type)))
    if node.ctrl_deps:
        parts.append(_len_delimited(_NODE_CTRL, _packed(node.ctrl_deps)))
    if node.data_deps:
        parts.append(_len_delimited(_NODE_DATA, _packed(node.data_deps)))
    if node.duration_ns:
        parts.append(_NODE_DURATION + varint(int(node.duration_ns)))
    for k, v in node.attrs.items():
        parts.append(_len_delimited(_NODE_ATTR, encode_attr(k, v)))
    return b"".join(parts)


def encode_metadata(version: str, metadata: dict) -> bytes:
    """A serialized ``chakra.GlobalMetadata``."""
    parts = [_len_delimited(_META_VERSION, version.encode())] if version else []
    parts.extend(_len_delimited(_META_ATTR, encode_attr(k, v)) for k, v in metadata.items())
    return b"".join(parts)


def frame(payloads) -> bytes:
    """Length-delimited concatenation (the .et file framing)."""
    out = []
    for p in payloads:
        out.append(varint(len(p)))
        out.append(p)
    return b"".join(out)


# ---- decoding -------------------------------------------------------------------------

class WireError(ValueError):
    """Bytes that are not a well-formed message of the expected type."""


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, new position) of the varint at ``pos``."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos + 1
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def _fields(buf: bytes):
    """(field number, wire type, value) for each field of a message: value is an int for
    varint and fixed wire types (raw bits), bytes for length-delimited ones."""
    pos, end = 0, len(buf)
    try:
        while pos < end:
            tag, pos = read_varint(buf, pos)
            number, wt = tag >> 3, tag & 7
            if number == 0:
                raise WireError("field number 0")
            if wt == 0:
                value, pos = read_varint(buf, pos)
            elif wt == 2:
                size, pos = read_varint(buf, pos)
                if pos + size > end:
                    raise WireError("length-delimited field runs past the end")
                value = buf[pos:pos + size]
                pos += size
            elif wt == 1:
                if pos + 8 > end:
                    raise WireError("fixed64 field runs past the end")
                value = int.from_bytes(buf[pos:pos + 8], "little")
                pos += 8
            elif wt == 5:
                if pos + 4 > end:
                    raise WireError("fixed32 field runs past the end")
                value = int.from_bytes(buf[pos:pos + 4], "little")
                pos += 4
            else:
                raise WireError(f"unsupported wire type {wt}")
            yield number, wt, value
    except IndexError:
        raise WireError("message ends inside a field") from None


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _zigzag(v: int) -> int:
    return (v >> 1) ^ -(v & 1)


def _text(raw) -> str:
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        raise WireError("string field is not valid UTF-8") from None


# wire type each attribute kind is written with (2 for string/bytes; lists are messages)
_WIRE = {"double": 1, "fixed64": 1, "sfixed64": 1, "float": 5, "fixed32": 5, "sfixed32": 5,
         "string": 2, "bytes": 2}


def _scalar(kind: str, raw):
    """One value of an AttributeProto kind from its raw wire value."""
    if kind == "string":
        return _text(raw)
    if kind == "bytes":
        return bytes(raw)
    if kind == "double":
        return struct.unpack("<d", raw.to_bytes(8, "little"))[0]
    if kind == "float":
        return struct.unpack("<f", raw.to_bytes(4, "little"))[0]
    if kind == "bool":
        return bool(raw)
    if kind in ("int32", "sfixed32"):
        return _signed(raw, 32)
    if kind in ("int64", "sfixed64"):
        return _signed(raw, 64)
    if kind in ("uint32", "fixed32"):
        return raw & 0xFFFFFFFF
    if kind == "sint32":
        return _signed(_zigzag(raw & _U64), 32)
    if kind == "sint64":
        return _zigzag(raw)
    return raw  # uint64, fixed64


def _packed_varints(raw: bytes, what: str) -> list[int]:
    """The varints of a packed repeated field (``what`` names it in the error)."""
    out, pos = [], 0
    while pos < len(raw):
        try:
            v, pos = read_varint(raw, pos)
        except IndexError:
            raise WireError(f"packed {what} ends inside a value") from None
        out.append(v)
    return out


def _list_values(kind: str, payload: bytes) -> list:
    out = []
    want = _WIRE.get(kind, 0)
    for number, wt, raw in _fields(payload):
        if number != 1:
            continue
        if wt == want:
            out.append(_scalar(kind, raw))
        elif wt == 2:  # a packed run of numbers
            if want == 0:
                out.extend(_scalar(kind, v) for v in _packed_varints(raw, "list"))
            else:
                size = 8 if want == 1 else 4
                if len(raw) % size:
                    raise WireError("packed fixed-width list of a wrong length")
                out.extend(_scalar(kind, int.from_bytes(raw[i:i + size], "little"))
                           for i in range(0, len(raw), size))
    return out


_KINDS = chakra._ATTR_KINDS


def decode_attr(buf: bytes) -> tuple[str, Any]:
    """(name, value) of a serialized AttributeProto; lists come back as lists, an unset
    value as None. Fields of an unexpected wire type are skipped, as protobuf does."""
    name, value = "", None
    for number, wt, raw in _fields(buf):
        if number == 1 and wt == 2:
            name = _text(raw)
        elif 3 <= number <= 2 * len(_KINDS) + 2:
            k, is_list = divmod(number - 3, 2)
            kind = _KINDS[k]
            if is_list:
                if wt == 2:
                    value = _list_values(kind, raw)
            elif wt == _WIRE.get(kind, 0):
                value = _scalar(kind, raw)
    return name, value


_ATTR_DECODED: dict = {}


def _cached_attr(raw: bytes) -> tuple[str, Any]:
    """``decode_attr`` remembered by payload: a graph's attributes repeat (the same
    collective type, size and dimensions on every node of a kind)."""
    hit = _ATTR_DECODED.get(raw)
    if hit is None:
        hit = decode_attr(raw)
        if isinstance(hit[1], list):  # callers get their own list
            return hit
        if len(_ATTR_DECODED) >= _ATTR_CACHE_MAX:
            _ATTR_DECODED.clear()
        _ATTR_DECODED[raw] = hit
    return hit


def decode_node(buf: bytes):
    """A serialized ``chakra.Node`` as a ``graph.Node`` (inputs/outputs are skipped, as
    the simulator does not use them). Fields of an unexpected wire type are skipped, as
    protobuf does. This is ``_fields`` written out inline, with one-byte tags and lengths
    taken without a call: the interactive server decodes every node of every iteration,
    and the generator's per-field cost showed there."""
    node = _Node(0, "", 0)  # proto3 defaults: an absent type is 0 (INVALID_NODE)
    pos, end = 0, len(buf)
    try:
        while pos < end:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = read_varint(buf, pos)
            number, wt = tag >> 3, tag & 7
            if wt == 0:
                value = buf[pos]
                if value < 0x80:
                    pos += 1
                else:
                    value, pos = read_varint(buf, pos)
                if number == 1:
                    node.id = value
                elif number == 3:
                    node.type = _signed(value, 32)
                elif number == 7:
                    node.duration_ns = value
                elif number == 4:
                    node.ctrl_deps.append(value)
                elif number == 5:
                    node.data_deps.append(value)
            elif wt == 2:
                size = buf[pos]
                if size < 0x80:
                    pos += 1
                else:
                    size, pos = read_varint(buf, pos)
                if pos + size > end:
                    raise WireError("length-delimited field runs past the end")
                raw = buf[pos:pos + size]
                pos += size
                if number == 10:
                    k, v = _cached_attr(raw)
                    node.attrs[k] = v
                elif number == 5:
                    node.data_deps.extend(_packed_varints(raw, "dependency list"))
                elif number == 4:
                    node.ctrl_deps.extend(_packed_varints(raw, "dependency list"))
                elif number == 2:
                    node.name = _text(raw)
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            else:
                raise WireError(f"unsupported wire type {wt}")
            if number == 0:
                raise WireError("field number 0")
        if pos > end:
            raise WireError("fixed-width field runs past the end")
    except IndexError:
        raise WireError("message ends inside a field") from None
    return node


def decode_metadata(buf: bytes) -> tuple[str, dict]:
    """(version, attributes) of a serialized ``chakra.GlobalMetadata``."""
    version, attrs = "", {}
    for number, wt, raw in _fields(buf):
        if number == 1 and wt == 2:
            version = _text(raw)
        elif number == 2 and wt == 2:
            k, v = decode_attr(raw)
            attrs[k] = v
    return version, attrs
