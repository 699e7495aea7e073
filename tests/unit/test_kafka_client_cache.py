"""The per-process cache of Kafka clients (connectors/kafka/common.py ``ClientCache``):
bounded in count, least recently used closed first, idle ones closed, and a client a task
holds is never closed under it."""

from __future__ import annotations

import os
import time

from connectors.kafka.common import ClientCache, cached_client_counts, client_bounds


class Client:
    def __init__(self, name: str) -> None:
        self.name, self.closed = name, False


def _cache(size: int = 2, idle: float = 3600.0) -> tuple[ClientCache[Client], list[str]]:
    closed: list[str] = []

    def close(c: Client) -> None:
        c.closed = True
        closed.append(c.name)

    return ClientCache(f"test-{id(closed)}", size, close, idle_seconds=idle), closed


def _use(cache: ClientCache[Client], key: str) -> Client:
    with cache.lease(key, lambda: Client(key)) as c:
        return c


def test_the_cache_is_bounded_and_closes_the_least_recently_used() -> None:
    cache, closed = _cache(size=2)
    a = _use(cache, "a")
    _use(cache, "b")
    assert _use(cache, "a") is a  # reused, and now the most recent
    _use(cache, "c")
    assert closed == ["b"] and len(cache) == 2
    for k in "defgh":
        _use(cache, k)
    assert len(cache) == 2 and closed == ["b", "a", "c", "d", "e", "f"]


def test_a_held_client_is_never_closed_under_its_task() -> None:
    cache, closed = _cache(size=1)
    with cache.lease("a", lambda: Client("a")) as a:
        _use(cache, "b")  # over the bound while "a" is held: "b" goes, not "a"
        assert not a.closed and closed == ["b"]
        cache.discard("a")  # an error: closed when given back, not now
        assert not a.closed
        cache.clear()
        assert not a.closed
    assert a.closed and len(cache) == 0


def test_idle_clients_are_closed() -> None:
    cache, closed = _cache(size=4, idle=60.0)
    _use(cache, "a")
    with cache.lease("b", lambda: Client("b")):
        assert cache.reap(time.monotonic() + 61) == 1  # "b" is held: only "a" goes
    assert closed == ["a"]
    assert cache.reap(time.monotonic() + 61) == 1 and closed == ["a", "b"]


def test_the_reaper_thread_closes_idle_clients_on_its_own() -> None:
    cache, closed = _cache(size=4, idle=0.2)
    _use(cache, "a")
    deadline = time.monotonic() + 10
    while not closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed == ["a"]


def test_counts_and_bounds_of_every_kind() -> None:
    cache, _ = _cache(size=3)
    _use(cache, "a")
    assert cached_client_counts()[cache.kind] == 1
    assert client_bounds()[cache.kind] == 3
    # the connectors' own caches are registered with their bounds
    import connectors.kafka.sink.commit_facts  # noqa: F401
    import connectors.kafka.sink.producers  # noqa: F401
    import connectors.kafka.source.range_reader  # noqa: F401

    bounds = client_bounds()
    assert {"consumer", "producer", "admin", "commit-fact"} <= set(bounds)
    assert all(b <= 8 for k, b in bounds.items() if not k.startswith("test-"))


def test_a_forked_child_forgets_its_parents_clients() -> None:
    cache, closed = _cache(size=2)
    _use(cache, "a")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: neither uses nor closes the parent's handles
        os.write(w, b"%d,%d" % (len(cache), len(closed)))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 100) == b"0,0"
    assert len(cache) == 1
