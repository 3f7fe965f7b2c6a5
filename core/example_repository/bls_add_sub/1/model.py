"""bls_add_sub: sends each request's inputs to the add_sub model (BLS) and returns what add_sub answered.
Passing ``trace=request.trace()`` makes a traced request's BLS call a child trace of it, as in Triton."""
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        calls = [
            pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")],
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                trace=request.trace(),
            ).async_exec()
            for request in requests
        ]
        responses = []
        for answer in await asyncio.gather(*calls):
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
