"""`onnxruntime.capi` as programs import it: the exception classes."""
