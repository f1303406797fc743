"""What the model runner reads of the engine's configuration: one small frozen dataclass.

Built once from a validated ``ServerArgs`` (``RunnerConfig.of``), so the runner depends on the
settings it uses, not on every flag of the engine; a test builds one directly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from roundgate.actors.control.speculative_config import SpeculativeConfig
from roundgate.actors.model.config import ModelConfig
from roundgate.actors.role import DisaggregationRole
from roundgate.actors.server_args import ServerArgs


def resolve_device(name: str) -> torch.device:
    """``--device``: ``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


@dataclass(frozen=True)
class RunnerConfig:
    """One rank's model, device, KV cache and kernels (each field is the flag of that name)."""

    model: str  # preset name, model directory or GGUF file
    model_config: ModelConfig  # read once, when the ServerArgs were validated
    device: str  # auto, cpu or cuda
    seed: int
    dp_size: int  # the expert-parallel world of an MoE model
    max_batch_size: int  # running requests one rank holds (decode graphs, MoE dispatch)
    max_model_len: int
    page_size: int
    num_kv_pages: int  # this rank's pool (set from free memory under gpu_memory_utilization)
    gpu_memory_utilization: float | None
    attention_backend: str
    moe_backend: str
    moe_kernel: str
    gguf_weights: str
    enforce_eager: bool
    chat_template: str | None
    max_grammar_cache: int
    disaggregation_mode: DisaggregationRole
    enable_eplb: bool
    num_redundant_experts: int
    eplb_window_rounds: int
    eplb_interval_rounds: int
    expert_placement_file: str | None
    eplb_load_file: str | None
    # Speculative decoding (``--speculative-config``): the rank verifies drafts.
    speculative: SpeculativeConfig | None = None
    fp8_weights: str = "auto"  # block-FP8 checkpoints: kept FP8 or dequantized at load

    @classmethod
    def of(cls, args: ServerArgs) -> RunnerConfig:
        """The runner's part of ``args`` (validated already, so nothing is checked here)."""
        names = (f.name for f in dataclasses.fields(cls))
        return cls(**{name: getattr(args, name) for name in names})

    def with_pages(self, num_kv_pages: int) -> RunnerConfig:
        """This config with the pool sized (``gpu_memory_utilization`` is then spent)."""
        return dataclasses.replace(self, num_kv_pages=num_kv_pages, gpu_memory_utilization=None)
