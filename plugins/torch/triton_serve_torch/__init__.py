"""triton-serve's ``pytorch`` backend: TorchScript and torch.export models, served like Triton's PyTorch backend."""
