"""The whole forward on the Triton kernels, interpreted on CPU: the offline Engine with
``--attention-backend triton --moe-kernel triton`` gives the torch backends' greedy tokens
(and transformers' for the family models).

The script covers the paths a server takes: ragged prompts in one batch, chunked prefill (5
tokens a round over 4-token pages, so chunks straddle pages), decodes mixed into prefill
rounds (the extend kernel with one-token rows), decode-only rounds (the decode kernel), and
a later turn that resends an earlier one (a prefix-cache hit: its chunks attend over cached
pages). Models: the two presets, and tiny random Qwen3-MoE (GQA + fused experts),
DeepSeek-V3 (MLA with q-LoRA on the latent cache, grouped sigmoid routing), DeepSeek-V2 (MLA
without q-LoRA, grouped softmax routing) and Qwen2-MoE (a gated shared expert) saved by
transformers; on the fused decode path (``actors/model/fused_path.py``).
"""

from __future__ import annotations

import pytest
import torch
from family_models import build_family
from model_driver import hf_greedy

from roundgate.actors.engine import Engine, SamplingParams
from roundgate.actors.server_args import ServerArgs

pytestmark = pytest.mark.triton

PROMPTS = [[5, 7, 9], list(range(20, 37)), [3, 1, 4, 1, 5, 9, 2, 6, 5], [250, 11, 42, 42, 7, 8]]
GREEDY = SamplingParams(max_tokens=6)
TRITON = {"attention_backend": "triton", "moe_kernel": "triton"}


def script(engine: Engine) -> list[list[int]]:
    """One ragged batch, then a turn resending the second prompt and its answer (cached)."""
    first = engine.generate(PROMPTS, GREEDY)
    second = engine.generate([PROMPTS[1] + first[1] + [40, 41, 42]], GREEDY)
    return first + second


def run(model: str, device: str, **flags: str) -> tuple[list[list[int]], Engine]:
    args = ServerArgs(
        model=model,
        device=device,
        page_size=4,
        num_kv_pages=64,
        max_scheduled_tokens=5,
        enable_mixed_prefill_decode=True,
        **flags,
    )
    engine = Engine(args)
    return script(engine), engine


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, list]]:
    """Saved tiny models and transformers' greedy answers to ``PROMPTS``."""
    saved = {}
    for name in ("qwen3_moe", "deepseek_v3", "deepseek_v2", "qwen2_moe"):
        model = build_family(name)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        saved[name] = (str(path), [hf_greedy(model, p, GREEDY.max_tokens) for p in PROMPTS])
    return saved


@pytest.mark.parametrize(
    "model", ["tiny-llama", "tiny-moe", "qwen3_moe", "deepseek_v3", "deepseek_v2", "qwen2_moe"]
)
def test_triton_engine_gives_the_torch_tokens(
    model: str, kernel_device: str, family_dirs: dict
) -> None:
    torch.set_num_threads(1)
    expected_hf = None
    if model in family_dirs:
        model, expected_hf = family_dirs[model]
    ours, engine = run(model, kernel_device, **TRITON)
    reference, _ = run(model, kernel_device)
    assert engine.runner.attention.name == "triton"
    assert engine.runner.fused.layers  # the fused decode path (fused_path.py)
    assert engine.runner.fused.moe == engine.runner.config.is_moe
    assert engine.runner.experts.__name__ == "triton_run_experts"
    assert ours == reference
    if expected_hf is not None and kernel_device == "cpu":  # float32 there, like transformers
        assert ours[: len(PROMPTS)] == expected_hf
    prefix = engine.core.scheduler.prefix
    assert prefix.num_hits > 0  # the second turn attended over cached pages
