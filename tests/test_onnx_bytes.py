"""flipgate.onnx_bytes: ONNX's numbers, and messages that are the bytes onnx.helper's make."""

import onnx
import pytest
from onnx import TensorProto, helper

from flipgate import onnx_bytes as proto
from flipgate.metrics import kernel

NODES = [("TopK", ["logits", "two"], ["top", "index"], {"axis": 1}),
         ("ReduceSum", ["x", "axes"], ["sum"], {"keepdims": 0}),
         ("Gather", ["x", "i"], ["y"], {"axis": -1}),
         ("Sub", ["a", "b"], ["difference"], {})]
TENSORS = [("two", TensorProto.INT64, [1], [2]),
           ("big", TensorProto.INT64, [2, 1], [-3, 1 << 40]),
           ("alpha", TensorProto.FLOAT, [], [2.5]),
           ("alpha", TensorProto.DOUBLE, [], [0.1]),
           ("weights", TensorProto.FLOAT, [3], [0.5, -1.25, 1e-30])]
VALUE_INFOS = [("logits", TensorProto.FLOAT, ["N", "C"]), ("labels", TensorProto.INT64, ["N"]),
               ("x", TensorProto.DOUBLE, ["N", 3]), ("out", TensorProto.DOUBLE, None)]


def test_the_numbers_are_onnxs():
    assert [proto.FLOAT, proto.INT32, proto.INT64, proto.STRING, proto.BOOL, proto.FLOAT16,
            proto.DOUBLE, proto.EXTERNAL] == [
        TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.STRING,
        TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.EXTERNAL]


@pytest.mark.parametrize(("op_type", "inputs", "outputs", "attributes"), NODES)
def test_nodes_are_onnx_helpers_bytes(op_type, inputs, outputs, attributes):
    assert proto.make_node(op_type, inputs, outputs, **attributes) == helper.make_node(
        op_type, inputs, outputs, **attributes).SerializeToString()


@pytest.mark.parametrize("tensor", TENSORS)
def test_tensors_are_onnx_helpers_bytes(tensor):
    assert proto.make_tensor(*tensor) == helper.make_tensor(*tensor).SerializeToString()


@pytest.mark.parametrize("value_info", VALUE_INFOS)
def test_value_infos_are_onnx_helpers_bytes(value_info):
    assert proto.make_tensor_value_info(*value_info) == \
        helper.make_tensor_value_info(*value_info).SerializeToString()


def test_a_model_is_onnx_helpers_bytes():
    ours = proto.make_model(proto.make_graph(
        [proto.make_node(*node[:3], **node[3]) for node in NODES], "g",
        [proto.make_tensor_value_info(*value) for value in VALUE_INFOS[:2]],
        [proto.make_tensor_value_info(*value) for value in VALUE_INFOS[2:]],
        initializer=[proto.make_tensor(*tensor) for tensor in TENSORS]), ir_version=9, opset=17)
    theirs = helper.make_model(helper.make_graph(
        [helper.make_node(*node[:3], **node[3]) for node in NODES], "g",
        [helper.make_tensor_value_info(*value) for value in VALUE_INFOS[:2]],
        [helper.make_tensor_value_info(*value) for value in VALUE_INFOS[2:]],
        initializer=[helper.make_tensor(*tensor) for tensor in TENSORS]),
        ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    assert ours == theirs.SerializeToString()


@pytest.mark.parametrize("element_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("alpha", [1.0, 2.5])
def test_onnx_reads_the_kernels_model_back_as_written(element_type, alpha):
    """Well-formed protobuf all through: onnx parses every field and writes the same bytes."""
    written = proto.make_model(kernel._graph(element_type, alpha), ir_version=kernel.IR_VERSION,
                               opset=kernel.OPSET)
    model = onnx.load_from_string(written)
    assert model.SerializeToString() == written
    assert [output.name for output in model.graph.output] == list(kernel.OUTPUTS)
    assert {node.op_type for node in model.graph.node} >= {"TopK", "Softmax", "ReduceSum"}
