"""Decode CUDA graphs, the parts a CPU can check: who is eligible, padding, the group's bucket
replayed by every rank of an attention-DP group, capture at startup, and the padded
static-buffer path itself (run without capture) giving the eager tokens.

On CPU the runner never captures (``ineligibility`` says why). A stand-in graph (it replays
by calling the forward again into its static logits, a CUDA graph's contract) and a stand-in
forward (it reads the batch as the decode kernel does: pages up to ``kv_lens``) check the
bucket agreement and padding; the parity test builds the same per-bucket path with
``capture=False`` over the Triton decode kernel, interpreted, so padding rows, the scratch page
and the eager fallback for extend rounds run for real.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.engine import Engine
from roundgate.actors.model.decode_graphs import DecodeGraphs, ineligibility, pad_decodes
from roundgate.actors.model.graph_buckets import capture_sizes
from roundgate.actors.server_args import ServerArgs
from roundgate.cli.engine_flags import parse_server_args
from roundgate.gate.rows import RankRow
from roundgate.kernels.attention.batch import AttentionBatch

PAGE_SIZE = 4
MAX_PAGES = 5
SCRATCH = 99  # the scratch page id


@pytest.mark.parametrize(
    ("device", "enforce_eager", "is_moe", "moe_graph_safe", "attention", "why"),
    [
        ("cuda", False, False, False, "triton", None),
        ("cuda", True, False, False, "triton", "--enforce-eager"),
        ("cpu", False, False, False, "triton", "need a CUDA device"),
        ("cuda", False, True, False, "triton", "MoE dispatch reads expert counts"),
        ("cuda", False, True, True, "triton", None),  # a backend declaring it graph-safe
        ("cpu", False, True, True, "triton", "need a CUDA device"),
        ("cuda", False, False, False, "torch", "torch attention backend is not capturable"),
        ("cuda", False, True, True, "flashinfer", "flashinfer attention backend"),
    ],
)
def test_who_is_captured(device, enforce_eager, is_moe, moe_graph_safe, attention, why) -> None:
    reason = ineligibility(device, enforce_eager, is_moe, attention, moe_graph_safe)
    assert reason == why if why is None else why in reason


def test_a_moe_backend_is_not_graph_safe_unless_it_says_so() -> None:
    from roundgate.kernels.moe.base import MoEBackend

    class Declares(MoEBackend):
        @property
        def is_graph_safe(self) -> bool:
            return True

    class Silent(MoEBackend):
        pass

    assert Declares().is_graph_safe and not Silent().is_graph_safe


def test_padding_rows_live_in_the_scratch_page() -> None:
    padded = pad_decodes(
        [11, 12], [5, 0], [[3, 7], [2]], bucket=4, page_size=4, scratch_page=9, num_columns=3
    )
    assert padded["input_ids"].tolist() == [11, 12, 0, 0]
    assert padded["positions"].tolist() == [5, 0, 0, 0]
    assert padded["slot_mapping"].tolist() == [7 * 4 + 1, 2 * 4, 9 * 4, 9 * 4]
    assert padded["page_table"].tolist() == [[3, 7, 9], [2, 9, 9], [9, 9, 9], [9, 9, 9]]
    assert padded["kv_lens"].tolist() == [6, 1, 1, 1]
    assert padded["cu_query_lens"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("page_tables", "columns"),
    [
        ([[3, 7], [2]], [[3, 7], [2, 9], [9, 9], [9, 9]]),  # the longest request's pages
        ([[3], [2]], [[3], [2], [9], [9]]),
        ([], [[9], [9], [9], [9]]),  # nobody decodes: one column of scratch
    ],
)
def test_the_page_table_holds_the_used_columns(page_tables, columns) -> None:
    count = len(page_tables)
    padded = pad_decodes([1] * count, [0] * count, page_tables, 4, 4, 9)
    assert padded["page_table"].tolist() == columns


def test_a_bucket_of_padding_only() -> None:
    padded = pad_decodes([], [], [], bucket=2, page_size=4, scratch_page=9)
    assert padded["input_ids"].tolist() == [0, 0]
    assert padded["slot_mapping"].tolist() == [9 * 4, 9 * 4]
    assert padded["kv_lens"].tolist() == [1, 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([1, 2, 3], [0, 0, 0], [[0]] * 3, 2, 4, 9), "3 decodes .* do not fit a bucket of 2"),
        (([1], [0, 0], [[0]], 2, 4, 9), r"1 decodes \(2 positions"),
        (([1], [0], [[0, 1, 2]], 2, 4, 9, 2), "holds 3 pages, more than the 2 columns"),
    ],
)
def test_padding_refuses_what_a_bucket_cannot_hold(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        pad_decodes(*args)


# --- a stand-in graph and forward -------------------------------------------------------------


class StandInGraph:
    """A captured forward for a CPU: ``replay`` reruns the forward into the static logits, as
    a CUDA graph rewrites its output tensor; records which bucket sizes were captured."""

    def __init__(self, forward_once: Callable[[], torch.Tensor], captured: list[int]) -> None:
        self.forward_once = forward_once
        self.logits = forward_once()
        captured.append(self.logits.shape[0])

    def replay(self) -> None:
        self.logits.copy_(self.forward_once())


class StandInForward:
    """Logits per row: ``[token, position, slot, pages read]``, reading a row's pages only up
    to its ``kv_lens`` as the decode kernel does; records each call's rows."""

    def __init__(self) -> None:
        self.calls: list[dict[str, list]] = []

    def __call__(self, input_ids: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        num_pages = (batch.kv_lens + PAGE_SIZE - 1) // PAGE_SIZE
        read = [
            row[:n] for row, n in zip(batch.page_table.tolist(), num_pages.tolist(), strict=True)
        ]
        self.calls.append(
            {
                "input_ids": input_ids.tolist(),
                "positions": batch.positions.tolist(),
                "slots": batch.slot_mapping.tolist(),
                "pages_read": read,
            }
        )
        sums = torch.tensor([sum(pages) for pages in read], dtype=torch.float32)
        return torch.stack(
            [input_ids.float(), batch.positions.float(), batch.slot_mapping.float(), sums], 1
        )


def expected_logits(
    token_ids: Sequence[int], positions: Sequence[int], page_tables: Sequence[Sequence[int]]
) -> list[list[float]]:
    """The stand-in forward's logits for the real rows alone: what no padding may change."""
    rows = []
    for token, pos, pages in zip(token_ids, positions, page_tables, strict=True):
        slot = pages[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE
        rows.append([token, pos, slot, sum(pages[: pos // PAGE_SIZE + 1])])
    return rows


def make_graphs(
    forward: StandInForward, captured: list[int] | None = None, shared_bucket: bool = False
) -> DecodeGraphs:
    """A rank's decode graphs over ``forward``; with ``captured``, capturing stand-in graphs."""
    return DecodeGraphs(
        forward,
        max_batch_size=20,
        max_pages=MAX_PAGES,
        page_size=PAGE_SIZE,
        scratch_page=SCRATCH,
        device=torch.device("cpu"),
        capture=captured is not None,
        shared_bucket=shared_bucket,
        capture_with=None if captured is None else (lambda once: StandInGraph(once, captured)),
    )


def decodes(count: int, first_page: int) -> tuple[list[int], list[int], list[list[int]]]:
    """``count`` decodes: tokens, positions (1 to 3 pages deep), and distinct pages."""
    tokens = [100 + first_page + i for i in range(count)]
    positions = [1 + 5 * (i % 3) for i in range(count)]
    pages = [
        [first_page + 10 * i + k for k in range(p // PAGE_SIZE + 1)]
        for i, p in enumerate(positions)
    ]
    return tokens, positions, pages


def test_ranks_with_different_batches_replay_the_groups_bucket() -> None:
    """Four ranks decoding 3, 0, 6 and 1 requests: each reads the gathered rows, picks bucket
    8, and replays it; each gets its own rows' logits, the padding's dropped."""
    batches = (3, 0, 6, 1)
    rows = [RankRow(b, b, 0, False, b > 0) for b in batches]
    for rank, count in enumerate(batches):
        forward, captured = StandInForward(), []
        graphs = make_graphs(forward, captured, shared_bucket=True)
        graphs.capture_all()
        bucket = graphs.round_bucket(rows)
        assert bucket == 8, rank
        work = decodes(count, first_page=rank * 100)
        logits = graphs.run(*work, bucket=bucket)
        assert logits is not None and logits.tolist() == expected_logits(*work), rank
        replayed = forward.calls[-1]
        assert len(replayed["input_ids"]) == 8, rank  # the group's bucket, not the rank's own
        padding = slice(count, 8)
        assert replayed["input_ids"][padding] == [0] * (8 - count)
        assert replayed["slots"][padding] == [SCRATCH * PAGE_SIZE] * (8 - count)
        assert replayed["pages_read"][padding] == [[SCRATCH]] * (8 - count)


@pytest.mark.parametrize(
    ("shared", "batches", "bucket"),
    [
        (True, (3, 0, 6, 1), 8),  # MoE collectives in the graph: the group's bucket
        (True, (), None),  # no gathered rows (a driver without a group): the rank's own
        (False, (3, 0, 6, 1), None),  # a dense model: every rank pads to its own bucket
    ],
)
def test_the_round_bucket_is_the_groups_only_when_the_graphs_hold_collectives(
    shared: bool, batches: tuple[int, ...], bucket: int | None
) -> None:
    rows = [RankRow(b, b, 0, False, b > 0) for b in batches]
    assert make_graphs(StandInForward(), shared_bucket=shared).round_bucket(rows) == bucket


def test_a_rank_without_requests_replays_a_bucket_of_padding() -> None:
    forward, captured = StandInForward(), []
    graphs = make_graphs(forward, captured)
    graphs.capture_all()
    logits = graphs.run([], [], [], bucket=4)
    assert logits is not None and tuple(logits.shape) == (0, 4)
    assert graphs.num_replays == 1
    replayed = forward.calls[-1]
    assert replayed["input_ids"] == [0] * 4 and replayed["positions"] == [0] * 4
    assert replayed["slots"] == [SCRATCH * PAGE_SIZE] * 4  # its K/V lands in the scratch page
    # Without the group's bucket a rank with nothing to decode runs no forward.
    assert graphs.run([], [], []) is None


def test_alone_a_rank_replays_its_own_bucket() -> None:
    forward = StandInForward()
    graphs = make_graphs(forward)
    work = decodes(3, first_page=0)
    logits = graphs.run(*work)
    assert logits is not None and logits.tolist() == expected_logits(*work)
    assert len(forward.calls[-1]["input_ids"]) == 4


def test_every_bucket_is_captured_at_startup_and_none_later() -> None:
    forward, captured = StandInForward(), []
    graphs = make_graphs(forward, captured)
    with pytest.raises(RuntimeError, match="bucket 4 was not captured: call capture_all"):
        graphs.run(*decodes(3, first_page=0))
    graphs.capture_all()
    assert captured == sorted(capture_sizes(20), reverse=True)  # largest first, all of them
    assert set(graphs.buckets) == set(capture_sizes(20))
    for count, bucket in ((1, 8), (3, 8), (20, 20), (7, 8), (0, 8)):  # a peer decodes 5
        graphs.run(*decodes(count, first_page=0), bucket=bucket)
    graphs.capture_all()  # again: nothing new
    assert len(captured) == len(capture_sizes(20))
    assert graphs.num_replays == 5


def test_without_capture_the_static_buffers_are_built_on_first_use() -> None:
    graphs = make_graphs(StandInForward())
    graphs.run(*decodes(3, first_page=0))
    assert set(graphs.buckets) == {4}
    graphs.capture_all()
    assert set(graphs.buckets) == set(capture_sizes(20))


def test_a_round_copies_the_used_page_columns_only() -> None:
    """A round of 3-page requests, then one of 1-page requests: the second copies one column;
    the stale columns behind it are never read (the logits are the 1-page rows')."""
    forward, captured = StandInForward(), []
    graphs = make_graphs(forward, captured)
    graphs.capture_all()
    deep = ([7, 8], [9, 10], [[1, 2, 3], [4, 5, 6]])
    graphs.run(*deep, bucket=2)
    table = graphs.buckets[2].buffers["page_table"]
    assert table.tolist() == [[1, 2, 3, SCRATCH, SCRATCH], [4, 5, 6, SCRATCH, SCRATCH]]
    shallow = ([7, 8], [1, 2], [[11], [12]])
    logits = graphs.run(*shallow, bucket=2)
    assert table.tolist() == [[11, 2, 3, SCRATCH, SCRATCH], [12, 5, 6, SCRATCH, SCRATCH]]
    assert logits is not None and logits.tolist() == expected_logits(*shallow)


@pytest.mark.parametrize(
    ("count", "bucket", "message"),
    [
        (3, 3, "bucket 3 is not one of the captured sizes"),
        (5, 4, "5 decodes do not fit the group's bucket of 4"),
    ],
)
def test_a_group_bucket_that_cannot_hold_the_round_is_refused(count, bucket, message) -> None:
    graphs = make_graphs(StandInForward())
    with pytest.raises(ValueError, match=message):
        graphs.run(*decodes(count, first_page=0), bucket=bucket)


def test_enforce_eager_is_a_flag() -> None:
    assert parse_server_args(["--enforce-eager", "--model", "tiny-llama"]).enforce_eager
    args = ServerArgs(model="tiny-llama", device="cpu", num_kv_pages=8)
    engine = Engine(args)
    assert engine.runner.graphs is None  # a CPU never captures
    assert engine.runner.cache.num_pages == 9  # the scratch page after the pool's pages


@pytest.mark.triton
def test_padded_decode_path_gives_the_eager_tokens(kernel_device: str) -> None:
    """Three prompts decode in the bucket of 4 (a padding row), and extend rounds fall back.

    On CPU the padded path runs without capture; on a GPU it is captured for real."""
    torch.set_num_threads(1)
    flags = {
        "model": "tiny-llama",
        "device": kernel_device,
        "attention_backend": "triton",
        "page_size": 4,
        "num_kv_pages": 64,
        "max_scheduled_tokens": 6,
    }
    prompts = [[5, 7, 9], list(range(20, 33)), [3, 1, 4, 1, 5]]
    greedy = SamplingParams(max_tokens=5)
    eager = Engine(ServerArgs(**flags, enforce_eager=True)).generate(prompts, greedy)
    engine = Engine(ServerArgs(**flags))
    capture = kernel_device == "cuda"
    graphs = engine.runner.graphs = engine.runner.decode_graphs(capture=capture)
    if capture:
        graphs.capture_all()
    assert engine.generate(prompts, greedy) == eager
    assert graphs.num_replays > 0
    assert capture or set(graphs.buckets) <= {1, 2, 4}  # uncaptured: built on first use

    replays = graphs.num_replays
    request = Request("extend", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1))
    request.page_ids = [10, 11]
    engine.runner.forward([ScheduledChunk(request, 0, 5, True)])
    assert graphs.num_replays == replays  # an extend round runs eagerly
