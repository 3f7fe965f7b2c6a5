"""token_streamer: streams its input text back one word per response through the request's response sender.

Each word carries the whitespace before it (``"hello streaming world"`` streams ``"hello"``, ``" streaming"``,
``" world"``), as an LLM's streamed text deltas do: the responses joined give back the input exactly, which is
how OpenAI's API and other clients of Triton's LLM contracts read them."""
import re

import numpy as np
import triton_python_backend_utils as pb_utils

# Zero-width cuts before each run of whitespace that follows a non-space: every piece is whitespace then a word.
WORD_STARTS = re.compile(r"(?<=\S)(?=\s)")


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().ravel()[0]
            for word in WORD_STARTS.split(text.decode("utf-8")):
                if not word:
                    continue
                if request.is_cancelled():  # the client went away: stop early
                    break
                output = pb_utils.Tensor("text_output", np.array([word.encode("utf-8")], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[output]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
