"""MoE expert dispatch/combine across the DP group (``--moe-backend``: ``local``, ``torch``,
``deepep``), and the expert computation between them (``--moe-kernel``: ``torch``, a GEMM pair
per expert, or ``triton``, fused grouped GEMMs); ``registry.py`` lists both.

Attention is data-parallel (each rank its own batch); experts are sharded over the same
ranks (``ExpertPlacement``), so every MoE layer is a group collective.

This file holds no code: ``registry`` is read where torch must not load (``ServerArgs`` lists
the choices in every process, the ingress included), and Python runs this file first. Import
each name from the module that defines it (``base``, ``placement``, ``registry``, ...).
"""
