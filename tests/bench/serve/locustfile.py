"""REST load on an Open Inference Protocol server with locust (PyPI): each user posts inference
requests for one model back to back, inputs random, made once from the model's metadata
(dynamic extents 1), sent as binary tensor data.

    epx serve --model-repository DIR --http-port 8000 &
    EPX_LOAD_MODEL=mnist [EPX_LOAD_INPUTS="image=1,1,28,28:FP32"] \
    locust -f tests/bench/serve/locustfile.py --headless \
        --host http://127.0.0.1:8000 -u 8 -r 8 -t 30s --csv /tmp/mnist

Works the same against KServe's server (tests/bench/serve/kserve_onnx.py) or any other server
of the protocol.
"""

import json
import os

import numpy as np
from locust import FastHttpUser, constant, events, task

MODEL = os.environ.get("EPX_LOAD_MODEL", "mnist")
# Inputs as NAME=D,D,...:DATATYPE;... for a server whose metadata lists none (KServe's, for a
# kserve.Model that does not describe its inputs).
INPUTS = os.environ.get("EPX_LOAD_INPUTS", "")
DTYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16, "INT64": np.int64,
          "INT32": np.int32, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}
BODY = None
HEADER_LEN = None


@events.test_start.add_listener
def make_request(environment, **_kwargs):
    """The request body every user sends: a JSON header, then each input's bytes."""
    global BODY, HEADER_LEN
    import urllib.request
    with urllib.request.urlopen(f"{environment.host}/v2/models/{MODEL}") as r:
        meta = json.load(r)
    if not meta.get("inputs") and INPUTS:
        meta["inputs"] = []
        for item in INPUTS.split(";"):
            name, rest = item.split("=")
            dims, datatype = rest.split(":")
            meta["inputs"].append({"name": name, "datatype": datatype,
                                   "shape": [int(d) for d in dims.split(",")]})
    rng = np.random.default_rng(0)
    inputs, data = [], b""
    for i in meta["inputs"]:
        shape = [d if d > 0 else 1 for d in i["shape"]]
        value = rng.random(shape).astype(DTYPES[i["datatype"]])
        raw = value.tobytes()
        inputs.append({"name": i["name"], "shape": shape, "datatype": i["datatype"],
                       "parameters": {"binary_data_size": len(raw)}})
        data += raw
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    BODY, HEADER_LEN = header + data, str(len(header))


class Client(FastHttpUser):
    wait_time = constant(0)

    @task
    def infer(self):
        self.client.post(f"/v2/models/{MODEL}/infer", data=BODY,
                         headers={"Inference-Header-Content-Length": HEADER_LEN,
                                  "Content-Type": "application/octet-stream"})
