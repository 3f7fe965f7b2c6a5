"""preprocess: FP32 values to the fixed-point INT32 tensors add_sub takes."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            scaled = np.rint(raw * 100).astype(np.int32)
            one = np.full_like(scaled, 100)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("SCALED", scaled), pb_utils.Tensor("ONE", one)]))
        return responses
