"""The decode forward's host budget: ops per layer and host reads per round.

A decode round of DeepSeek-V3 on a GPU is bound by the host when each of its 61 layers
dispatches a hundred small ops and every MoE layer reads its expert counts back (a device
sync). The fused path (``actors/model/fused_path.py``) is held here to what the peers' fused
layers cost: at most ``OPS_PER_LAYER`` torch ops plus Triton launches per decoder layer, no
host read inside any layer, and at most ``HOST_READS`` reads a round (the sampled tokens and
the round's own bookkeeping), counted on the tiny random DeepSeek-V3 (MLA with q-LoRA, a dense
first layer, shared and grouped-routed experts) decoding 8 requests, on CPU under Triton's
interpreter. The reference path is counted too: it must stay over the budget, or the budget
no longer tells the two apart.
"""

from __future__ import annotations

import pytest
import torch
from family_models import build_family

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.model.fused_path import FusedPath
from roundgate.actors.server_args import ServerArgs
from roundgate.kernels.dispatch_count import OUTSIDE, DispatchTally, count_decode_round

pytestmark = pytest.mark.triton

OPS_PER_LAYER = 60
HOST_READS = 4
BATCH = 8
FUSED = {"attention_backend": "triton", "moe_kernel": "triton"}


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("deepseek_v3")
    build_family("deepseek_v3").save_pretrained(path)
    return str(path)


def engine_for(model: str, device: str, **flags: str) -> Engine:
    return Engine(ServerArgs(model=model, device=device, page_size=4, num_kv_pages=64, **flags))


def counted_round(engine: Engine) -> tuple[DispatchTally, list]:
    """The tally of the first decode round of ``BATCH`` requests, and every request's tokens."""
    prompts = [[5 + i, 7, 9, 11 + 2 * i] for i in range(BATCH)]
    outputs: list = []
    drive = lambda: outputs.extend(engine.generate(prompts, SamplingParams(max_tokens=4)))  # noqa: E731
    return count_decode_round(engine.runner, drive, BATCH), outputs


def test_fused_path_holds_the_budget(deepseek_dir: str, kernel_device: str) -> None:
    torch.set_num_threads(1)
    engine = engine_for(deepseek_dir, kernel_device, **FUSED)
    assert engine.runner.fused == FusedPath(layers=True, moe=True)
    fused, tokens = counted_round(engine)
    per_layer = fused.layer_ops()
    assert len(per_layer) == 3  # every decoder layer ran, each attributed
    assert max(per_layer.values()) <= OPS_PER_LAYER, per_layer
    assert sum(fused.layer_reads.values()) == fused.layer_reads[OUTSIDE], fused.host_reads
    assert fused.num_host_reads <= HOST_READS, fused.host_reads
    # The same tokens as the reference path: the budget is not bought with other arithmetic.
    _, reference_tokens = counted_round(engine_for(deepseek_dir, kernel_device))
    assert tokens == reference_tokens


@pytest.mark.parametrize("path", ["torch", "triton unfused"])
def test_reference_paths_are_over_the_budget(
    deepseek_dir: str, path: str, kernel_device: str
) -> None:
    """Today's reference path (torch attention, per-expert GEMMs) and the Triton kernels
    without the fused path both exceed it, and their MoE layers read expert counts back."""
    torch.set_num_threads(1)
    engine = engine_for(deepseek_dir, kernel_device, **(FUSED if path != "torch" else {}))
    engine.runner.fused = FusedPath()
    tally, _ = counted_round(engine)
    assert max(tally.layer_ops().values()) > OPS_PER_LAYER
    for name in ("layer1", "layer2"):  # the MoE layers
        assert tally.layer_reads[name] > 0, tally.host_reads
