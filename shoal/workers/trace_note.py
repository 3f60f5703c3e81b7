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
