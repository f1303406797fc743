"""The closed sets of values engine flags take (``ServerArgs`` checks them, argparse lists
them as choices)."""

from __future__ import annotations

DISAGGREGATION_MODES = ("null", "prefill", "decode")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flashinfer")
MOE_BACKENDS = ("auto", "local", "torch", "deepep")
GGUF_WEIGHTS = ("packed", "float")
# Flags that must be positive integers.
POSITIVE = ("dp_size", "max_num_seqs", "max_scheduled_tokens", "page_size", "num_kv_pages")
CHOICES = {
    "disaggregation_mode": DISAGGREGATION_MODES,
    "device": DEVICES,
    "attention_backend": ATTENTION_BACKENDS,
    "moe_backend": MOE_BACKENDS,
    "gguf_weights": GGUF_WEIGHTS,
}
