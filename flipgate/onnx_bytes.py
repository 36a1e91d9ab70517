"""ONNX's numbers and the few messages the metrics kernel builds, without the onnx package.

Importing the `onnx` package costs about 45 ms (protobuf's JSON support, ml_dtypes,
importlib.metadata), which all that imports the metrics would pay to build one small graph
(onnx is imported where a model is read: flipgate.formats.onnx_models.inspect_onnx and its
callers). These functions take the arguments of their `onnx.helper` namesakes (integer
attributes only; the model's opset for the default domain) and return the same bytes as the
message's `SerializeToString()`; the tests compare the two. Field numbers are onnx.proto's; each
message writes its fields in field-number order, as protobuf does. The data type numbers let
flipgate.onnx_io describe a model's inputs without importing onnx before a model is read.
"""

import struct
from collections.abc import Sequence

# TensorProto.DataType and TensorProto.DataLocation numbers, fixed by the ONNX standard
FLOAT, INT32, INT64, STRING, BOOL, FLOAT16, DOUBLE = 1, 6, 7, 8, 9, 10, 11
EXTERNAL = 1  # TensorProto.DataLocation: the tensor's data lies in another file
INT_ATTRIBUTE = 2  # AttributeProto.AttributeType.INT
VARINT, LENGTH_DELIMITED = 0, 2  # wire types
PACKED_FORMATS = {FLOAT: "f", DOUBLE: "d"}
DATA_FIELDS = {FLOAT: 4, INT64: 7, DOUBLE: 10}  # TensorProto.float_data, int64_data, double_data


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 as its two's complement, as protobuf writes it
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _integer(field: int, value: int) -> bytes:
    return _varint(field << 3 | VARINT) + _varint(value)


def _field(field: int, data: bytes | str) -> bytes:
    """A length-delimited field: a string, packed numbers or an embedded message."""
    data = data.encode() if isinstance(data, str) else data
    return _varint(field << 3 | LENGTH_DELIMITED) + _varint(len(data)) + data


def _repeated(field: int, messages: Sequence[bytes | str]) -> bytes:
    return b"".join(_field(field, message) for message in messages)


def make_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
              **attributes: int) -> bytes:
    """A NodeProto with integer attributes."""
    return (_repeated(1, inputs) + _repeated(2, outputs) + _field(4, op_type)
            + _repeated(5, [_field(1, name) + _integer(3, value) + _integer(20, INT_ATTRIBUTE)
                            for name, value in attributes.items()]))


def make_tensor(name: str, data_type: int, dims: Sequence[int],
                vals: Sequence[float]) -> bytes:
    """A TensorProto of FLOAT, INT64 or DOUBLE values (kept in its typed field, not raw)."""
    if data_type == INT64:
        values = b"".join(_varint(int(value)) for value in vals)
    else:
        values = struct.pack(f"<{len(vals)}{PACKED_FORMATS[data_type]}", *vals)
    fields = sorted([(DATA_FIELDS[data_type], values), (8, name)])  # the name is field 8
    return (b"".join(_integer(1, dim) for dim in dims) + _integer(2, data_type)
            + b"".join(_field(number, data) for number, data in fields))


def make_tensor_value_info(name: str, elem_type: int,
                           shape: Sequence[int | str] | None) -> bytes:
    """A ValueInfoProto of a tensor; its dimensions fixed (int) or named (str), or no shape."""
    tensor_type = _integer(1, elem_type)
    if shape is not None:
        tensor_type += _field(2, _repeated(1, [
            _integer(1, dim) if isinstance(dim, int) else _field(2, dim) for dim in shape]))
    return _field(1, name) + _field(2, _field(1, tensor_type))


def make_graph(nodes: Sequence[bytes], name: str, inputs: Sequence[bytes],
               outputs: Sequence[bytes], initializer: Sequence[bytes] = ()) -> bytes:
    return (_repeated(1, nodes) + _field(2, name) + _repeated(5, initializer)
            + _repeated(11, inputs) + _repeated(12, outputs))


def make_model(graph: bytes, *, ir_version: int, opset: int) -> bytes:
    """A ModelProto of `graph` importing the default domain at `opset`."""
    opset_id = _field(1, "") + _integer(2, opset)  # OperatorSetIdProto: domain, version
    return _integer(1, ir_version) + _field(7, graph) + _field(8, opset_id)
