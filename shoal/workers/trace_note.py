"""A traced request's part in a worker (shoal/dataplane/tracing.py): its compute phases
as Triton names them, what ran it (this process, its instance, cores and GPU) and the
batch it ran in (its size, and the request ids of the others: ids as their frontends
number them). Pure."""

from __future__ import annotations

from shoal.ipc import messages as m


def batch_note(
    batch: m.ExecuteBatch,
    item: m.WorkItem,
    done: m.BatchDone,
    received: int,
    where: dict[str, int | str | list[int]],
    children: list[m.TraceRecord],
) -> m.BatchNote:
    """``received``: the batch's arrival (monotonic ns); the phases follow from the
    batch's timings. ``where``: the process's own attributes."""
    input_end = received + done.input_ns
    output_start = input_end + done.infer_ns
    stamps = [
        ("COMPUTE_START", received),
        ("COMPUTE_INPUT_END", input_end),
        ("COMPUTE_OUTPUT_START", output_start),
        ("COMPUTE_END", output_start + done.output_ns),
    ]
    others = [i.request.req_id for i in batch.items if i is not item]
    attributes = {
        **where,
        "batch_size": done.batch_size,
        "batch_requests": len(batch.items),
        "batch_companions": others,
    }
    return m.BatchNote(stamps, attributes, children)
