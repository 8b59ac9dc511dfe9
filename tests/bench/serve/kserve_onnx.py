"""The server a user would write instead of `epx serve`: KServe's Python model server (the
`kserve` package from PyPI) with a `kserve.Model` that runs an ONNX model on ONNX Runtime,
serving the Open Inference Protocol over REST and gRPC.

    python kserve_onnx.py --model_name NAME --model_file FILE --threads N \
        --http_port 8080 --grpc_port 8081
"""

import argparse

import kserve
import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype


class OnnxModel(kserve.Model):
    def __init__(self, name: str, path: str, threads: int):
        super().__init__(name)
        self.path = path
        self.threads = threads
        self.session = None

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        names = [o.name for o in self.session.get_outputs()]
        results = self.session.run(names, feeds)
        outputs = []
        for name, value in zip(names, results):
            value = np.ascontiguousarray(value)
            out = InferOutput(name=name, shape=list(value.shape),
                              datatype=from_np_dtype(value.dtype))
            out.set_data_from_numpy(value, binary_data=payload.use_binary_outputs)
            outputs.append(out)
        return InferResponse(model_name=self.name, infer_outputs=outputs,
                             response_id=payload.id, use_binary_outputs=payload.use_binary_outputs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model_file", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args, _ = parser.parse_known_args()
    model = OnnxModel(args.model_name, args.model_file, args.threads)
    model.load()
    kserve.ModelServer().start([model])
