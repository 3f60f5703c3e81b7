"""shoal.broker.cores: idle CPU instances lend their cores to busy ones that can use them."""

from __future__ import annotations

from shoal.broker.cores import CoreLender

A, B, C = b"a", b"b", b"c"


def lender() -> CoreLender:
    return CoreLender(idle_after_s=0.5, period_s=0.1)


def test_a_busy_borrower_gets_the_cores_of_an_idle_instance_and_gives_them_back() -> None:
    cl = lender()
    cl.add(A, [0], threads=2)  # may use two cores
    cl.add(B, [1], threads=1)
    assert cl.active(A, 1.0) == {A: (0, 1)}  # B never ran: idle since
    cl.done(A, 1.01)
    assert cl.active(B, 1.02) == {A: (0,)}  # B takes its core back before its batch
    cl.done(B, 1.03)
    cl.active(A, 1.04)
    assert cl.tick(1.2) == {}  # B ran 0.17 s ago: still busy
    assert cl.tick(1.6) == {A: (0, 1)}  # now idle: lent again
    assert cl.pins() == {A: (0, 1), B: (1,)}


def test_an_instance_that_cannot_use_more_threads_borrows_nothing() -> None:
    cl = lender()
    cl.add(A, [0], threads=1)
    cl.add(B, [1], threads=1)
    assert cl.active(A, 1.0) == {}
    assert cl.tick(2.0) == {}


def test_a_lent_core_goes_to_one_busy_borrower_only() -> None:
    cl = lender()
    cl.add(A, [0], threads=4)
    cl.add(B, [1], threads=4)
    cl.add(C, [2, 3], threads=2)
    cl.active(A, 1.0)
    changes = cl.active(B, 1.0)
    pins = cl.pins()
    assert pins[C] == (2, 3)
    lent_a = set(pins[A]) - {0}
    lent_b = set(pins[B]) - {1}
    assert lent_a | lent_b == {2, 3} and not lent_a & lent_b  # each core to one borrower
    assert changes  # B's arrival re-split what A had borrowed


def test_room_is_bounded_by_the_threads_the_worker_was_given() -> None:
    cl = lender()
    cl.add(A, [0], threads=2)
    cl.add(B, [1], threads=1)
    cl.add(C, [2], threads=1)
    assert cl.active(A, 1.0) == {A: (0, 1)}  # one more thread: one more core


def test_a_core_that_is_also_a_busy_instances_home_is_never_lent() -> None:
    cl = lender()
    cl.add(A, [0], threads=2)
    cl.add(B, [1], threads=1)
    cl.add(C, [1], threads=1)  # more instances than cores: B and C share core 1
    cl.active(C, 1.0)
    assert cl.active(A, 1.0) == {}  # core 1 is C's home and C is busy
    cl.done(C, 1.0)
    cl.done(A, 1.0)
    assert cl.tick(1.6) == {}  # A went idle too meanwhile (no batch since 1.0)
    cl.active(A, 2.0)
    assert cl.pins()[A] == (0, 1)


def test_an_instance_that_exits_returns_what_it_borrowed_and_lent() -> None:
    cl = lender()
    cl.add(A, [0], threads=2)
    cl.add(B, [1], threads=2)
    cl.active(A, 1.0)
    assert cl.pins()[A] == (0, 1)
    assert cl.remove(B, 1.1) == {A: (0,)}  # its core is no one's to lend any more


def test_tick_runs_at_most_once_a_period_and_unpinned_instances_are_left_alone() -> None:
    cl = lender()
    cl.add(A, [], threads=8)  # not pinned (a GPU instance): not a member
    assert cl.next_wakeup() is None
    cl.add(B, [0], threads=2)
    cl.add(C, [1], threads=1)
    assert cl.next_wakeup() is not None
    cl.active(B, 1.0)
    cl.tick(1.0)
    assert cl.tick(1.05) == {}
    assert cl.plan(1.05) == {B: (0, 1), C: (1,)}
