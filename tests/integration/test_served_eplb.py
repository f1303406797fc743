"""EPLB served: the shared dp=2 MoE deployment (tiny-moe, experts sharded over the two ranks)
redeployed with ``enable_eplb``, two redundant expert slots and a rebalance every few rounds.

Eight concurrent greedy streams over HTTP, four pinned to each rank, run through several live
rebalances: every stream completes with the tokens the static placement gives; ``/metrics``
shows the rebalances, the experts they moved, their duration and each MoE layer's
balancedness; rank 0's loads file is written and ``roundgate eplb-plan`` turns it into a
placement file the same model and group accept.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from helpers import complete, wait_for

from roundgate.actors.model.config import PRESETS
from roundgate.cli.main import main as roundgate
from roundgate.kernels.moe.placement import ExpertPlacement
from roundgate.kernels.moe.placement_file import read_loads_file, read_placement_file

PROMPTS = [[3 + i, 17, 5 * i + 1, 9, 40 + 3 * i] for i in range(8)]
TOKENS = 48
INTERVAL = 8  # rounds between rebalances: several within one batch of streams
MOE_LAYERS = PRESETS["tiny-moe"].num_layers  # every layer of the preset is sparse


def eight_streams(url: str) -> list[list[int]]:
    """Greedy token ids of the 8 prompts, all in flight at once, prompt i pinned to rank i % 2."""

    def one(i: int) -> list[int]:
        body = complete(
            url,
            prompt=PROMPTS[i],
            max_tokens=TOKENS,
            temperature=0,
            ignore_eos=True,
            return_token_ids=True,
            dp_rank=i % 2,
        )
        return body["choices"][0]["token_ids"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def eplb_series(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The EPLB samples of one ``/metrics`` scrape, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "eplb" in s.name or "expert_balancedness" in s.name:
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(series: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(value for _, value in series.get(name, []))


def test_served_rebalances_keep_every_stream_and_show_in_metrics(
    redeploy: Any, tmp_path: Path
) -> None:
    app = redeploy
    static = eight_streams(app.url)  # the shared app: contiguous blocks, one copy each
    loads = tmp_path / "loads.json"
    app.deploy(
        enable_eplb=True,
        num_redundant_experts=2,
        eplb_window_rounds=INTERVAL,
        eplb_interval_rounds=INTERVAL,
        eplb_load_file=str(loads),
    )
    assert eight_streams(app.url) == static, "a stream changed across live rebalances"

    series = wait_for(
        lambda: eplb_series(app.url),
        60,
        "the rebalances in /metrics",
        until=lambda s: total(s, "roundgate_eplb_rebalances_total") >= 2,
    )
    # Rank 0 exports the group's series: one group, every MoE layer's balancedness.
    layers = {labels["moe_layer"] for labels, _ in series["roundgate_expert_balancedness"]}
    assert layers == {str(i) for i in range(MOE_LAYERS)}
    assert all(0 < value <= 1 for _, value in series["roundgate_expert_balancedness"])
    assert "roundgate_eplb_experts_moved_total" in series
    assert total(series, "roundgate_eplb_last_rebalance_seconds") > 0

    # The offline half: the recorded loads -> a placement file this model and group accept.
    recorded = read_loads_file(loads)
    assert len(recorded) == MOE_LAYERS
    assert all(len(layer) == PRESETS["tiny-moe"].num_experts for layer in recorded)
    assert sum(map(sum, recorded)) > 0
    placement_file = tmp_path / "placement.json"
    argv = [str(loads), "-o", str(placement_file), "--dp-size", "2"]
    assert roundgate(["eplb-plan", *argv, "--num-redundant-experts", "2"]) == 0
    layout = ExpertPlacement(PRESETS["tiny-moe"].num_experts, 2, 0, 2).layout()
    assert len(read_placement_file(placement_file, layout, MOE_LAYERS)) == MOE_LAYERS
