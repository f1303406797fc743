"""The Responses store with two ingress replicas, served: nothing is lost with a replica.

The app runs ``ingress_replicas: 2``. Which replica accepted a background response is read
from the shared store (its ``owner`` is the Serve replica's id), so the test knows both
replicas took some, and:

- every GET, ``previous_response_id`` and cancel finds them whichever replica it reaches
  (with one replica's memory per store, as before, a third of these missed with a 404); a
  cancel reached through the other replica stops the owner's rank request too (the ranks
  go idle);
- once one replica is killed, every request reaches another: its completed responses are
  read and continued there, its running one reads ``failed`` (``ingress_lost``) instead of
  ``queued`` forever, and the store's actor is the same one, untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai
import pytest
from helpers import served_client, wait_for

from roundgate.deployment.response_store_actor import STORE_ACTOR_NAME, STORE_NAMESPACE

if TYPE_CHECKING:
    from integration.conftest import Deployment

SHORT = {"input": "Hi", "max_output_tokens": 2, "temperature": 0.0}
# Still running when cancelled or when its replica dies (the tiny preset on two cores).
LONG = {
    "input": "Tell a long story.",
    "max_output_tokens": 800,
    "temperature": 0.0,
    "extra_body": {"ignore_eos": True},
}


@pytest.fixture(scope="module")
def two_ingresses(app: Deployment) -> Iterator[Deployment]:
    app.deploy(ingress_replicas=2)
    yield app
    app.deploy()


@pytest.fixture(scope="module")
def client(two_ingresses: Deployment) -> openai.OpenAI:
    return served_client(two_ingresses)


def store_actor() -> Any:
    import ray

    return ray.get_actor(STORE_ACTOR_NAME, namespace=STORE_NAMESPACE)


def store_incarnation() -> str:
    """The store actor's incarnation: another one once Ray has restarted it."""
    import ray

    return ray.get(store_actor().ping.remote(), timeout=30)


def rank_running(url: str) -> float:
    """Requests resident on the ranks, from ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "roundgate_rank_running_requests"
    )


def owner_of(response_id: str) -> str | None:
    """The Serve replica that accepted a background response (None once it has ended)."""
    import ray

    stored = ray.get(store_actor().get.remote(response_id), timeout=30)
    return stored.owner


def one_per_replica(client: openai.OpenAI, ask: dict[str, Any]) -> dict[str, str]:
    """Background responses created until each of the two replicas accepted one: replica id
    -> the id of the response it accepted (the extra ones are cancelled)."""
    taken: dict[str, str] = {}
    for _ in range(30):
        made = client.responses.create(model="tiny-moe", background=True, **ask)
        owner = owner_of(made.id)
        if owner is not None and owner not in taken:
            taken[owner] = made.id
        elif made.status in ("queued", "in_progress"):
            client.responses.cancel(made.id)
        if len(taken) == 2:
            return taken
    raise AssertionError(f"30 background responses reached one replica only: {taken}")


def completed(client: openai.OpenAI, response_id: str) -> Any:
    return wait_for(
        lambda: client.responses.retrieve(response_id),
        120,
        f"{response_id} to end",
        until=lambda r: r.status not in ("queued", "in_progress"),
        interval_s=0.2,
    )


def test_each_replica_s_responses_are_read_continued_and_cancelled_through_any(
    client: openai.OpenAI, two_ingresses: Deployment
) -> None:
    running = one_per_replica(client, LONG)
    more = [client.responses.create(model="tiny-moe", background=True, **LONG) for _ in range(4)]
    ids = [*running.values(), *(r.id for r in more)]
    for response_id in ids * 2:  # each read reaches either replica
        assert client.responses.retrieve(response_id).status in ("queued", "in_progress")
    for response_id in ids:  # a cancel through either replica: the store says cancelled
        assert client.responses.cancel(response_id).status == "cancelled"
    for response_id in ids:
        assert client.responses.retrieve(response_id).status == "cancelled"
    # Each owner learnt it and stopped its rank request: nothing runs on the ranks.
    wait_for(lambda: rank_running(two_ingresses.url), 60, "the ranks idle", until=lambda n: n == 0)

    done = one_per_replica(client, SHORT)
    for response_id in done.values():
        assert completed(client, response_id).status in ("completed", "incomplete")
        for _ in range(3):  # each continuation reaches either replica
            follow = client.responses.create(
                model="tiny-moe", previous_response_id=response_id, **SHORT
            )
            assert follow.status in ("completed", "incomplete")


def test_a_dead_replica_s_responses_outlive_it_and_its_running_one_fails_named(
    client: openai.OpenAI,
) -> None:
    import ray

    before = store_incarnation()
    done = one_per_replica(client, SHORT)
    for response_id in done.values():
        completed(client, response_id)
    running = one_per_replica(client, LONG)
    dead = next(iter(running))
    ray.kill(ray.get_actor(f"SERVE_REPLICA::roundgate#OpenAIServer#{dead}", namespace="serve"))

    # Every request now reaches another replica (the survivor or Serve's replacement).
    got = client.responses.retrieve(done[dead])
    assert got.status in ("completed", "incomplete") and got.id == done[dead]
    follow = client.responses.create(model="tiny-moe", previous_response_id=done[dead], **SHORT)
    assert follow.status in ("completed", "incomplete")
    lost = completed(client, running[dead])  # past the dead owner's lease
    assert lost.status == "failed" and lost.error.code == "ingress_lost"
    alive = next(owner for owner in running if owner != dead)
    assert client.responses.cancel(running[alive]).status == "cancelled"
    assert store_incarnation() == before  # the store's actor: the same, never restarted
