"""A worker's hello, as the model table takes it (pure: the table and the hello in, what the
worker is told out; no sockets).

A worker of a version the table expects joins it as a LOADING instance (READY once it
reports its model loaded); one that greets a new broker after a restart (``rejoin``) makes
its version READY as soon as it is, as it was under the last broker. A worker of a model
that is not loaded (now) is told to stop for good; one of an ensemble (a supervisord.conf
that lists it by mistake) to stop; one of a model the table never heard of is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from shoal.broker.models import Instance, ModelTable
from shoal.ipc import messages as m

log = logging.getLogger("shoal.broker")


def greet(
    table: ModelTable,
    managed: bool,
    ident: bytes,
    hello: m.WorkerHello,
    watch: Callable[[bytes, int, str], None],
) -> m.Shutdown | Literal["welcome", "ignore"]:
    """Take ``hello`` from worker ``ident`` (``managed``: models load and unload while the
    server runs). ``watch(ident, pid, "worker")`` is called for an instance the table did
    not know, once it joined. Returns "welcome", "ignore", or the Shutdown the worker is sent."""
    mv = table.find(hello.model, hello.version, hello.generation)
    if mv is None and managed:
        # one of a load since unloaded or replaced (restarted after a crash, say)
        log.info("worker for %s/%d (load %d) stopped: not loaded now",
                 hello.model, hello.version, hello.generation)  # fmt: skip
        return m.Shutdown("its model is not loaded", retire=True)
    if mv is None:
        log.warning("worker for unexpected model %s/%d ignored", hello.model, hello.version)
        return "ignore"
    if mv.ensemble is not None:
        log.warning("worker for ensemble %s/%d stopped: an ensemble has no instances",
                    hello.model, hello.version)  # fmt: skip
        return m.Shutdown("an ensemble has no instances")
    if ident not in table.by_ident:
        gpu = hello.gpu if hello.gpu >= 0 else None
        inst = Instance(
            ident, hello.model, hello.version, hello.instance, hello.pid, gpu=gpu,
            name=hello.name or f"{hello.model}_{hello.instance}",
            generation=hello.generation,
        )  # fmt: skip
        table.by_ident[ident] = inst
        mv.add_instance(inst)
        watch(ident, hello.pid, "worker")
    if hello.rejoin:
        # A broker restart: this instance's version was loaded under the last one. It is
        # READY once this instance is, as it was then, even if another instance of it
        # never comes back (its load failed after a crash, say).
        mv.ever_ready = True
        mv.refresh_state()
    return "welcome"
