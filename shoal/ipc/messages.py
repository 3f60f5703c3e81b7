"""Every message that crosses a process boundary, and its wire framing.

A message travels as ZeroMQ frames ``[kind, payload]``: a one-byte kind and a typed
msgspec msgpack payload (``array_like`` structs: small and fast to decode). No pickle,
no ``Any``: decoding validates types, so a malformed peer cannot run code. Two kinds
carry several payloads, one per frame, so that a burst costs one message (one wake-up
of each process on its way) and not one per request: a frontend's ``InferRequest``
message holds every request of one turn of its event loop, ``[I, req, req, ...]``, and
a worker's answers to one frontend (on that frontend's PULL socket, no kind frame) hold
every answer of one batch, ``[resp, resp, ...]``; the broker's ``RESULT`` messages may
hold several too.

Tensor bytes stay out of messages: a ``TensorRef`` points into a POSIX shared-memory
region. Only tensors of at most ``INLINE_MAX_BYTES`` ride inside the message (``data``).

Topology (see ``shoal.ipc.sockets``): frontends and workers connect DEALER sockets to two
ROUTER sockets of the broker. A worker answers each request of a batch straight to the
frontend that sent it (a PUSH to that frontend's bound PULL socket: three hops per
request, not four), then tells the broker the batch is done. The broker itself answers
only the requests it refuses or that a dead worker held, with ``RESULT`` frames on the
frontend's DEALER, and names those a worker reported answered just before it died
(``Unconfirmed``): their answers may have died with it.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from shoal.ipc.trace_messages import TracedAnswer as TracedAnswer
from shoal.ipc.trace_messages import TracedWay as TracedWay
from shoal.ipc.trace_messages import TraceRecord as TraceRecord
from shoal.ipc.trace_messages import TraceSetting as TraceSetting
from shoal.ipc.trace_messages import TraceTable as TraceTable

# Measured in bench/bench_inline.py: below this size, carrying bytes in the message
# costs less than a slot allocation, a copy into shm and a mapping lookup.
INLINE_MAX_BYTES: Final[int] = 16384


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True):
    code: int  # ipc.errors.Code
    message: str
    names_request: bool = False  # the frontend prefixes the client's request id


class TensorRef(msgspec.Struct, array_like=True):
    """A tensor in wire layout (row-major, little-endian; BYTES length-prefixed)."""

    name: str
    datatype: str
    shape: list[int]
    nbytes: int
    region: str = ""  # shm region name; "" when the bytes are inline
    offset: int = 0
    data: bytes | None = None


class OutputSpec(msgspec.Struct, array_like=True):
    """A requested output and, optionally, where the worker should write it."""

    name: str
    region: str = ""  # "" lets the worker answer inline
    offset: int = 0
    nbytes: int = 0  # capacity of the destination slot
    classification: int = 0  # > 0: the top K classes as BYTES in place of the values


class InferRequest(msgspec.Struct, array_like=True):
    req_id: int
    model: str
    version: int  # -1 = the latest ready version
    inputs: list[TensorRef]
    outputs: list[OutputSpec]
    batch_size: int = 1  # 0 for models that do not batch
    priority: int = 0
    timeout_us: int = 0
    # looked up in the frontend's response cache, in vain, in this many ns (-1: not)
    cache_miss_ns: int = -1
    # Triton's sequence parameters (for a model with sequence_batching; 0 or "": none)
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    # for a Python model (its request.request_id() and .parameters()): the client's id and
    # the parameters Triton does not read itself; others go without
    request_id: str = ""
    parameters: dict[str, bool | int | float | str] = {}
    # Its way through the processes, when measured (a frontend under SHOAL_HOP_TIMING=1):
    # time.monotonic_ns() at the frontend's send, the broker's receipt and its dispatch.
    # Empty: not measured, and no process stamps it. A traced request's: its TracedWay.
    hops: list[int] | TracedWay = []
    # with version -1 under the model's traffic policy: the client's shoal_route_key, which
    # keeps it on one version (shoal/broker/traffic.py); "": none
    route_key: str = ""


class InferResponse(msgspec.Struct, array_like=True):
    req_id: int
    outputs: list[TensorRef] = []
    error: ErrorInfo | None = None
    model_version: int = 0
    # A decoupled model answers a request with any number of responses: each but the last
    # says final=False; the last (final=True) may carry no outputs, only the end.
    final: bool = True
    empty: bool = False  # the final flag alone: no response of the model's
    # the request's hops, then the worker's receipt of its batch and its send (measured);
    # a traced request's: TracedAnswer
    hops: list[int] | TracedAnswer = []
    # the response's own parameters (a Python model's ``InferenceResponse(parameters=)``);
    # none: one byte (an empty map) on the wire
    parameters: dict[str, bool | int | str] = {}


# A tensor in a client-registered region is referenced as "shm:<region name>" by the
# frontend; the broker checks it and rewrites it to CLIENT_REGION + str(reg_id), and the
# WorkItem then carries that registration so the worker can map it.
CLIENT_SHM: Final[str] = "shm:"
CLIENT_REGION: Final[str] = "c"
CUDA_HANDLE_BYTES: Final[int] = 64  # a cudaIpcMemHandle_t, as a client registers it


class ClientRegion(msgspec.Struct, array_like=True):
    reg_id: int
    kind: str  # "system" | "cuda"
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0
    raw_handle: bytes = b""
    # system: where a worker opens the object the client registered, the broker's own
    # descriptor of it (/proc/<pid>/fd/<n>): the key may since name another file, or none
    path: str = ""
    dev: int = 0  # system: the registered object's st_dev and st_ino; a worker maps only
    ino: int = 0  # that object, whichever way it was reached


class WorkItem(msgspec.Struct, array_like=True):
    """One request of a batch as the broker hands it to a worker."""

    frontend: bytes  # routing id of the frontend that waits for the answer
    request: InferRequest
    seq: int = 0  # >0: preserve_ordering; the answer goes back through the broker
    regions: list[ClientRegion] = []  # client regions its tensors reference
    slot: int = -1  # a sequence's slot on the instance (shoal.broker.sequencer); -1: none


class ExecuteBatch(msgspec.Struct, array_like=True):
    batch_id: int
    items: list[WorkItem]
    # a sequence model's Direct batch: this many rows, item i in row items[i].slot, the
    # others null rows (shoal/workers/sequence_io.py); 0: the items in order
    rows: int = 0


class BatchDone(msgspec.Struct, array_like=True):
    """Worker -> broker after the batch's results went out, with its timings."""

    batch_id: int
    batch_size: int = 0  # samples executed (the sum of the requests' batch sizes)
    input_ns: int = 0  # gathering inputs into the batch
    infer_ns: int = 0  # the backend's execution
    output_ns: int = 0  # splitting and writing outputs
    # positions in the batch's items that got an error instead of outputs (not req_ids:
    # those are numbered per frontend, so two frontends' requests can share one)
    failed: list[int] = []
    # of those, the ones refused as malformed before anything ran (BYTES in a client
    # region): Triton refuses these before its scheduler, so they count in no statistic
    refused: list[int] = []
    # a decoupled model's requests whose final response has not gone out yet: the
    # instance answers them later, and reports each (StreamsEnded) when it has
    open: list[int] = []


class StreamsEnded(msgspec.Struct, array_like=True):
    """Worker -> broker: these requests, reported open in their BatchDone, got their
    final response (frontend, req_id)."""

    keys: list[tuple[bytes, int]]


class RerunDone(msgspec.Struct, array_like=True):
    """Worker -> broker: it ran requests its model rescheduled again, as one execution
    (shoal/workers/rescheduling.py). As Triton counts each run of an iterative
    sequence's request (each goes through its scheduler again), each run is a request
    of its own in the statistics: ``ok`` ran (answered, or rescheduled again), ``failed``
    got an error; ``done`` has the run's timings (its ``batch_id`` unused)."""

    done: BatchDone
    ok: int = 0
    ok_samples: int = 0  # the sum of the ok requests' batch sizes
    failed: int = 0


class WorkerHello(msgspec.Struct, array_like=True):
    model: str
    version: int
    instance: int
    pid: int
    # it served under a broker that exited: its version was loaded, whatever became of
    # the version's other instances (a new broker must not wait for them for ever)
    rejoin: bool = False
    gpu: int = -1  # the server's id of the GPU it runs on; -1: on the CPU
    name: str = ""  # Triton's instance name, <group>_<k>, for the errors that name it
    generation: int = 0  # the load it belongs to (model control: a reload starts a new one)


class WorkerReady(msgspec.Struct, array_like=True):
    config: bytes  # serialized ModelConfig (protobuf), completed by the worker
    cores: list[int] = []
    # intra-op threads its backend was given; more than len(cores): it may borrow the
    # cores of idle instances (shoal/broker/cores.py)
    threads: int = 0
    # its model has a readiness check of its own (a Python model's ``is_ready``): the
    # worker answers it on its readiness socket (shoal/workers/readiness.py)
    checks_ready: bool = False


class WorkerFailed(msgspec.Struct, array_like=True):
    message: str


class FrontendHello(msgspec.Struct, array_like=True):
    pid: int
    index: int
    # it serves latency summaries (--metrics-config summary_latencies=true): the broker
    # keeps a window of recent observations from then on
    summaries: bool = False
    # the client shared-memory registrations it knows (ClientRegionsKnown): a broker
    # restarted under it registers again those it lacks
    regions: list[ShmRequest] = []


LOG_FORMATS: Final = ("default", "ISO8601")


class LogSettings(msgspec.Struct, array_like=True):
    """tritonserver's log settings (the logging extension's log_info, log_warning,
    log_error, log_verbose_level and log_format). Broker -> frontends and workers when
    they change."""

    info: bool = True
    warning: bool = True
    error: bool = True
    verbose: int = 0
    format: str = "default"
    file: str = ""  # --log-file ("": stderr); set at start only, never through the API


class Welcome(msgspec.Struct, array_like=True):
    broker_pid: int
    log: LogSettings | None = None  # the server's, once changed at run time
    model_control: bool = False  # explicit model control: the API loads and unloads
    trace: TraceTable | None = None  # the server's trace settings


class ModelQuery(msgspec.Struct, array_like=True):
    query_id: int
    model: str
    version: int = -1


class ModelInfo(msgspec.Struct, array_like=True):
    query_id: int
    error: ErrorInfo | None = None
    name: str = ""
    version: int = 0  # the version resolved for the query
    versions: list[int] = []  # every version that is loaded (ready)
    ready: bool = False
    platform: str = ""
    config: bytes = b""  # serialized ModelConfig of `version`
    # pids of the version's READY instances whose model checks its own readiness: a
    # readiness probe asks each (shoal/dataplane/readiness_checks.py)
    ready_checks: list[int] = []


class ModelFileQuery(msgspec.Struct, array_like=True):
    """A file of a loaded model's directory (a tokenizer, a chat template the config's
    parameters name): ``path`` relative to the version's directory, else the model's."""

    query_id: int
    model: str
    version: int
    path: str


class ModelFileReply(msgspec.Struct, array_like=True):
    query_id: int
    error: ErrorInfo | None = None
    data: bytes = b""


class ServerQuery(msgspec.Struct, array_like=True):
    query_id: int
    memory_of: str = ""  # this model's instances in detail (/proc reads: not for probes)


class ResourceNeed(msgspec.Struct):
    name: str
    count: int
    device: int | None = None  # None: a global resource


class InstanceTurns(msgspec.Struct):
    """An instance under the rate limiter (--rate-limit=execution_count)."""

    priority: int
    resources: list[ResourceNeed]  # what it needs to run a batch
    executions: int  # so far, for its turns (executions x priority, lowest first)
    holding: bool  # its resources, now (running a batch)


class InstanceInfo(msgspec.Struct):
    index: int
    pid: int
    state: str
    cores: list[int] = []
    busy: bool = False  # running a batch now
    passive: bool = False  # loaded, never sent requests (a passive instance group)
    gpu: int | None = None  # the server's id of its GPU; None: a CPU instance
    memory_mb: int | None = None  # its own memory (shoal.broker.memory), when asked for
    rate_limiter: InstanceTurns | None = None  # when asked for, and the limiter is on


class SequenceSummary(msgspec.Struct):
    """A stateful model's sequence batcher, now (shoal/broker/sequencer.py)."""

    strategy: str  # direct | oldest
    slots_per_instance: int
    in_slots: int  # sequences holding a slot
    backlog: int  # sequences waiting for one


class ModelState(msgspec.Struct, array_like=True):
    name: str
    version: int
    state: str  # READY | UNAVAILABLE | LOADING
    reason: str = ""
    instances: list[InstanceInfo] = []
    queued: int = 0  # requests waiting in the version's queue (not yet sent to an instance)
    memory_limit_mb: int = 0  # the limit on each instance's own memory; 0: none
    sequences: SequenceSummary | None = None  # a stateful model's sequence batcher


class ServerState(msgspec.Struct, array_like=True):
    query_id: int
    live: bool
    ready: bool
    models: list[ModelState] = []
    # ready under strict readiness only if each of these instances says its model is (a
    # Python model's is_ready, asked by the frontend: shoal/dataplane/readiness_checks.py)
    ready_checks: list[int] = []


class FrontendGone(msgspec.Struct, array_like=True):
    """Broker -> workers: stop sending results to this frontend (it exited)."""

    frontend: bytes


class FrontendLeaving(msgspec.Struct, array_like=True):
    """Frontend -> broker: stopping on request (SIGTERM); its exit, which follows once it
    has drained, is an orderly stop, not a fault."""


class CacheHit(msgspec.Struct, array_like=True):
    """Frontend -> broker: a request answered from the frontend's response cache, for the
    statistics (Triton's: a success and a cache hit, no inference, no execution)."""

    model: str
    version: int
    request_ns: int  # from its arrival to its answer
    hit_ns: int  # of that, the lookup and the copy out of the cache


class EnsembleDone(msgspec.Struct, array_like=True):
    """Frontend -> broker: an ensemble request it ran (shoal/dataplane/ensemble_runner.py), for the
    ensemble's statistics (its steps count in their models' own)."""

    model: str
    version: int
    request_ns: int  # from its arrival to its answer
    ok: bool
    batch_size: int = 0  # the request's (0: the ensemble does not batch)


class Cancel(msgspec.Struct, array_like=True):
    """Frontend -> broker: the client gave up on this request (a gRPC deadline or cancel).
    If it is still queued the broker drops it and answers CANCELLED, which frees what the
    frontend holds for it; once it runs, the worker's answer does that. Broker -> worker,
    with ``frontend``: a decoupled model's request it runs or still answers was cancelled
    (the model's ``is_cancelled()`` says so from then on)."""

    req_id: int
    frontend: bytes = b""


class Unconfirmed(msgspec.Struct, array_like=True):
    """Broker -> frontend: a worker died soon after reporting these requests answered,
    so their answers may have died in its send queue. The frontend fails those it is
    still waiting for once any answer already on its way has had time to arrive."""

    req_ids: list[int]
    error: ErrorInfo


class StatsQuery(msgspec.Struct, array_like=True):
    query_id: int
    model: str = ""  # "" = every model
    version: int = -1  # -1 = every version


class Duration(msgspec.Struct):
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


class InferStats(msgspec.Struct):
    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)
    queue: Duration = msgspec.field(default_factory=Duration)
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)
    cache_hit: Duration = msgspec.field(default_factory=Duration)
    cache_miss: Duration = msgspec.field(default_factory=Duration)


class BatchStats(msgspec.Struct):
    batch_size: int
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)


class ResponseStats(msgspec.Struct):
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)
    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)
    empty_response: Duration = msgspec.field(default_factory=Duration)
    cancel: Duration = msgspec.field(default_factory=Duration)


class MemoryUsage(msgspec.Struct):
    type: str  # CPU, CPU_PINNED, GPU
    id: int
    byte_size: int


class ModelStats(msgspec.Struct):
    """Triton's statistics extension, field for field (JSON keys as Triton's)."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch
    inference_count: int = 0
    execution_count: int = 0
    inference_stats: InferStats = msgspec.field(default_factory=InferStats)
    # Per-response statistics (decoupled models) and memory usage reports: Triton always
    # prints both; no shoal backend reports either, as ONNX Runtime and PyTorch in Triton.
    response_stats: dict[str, ResponseStats] = {}
    batch_stats: list[BatchStats] = []
    memory_usage: list[MemoryUsage] = []


class StatsReply(msgspec.Struct, array_like=True):
    query_id: int
    error: ErrorInfo | None = None
    model_stats: list[ModelStats] = []


FailureReason = Literal["REJECTED", "CANCELED", "BACKEND", "OTHER"]
# Triton's reasons for a failed request, its metrics' ``reason`` label: REJECTED (its
# queue timeout expired), CANCELED (its client gave up), BACKEND (its execution failed,
# or its instance died), OTHER (anything else: its frontend exited).
FAILURE_REASONS: Final[tuple[FailureReason, ...]] = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# Why an instance of a model exited without being asked to (shoal's metric
# shoal_instance_exit_count): it died by itself or by an outside kill (crash), or the
# broker killed it, for a batch over --model-execution-timeout-secs (execution_timeout)
# or for holding more memory than its limit (memory_limit).
ExitReason = Literal["crash", "execution_timeout", "memory_limit"]
EXIT_REASONS: Final[tuple[ExitReason, ...]] = ("crash", "execution_timeout", "memory_limit")
# The phases of a request that latency summaries observe, in Triton's order.
PHASES: Final = ("request", "queue", "compute_input", "compute_infer", "compute_output")
CACHE_PHASES: Final = ("cache_hit", "cache_miss")  # a response cache's lookups


class MetricsQuery(msgspec.Struct, array_like=True):
    query_id: int
    quantiles: list[float] = []  # of the latency summaries, when they are served


class VersionMetrics(msgspec.Struct, array_like=True):
    """What the Prometheus metrics of one model version are made from."""

    stats: ModelStats
    failures: dict[str, int]  # failed requests by Triton's reason label
    pending: int  # queued, not yet executing
    tags: dict[str, str] = {}  # the config's metric_tags: extra labels
    # phase -> the query's quantiles of the last minute's observations, in µs (NaN: none)
    summaries: dict[str, list[float]] = {}
    exits: dict[ExitReason, int] = {}  # instance exits unasked
    memory: dict[
        int, int
    ] = {}  # instance index -> the bytes of its own memory (shoal.broker.memory)
    memory_limit: int = 0  # bytes; 0: none
    response_cache: bool = False  # its config enables the response cache
    # the server's id of the GPU all its instances run on (its series then carry that
    # GPU's gpu_uuid, as Triton's do); -1: they run on the CPU, or on several devices
    gpu: int = -1


class MetricsReply(msgspec.Struct, array_like=True):
    query_id: int
    versions: list[VersionMetrics] = []


class LogQuery(msgspec.Struct, array_like=True):
    """Frontend -> broker: the log settings, after ``changes`` (checked by the frontend:
    keys of LogSettings, values of their types) if there are any."""

    query_id: int
    changes: dict[str, bool | int | str] = {}


class LogReply(msgspec.Struct, array_like=True):
    query_id: int
    settings: LogSettings


class TraceQuery(msgspec.Struct, array_like=True):
    """Frontend -> broker: a model's trace settings ("": the global ones), after
    ``changes`` (checked by the frontend: a field of TraceSetting -> its value, or None
    to clear it) if there are any."""

    query_id: int
    model: str = ""
    changes: dict[str, list[str] | int | None] = {}


class TraceReply(msgspec.Struct, array_like=True):
    query_id: int
    setting: TraceSetting = TraceSetting()
    mode: str = "triton"
    options: dict[str, str] = {}
    error: ErrorInfo | None = None


class ShmRequest(msgspec.Struct, array_like=True):
    """Frontend -> broker: the shared-memory extension's register/unregister/status."""

    query_id: int
    op: str  # "register" | "unregister" | "status" | "check"
    kind: str  # "system" | "cuda"
    name: str = ""  # "" with unregister/status: every region of the kind
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0
    raw_handle: bytes = b""
    # check: a request's references (region, offset, byte size) in its order; the reply
    # carries the error of the first that does not resolve, as inference would answer
    refs: list[tuple[str, int, int]] = []


class RegionStatus(msgspec.Struct):
    name: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0


class ShmReply(msgspec.Struct, array_like=True):
    query_id: int
    error: ErrorInfo | None = None
    regions: list[RegionStatus] = []


class ClientRegionsKnown(msgspec.Struct, array_like=True):
    """Broker -> every frontend, after each change and to a frontend that joins: the
    whole table of client shared-memory registrations, each as the register request
    that made it. A frontend keeps the latest and gives it in its next hello, so a broker
    that restarts gets them back."""

    regions: list[ShmRequest]


class RegionsReleased(msgspec.Struct, array_like=True):
    """Broker -> workers: unmap these client registrations (unregistered, unused)."""

    reg_ids: list[int]


class Shutdown(msgspec.Struct, array_like=True):
    reason: str = ""
    retire: bool = False  # its model was unloaded or replaced: exit for good (EXIT_RETIRED)


class ModelControl(msgspec.Struct, array_like=True):
    """Frontend -> broker: the model repository extension's load or unload (explicit
    model control). Answered by ControlReply once the model has settled."""

    query_id: int
    action: str  # load | unload
    model: str
    config: str = ""  # load: a JSON ModelConfig that replaces the model's config file
    files: dict[str, bytes] = {}  # load: "file:<version>/<path>" parameters, decoded
    unload_dependents: bool = False  # unload: the ensembles that use it go too


class ControlReply(msgspec.Struct, array_like=True):
    query_id: int
    error: ErrorInfo | None = None


class ModelsChanged(msgspec.Struct, array_like=True):
    """Broker -> frontends: these models were loaded, reloaded or unloaded; what a
    frontend keeps of them (configs, ensemble plans, cached responses) is stale."""

    names: list[str]


class LauncherHello(msgspec.Struct, array_like=True):
    """Launcher -> broker (on the frontend socket): it starts the workers the broker asks
    for (StartWorkers), the instances of models loaded through the model control API."""

    pid: int


class WorkerSpec(msgspec.Struct, array_like=True):
    model: str
    version: int
    instance: int
    name: str  # Triton's instance name, <group>_<k>
    generation: int
    cores: list[int] = []
    gpu: int = -1  # -1: a CPU instance, on ``cores``
    config_file: str = ""  # a JSON ModelConfig replacing the repository's (load's config)
    model_repository: str = ""  # "": the server's; else a load's own files (file:...)


class StartWorkers(msgspec.Struct, array_like=True):
    """Broker -> launcher: start these instances."""

    workers: list[WorkerSpec]


class GenerationsGone(msgspec.Struct, array_like=True):
    """Broker -> launcher: nothing of these loads is left; a worker of one still running
    (one that never said hello) is stopped, and none is restarted."""

    generations: list[int]


# One-byte kinds. RESULT frames an InferResponse on the broker -> frontend path, and on
# the worker -> broker path for preserve_ordering items: [RESULT, frontend, seq, payload].
KINDS: Final[dict[type[msgspec.Struct], bytes]] = {
    InferRequest: b"I",
    InferResponse: b"R",
    ExecuteBatch: b"X",
    BatchDone: b"D",
    WorkerHello: b"H",
    WorkerReady: b"Y",
    WorkerFailed: b"F",
    FrontendHello: b"h",
    Welcome: b"W",
    ModelQuery: b"q",
    ModelInfo: b"m",
    ModelFileQuery: b"f",
    ModelFileReply: b"b",
    ServerQuery: b"s",
    ServerState: b"S",
    Shutdown: b"Z",
    FrontendGone: b"G",
    FrontendLeaving: b"B",
    StatsQuery: b"t",
    StatsReply: b"T",
    MetricsQuery: b"p",
    MetricsReply: b"P",
    LogQuery: b"g",
    LogReply: b"l",
    LogSettings: b"V",
    TraceQuery: b"x",
    TraceReply: b"y",
    TraceTable: b"z",
    ShmRequest: b"k",
    ShmReply: b"K",
    RegionsReleased: b"L",
    ClientRegionsKnown: b"j",
    Unconfirmed: b"U",
    Cancel: b"C",
    CacheHit: b"c",
    EnsembleDone: b"e",
    ModelControl: b"n",
    ControlReply: b"N",
    ModelsChanged: b"M",
    LauncherHello: b"a",
    StartWorkers: b"A",
    GenerationsGone: b"O",
    StreamsEnded: b"E",
    RerunDone: b"v",
}
RESULT: Final[bytes] = b"r"

_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: Final[dict[bytes, msgspec.msgpack.Decoder]] = {
    kind: msgspec.msgpack.Decoder(cls) for cls, kind in KINDS.items()
}


def encode(msg: msgspec.Struct) -> list[bytes]:
    """Frames ``[kind, payload]`` for a message."""
    return [KINDS[type(msg)], _ENCODER.encode(msg)]


def encode_payload(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)


def decode(kind: bytes, payload: bytes | memoryview) -> msgspec.Struct:
    """Decode one message; raises ValueError for an unknown kind or a malformed payload."""
    dec = _DECODERS.get(bytes(kind))
    if dec is None:
        raise ValueError(f"unknown message kind {bytes(kind)!r}")
    try:
        return dec.decode(payload)  # type: ignore[no-any-return]
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed {bytes(kind)!r} message: {exc}") from exc


def decode_response(payload: bytes | memoryview) -> InferResponse:
    return decode(b"R", payload)  # type: ignore[return-value]
