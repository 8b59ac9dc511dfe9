"""Makes the models of the Python tests (committed; rerun only to change them):

    .testdata/bench-venv/bin/python host/python/tests/models/make_models.py

metadata.onnx: `y = x + bias` with every descriptive field of a model set (producer, domain,
version, doc strings, metadata_props), a symbolic batch extent, and `bias` both an initializer
and a graph input (IR 3 style), which ONNX Runtime lists as an overridable initializer.
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.dirname(os.path.abspath(__file__))

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
bias_in = helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
bias = numpy_helper.from_array(np.array([1.0, -2.0, 0.5], np.float32), "bias")
graph = helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"])], "add-bias",
                          [x, bias_in], [y], [bias], doc_string="adds a bias")
model = helper.make_model(graph, producer_name="epx-tests", producer_version="2.1",
                          domain="ai.epx.tests", model_version=7, doc_string="a model with metadata",
                          opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 7
helper.set_model_props(model, {"character": "a\nb\nc", "author": "epx"})
onnx.checker.check_model(model)
onnx.save(model, os.path.join(here, "metadata.onnx"))
print("metadata.onnx")

# identities.onnx: one input and one Identity output per element type a Python program can feed
# (`x_<type>` -> `y_<type>`), shapes left unknown so that any rank is accepted; and
# scalar.onnx: a float input declared as a scalar (rank 0) and one declared as [1].
types = {"float": TensorProto.FLOAT, "double": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
         "int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32,
         "int64": TensorProto.INT64, "uint8": TensorProto.UINT8, "uint16": TensorProto.UINT16,
         "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64, "bool": TensorProto.BOOL,
         "string": TensorProto.STRING}
inputs = [helper.make_tensor_value_info(f"x_{t}", code, None) for t, code in types.items()]
outputs = [helper.make_tensor_value_info(f"y_{t}", code, None) for t, code in types.items()]
nodes = [helper.make_node("Identity", [f"x_{t}"], [f"y_{t}"]) for t in types]
model = helper.make_model(helper.make_graph(nodes, "identities", inputs, outputs),
                          opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, os.path.join(here, "identities.onnx"))  # (the checker wants shapes)
print("identities.onnx")

scalar = helper.make_tensor_value_info("s", TensorProto.FLOAT, [])
one = helper.make_tensor_value_info("one", TensorProto.FLOAT, [1])
nodes = [helper.make_node("Identity", ["s"], ["s_out"]), helper.make_node("Identity", ["one"], ["one_out"])]
model = helper.make_model(helper.make_graph(nodes, "scalar", [scalar, one], [
    helper.make_tensor_value_info("s_out", TensorProto.FLOAT, []),
    helper.make_tensor_value_info("one_out", TensorProto.FLOAT, [1])]),
    opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, os.path.join(here, "scalar.onnx"))
print("scalar.onnx")

# loop.onnx: Loop(m) whose body casts its counter to float; the scan output is [0, ..., m-1].
# With a large m it runs long enough to be cancelled (RunOptions.terminate).
body = helper.make_graph(
    [helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
     helper.make_node("Identity", ["c"], ["c_out"])], "body",
    [helper.make_tensor_value_info("i", TensorProto.INT64, []),
     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
    [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
     helper.make_tensor_value_info("f", TensorProto.FLOAT, [])])
model = helper.make_model(helper.make_graph(
    [helper.make_node("Loop", ["m", ""], ["scan"], body=body)], "loop",
    [helper.make_tensor_value_info("m", TensorProto.INT64, [])],
    [helper.make_tensor_value_info("scan", TensorProto.FLOAT, ["n"])]),
    opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, os.path.join(here, "loop.onnx"))
print("loop.onnx")
