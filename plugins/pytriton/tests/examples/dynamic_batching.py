"""PyTriton's dynamic-batching shape: requests held up to 2 s to make batches of 4; the function
reports the size of the batch each row was in."""
import numpy as np

from triton_serve_pytriton.decorators import batch
from triton_serve_pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton


@batch
def batch_size(value):
    rows = value.shape[0]
    return {"doubled": value * 2, "batch_size": np.full((rows, 1), rows, dtype=np.int64)}


with Triton() as triton:
    triton.bind(
        model_name="Batched",
        infer_func=batch_size,
        inputs=[Tensor(name="value", dtype=np.int64, shape=(1,))],
        outputs=[Tensor(name="doubled", dtype=np.int64, shape=(1,)),
                 Tensor(name="batch_size", dtype=np.int64, shape=(1,))],
        config=ModelConfig(max_batch_size=8,
                           batcher=DynamicBatcher(max_queue_delay_microseconds=2_000_000, preferred_batch_size=[4])),
    )
    triton.serve()
