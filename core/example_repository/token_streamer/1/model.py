"""token_streamer: streams its input text back one token per response through the request's response sender."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().ravel()[0]
            for token in text.decode("utf-8").split():
                if request.is_cancelled():  # the client went away: stop early
                    break
                output = pb_utils.Tensor("text_output", np.array([token.encode("utf-8")], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[output]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
