"""The frontend's connection to the broker groups what one turn of its event loop sends:
the requests of a turn leave in one message, and the answers of a batch arrive in one.
The broker's side is a real ROUTER socket bound where the broker binds it (StandInBroker)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from shoal.dataplane.broker_client import BrokerClient
from shoal.ipc import messages as m
from tests.unit.dataplane.stand_in import StandInBroker

Scenario = Callable[[BrokerClient, StandInBroker], Awaitable[None]]


@contextlib.asynccontextmanager
async def _connected(tmp_path: Path) -> AsyncIterator[tuple[BrokerClient, StandInBroker]]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    broker = StandInBroker(run)
    client = BrokerClient(run, 0)
    client.start()
    await asyncio.sleep(0.05)  # the greeter's first hello leaves
    broker.welcome(client)
    assert await client.wait_connected(2.0)
    try:
        yield client, broker
    finally:
        await client.close()
        broker.close()


def _run(tmp_path: Path, scenario: Scenario) -> None:
    async def main() -> None:
        async with _connected(tmp_path) as (client, broker):
            await scenario(client, broker)

    asyncio.run(main())


def _request(client: BrokerClient) -> m.InferRequest:
    return m.InferRequest(client.next_id(), "simple", -1, [], [])


def _req_ids(frames: list[bytes]) -> list[int]:
    assert frames[0] == m.KINDS[m.InferRequest]
    return [m.decode(frames[0], f).req_id for f in frames[1:]]  # type: ignore[attr-defined]


def test_the_requests_of_one_turn_share_a_message_and_each_gets_its_answer(tmp_path: Path) -> None:
    _run(tmp_path, _one_turn_one_message)


async def _one_turn_one_message(client: BrokerClient, broker: StandInBroker) -> None:
    first = _request(client)
    lone = asyncio.create_task(client.infer(first, lambda: None))
    await asyncio.sleep(0)  # in the client; it leaves at the turn's end, not before
    assert broker.recv(timeout_ms=100) is None
    await asyncio.sleep(0)
    frames = broker.recv()
    assert frames is not None and _req_ids(frames) == [first.req_id]

    reqs = [_request(client) for _ in range(5)]
    tasks = [asyncio.create_task(client.infer(r, lambda: None)) for r in reqs]
    await asyncio.sleep(0)  # each reaches the client in this turn; none is sent yet
    assert broker.recv(timeout_ms=100) is None
    await asyncio.sleep(0)  # the turn's end: one message, in the order they came
    frames = broker.recv()
    assert frames is not None and _req_ids(frames) == [r.req_id for r in reqs]
    assert broker.recv(timeout_ms=100) is None

    # One batch's answers in one message, in another order: each caller gets its own.
    broker.answer(client, [r.req_id for r in reversed(reqs)] + [first.req_id])
    answers = await asyncio.wait_for(asyncio.gather(lone, *tasks), 5.0)
    assert [a.req_id for a in answers] == [first.req_id] + [r.req_id for r in reqs]
    assert all(a.model_version == a.req_id for a in answers)
    assert client.waiting == 0


def test_nothing_sent_in_a_turn_overtakes_its_requests(tmp_path: Path) -> None:
    _run(tmp_path, _nothing_overtakes)


async def _nothing_overtakes(client: BrokerClient, broker: StandInBroker) -> None:
    # A Cancel for a request still waiting for the turn's end (or any other message)
    # goes after the requests of the turn, never before them.
    a, b = _request(client), _request(client)
    tasks = [asyncio.create_task(client.infer(r, lambda: None)) for r in (a, b)]
    await asyncio.sleep(0)  # both wait for the turn's end
    client._send(m.encode(m.Cancel(b.req_id)))
    first, second = broker.recv(), broker.recv()
    assert first is not None and _req_ids(first) == [a.req_id, b.req_id]
    assert second is not None and second[0] == m.KINDS[m.Cancel]
    assert m.decode(second[0], second[1]) == m.Cancel(b.req_id)
    await asyncio.sleep(0)  # the turn's end: nothing left to send
    assert broker.recv(timeout_ms=100) is None
    broker.answer(client, [a.req_id, b.req_id])
    answers = await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert [r.req_id for r in answers] == [a.req_id, b.req_id]


def test_requests_unsent_when_the_broker_is_lost_never_reach_the_next_one(tmp_path: Path) -> None:
    _run(tmp_path, _lost_broker_drops_unsent)


async def _lost_broker_drops_unsent(client: BrokerClient, broker: StandInBroker) -> None:
    reqs = [_request(client) for _ in range(3)]
    tasks = [asyncio.create_task(client.infer(r, lambda: None)) for r in reqs]
    await asyncio.sleep(0)  # all three wait for the turn's end
    client._broker_lost("the server's broker process exited")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all("broker process exited" in str(r) for r in results)
    await asyncio.sleep(0.05)  # the turn's end came and went
    assert broker.recv(timeout_ms=300) is None  # no request reached any broker


def test_a_frontend_leaving_says_so_again_to_a_broker_that_welcomes_it_later(
    tmp_path: Path,
) -> None:
    _run(tmp_path, _leaving_said_again)


async def _leaving_said_again(client: BrokerClient, broker: StandInBroker) -> None:
    # A frontend draining when its broker is restarted: the new broker must know too.
    leaving = m.KINDS[m.FrontendLeaving]
    client.leaving()
    frames = broker.recv()
    assert frames is not None and frames[0] == leaving
    client._broker_lost("the server's broker process exited")
    await asyncio.sleep(0.6)  # the greeter's next hello leaves
    broker.welcome(client)
    await asyncio.sleep(0.05)  # the welcome is read; the news follows it
    frames = broker.recv()
    assert frames is not None and frames[0] == leaving


def test_the_client_regions_a_broker_told_are_handed_to_the_next_one(tmp_path: Path) -> None:
    _run(tmp_path, _regions_handed_on)


async def _regions_handed_on(client: BrokerClient, broker: StandInBroker) -> None:
    region = m.ShmRequest(0, "register", "system", "in0", "/key0", 0, 64)
    broker.reply(client, m.ClientRegionsKnown([region]))
    await asyncio.sleep(0.05)  # read
    client._broker_lost("the server's broker process exited")
    await asyncio.sleep(0.6)  # the greeter's next hello leaves
    frames = broker.recv(keepalive=True)
    while frames is not None and frames[0] != m.KINDS[m.FrontendHello]:
        frames = broker.recv(keepalive=True)
    assert frames is not None
    hello = m.decode(frames[0], frames[1])
    assert isinstance(hello, m.FrontendHello) and hello.regions == [region]


def test_a_frontend_with_nothing_to_send_pings_a_broker_that_talks(tmp_path: Path) -> None:
    """The broker kills a frontend it has heard nothing from for long (a stuck one): an
    idle frontend pings even while the broker keeps talking to it."""
    _run(tmp_path, _pings_while_told)


async def _pings_while_told(client: BrokerClient, broker: StandInBroker) -> None:
    pings = 0
    for _ in range(20):  # 4 s of news from the broker every 0.2 s, nothing from the client
        broker.reply(client, m.ModelsChanged([]))
        await asyncio.sleep(0.2)
        while (frames := broker.recv(timeout_ms=0, keepalive=True)) is not None:
            assert frames[0] == m.KINDS[m.ServerQuery], frames
            pings += 1
    assert pings >= 2
