"""triton-serve backend ``vllm``: Triton's vLLM backend, vLLM's async engine in a process of its own."""
