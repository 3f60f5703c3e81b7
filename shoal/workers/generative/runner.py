"""The shell around the engine: what a Python-backend model whose config names a
generative class (``generative_model``) runs as, in place of a ``TritonPythonModel``.

Its ``execute`` only reads each request (Triton's vLLM backend inputs: text_input,
stream, sampling_parameters, exclude_input_in_output, the return_* flags) and hands it
to the engine's thread, then returns: the worker takes the next batch at once, so new
requests join the sequences already generating (in-flight batching). The engine's
thread runs one step after another while there is work; each step's tokens go out
through the requests' response senders (the decoupled path of the worker,
shoal/workers/streams.py), the last one with the final flag. A request whose client
gave up (``is_cancelled``) is retired before the next step, its blocks freed.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shoal.configs.devices import group_devices
from shoal.workers import pb_utils
from shoal.workers.generative.engine import Engine, Output
from shoal.workers.generative.interface import KvCache
from shoal.workers.generative.metrics import EngineMetrics
from shoal.workers.generative.sampler import InvalidSampling, SamplingParams
from shoal.workers.generative.settings import EngineSettings
from shoal.workers.generative.tensor_parallel import TensorParallelGroup

log = logging.getLogger("shoal.worker")

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_RETURNS = (
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
)


#: The inputs and outputs of Triton's vLLM backend, as its auto-complete fills them.
_INPUTS: list[dict[str, Any]] = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
    {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "exclude_input_in_output", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    *(
        {"name": f"return_{r}", "data_type": "TYPE_BOOL", "dims": [1], "optional": True}
        for r in _RETURNS
    ),
]
_OUTPUTS: list[dict[str, Any]] = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
]


@dataclass(eq=False)
class _Live:
    """A request the engine runs (its handle there)."""

    sender: Any
    prompt: str
    stream: bool
    exclude_input: bool
    returns: set[str]
    text: list[str] = field(default_factory=list)  # held for a request that does not stream
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # held until sent


def _returned(name: str, out: Output) -> np.ndarray:
    """The output ``name`` (one of ``_RETURNS``) of a response carrying ``out``."""
    if name == "finish_reason":
        return np.array([str(out.finish).encode()], dtype=np.object_)
    if name == "cumulative_logprob":
        return np.array([out.cumulative_logprob], dtype=np.float32)
    if name == "logprobs":
        return np.array([json.dumps(out.logprobs).encode()], dtype=np.object_)
    count = out.num_input_tokens if name == "num_input_tokens" else out.num_output_tokens
    return np.array([count], dtype=np.uint32)


def runner_for(model_class: type) -> type:
    """The TritonPythonModel class that serves ``model_class`` with the engine."""
    return type("GenerativeRunner", (GenerativeRunner,), {"model_class": model_class})


def _parameters(config: dict[str, Any]) -> dict[str, str]:
    raw = config.get("parameters", {}) or {}
    return {
        k: (v.get("string_value", "") if isinstance(v, dict) else str(v)) for k, v in raw.items()
    }


class GenerativeRunner:
    model_class: type

    @staticmethod
    def auto_complete_config(config: Any) -> Any:
        """As Triton's vLLM backend completes a config: each input and output of the
        contract the config does not list, decoupled, no batch dimension (a config that
        says otherwise fails the load, in Triton's words)."""
        have = config.as_dict()
        inputs = {t.get("name") for t in have.get("input", [])}
        outputs = {t.get("name") for t in have.get("output", [])}
        for spec in _INPUTS:
            if spec["name"] not in inputs:
                config.add_input(dict(spec))
        for spec in _OUTPUTS:
            if spec["name"] not in outputs:
                config.add_output(dict(spec))
        config.set_max_batch_size(0)
        config.set_model_transaction_policy({"decoupled": True})
        return config

    def initialize(self, args: dict[str, Any]) -> None:
        """Build the model, its KV cache and the engine, then start the engine's thread;
        raises (the load fails with it) on a config the engine cannot serve."""
        config = json.loads(args["model_config"])
        if not config.get("model_transaction_policy", {}).get("decoupled", False):
            raise ValueError(
                "a generative model must be decoupled: model_transaction_policy { decoupled: true }"
            )
        params = _parameters(config)
        settings = EngineSettings.from_parameters(params)
        from tokenizers import Tokenizer

        folder = Path(args["model_repository"])
        path = folder / args["model_version"] / settings.tokenizer
        tokenizer = Tokenizer.from_file(str(path if path.exists() else folder / settings.tokenizer))
        self.tokenizer = tokenizer
        device = "cuda" if args.get("model_instance_kind") == "GPU" else "cpu"
        self._group: TensorParallelGroup | None = None
        model, kv, blocks = self._model(params, settings, device)
        self.engine = Engine(
            model, kv, blocks, settings.scheduler(),
            lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            settings.default_max_tokens, settings.request_timeout_s,
        )  # fmt: skip
        self.metrics = EngineMetrics(
            args["model_name"], args["model_version"], args["model_instance_name"]
        )
        self._publish(force=True)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._live: list[_Live] = []
        self._thread = threading.Thread(target=self._loop, name="generative-engine", daemon=True)
        self._thread.start()

    def _model(
        self, params: dict[str, str], settings: EngineSettings, device: str
    ) -> tuple[Any, KvCache, int]:
        """The model (this rank's shard, wrapped, for a tensor-parallel group, whose other
        ranks start here), its KV cache, and the cache's block count."""
        size = settings.tensor_parallel_size
        if size > 1:
            visible = group_devices(size) if device == "cuda" else None
            self._group = TensorParallelGroup(size, self.model_class, params, device, visible)
            model = self._group.model()
        else:
            model = self.model_class(params, device)
        layout = model.kv_layout()
        blocks = settings.num_blocks(layout.bytes_per_token())
        kv = KvCache.allocate(layout, blocks, settings.kv_block_size, device)
        if self._group is not None:
            self._group.start(blocks, settings.kv_block_size)
            model, kv = self._group.leader(model), self._group.cache(kv)
        return model, kv, blocks

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._inbox.put(request)
        self._wake.set()

    def finalize(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        if self._group is not None:
            self._group.stop()

    # -- the engine's thread --------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop:
            self._wake.clear()
            try:
                self._take_requests()
                self._retire_cancelled()
                if not self.engine.has_work():
                    self._publish(force=True)
                    self._wake.wait()
                    continue
                outputs = self.engine.step(time.monotonic())
                # (a request's first token and its end: on /metrics before its client sees them)
                self._publish(force=any(out.first or out.finish is not None for out in outputs))
                for out in outputs:
                    self._respond(out)
            except Exception as exc:  # the model's fault: its requests end, the loop goes on
                log.exception("generative model step failed")
                self._fail_all(f"{type(exc).__name__}: {exc}")
        self._fail_all("the model is being unloaded")

    def _take_requests(self) -> None:
        now = time.monotonic()
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return
            sender = request.get_response_sender()
            try:
                live, ids, params = self._read(request, sender)
                self.engine.add(live, ids, params, now, "logprobs" in live.returns)
                self._live.append(live)
            except (InvalidSampling, ValueError, UnicodeDecodeError) as exc:
                self._error(sender, pb_utils.TritonError.INVALID_ARG, str(exc))
            except Exception as exc:  # (the model's or the tokenizer's fault)
                log.exception("a generative request could not be read")
                self._error(sender, pb_utils.TritonError.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _read(self, request: Any, sender: Any) -> tuple[_Live, list[int], SamplingParams]:
        def scalar(name: str, default: Any) -> Any:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                return default
            array = tensor.as_numpy().reshape(-1)
            return array[0] if array.size else default

        prompt = scalar("text_input", None)
        if prompt is None:
            raise ValueError("input 'text_input' is required")
        prompt = prompt.decode() if isinstance(prompt, bytes) else str(prompt)
        sampling = scalar("sampling_parameters", b"")
        sampling = sampling.decode() if isinstance(sampling, bytes) else str(sampling)
        returns = {r for r in _RETURNS if bool(scalar(f"return_{r}", False))}
        live = _Live(
            sender, prompt, bool(scalar("stream", False)),
            bool(scalar("exclude_input_in_output", False)), returns,
        )  # fmt: skip
        params = SamplingParams.parse(sampling)
        return live, self.tokenizer.encode(prompt).ids, params

    def _retire_cancelled(self) -> None:
        for live in [x for x in self._live if x.sender.is_cancelled()]:
            out = self.engine.cancel(live)
            if out is not None:
                self._publish(force=True)
                self._respond(out)

    def _respond(self, out: Output) -> None:
        """Send ``out`` to its request: a response per new text when it streams (with the
        logprobs of every token since the last response), else one response at the end
        with all of the text and every token's logprobs."""
        live: Any = out.handle
        final = out.finish is not None
        if final:
            self._live.remove(live)
        live.logprobs += out.logprobs
        if not live.stream:
            live.text.append(out.text)
            if not final:
                return
            text = "".join(live.text)
            text = text if live.exclude_input else live.prompt + text
        elif not out.text and not final:
            return  # (nothing to show yet: a partial character, a held-back stop string)
        else:
            text = out.text
        out.logprobs, live.logprobs = live.logprobs, []
        response = self._response(live, out, text)
        try:
            live.sender.send(response, _FINAL if final else 0)
        except pb_utils.TritonModelException:  # (the worker ended it: it is stopping)
            log.debug("a response of a generative request could not be sent")

    def _response(self, live: _Live, out: Output, text: str) -> pb_utils.InferenceResponse:
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
        tensors += [  # (most requests ask for none: built only when asked)
            pb_utils.Tensor(name, _returned(name, out)) for name in _RETURNS if name in live.returns
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _error(self, sender: Any, code: int, message: str) -> None:
        error = pb_utils.TritonError(message, code)
        try:
            sender.send(pb_utils.InferenceResponse(error=error), _FINAL)
        except pb_utils.TritonModelException:
            log.debug("an error response of a generative request could not be sent")

    def _fail_all(self, message: str) -> None:
        """End every request with ``message`` (a client never waits for ever, even when
        the engine's own state is what failed)."""
        for live in list(self._live):
            self._error(live.sender, pb_utils.TritonError.INTERNAL, message)
            try:
                self.engine.cancel(live, "abort")
            except Exception:
                log.exception("a failed generative request could not be retired")
        self._live = []
        self._publish(force=True)

    def _publish(self, force: bool) -> None:
        """The metrics after a step (``force``: now, not at the next interval)."""
        self.metrics.update(self.engine.stats, self.engine.take_times(), time.monotonic(), force)
