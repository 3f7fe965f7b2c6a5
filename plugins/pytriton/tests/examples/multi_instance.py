"""PyTriton's multi-instance example shape: one callable per instance (there, one per GPU; here, a
NumPy "model" per instance), each answering with its own number."""
import time

import numpy as np

from triton_serve_pytriton.decorators import batch
from triton_serve_pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton


class Scaler:
    def __init__(self, number):
        self.number = number
        self.weights = np.full((1, 4), 2.0, dtype=np.float32)

    @batch
    def __call__(self, features):
        time.sleep(0.2)  # long enough for concurrent requests to reach the other instance
        rows = features.shape[0]
        return {"scaled": features * self.weights, "instance": np.full((rows, 1), self.number, dtype=np.int32)}


with Triton() as triton:
    triton.bind(
        model_name="Scaler",
        infer_func=[Scaler(number) for number in range(2)],
        inputs=[Tensor(name="features", dtype=np.float32, shape=(4,))],
        outputs=[Tensor(name="scaled", dtype=np.float32, shape=(4,)), Tensor(name="instance", dtype=np.int32, shape=(1,))],
        config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
    )
    triton.serve()
