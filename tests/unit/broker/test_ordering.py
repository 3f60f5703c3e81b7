"""preserve_ordering's release buffer."""

from __future__ import annotations

from shoal.broker.ordering import OrderedRelease


def test_answers_leave_in_arrival_order() -> None:
    o = OrderedRelease()
    a, b, c = o.assign(), o.assign(), o.assign()
    assert o.answer(c, b"f", b"C") == []
    assert o.answer(b, b"f", b"B") == []
    assert o.answer(a, b"f", b"A") == [(b"f", b"A"), (b"f", b"B"), (b"f", b"C")]
    assert len(o) == 0


def test_a_skip_unblocks_the_sequence() -> None:
    o = OrderedRelease()
    a, b = o.assign(), o.assign()
    assert o.answer(b, b"f", b"B") == []
    assert o.answer(a, b"gone", None) == [(b"gone", None), (b"f", b"B")]
    assert o.answer(a, b"f", b"late") == []  # a duplicate of a released number is ignored


def test_the_first_answer_of_a_sequence_number_stands() -> None:
    o = OrderedRelease()
    a, b = o.assign(), o.assign()
    assert o.answer(b, b"f", b"success") == []
    assert o.answer(b, b"f", b"late error") == []
    assert o.answer(a, b"f", b"A") == [(b"f", b"A"), (b"f", b"success")]
