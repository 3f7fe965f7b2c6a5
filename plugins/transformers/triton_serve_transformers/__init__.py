"""triton-serve backend ``transformers``: causal language models from a local Hugging Face directory, served token
by token under Triton's vLLM tensor contract, with continuous batching."""
