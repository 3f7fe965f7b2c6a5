"""postprocess: add_sub's fixed-point INT32 outputs back to FP32 values."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            plus = pb_utils.get_input_tensor_by_name(request, "PLUS").as_numpy()
            minus = pb_utils.get_input_tensor_by_name(request, "MINUS").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("RAW_PLUS_ONE", (plus / 100).astype(np.float32)),
                pb_utils.Tensor("RAW_MINUS_ONE", (minus / 100).astype(np.float32))]))
        return responses
