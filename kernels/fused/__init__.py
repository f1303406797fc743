"""Fused per-layer kernels for the decode path: the elementwise work between a layer's GEMMs.

A decode round moves few bytes per op, so its layers cost what they dispatch: every torch op
and kernel launch is a fixed few microseconds. These Triton kernels each do, in one launch,
what the torch layers spell as several ops (RMSNorm, residual add + RMSNorm, SiLU-and-mul),
with the torch layers' arithmetic (float32 where they upcast, rounded where they round), so
their outputs match the reference. Compiled on CUDA, interpreted on CPU under
``TRITON_INTERPRET=1`` (``kernels/triton_env.py``). None reads a device value back to the
host, so each may run inside a captured CUDA graph.

This file holds no code: import each name from the module that defines it (``triton_norm``,
``triton_act``).
"""
