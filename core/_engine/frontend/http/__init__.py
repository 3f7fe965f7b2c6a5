"""The HTTP/REST front-end (KServe v2 with Triton's extensions)."""
