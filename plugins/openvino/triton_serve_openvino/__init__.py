"""triton-serve's ``openvino`` backend: OpenVINO IR and ONNX models compiled for the CPU."""
