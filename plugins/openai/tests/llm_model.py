"""A Triton Python model that follows Triton's vLLM tensor contract, or its TensorRT-LLM one (whichever inputs its
config declares), for the OpenAI front-end's tests. Its "tokens" are the prompt's words, read backwards, one word
per token (a prompt holding «text» answers text's words instead, in order); generation stops at a stop word,
after max_tokens or when the words run out. A prompt holding "boom" fails after the first token; one holding
"slow" waits between tokens and, cancelled, writes "cancelled" into the model's directory; one over CONTEXT words
is refused (INVALID_ARG). Asked for logprobs (vLLM's contract), each token's entry lists the sampled token first,
then the top ``logprobs`` tokens: token i of even i is the most likely (logprob -i/10, rank 1) before "alt<k>" (logprob -k,
rank k+1, k from 1); token i of odd i was sampled at rank top+1 (logprob -(top+1)) after "alt<k>" (logprob -k-0.5,
rank k+1, k from 0)."""
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CONTEXT = 300  # the longest prompt, in words, the model takes


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().ravel()


class TritonPythonModel:
    def initialize(self, args):
        self.directory = os.path.join(args["model_repository"])
        config = json.loads(args["model_config"])
        self.vllm = any(spec["name"] == "sampling_parameters" for spec in config["input"])

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.generate, args=(request,), daemon=True).start()
        return None

    def settings(self, request):
        if self.vllm:
            parameters = json.loads(_input(request, "sampling_parameters")[0] or b"{}")
            stop = parameters.get("stop") or []
            exclude = _input(request, "exclude_input_in_output")
            flags = {name: bool(_input(request, name)[0]) if _input(request, name) is not None else False
                     for name in ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason",
                                  "return_logprobs")}
            flags["top"] = parameters.get("logprobs") or 0
            return parameters.get("max_tokens", 16), stop, exclude is None or bool(exclude[0]), flags, parameters
        max_tokens = int(_input(request, "max_tokens")[0])
        stop_words = _input(request, "stop_words")
        stop = [] if stop_words is None else [word.decode() for word in stop_words]
        seen = {name: float(_input(request, name)[0]) for name in ("temperature", "top_p", "seed")
                if _input(request, name) is not None}
        flags = {"return_num_input_tokens": True, "return_num_output_tokens": True, "return_finish_reason": False,
                 "return_logprobs": False}
        return max_tokens, stop, True, flags, seen

    def respond(self, sender, text, flags, words, count, reason, final, tokens=(), first=0):
        outputs = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
        if flags["return_logprobs"]:
            entries = []
            top = flags["top"]
            for index, token in enumerate(tokens, start=first):
                if index % 2 and top:  # sampled, though not among the top tokens: they are alt0..alt<top-1>
                    entry = {str(1000 + index): {"logprob": -float(top + 1), "rank": top + 1, "decoded_token": token}}
                    alternatives = [(k, k + 1, -k - 0.5) for k in range(top)]
                else:  # sampled as the most likely token; then alt1..alt<top-1>
                    entry = {str(1000 + index): {"logprob": -index / 10, "rank": 1, "decoded_token": token}}
                    alternatives = [(k, k + 1, -float(k)) for k in range(1, top)]
                for k, rank, logprob in alternatives:
                    entry[str(k)] = {"logprob": logprob, "rank": rank, "decoded_token": f"alt{k}"}
                entries.append(entry)
            outputs.append(pb_utils.Tensor("logprobs", np.array([json.dumps(entries).encode()], dtype=np.object_)))
        if flags["return_num_input_tokens"]:
            outputs.append(pb_utils.Tensor("num_input_tokens", np.array([len(words)], dtype=np.uint32)))
        if flags["return_num_output_tokens"]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([count], dtype=np.uint32)))
        if flags["return_finish_reason"] and reason:
            outputs.append(pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)))
        flag = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(pb_utils.InferenceResponse(outputs), flags=flag)

    def generate(self, request):
        sender = request.get_response_sender()
        prompt = _input(request, "text_input")[0].decode()
        stream_input = _input(request, "stream")
        stream = stream_input is not None and bool(stream_input[0])
        max_tokens, stop, exclude, flags, seen = self.settings(request)
        words = prompt.split()
        if len(words) > CONTEXT:
            error = pb_utils.TritonError(f"the prompt's {len(words)} tokens do not fit the model's context of "
                                         f"{CONTEXT} tokens", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        tokens, reason = [], "stop"
        script = "«" in prompt and "»" in prompt
        sequence = prompt[prompt.rindex("«") + 1:prompt.rindex("»")].split() if script else list(reversed(words))
        for word in sequence:
            if word in stop:
                break
            if len(tokens) == max_tokens:
                reason = "length"
                break
            if "slow" in words:
                time.sleep(0.05)
                if sender.is_cancelled():
                    with open(os.path.join(self.directory, "cancelled"), "w") as marker:
                        marker.write("cancelled")
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
            tokens.append((" " + word if tokens else word) if script else word + " ")
            if stream:
                if "boom" in words and len(tokens) == 2:
                    error = pb_utils.TritonError("the model blew up mid-stream")
                    sender.send(pb_utils.InferenceResponse(error=error),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
                text = tokens[-1] if exclude or len(tokens) > 1 else prompt + tokens[-1]
                self.respond(sender, text, flags, words, 1, None, False, tokens[-1:], len(tokens) - 1)
        if "boom" in words and not stream:
            error = pb_utils.TritonError("the model blew up")
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if "settings" in words:  # answer with what the sampling settings arrived as
            tokens = [json.dumps(seen, sort_keys=True)]
        if stream:
            self.respond(sender, "", flags, words, 0, reason, True)
        else:
            text = "".join(tokens) if exclude else prompt + "".join(tokens)
            self.respond(sender, text, flags, words, len(tokens), reason, True, tokens)
