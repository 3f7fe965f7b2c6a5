"""PyTriton's add_sub example shape: a batched function adding and subtracting two FP32 vectors."""
import numpy as np

from triton_serve_pytriton.decorators import batch
from triton_serve_pytriton.model_config import ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton


@batch
def add_sub(**inputs):
    first, second = inputs.values()
    return {"add": first + second, "sub": first - second}


with Triton() as triton:
    triton.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=128),
        strict=True,
    )
    triton.serve()
