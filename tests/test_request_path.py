"""The request-path tracer's counting rule (``bench/request_shapes.py``, which
``benchmarks/request_path.py`` counts with): a container is its elements unless it holds only
scalars, a named tuple is a record, telemetry is not data."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from roundgate.actors.control.messages import Usage
from roundgate.bench.request_shapes import counted, describe
from roundgate.deployment.request_metrics import RequestRecorder


class Event(NamedTuple):
    token_id: int
    finished: bool


@pytest.mark.parametrize(
    ("value", "raw", "shapes"),
    [
        ([1, 2], "list[int]", {"list[int]"}),  # token ids: scalars are no shape of their own
        ([[1, 2], [3]], "list[list[int]]", {"list[int]"}),
        ({"role": "user"}, "dict[str, ...]", {"dict[str, ...]"}),
        ([{"role": "user"}], "list[dict[str, ...]]", {"dict[str, ...]"}),
        ([Usage(prompt_tokens=1, completion_tokens=2)], "list[Usage]", {"Usage"}),
    ],
)
def test_a_container_counts_as_its_elements(value: Any, raw: str, shapes: set[str]) -> None:
    assert describe(value) == raw
    assert counted(value) == shapes


def test_a_named_tuple_is_a_record_not_a_container() -> None:
    raw = describe(Event(3, False))
    assert raw.endswith("Event")  # not ``Event[bool | int]``
    assert counted(Event(3, False)) == {raw}


def test_per_request_telemetry_is_not_the_requests_data() -> None:
    timer = RequestRecorder("m").timer()
    assert describe(timer) == "RequestTimer"
    assert counted(timer) == set()
