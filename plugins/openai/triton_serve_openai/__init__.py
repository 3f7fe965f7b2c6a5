"""triton-serve's OpenAI-compatible front-end: OpenAI's /v1 API on the server's HTTP port, over models that follow
Triton's vLLM or TensorRT-LLM tensor contract."""
