"""add_sub: the element-wise sum and difference of two INT32 tensors."""
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = {
            name: pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.dtypes["OUTPUT0"]))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.dtypes["OUTPUT1"]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
