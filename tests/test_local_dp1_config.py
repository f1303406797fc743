"""deployment/configs/local-dp1.yaml: one rank holding both cores, validated like local.yaml."""

from __future__ import annotations

from pathlib import Path

from roundgate.deployment.local import build, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployment" / "configs"


def test_the_one_rank_config_builds_with_both_cores_on_its_rank() -> None:
    cfg = load_config(CONFIGS / "local-dp1.yaml")
    args = cfg["applications"][0]["args"]
    # Both cores: with the ingress's 0.25 CPU the rank's 1.75 fill a 2-CPU Ray node exactly
    # (2 would leave the rank unplaceable there), and 1.75 CPUs run two threads.
    assert (args["dp_size"], args["num_cpus_per_rank"]) == (1, 1.75)
    # The same model and engine settings as local.yaml apart from the rank layout.
    base = load_config(CONFIGS / "local.yaml")["applications"][0]["args"]
    # (elastic_dp too: one rank has no group to keep serving while it is replaced)
    layout = {"dp_size", "num_cpus_per_rank", "num_kv_pages", "elastic_dp"}
    assert {k: v for k, v in args.items() if k not in layout} == {
        k: v for k, v in base.items() if k not in layout
    }
    assert build(cfg) is not None  # every flag validated, no cluster needed
