"""A stand-in generative model (a Python model's model.py, copied into test repositories
by tests/generative.py): decoupled, with the I/O of Triton's vLLM backend, and fully
deterministic, so that tests can say what every answer must be.

Its "tokens" are the UTF-8 bytes of its text (tests/generative.py's byte-level
tokenizer counts the same). Greedy (temperature 0 or unset), it writes the prompt's
characters reversed; sampled, 64 letters drawn by ``random.Random(seed)``. It honours
``max_tokens`` ("length"), ``stop`` (cut before the first stop string: "stop"),
``ignore_eos`` (the text repeated up to ``max_tokens``), ``stream`` (a response per
token) and ``exclude_input_in_output``, and sends the extras it is asked for. A prompt
containing ``[raise]`` makes ``execute`` raise; ``[fail-mid]`` sends three tokens, then
an error; ``[crash]`` three tokens, then its process exits; ``[slow]`` waits 50 ms per
token and logs ``standin cancelled after N`` when its request is cancelled.
"""

import json
import os
import random
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LETTERS = "abcdefghij "
LOGPROB = -0.25
ALT_LOGPROB = -2.0


def _flag(request, name, default=False):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else bool(t.as_numpy().reshape(-1)[0])


def _sampling(request):
    t = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    if t is None:
        return {}
    raw = t.as_numpy().reshape(-1)[0]
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


def _story(prompt, params):
    if params.get("temperature"):
        rng = random.Random(params.get("seed"))
        return "".join(rng.choice(LETTERS) for _ in range(64)).encode()
    return prompt[::-1].encode()


def _generate(prompt, params):
    """The bytes generated and the finish reason."""
    full = _story(prompt, params)
    limit = params.get("max_tokens")
    if params.get("ignore_eos") and limit and full:
        full = (full * (limit // len(full) + 1))[:limit]
    cut = min((i for s in params.get("stop", []) if (i := full.find(s.encode())) >= 0),
              default=None)  # fmt: skip
    if cut is not None and (limit is None or cut <= limit):
        return full[:cut], "stop"
    if limit is not None and limit < len(full):
        return full[:limit], "length"
    return full, "stop"


def _logprobs(tokens):
    out = []
    for b in tokens:
        alt = (b + 1) % 256
        out.append({
            str(b): {"logprob": LOGPROB, "rank": 1, "decoded_token": bytes([b]).decode("latin-1")},
            str(alt): {"logprob": ALT_LOGPROB, "rank": 2,
                       "decoded_token": bytes([alt]).decode("latin-1")},
        })  # fmt: skip
    return json.dumps(out).encode()


class TritonPythonModel:
    def initialize(self, args):
        outputs = json.loads(args["model_config"])["output"]
        self.outputs = {o["name"] for o in outputs}
        self.threads = []

    def _response(self, request, text, tokens, n_in, reason):
        tensors = [pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))]
        extras = {
            "finish_reason": lambda: np.array([reason.encode() if reason else b""], np.object_),
            "cumulative_logprob": lambda: np.array([LOGPROB * tokens[0]], np.float32),
            "logprobs": lambda: np.array([_logprobs(tokens[1])], np.object_),
            "num_input_tokens": lambda: np.array([n_in], np.uint32),
            "num_output_tokens": lambda: np.array([tokens[0]], np.uint32),
        }
        for name, make in extras.items():
            if name in self.outputs and _flag(request, f"return_{name}"):
                tensors.append(pb_utils.Tensor(name, make()))
        return pb_utils.InferenceResponse(tensors)

    def respond(self, request):
        sender = request.get_response_sender()
        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        prompt = raw.decode() if isinstance(raw, bytes) else str(raw)
        params = _sampling(request)
        out, reason = _generate(prompt, params)
        head = b"" if _flag(request, "exclude_input_in_output") else prompt.encode()
        n_in = len(prompt.encode())
        if not _flag(request, "stream"):
            answer = self._response(request, head + out, (len(out), out), n_in, reason)
            sender.send(answer, FINAL)
            return
        steps = [out[i : i + 1] for i in range(len(out))] or [b""]
        for i, token in enumerate(steps):
            if "[slow]" in prompt:
                time.sleep(0.05)
                if request.is_cancelled():
                    pb_utils.Logger.log_info(f"standin cancelled after {i}")
                    sender.send(flags=FINAL)
                    return
            if "[crash]" in prompt and i == 3:
                os._exit(1)  # the instance dies mid-stream
            if "[fail-mid]" in prompt and i == 3:
                error = pb_utils.TritonError("standin failed mid-stream")
                sender.send(pb_utils.InferenceResponse(error=error), FINAL)
                return
            last = i == len(steps) - 1
            text = (head if i == 0 else b"") + token
            done = (min(i + 1, len(out)), token)
            answer = self._response(request, text, done, n_in, reason if last else "")
            sender.send(answer, FINAL if last else 0)

    def execute(self, requests):
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            if b"[raise]" in bytes(raw.reshape(-1)[0]):
                raise RuntimeError("standin raised")
        for request in requests:
            t = threading.Thread(target=self.respond, args=(request,))
            t.start()
            self.threads.append(t)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def finalize(self):
        for t in self.threads:
            t.join()
