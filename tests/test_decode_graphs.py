"""Decode CUDA graphs, the parts a CPU can check: buckets, padding, who is eligible, and the
padded static-buffer path itself (run without capture) giving the eager tokens.

On CPU the runner never captures (``ineligibility`` says why); the parity test builds the
same per-bucket path with ``capture=False`` over the Triton decode kernel, interpreted, so
padding rows, the scratch page and the eager fallback for extend rounds run for real.
"""

from __future__ import annotations

import pytest
import torch

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.control.round import ScheduledChunk
from roundgate.actors.engine import Engine
from roundgate.actors.model.decode_graphs import (
    bucket_for,
    capture_sizes,
    ineligibility,
    pad_decodes,
)
from roundgate.actors.server_args import ServerArgs
from roundgate.cli.engine_flags import parse_server_args


@pytest.mark.parametrize(
    ("max_batch_size", "sizes"),
    [
        (1, (1,)),
        (3, (1, 2, 3)),
        (8, (1, 2, 4, 8)),
        (20, (1, 2, 4, 8, 16, 20)),
        (40, (1, 2, 4, 8, 16, 24, 32, 40)),
        (1000, (1, 2, 4, *range(8, 256, 8), 256)),
    ],
)
def test_capture_sizes(max_batch_size: int, sizes: tuple[int, ...]) -> None:
    assert capture_sizes(max_batch_size) == sizes


@pytest.mark.parametrize(
    ("batch_size", "bucket"),
    [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 20), (20, 20), (21, None), (0, None)],
)
def test_bucket_is_the_smallest_that_holds_the_batch(batch_size: int, bucket: int | None):
    assert bucket_for(batch_size, capture_sizes(20)) == bucket


@pytest.mark.parametrize(
    ("device", "enforce_eager", "is_moe", "attention", "why"),
    [
        ("cuda", False, False, "triton", None),
        ("cuda", True, False, "triton", "--enforce-eager"),
        ("cpu", False, False, "triton", "need a CUDA device"),
        ("cuda", False, True, "triton", "MoE dispatch"),
        ("cuda", False, False, "torch", "torch attention backend is not capturable"),
        ("cuda", False, False, "flashinfer", "flashinfer attention backend"),
    ],
)
def test_who_is_captured(device, enforce_eager, is_moe, attention, why) -> None:
    reason = ineligibility(device, enforce_eager, is_moe, attention)
    assert reason == why if why is None else why in reason


def test_padding_rows_live_in_the_scratch_page() -> None:
    padded = pad_decodes(
        [11, 12], [5, 0], [[3, 7], [2]], bucket=4, max_pages=3, page_size=4, scratch_page=9
    )
    assert padded["input_ids"].tolist() == [11, 12, 0, 0]
    assert padded["positions"].tolist() == [5, 0, 0, 0]
    assert padded["slot_mapping"].tolist() == [7 * 4 + 1, 2 * 4, 9 * 4, 9 * 4]
    assert padded["page_table"].tolist() == [[3, 7, 9], [2, 9, 9], [9, 9, 9], [9, 9, 9]]
    assert padded["kv_lens"].tolist() == [6, 1, 1, 1]
    assert padded["cu_query_lens"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="3 decodes do not fit a bucket of 2"):
        pad_decodes([1, 2, 3], [0, 0, 0], [[0]] * 3, 2, 1, 4, 9)


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
    assert engine.generate(prompts, greedy) == eager
    assert graphs.num_replays > 0 and set(graphs.buckets) <= {1, 2, 4}

    replays = graphs.num_replays
    request = Request("extend", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1))
    request.page_ids = [10, 11]
    engine.runner.forward([ScheduledChunk(request, 0, 5, True)])
    assert graphs.num_replays == replays  # an extend round runs eagerly
