"""Request: the ordered status enum, stop conditions, token slicing, sampling validation."""

from __future__ import annotations

import pytest
from builders import make_request

from roundgate.actors.control.request import FINISH_REASONS, Request, RequestStatus, SamplingParams

# --- status ------------------------------------------------------------------------------------


def test_status_order_follows_the_lifecycle() -> None:
    order = [
        RequestStatus.WAITING,
        RequestStatus.LOADING,
        RequestStatus.WAITING_FOR_REMOTE_KV,
        RequestStatus.PREFILLING,
        RequestStatus.DECODING,
        RequestStatus.RETRACTED,
        RequestStatus.FINISHED_STOPPED,
        RequestStatus.FINISHED_LENGTH,
        RequestStatus.FINISHED_ABORTED,
        RequestStatus.FINISHED_ERROR,
    ]
    assert list(RequestStatus) == order
    assert sorted(order) == order


@pytest.mark.parametrize(
    ("status", "finished", "reason"),
    [
        (RequestStatus.WAITING, False, None),
        (RequestStatus.LOADING, False, None),
        (RequestStatus.WAITING_FOR_REMOTE_KV, False, None),
        (RequestStatus.PREFILLING, False, None),
        (RequestStatus.DECODING, False, None),
        (RequestStatus.RETRACTED, False, None),
        (RequestStatus.FINISHED_STOPPED, True, "stop"),
        (RequestStatus.FINISHED_LENGTH, True, "length"),
        (RequestStatus.FINISHED_ABORTED, True, "abort"),
    ],
)
def test_terminal_statuses_and_finish_reasons(
    status: RequestStatus, finished: bool, reason: str | None
) -> None:
    req = make_request("r")
    req.status = status
    assert status.is_finished is finished
    assert req.is_finished is finished
    assert req.finish_reason == reason
    assert (status in FINISH_REASONS) is finished


def test_a_new_request_waits_with_nothing_computed() -> None:
    req = make_request("r", prompt_len=5)
    assert req.status is RequestStatus.WAITING
    assert (req.num_prompt_tokens, req.num_output_tokens, req.num_tokens) == (5, 0, 5)
    assert (req.num_computed_tokens, req.num_uncomputed_prompt_tokens) == (0, 5)
    assert req.page_ids == [] and req.finish_reason is None


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt must not be empty"):
        Request("r", [])


@pytest.mark.parametrize(("computed", "uncomputed"), [(0, 6), (4, 2), (6, 0), (7, 0)])
def test_uncomputed_prompt_tokens(computed: int, uncomputed: int) -> None:
    req = make_request("r", prompt_len=6)
    req.num_computed_tokens = computed
    assert req.num_uncomputed_prompt_tokens == uncomputed


# --- stop conditions ---------------------------------------------------------------------------

# (prompt_len, max_tokens, stop ids, max_model_len, tokens to append, statuses after each)
D, S, L = RequestStatus.DECODING, RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH
STOP_CASES = [
    pytest.param(4, 3, (), None, [1, 2, 3], [D, D, L], id="max_tokens"),
    pytest.param(4, 1, (), None, [1], [L], id="max_tokens=1"),
    pytest.param(4, 5, (7,), None, [1, 7], [D, S], id="stop-token"),
    pytest.param(4, 2, (7,), None, [1, 7], [D, S], id="stop-token-beats-max_tokens"),
    pytest.param(4, 9, (), 6, [1, 2], [D, L], id="max_model_len"),
    pytest.param(4, 9, (), 5, [1], [L], id="max_model_len-first-token"),
    pytest.param(4, 9, (7, 8), None, [1, 2, 8], [D, D, S], id="second-stop-id"),
]


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "stop", "max_model_len", "tokens", "after"), STOP_CASES
)
def test_append_token_applies_stop_conditions(
    prompt_len: int,
    max_tokens: int,
    stop: tuple[int, ...],
    max_model_len: int | None,
    tokens: list[int],
    after: list[RequestStatus],
) -> None:
    req = make_request("r", prompt_len, max_tokens, stop_token_ids=stop)
    req.status = RequestStatus.DECODING
    for token, expected in zip(tokens, after, strict=True):
        req.append_token(token, max_model_len)
        assert req.status is expected
    assert req.output_token_ids == tokens


def test_stop_token_is_kept_in_the_output() -> None:
    req = make_request("r", max_tokens=8, stop_token_ids=(2,))
    req.append_token(2)
    assert req.output_token_ids == [2] and req.finish_reason == "stop"


# --- token slicing -----------------------------------------------------------------------------

PROMPT = [100, 101, 102, 103]  # distinct from each other and from the sampled ids
OUTPUT = [1, 2, 3]


@pytest.mark.parametrize(
    ("start", "stop", "expected"),
    [
        (0, 4, PROMPT),  # the whole prompt
        (1, 3, [101, 102]),  # inside the prompt
        (4, 7, OUTPUT),  # the whole output
        (5, 6, [2]),  # inside the output
        (6, 7, [3]),  # a decode: the last sampled token
        (2, 6, [102, 103, 1, 2]),  # straddling the boundary
        (0, 7, PROMPT + OUTPUT),  # everything
        (3, 5, [103, 1]),
        (4, 4, []),  # empty at the boundary
    ],
)
def test_token_ids_slices_across_prompt_and_output(
    start: int, stop: int, expected: list[int]
) -> None:
    req = Request("r", PROMPT, SamplingParams(max_tokens=16))
    for token in OUTPUT:
        req.append_token(token)
    assert req.token_ids(start, stop) == expected


# --- sampling validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_sampling_params_refuse_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
