"""What a restarted broker gets back of the client registrations: the frontends keep
the table the broker last told them, and a new broker registers it again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.broker.client_shm_requests import ClientRegions
from shoal.ipc import messages as m


@pytest.fixture
def key() -> Iterator[str]:
    path = Path(f"/dev/shm/test_client_regions_{os.getpid()}")
    path.write_bytes(b"\0" * 256)
    yield f"/{path.name}"
    path.unlink(missing_ok=True)


def _register(name: str, key: str, offset: int = 0) -> m.ShmRequest:
    return m.ShmRequest(1, "register", "system", name, key, offset, 64)


def test_a_new_broker_registers_again_what_the_last_one_held(key: str) -> None:
    old = ClientRegions()
    for q in (_register("a", key), _register("b", key, 64), _register("c", key, 128)):
        assert old.handle(q)[0].error is None
    assert old.handle(m.ShmRequest(2, "unregister", "system", "b"))[0].error is None
    kept = old.known()
    assert [(q.name, q.offset) for q in kept] == [("a", 0), ("c", 128)]

    new = ClientRegions()
    assert new.handle(_register("c", key, 192))[0].error is None  # registered again first
    assert new.restore(kept) == (1, [])  # "a" comes back; "c" keeps its new registration
    assert [(q.name, q.offset) for q in new.known()] == [("c", 192), ("a", 0)]
    old.table.close()
    new.table.close()


def test_a_registration_whose_object_is_gone_is_reported_lost(key: str) -> None:
    old = ClientRegions()
    assert old.handle(_register("a", key))[0].error is None
    kept = old.known()
    old.table.close()
    Path("/dev/shm", key.lstrip("/")).unlink()  # the client unlinked it meanwhile
    new = ClientRegions()
    restored, lost = new.restore(kept)
    assert restored == 0
    assert lost == [f"'a': Unable to open shared memory region: '{key}'"]
    assert new.known() == []
