"""The mapping methods across real processes: clear, touch and ttl, pop and items under churn."""

from __future__ import annotations

from workers import Children, audit, verify, wait_for_line


def test_a_clear_by_another_process_empties_the_pool_for_everyone(make_pool) -> None:
    pool = make_pool("8M", page_size="1K")
    for i in range(3000):  # more than two EVICT_BATCHes
        pool.put(f"k{i}", b"v" * (i % 3000))
    with Children() as children:
        seen = children.result(children.start("clear", pool=pool.name))
    assert seen == {"removed": 3000, "len": 0, "keys": []}
    assert len(pool) == 0 and pool.keys() == [] and pool.get("k1") is None
    assert pool.stats().used_bytes == 0 and pool.check() == []
    pool.put("after", b"v")
    assert pool["after"] == b"v"


def test_an_expiry_set_by_another_process_holds_here(make_pool, clock) -> None:
    pool = make_pool(clock=clock)
    pool.put("k", b"v", ttl=10)
    pool.put("forever", b"v")
    with Children() as children:  # the child's clock stands 5 s after ours
        later = children.result(
            children.start("touch", pool=pool.name, now=clock() + 5, key="k", ttl=100)
        )
        limited = children.result(
            children.start("touch", pool=pool.name, now=clock(), key="forever", ttl=30)
        )
    assert later == {"touched": True, "ttl": 100.0}
    assert limited == {"touched": True, "ttl": 30.0}
    assert pool.ttl("k") == 105.0 and pool.ttl("forever") == 30.0
    clock.advance(31)  # past the touched "forever", and past "k"'s first expiry
    assert pool.get("k") == b"v" and "forever" not in pool
    clock.advance(75)
    assert "k" not in pool


def test_clear_pop_and_items_beside_a_hammering_process(make_pool) -> None:
    pool = make_pool("16M", page_size="4K")
    problems: list[str] = []
    rounds = 0
    with Children() as children:
        child = children.start(
            "hammer", pool=pool.name, seed=9, seconds=3, key_space=80, max_size=200_000
        )
        wait_for_line(child, "ready", timeout=20)
        while child.poll() is None or rounds == 0:
            rounds += 1
            problems += filter(None, (verify(key, value) for key, value in pool.items()))
            for i in range(0, 80, 7):
                value = pool.pop(f"k{i}", None)
                if value is not None and (problem := verify(f"k{i}", value)):
                    problems.append(f"pop {problem}")
            pool.clear()
        counts = children.result(child)
    assert counts["failures"] == [] and problems == []
    assert counts["puts"] > 0
    used, audit_problems = audit(pool)
    assert audit_problems == [] and pool.check() == []
    assert pool.stats().used_bytes == used
