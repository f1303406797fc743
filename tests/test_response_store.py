"""The Responses store's rules without Ray: eviction by count and by bytes, the per-response
size bound, leases of background responses (``ingress_lost`` past them), cancel and delete
learnt by the owner's renewal, the SQLite snapshot an actor restart reloads, the 503 of a
store that does not answer, and a background response cancelled through another replica."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.response_snapshot import ResponseSnapshot
from roundgate.deployment.openai.response_store import (
    INGRESS_LOST,
    ResponseStore,
    StoredResponse,
    entry_bytes,
)
from roundgate.deployment.openai.responses_background import (
    BackgroundResponses,
    cancel_response,
    delete_response,
)
from roundgate.deployment.openai.stored_responses import StoredResponses


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def done(text: str = "ok") -> StoredResponse:
    return StoredResponse(
        messages=({"role": "assistant", "content": text},), body={"status": "completed"}
    )


def running(owner: str = "a") -> StoredResponse:
    return StoredResponse(body={"id": "x", "status": "queued"}, background=True, owner=owner)


def make_store(**kwargs: Any) -> tuple[ResponseStore, Clock]:
    clock = Clock()
    return ResponseStore(clock=clock, lease_s=10.0, **kwargs), clock


# ---- bounds ------------------------------------------------------------------------------


def test_bytes_past_the_total_drop_the_least_recently_used_finished() -> None:
    size = entry_bytes(done("x" * 100))
    store, _ = make_store(max_total_bytes=3 * size, max_entry_bytes=size)
    for name in ("a", "b", "c"):
        store.put(name, done("x" * 100))
    store.get("a")  # now the most recently used
    store.put("d", done("x" * 100))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 3
    assert store.total_bytes == 3 * size


@pytest.mark.parametrize(
    ("conversation", "kept", "continues"),
    [
        ("x" * 100, True, True),  # fits
        ("x" * 5000, True, False),  # the object kept, its conversation not (named on use)
    ],
)
def test_one_response_is_bounded_in_bytes(conversation: str, kept: bool, continues: bool) -> None:
    store, _ = make_store(max_entry_bytes=1000)
    assert store.put("a", done(conversation)) is kept
    stored = store.get("a")
    assert stored is not None and bool(stored.messages) is continues
    assert (stored.conversation_bytes is None) is continues


def test_an_object_too_large_even_alone_is_not_kept() -> None:
    store, _ = make_store(max_entry_bytes=1000)
    store.put("a", done())
    big = StoredResponse(body={"status": "completed", "instructions": "x" * 5000})
    assert store.put("a", big) is False and store.get("a") is None and store.total_bytes == 0


# ---- leases ------------------------------------------------------------------------------


def test_a_running_response_past_its_owner_s_lease_reads_failed_ingress_lost() -> None:
    store, clock = make_store()
    store.put("r", running())
    clock.now += 9
    assert store.renew("a", ["r"]) == []  # renewed: 10 s from now
    clock.now += 9
    assert store.get("r").status == "queued"
    clock.now += 2
    lost = store.get("r")
    assert lost.status == "failed" and lost.body["error"]["code"] == INGRESS_LOST
    assert lost.body["id"] == "x" and lost.owner is None
    assert store.renew("a", ["r"]) == ["r"]  # a late owner learns to stop it
    assert store.finish("r", done()) is False  # and cannot overwrite what was read


def test_an_orphan_cannot_pin_the_store() -> None:
    """Unfinished responses are never dropped, but an orphan (its owner gone) is dropped
    like any finished one once its lease has run out."""
    store, clock = make_store(max_entries=2)
    store.put("orphan", running())
    store.put("a", done())
    store.put("b", done())
    assert store.get("orphan") is not None  # still leased: kept, "a" dropped
    assert store.get("a") is None
    clock.now += 11
    store.put("c", done())  # drops "b", the least recently used (the orphan was just read)
    store.put("d", done())
    assert store.get("orphan") is None and len(store) == 2


# ---- cancel and delete -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        (running(), ("cancelled", True)),
        (done(), ("completed", False)),  # nothing to cancel
        (StoredResponse(body={"status": "completed"}, background=True), ("completed", False)),
    ],
)
def test_cancel_marks_an_unfinished_background_response(
    first: StoredResponse, outcome: tuple[str, bool]
) -> None:
    store, _ = make_store()
    store.put("r", first)
    stored, cancelled = store.cancel("r")
    assert (stored.status, cancelled) == outcome
    assert store.cancel("missing") == (None, False)


@pytest.mark.parametrize("how", ["cancel", "delete"])
def test_the_owner_learns_at_renewal_and_its_end_is_ignored(how: str) -> None:
    store, _ = make_store()
    store.put("r", running("a"))
    store.put("other", running("b"))
    getattr(store, how)("r")
    assert store.renew("a", ["r"]) == ["r"]
    assert store.renew("a", ["other"]) == ["other"]  # not a's: a must not run it
    assert store.finish("r", done()) is False
    assert (store.get("r").status if how == "cancel" else store.get("r")) in ("cancelled", None)


# ---- the snapshot ------------------------------------------------------------------------


def test_a_restarted_store_reloads_its_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    store = ResponseStore(journal=True)
    snapshot = ResponseSnapshot(path)
    store.put("a", done("first"))
    store.put("r", running())
    store.put("gone", done())
    snapshot.save(store)
    store.delete("gone")
    store.cancel("r")
    snapshot.save(store)
    snapshot.close()

    again = ResponseStore(journal=True)
    assert ResponseSnapshot(path).load_into(again) == 2
    assert again.get("a") == done("first") and again.get("gone") is None
    assert again.get("r").status == "cancelled"


# ---- the client and the replicas ---------------------------------------------------------


class SilentActor:
    """An actor handle whose calls never answer."""

    def __getattr__(self, method: str) -> Any:
        return self

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()


def test_a_store_that_does_not_answer_is_a_503_naming_it() -> None:
    store = StoredResponses(actor=SilentActor(), timeout_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(APIError) as info:
        asyncio.run(store.get("resp_1"))
    assert info.value.status == 503 and info.value.code == "response_store_unavailable"
    assert "Responses store" in info.value.message and "Retry-After" in info.value.headers


def test_a_background_response_is_cancelled_and_deleted_through_another_replica() -> None:
    """Replica A runs the task; B, sharing the store, cancels: the store reads cancelled at
    once and A's renewal stops A's task (its rank request)."""

    async def scenario() -> list[str]:
        store = StoredResponses()
        a, b = BackgroundResponses(store, owner="A"), BackgroundResponses(store, owner="B")
        stopped: list[str] = []

        def body_of(rid: str) -> Any:
            class Body:
                response_id = rid

                def __call__(self, status: str, error: Any = None) -> dict[str, Any]:
                    return {"id": rid, "status": status, "error": error}

            return Body()

        async def forever(rid: str) -> dict[str, Any]:
            try:
                await asyncio.Event().wait()
            finally:
                stopped.append(rid)
            return {}

        for rid in ("r1", "r2"):
            await a.start(body_of(rid), lambda rid=rid: forever(rid))
        assert (await cancel_response(store, b, "r1"))["status"] == "cancelled"
        await delete_response(store, b, "r2")
        while len(stopped) < 2:  # A's renewal (every RENEW_S) stops both
            await asyncio.sleep(0.05)
        assert not a.tasks
        assert (await store.get("r1")).status == "cancelled" and await store.get("r2") is None
        return sorted(stopped)

    assert asyncio.run(scenario()) == ["r1", "r2"]
