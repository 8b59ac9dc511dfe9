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
