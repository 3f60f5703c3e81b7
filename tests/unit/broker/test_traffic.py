"""The choice of a version for requests that name none (shoal/broker/traffic.py)."""

from __future__ import annotations

from collections import Counter

from shoal.broker.traffic import VersionPicker, sticky_version
from shoal.configs.traffic import TrafficPolicy


def picker(weights: dict[int, int], shadow: int = 0) -> VersionPicker:
    return VersionPicker(
        TrafficPolicy(tuple(sorted(weights.items())), shadow, 1000 if shadow else 0)
    )


def test_unkeyed_requests_follow_the_weights_exactly_in_every_round() -> None:
    p = picker({1: 90, 2: 10})
    for _ in range(5):  # each round of 100 (the weights' sum) is exact
        assert Counter(p.choose({1, 2}) for _ in range(100)) == {1: 90, 2: 10}


def test_the_split_is_spread_not_in_bursts() -> None:
    p = picker({1: 1, 2: 1, 3: 2})
    assert [p.choose({1, 2, 3}) for _ in range(8)] == [3, 1, 2, 3, 3, 1, 2, 3]


def test_a_version_not_ready_gives_its_weight_to_the_others() -> None:
    p = picker({1: 50, 2: 30, 3: 20})
    [p.choose({1, 2, 3}) for _ in range(37)]  # midway through a round
    assert Counter(p.choose({1, 3}) for _ in range(70)) == {1: 50, 3: 20}
    assert Counter(p.choose({1, 2, 3}) for _ in range(100)) == {1: 50, 2: 30, 3: 20}


def test_without_a_weighted_version_ready_the_latest_other_than_the_shadow_serves() -> None:
    p = picker({1: 1, 2: 1}, shadow=5)
    assert p.choose({3, 4, 5}) == 4
    assert p.choose({5}) == 5  # the one version left
    assert p.choose(set()) is None
    assert picker({}, shadow=2).choose({1, 2}) == 1


def test_a_key_always_gets_the_same_version_and_keys_split_by_weight() -> None:
    p = picker({1: 75, 2: 25})
    keys = [f"user-{i}" for i in range(4000)]
    first = {k: p.choose({1, 2}, k) for k in keys}
    assert all(p.choose({1, 2}, k) == first[k] for k in keys[:500])
    share = Counter(first.values())[2] / len(keys)
    assert 0.22 < share < 0.28  # 25 %, within 3 points over 4000 keys


def test_a_key_keeps_its_version_across_pickers_and_moves_only_when_its_version_goes() -> None:
    candidates = [(1, 40), (2, 30), (3, 30)]
    keys = [f"k{i}" for i in range(2000)]
    before = {k: sticky_version(candidates, k) for k in keys}
    assert before == {k: picker({1: 40, 2: 30, 3: 30}).choose({1, 2, 3}, k) for k in keys}
    after = {k: sticky_version([(1, 40), (3, 30)], k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == 2 for k in moved)
    # pinned: a key's version must not change between releases (or restarts)
    pinned = {"alice": 1, "bob": 3, "carol": 1, "dave": 2}
    assert pinned == {k: sticky_version(candidates, k) for k in pinned}
