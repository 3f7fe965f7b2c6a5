"""triton-serve's ``onnxruntime`` backend: serves ONNX models (platform ``onnxruntime_onnx``) with ONNX Runtime."""
