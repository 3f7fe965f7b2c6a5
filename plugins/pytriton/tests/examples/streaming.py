"""PyTriton's decoupled (streaming) example shape: a batched generator that yields one word of each
request's text per response."""
import numpy as np

from triton_serve_pytriton.decorators import batch
from triton_serve_pytriton.model_config import ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton


@batch
def words(text):
    split = [row[0].decode("utf-8").split() for row in text]
    for position in range(max(len(each) for each in split)):
        yield {"word": np.array([[each[position].encode() if position < len(each) else b""] for each in split],
                                dtype=object)}


with Triton() as triton:
    triton.bind(
        model_name="Words",
        infer_func=words,
        inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="word", dtype=bytes, shape=(1,))],
        config=ModelConfig(decoupled=True),
        strict=True,
    )
    triton.serve()
