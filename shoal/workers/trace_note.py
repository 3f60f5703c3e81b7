"""A traced request's part in a worker (shoal/dataplane/tracing.py): its compute phases
as Triton names them, what ran it (this process, its instance, cores and GPU) and the
batch it ran in (its size, and the request ids of the others: ids as their frontends
number them). Pure."""

from __future__ import annotations

from shoal.ipc import messages as m

Attrs = dict[str, int | str | list[int]]


def first_traced(batch: m.ExecuteBatch) -> int:
    """The trace id of the batch's first traced request (0: none): a Python model's BLS
    requests while it runs are that trace's children."""
    for item in batch.items:
        if isinstance(item.request.hops, m.TracedWay):
            return item.request.hops.id
    return 0


def traced_answer(
    way: m.TracedWay,
    companions: list[int],
    done: m.BatchDone,
    received: int,
    sent: int,
    where: Attrs,
    children: list[m.TraceRecord],
) -> m.TracedAnswer:
    """The answer's ``hops`` for a traced request: its stamps with the batch's receipt
    and the answer's send (monotonic ns), the compute phases that follow from the
    batch's timings, ``where``: the process's own attributes, and the batch."""
    input_end = received + done.input_ns
    output_start = input_end + done.infer_ns
    stamps = [
        ("COMPUTE_START", received),
        ("COMPUTE_INPUT_END", input_end),
        ("COMPUTE_OUTPUT_START", output_start),
        ("COMPUTE_END", output_start + done.output_ns),
    ]
    attributes: Attrs = {
        **where,
        "batch_size": done.batch_size,
        "batch_requests": len(companions) + 1,
        "batch_companions": companions,
    }
    return m.TracedAnswer([*way.stamps, received, sent], stamps, attributes, children)


def where(pid: int, instance: str, cores: list[int], gpu: int | None) -> Attrs:
    """The attributes that name the process that ran a traced request."""
    return {"worker_pid": pid, "instance": instance, "cores": cores,
            "gpu": -1 if gpu is None else gpu}  # fmt: skip


def decoupled_answer(
    way: m.TracedWay,
    ran: list[int],
    sent: int,
    attrs: Attrs,
    children: list[m.TraceRecord] | None = None,
) -> m.TracedAnswer:
    """The final response's ``hops`` for a traced request to a decoupled model, sent
    at ``sent``: ``ran`` holds the batch's receipt, then (once known) when its inputs
    were ready and when the model's ``execute`` returned. COMPUTE_START is the receipt,
    COMPUTE_INPUT_END the inputs ready, COMPUTE_OUTPUT_START ``execute``'s return (or
    the final send, if that came first), COMPUTE_END the final response's send: the
    request's responses all went out between its COMPUTE_START and COMPUTE_END.
    ``children``: the BLS traces its model spawned."""
    received = ran[0]
    input_end = min(ran[1] if len(ran) > 1 else sent, sent)
    output_start = min(ran[2] if len(ran) > 2 else sent, sent)
    stamps = [
        ("COMPUTE_START", received),
        ("COMPUTE_INPUT_END", input_end),
        ("COMPUTE_OUTPUT_START", output_start),
        ("COMPUTE_END", sent),
    ]
    return m.TracedAnswer([*way.stamps, received, sent], stamps, dict(attrs), children or [])
