"""The live policy comparison measured by an independent client: NVIDIA AIPerf.

    python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
    .venv/bin/python benchmarks/aiperf_compare.py --aiperf /tmp/aiperf-venv/bin/aiperf \
        --policies roundgate,roundgate-auto,none,vllm-interval --rate 0.2 --num-requests 30 \
        --input-len 256 --output-len 64 --json docs/bench/aiperf_below.json

AIPerf lives in its own virtual environment (its pins differ from ours), so this script only
drives it as a subprocess. Per policy it deploys ``deployment/configs/local.yaml`` with that
policy (the same overrides ``roundgate bench --compare`` uses), waits for the deployment, runs
``aiperf profile`` against the completions endpoint (streaming, synthetic prompts of the given
length from the served model's own tokenizer, ``ignore_eos`` so every request generates
exactly ``--output-len`` tokens, Poisson arrivals at ``--rate``) and keeps AIPerf's own summary
(``profile_export_aiperf.json``): TTFT, ITL, time to second token, request latency, throughput.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roundgate.bench.cli import DEFAULT_CONFIG, policy_overrides
from roundgate.deployment.local import config_url, each_deployment, load_config

# AIPerf's metric tags kept in the report (its JSON has many more).
KEPT = (
    "time_to_first_token",
    "time_to_second_token",
    "inter_token_latency",
    "request_latency",
    "output_token_throughput",
    "request_throughput",
    "request_count",
)


def tokenizer_dir(model_args: dict[str, Any]) -> Path:
    """A directory holding the served model's tokenizer (AIPerf needs one, offline)."""
    from roundgate.actors.model.tokenizer import HFTokenizer, load_tokenizer

    tok = load_tokenizer(model_args["model"])
    if not isinstance(tok, HFTokenizer):
        raise SystemExit(f"--config: model {model_args['model']!r} has no HF tokenizer for AIPerf")
    out = Path(tempfile.mkdtemp(prefix="aiperf-tokenizer-"))
    tok.save_pretrained(str(out))
    return out


def aiperf_argv(ns: argparse.Namespace, url: str, model: str, tokenizer: Path, out: Path):
    return [
        str(ns.aiperf),
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--tokenizer",
        str(tokenizer),
        "--prompt-input-tokens-mean",
        str(ns.input_len),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(ns.output_len),
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--request-rate",
        str(ns.rate),
        "--arrival-pattern",
        "poisson",
        "--request-count",
        str(ns.num_requests),
        "--random-seed",
        str(ns.seed),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--output-artifact-dir",
        str(out),
    ]


def summary(artifacts: Path) -> dict[str, Any]:
    found = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if not found:
        raise SystemExit(f"aiperf wrote no profile_export_aiperf.json under {artifacts}")
    data = json.loads(found[-1].read_text())
    return {tag: data[tag] for tag in KEPT if tag in data}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--aiperf", type=Path, required=True, help="the aiperf executable")
    p.add_argument("--policies", default="roundgate,none")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--pd-config", type=Path, default=None, help="also run this P/D config: 'pd'")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--num-requests", type=int, default=30)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, required=True)
    ns = p.parse_args(argv)
    if not ns.aiperf.exists():
        p.error(f"--aiperf {ns.aiperf}: no such file (install AIPerf into its own venv first)")
    cfg = load_config(ns.config)
    base = cfg["applications"][0]["args"]
    url = config_url(cfg)
    tokenizer = tokenizer_dir(base)
    policies = [s.strip() for s in ns.policies.split(",")]
    overrides = {policy: policy_overrides(policy, base) for policy in policies}
    results: dict[str, Any] = {}

    def run(policy: str) -> None:
        artifacts = Path(tempfile.mkdtemp(prefix=f"aiperf-{policy}-"))
        command = aiperf_argv(ns, url, base["model"], tokenizer, artifacts)
        t0 = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise SystemExit(f"aiperf failed for {policy} (exit {done.returncode})")
        results[policy] = {"wall_s": round(time.monotonic() - t0, 1), **summary(artifacts)}
        print(policy, json.dumps(results[policy]["time_to_first_token"]), flush=True)

    extra = {} if ns.pd_config is None else {"pd": load_config(ns.pd_config)}
    each_deployment(cfg, overrides, run, extra)
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": sys.argv,
        "aiperf_command": aiperf_argv(ns, url, base["model"], Path("TOKENIZER"), Path("OUT")),
        "configs": {
            **{p: {**base, **overrides[p]} for p in policies},
            **{label: c["applications"][0]["args"] for label, c in extra.items()},
        },
        "results": results,
    }
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
