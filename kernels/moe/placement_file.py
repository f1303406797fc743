"""Expert placements and expert loads in files: recorded live, placed offline, loaded at start.

A placement file is JSON, one physical -> logical list per MoE layer, in layer order::

    {"num_experts": 8, "num_redundant_experts": 2, "dp_size": 2,
     "layers": [[0, 1, 4, 6, 7, 0, 0, 2, 3, 5], ...]}

A loads file holds routed tokens per logical expert, per MoE layer, over some rounds::

    {"num_experts": 8, "rounds": 1000, "layers": [[120.0, 4.0, ...], ...]}

``--eplb-load-file`` has rank 0 write one at each rebalance (the group's sum);
``roundgate eplb-plan`` places it for a group and writes a placement file;
``--expert-placement-file`` reads that, refusing a file that does not fit the model and
group it is given to (the culprit named).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from roundgate.kernels.moe.eplb import Layout, Placement, check_placement, place

FLAG = "--expert-placement-file"


def read_placement_file(path: str | Path, layout: Layout, num_layers: int) -> list[Placement]:
    """Each MoE layer's placement from ``path``, checked against ``layout``."""
    body = _read_json(path, FLAG)
    layers = body.get("layers") if isinstance(body, dict) else None
    if not isinstance(layers, list) or not all(isinstance(x, list) for x in layers):
        raise ValueError(f"{FLAG} {path}: needs a 'layers' list of per-layer lists")
    header = (
        ("num_experts", layout.num_logical),
        ("num_redundant_experts", layout.num_physical - layout.num_logical),
        ("dp_size", layout.num_ranks),
    )
    for key, expected in header:  # optional in a hand-written file; checked when given
        if key in body and body[key] != expected:
            raise ValueError(
                f"{FLAG} {path}: planned for {key} {body[key]!r}, this deployment has {expected}"
            )
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


def write_loads_file(path: str | Path, rounds: int, loads: Sequence[Sequence[float]]) -> None:
    """Write per-layer logical expert loads, atomically (a reader never sees half a file)."""
    body = {
        "num_experts": len(loads[0]) if loads else 0,
        "rounds": rounds,
        "layers": [[float(x) for x in layer] for layer in loads],
    }
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(body) + "\n")
    partial.replace(target)


def read_loads_file(path: str | Path) -> list[list[float]]:
    """The per-layer logical expert loads in ``path`` (the culprit named if malformed)."""
    body = _read_json(path, "loads file")
    layers = body.get("layers") if isinstance(body, dict) else None
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"loads file {path}: needs a non-empty 'layers' list")
    out: list[list[float]] = []
    for index, layer in enumerate(layers):
        if (
            not isinstance(layer, list)
            or not layer
            or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < float("inf")
                for x in layer
            )
        ):
            raise ValueError(
                f"loads file {path}, layer {index}: needs a list of finite token counts >= 0"
            )
        if len(layer) != len(layers[0]):
            raise ValueError(
                f"loads file {path}, layer {index}: {len(layer)} experts, layer 0 has "
                f"{len(layers[0])}"
            )
        out.append([float(x) for x in layer])
    return out


def _read_json(path: str | Path, what: str) -> object:
    """``path``'s JSON; a ``ValueError`` naming ``what`` and the path when it cannot be read
    or is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} {path}: not JSON ({exc})") from None
