"""What a frontend knows of one model version, and request validation against it.

Built from the broker's ModelInfo (the config completed by the worker). Validation
runs here, in the frontend, so that bad requests never reach the broker and the work
scales with the number of frontend processes. Messages follow Triton's wording.
"""

from __future__ import annotations

from shoal.configs.model_spec import InputSpec, OutputSpec
from shoal.configs.spec_reader import served_view
from shoal.configs.traffic import loaded_policy
from shoal.dataplane.json_tensors import check_bytes_elements
from shoal.dataplane.types import ClientRequest, InputTensor
from shoal.ipc import datatypes
from shoal.ipc.errors import RequestError, invalid_arg, invalid_request

#: What Triton appends to a shape error of a model that batches.
_BATCH_DIM_NOTE = (
    ". NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
    "dimension to be prepended to each input shape. If you want to specify the full shape "
    "including the batch dim in your input dims config, try setting max_batch_size to zero. "
    "See the model configuration docs for more info on max_batch_size."
)


def _dims_str(dims: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class ModelHandle:
    """One model version as the broker's ModelInfo gives it: ``config_bytes``, the
    completed config (serialized ModelConfig) for the gRPC adapter, ``config_json`` and
    ``metadata`` rendered from it as Triton's, ``spec`` what validation reads."""

    def __init__(self, name: str, version: int, versions: list[int], config_bytes: bytes) -> None:
        spec, self.config_json, self.metadata = served_view(config_bytes, versions)
        self.name = name
        self.version = version
        self.versions = versions
        self.spec = spec
        self.config_bytes = config_bytes
        self.max_batch_size = spec.max_batch_size
        self.inputs: dict[str, InputSpec] = {t.name: t for t in spec.inputs}
        self.outputs: dict[str, OutputSpec] = {t.name: t for t in spec.outputs}
        self.required = [n for n, s in self.inputs.items() if not s.optional]
        self.response_cache = spec.response_cache  # if the server has a cache
        self.is_ensemble = spec.is_ensemble  # the frontend runs its steps
        self.is_python = spec.backend == "python"  # its model reads the request's id, params
        # any number of answers per request, through streams only (ModelStreamInfer)
        self.decoupled = spec.decoupled
        self.traffic = loaded_policy(spec)

    def batch_size(self, req: ClientRequest) -> int:
        """Validate the inputs of ``req``; returns the batch size (0 when not batching).

        In Triton 2.51's order (InferenceRequest::Normalize, then its input checks): the
        names, the batch size common to all inputs, its limit, then each input's datatype,
        shape (-1 on either side matches any size) and, last, that no dimension is left
        unspecified (negative: only gRPC can send one). The inputs are walked newest first,
        as Triton walks its std::unordered_map of them. Each input's batch dimension is set
        to the request's (Triton's ShapeWithBatchDim)."""
        self._check_names(req)
        order = req.inputs[::-1]
        batch = 0
        if self.max_batch_size > 0:
            for t in order:
                if not t.shape:
                    raise self._shape_error(t, self.inputs[t.name])
                if batch == 0:
                    batch = t.shape[0] % 2**32  # Triton keeps it in a uint32
                elif t.shape[0] != batch:
                    raise invalid_request(
                        f"input '{t.name}' batch size does not match other inputs for '{self.name}'"
                    )
            if batch < 1 or batch > self.max_batch_size:
                raise invalid_request(
                    f"inference request batch-size must be <= {self.max_batch_size} for "
                    f"'{self.name}'"
                )
            for t in order:
                # A 0 seen before the batch was known, or a size Triton's uint32 wrapped:
                # Triton holds the tensor to the request's batch (ShapeWithBatchDim), so
                # its bytes are checked, and it runs, at that batch, never its own.
                t.shape[0] = batch
        for t in order:
            spec = self.inputs[t.name]
            if t.datatype != spec.datatype:
                raise invalid_request(
                    f"inference input '{t.name}' data-type is '{t.datatype}', but model "
                    f"'{self.name}' expects '{spec.datatype}'"
                )
            self._check_shape(t, spec)
            if any(d < 0 for d in t.shape):
                raise invalid_request(
                    f"All input dimensions should be specified for input '{t.name}' for "
                    f"model '{self.name}', got {_dims_str(t.shape)}"
                )
        return batch

    def _check_names(self, req: ClientRequest) -> None:
        """Triton's order: the input count first, then each name."""
        given = [t.name for t in req.inputs]
        missing = [n for n in self.required if n not in given]
        if len(given) > len(self.inputs) or len(given) < len(self.required):
            raise self._count_error(given, missing)
        for n in given:
            if n not in self.inputs:
                raise invalid_arg(f"unexpected inference input '{n}' for model '{self.name}'")
        if missing or len(set(given)) != len(given):
            raise self._count_error(given, missing)
        for o in req.outputs:
            if o.name not in self.outputs:
                raise invalid_arg(f"unexpected inference output '{o.name}' for model '{self.name}'")

    def _count_error(self, given: list[str], missing: list[str]) -> RequestError:
        n_all, n_req = len(self.inputs), len(self.required)
        expected = (
            f"expected {n_all} inputs"
            if n_all == n_req
            else f"expected number of inputs between {n_req} and {n_all}"
        )
        # Triton lists the inputs from a std::unordered_map: an order that depends on the
        # names' hashes, most often newest first (as here) for a few names.
        got = ",".join(f"'{n}'" for n in reversed(given))
        # Triton drops the last character of "['a','b'," to close the list: with nothing
        # missing, that is the "[" itself. Kept, so that messages compare equal.
        miss = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
        return invalid_request(
            f"{expected} but got {len(given)} inputs for model '{self.name}'. Got input(s) "
            f"[{got}], but missing required input(s) {miss}. Please provide all required "
            "input(s)."
        )

    def _check_shape(self, t: InputTensor, spec: InputSpec) -> None:
        dims = t.shape[1:] if self.max_batch_size > 0 else t.shape
        if len(dims) != len(spec.dims) or any(
            -1 not in (want, got) and want != got for want, got in zip(spec.dims, dims, strict=True)
        ):
            raise self._shape_error(t, spec)

    def _shape_error(self, t: InputTensor, spec: InputSpec) -> RequestError:
        full = [-1, *spec.dims] if self.max_batch_size > 0 else list(spec.dims)
        return invalid_request(
            f"unexpected shape for input '{t.name}' for model '{self.name}'. Expected "
            f"{_dims_str(full)}, got {_dims_str(t.shape)}"
            + (_BATCH_DIM_NOTE if self.max_batch_size > 0 else "")
        )

    def model_shape(self, t: InputTensor, batch: int) -> list[int]:
        """The shape the model receives (config ``reshape`` applied)."""
        spec = self.inputs[t.name]
        if spec.reshape is None:
            return list(t.shape)
        return [batch, *spec.reshape] if self.max_batch_size > 0 else list(spec.reshape)

    def output_nbytes(self, name: str, batch: int) -> int | None:
        """The byte size of an output when its shape is fixed, else None."""
        spec = self.outputs[name]
        dt = datatypes.datatype(spec.datatype)
        if dt is None or dt.itemsize == 0 or any(d < 0 for d in spec.dims):
            return None
        n = datatypes.element_count(spec.dims) * dt.itemsize
        return n * batch if self.max_batch_size > 0 else n


def check_byte_size(t: InputTensor, model: str) -> None:
    """The tensor's bytes must match its datatype and shape exactly."""
    assert t.data is not None
    dt = datatypes.datatype(t.datatype)
    assert dt is not None
    count = datatypes.element_count(t.shape)
    if dt.itemsize:
        expected = count * dt.itemsize
        if len(t.data) != expected:
            raise invalid_request(
                f"input byte size mismatch for input '{t.name}' for model '{model}'. "
                f"Expected {expected}, got {len(t.data)}"
            )
        return
    check_bytes_elements(t.name, t.data, count, model)
