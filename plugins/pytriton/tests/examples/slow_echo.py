"""A PyTriton script whose function takes a while, for stopping the server with a request in flight: the
function touches the file named by $SLOW_ECHO_STARTED when a call begins, then sleeps a second."""
import os
import pathlib
import time

import numpy as np

from triton_serve_pytriton.decorators import batch
from triton_serve_pytriton.model_config import ModelConfig, Tensor
from triton_serve_pytriton.triton import Triton


@batch
def slow_echo(value):
    pathlib.Path(os.environ["SLOW_ECHO_STARTED"]).touch()
    time.sleep(1.0)
    return {"echo": value}


with Triton() as triton:
    triton.bind(
        model_name="SlowEcho",
        infer_func=slow_echo,
        inputs=[Tensor(name="value", dtype=np.int64, shape=(1,))],
        outputs=[Tensor(name="echo", dtype=np.int64, shape=(1,))],
        config=ModelConfig(max_batch_size=4),
    )
    triton.serve()
