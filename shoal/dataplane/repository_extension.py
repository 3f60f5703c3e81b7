"""Triton's model repository extension through the broker: the index, and load and unload
(explicit model control), with shoal's view of one model's versions and instances and
of the files in its directory. What the HTTP and gRPC adapters call as
``DataPlane.repository``; the broker keeps the state.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from shoal.dataplane.broker_client import BrokerClient
from shoal.dataplane.json_limits import check_config_override
from shoal.ipc import messages as m
from shoal.ipc.errors import MODEL_CONTROL_DISABLED, Code, ServingError, unknown_model

# How long a load or unload may take before its client is answered UNAVAILABLE (a model
# that loads for longer is still loaded; the index shows when).
_MODEL_CONTROL_TIMEOUT_S: Final = 600.0


async def server_state(broker: BrokerClient, memory_of: str = "") -> m.ServerState | None:
    """The server's state as the broker tells it (with the memory of ``memory_of``'s
    instances); None without a broker."""
    try:
        return await broker.query(
            m.ServerQuery(broker.next_id(), memory_of), m.ServerState, timeout=2.0
        )
    except ServingError:
        return None


class RepositoryExtension:
    def __init__(self, broker: BrokerClient) -> None:
        self.broker = broker

    async def index(self, ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index: each model version's state (and why, when it is
        not ready); a model whose config failed is listed by name, without a version."""
        state = await server_state(self.broker)
        if state is None:
            raise ServingError(Code.UNAVAILABLE, "Server is not ready: no broker connection")
        out: list[dict[str, str]] = []
        for s in state.models:  # by name, then version
            if ready_only and s.state != "READY":
                continue
            entry = {"name": s.name}
            if s.version >= 0:
                entry["version"] = str(s.version)
            if s.state:  # none for a model never loaded: listed by name alone
                entry["state"] = s.state
            if s.reason:
                entry["reason"] = s.reason
            out.append(entry)
        return out

    async def model_instances(self, name: str) -> dict[str, Any]:
        """shoal's extension: each version's state and where its instances run."""
        state = await server_state(self.broker, memory_of=name)
        if state is None:
            raise ServingError(Code.UNAVAILABLE, "Server is not ready: no broker connection")
        versions = [s for s in state.models if s.name == name]
        if not versions:
            raise unknown_model(name)
        return {"name": name, "versions": [_version_state(s) for s in versions]}

    async def model_file(self, name: str, version: int, path: str) -> bytes:
        """A file of a loaded model's directory, as the broker reads it
        (shoal/broker/model_files.py): ``path`` relative to version ``version``'s
        directory, else the model's. Raises ServingError (NOT_FOUND, INVALID_ARG)."""
        reply = await self.broker.query(
            m.ModelFileQuery(self.broker.next_id(), name, version, path), m.ModelFileReply
        )
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message)
        return reply.data

    @staticmethod
    def refuse_named_repository() -> ServingError:
        """Load, unload (and, over gRPC, the index) naming a repository: Triton 2.51's."""
        return ServingError(Code.UNSUPPORTED, "'repository_name' specification is not supported")

    def refuse_model_control(self) -> ServingError | None:
        """Outside explicit model control mode (none, poll), load and unload are refused
        here: an HTTP unload before its body is read, a load after its body's checks, as
        Triton 2.51 does. (A frontend not yet welcomed by a broker refuses them too.)"""
        if self.broker.model_control:
            return None
        return ServingError(Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)

    async def model_control(
        self,
        action: str,
        model: str,
        config: str = "",
        files: dict[str, bytes] | None = None,
        unload_dependents: bool = False,
    ) -> None:
        """The repository extension's load or unload: answered once the model is loaded
        (READY) or unloaded, or with why not (the broker refuses both outside explicit
        model control mode, in Triton's words). A ``config`` too large or nested too deep
        is refused here, before the broker parses it."""
        if config:
            check_config_override(config)
        msg = m.ModelControl(
            self.broker.next_id(), action, model, config, files or {}, unload_dependents
        )
        reply = await self.broker.query(msg, m.ControlReply, timeout=_MODEL_CONTROL_TIMEOUT_S)
        if reply.error is not None:
            raise ServingError(Code(reply.error.code), reply.error.message)


def _version_state(s: m.ModelState) -> dict[str, Any]:
    out = {
        "version": s.version,
        "state": s.state,
        "reason": s.reason,
        "queued": s.queued,
        "memory_limit_mb": s.memory_limit_mb,
        "instances": msgspec.to_builtins(s.instances),
    }
    if s.sequences is not None:
        out["sequence_batcher"] = msgspec.to_builtins(s.sequences)
    return out
