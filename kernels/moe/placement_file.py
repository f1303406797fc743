"""A static expert placement in a file: computed offline from recorded loads, loaded at start.

The format is JSON, one physical -> logical list per MoE layer, in layer order::

    {"num_experts": 8, "num_redundant_experts": 2, "dp_size": 2,
     "layers": [[0, 1, 4, 6, 7, 0, 0, 2, 3, 5], ...]}

``roundgate eplb-plan`` writes one from a loads file (``[[tokens per logical expert] per
MoE layer]``); ``--expert-placement-file`` reads it, refusing a file that does not fit the
model and group it is given to (the culprit named).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from roundgate.kernels.moe.eplb import Layout, Placement, check_placement, place

FLAG = "--expert-placement-file"


def read_placement_file(path: str | Path, layout: Layout, num_layers: int) -> list[Placement]:
    """Each MoE layer's placement from ``path``, checked against ``layout``."""
    try:
        body = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{FLAG} {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{FLAG} {path}: not JSON ({exc})") from None
    layers = body.get("layers") if isinstance(body, dict) else None
    if not isinstance(layers, list) or not all(isinstance(x, list) for x in layers):
        raise ValueError(f"{FLAG} {path}: needs a 'layers' list of per-layer lists")
    if len(layers) != num_layers:
        raise ValueError(
            f"{FLAG} {path}: {len(layers)} layers, the model has {num_layers} MoE layers"
        )
    placements = []
    for index, layer in enumerate(layers):
        try:
            placements.append(check_placement(layer, layout))
        except ValueError as exc:
            raise ValueError(f"{FLAG} {path}, layer {index}: {exc}") from None
    return placements


def write_placement_file(
    path: str | Path, layout: Layout, loads: Sequence[Sequence[float]]
) -> None:
    """Place ``loads`` (per MoE layer, per logical expert) and write the result to ``path``."""
    body = {
        "num_experts": layout.num_logical,
        "num_redundant_experts": layout.num_physical - layout.num_logical,
        "dp_size": layout.num_ranks,
        "layers": [list(p) for p in place(loads, layout)],
    }
    Path(path).write_text(json.dumps(body) + "\n")
