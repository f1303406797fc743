"""FlashInfer's plan inputs, asked on CPU without flashinfer: which decode kernel a GQA shape
gets, and the host-side plan arrays equal to the device-side CSR they replace."""

from __future__ import annotations

import doctest

import pytest
import torch

from roundgate.kernels.attention import flashinfer_backend
from roundgate.kernels.attention.batch import build_attention_batch
from roundgate.kernels.attention.flashinfer_backend import (
    decode_uses_tensor_cores,
    paged_csr,
    plan_arrays,
)


@pytest.mark.parametrize(
    ("model", "heads", "kv_heads", "tensor_cores"),
    [
        ("Llama-3-8B", 32, 8, False),  # group 4: the CUDA-core kernel
        ("Mistral-7B", 32, 8, False),
        ("MHA", 16, 16, False),  # group 1
        ("Qwen2.5-1.5B", 12, 2, True),  # group 6: the CUDA-core kernel has no 6
        ("Qwen2.5-7B", 28, 4, True),  # group 7: refused by the CUDA-core kernel
        ("Qwen2.5-14B", 40, 8, True),  # group 5: refused too
        ("Qwen2.5-72B", 64, 8, True),  # group 8: compiled, but large (SGLang: group > 4)
        ("Qwen2.5-7B, TP 2", 14, 2, True),  # per-rank heads keep the group
        ("group 16", 32, 2, True),
    ],
)
def test_decode_kernel_for_the_group_size(
    model: str, heads: int, kv_heads: int, tensor_cores: bool
) -> None:
    assert decode_uses_tensor_cores(heads, kv_heads) is tensor_cores, model


@pytest.mark.parametrize(("heads", "kv_heads"), [(28, 3), (8, 0)])
def test_ungrouped_heads_are_refused(heads: int, kv_heads: int) -> None:
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        decode_uses_tensor_cores(heads, kv_heads)


def test_docstring_examples() -> None:
    assert doctest.testmod(flashinfer_backend).failed == 0


def random_batch(seed: int, decode_only: bool):
    """A ragged batch with shuffled, disjoint page tables (and some spare pages listed)."""
    gen = torch.Generator().manual_seed(seed)
    size = int(torch.randint(1, 9, (1,), generator=gen))
    page_size = int(torch.tensor([1, 4, 16])[torch.randint(0, 3, (1,), generator=gen)])
    cached = torch.randint(0, 70, (size,), generator=gen).tolist()
    query = [1] * size if decode_only else torch.randint(1, 20, (size,), generator=gen).tolist()
    perm = torch.randperm(4096, generator=gen).tolist()
    tables, used = [], 0
    for c, q in zip(cached, query, strict=True):
        n = -(-(c + q) // page_size) + int(torch.randint(0, 3, (1,), generator=gen))
        tables.append(perm[used : used + n])
        used += n
    return build_attention_batch(query, cached, tables, page_size)


@pytest.mark.parametrize("decode_only", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_host_plan_arrays_equal_the_device_csr(seed: int, decode_only: bool) -> None:
    batch = random_batch(seed, decode_only)
    arrays = plan_arrays(batch)
    indptr, indices, last_page_len = paged_csr(batch)
    for host in (arrays.qo_indptr, arrays.kv_indptr, arrays.last_page_len):
        assert host.device.type == "cpu" and host.dtype == torch.int32
    assert arrays.kv_indices.dtype == torch.int32
    assert arrays.kv_indices.device == batch.page_table.device
    torch.testing.assert_close(arrays.kv_indptr, indptr, rtol=0, atol=0)
    torch.testing.assert_close(arrays.kv_indices, indices, rtol=0, atol=0)
    torch.testing.assert_close(arrays.last_page_len, last_page_len, rtol=0, atol=0)
    torch.testing.assert_close(arrays.qo_indptr, batch.cu_query_lens.to(torch.int32))
    assert batch.is_decode_only == decode_only


def test_an_empty_batch_plans_nothing() -> None:
    arrays = plan_arrays(build_attention_batch([], [], [], 4))
    assert arrays.kv_indptr.tolist() == [0] and arrays.kv_indices.numel() == 0
