"""Running ``benchmarks/vllm_entrypoints.py``'s extracted tests: pytest in their venv, the
report, and the launch-flag groups.

A vLLM test module that starts
vLLM with a flag which changes behaviour (``--max-logprobs``) needs a roundgate server with the
matching setting, and one server cannot hold two settings at once.

Each such group names the deployment args it needs. With ``--launch`` the harness starts
``roundgate serve`` (``deployment/configs/local.yaml`` plus the group's args, on the
``--base-url`` port) for each group in turn and stops it after; without it, every group runs
against the one server at ``--base-url``, and the harness says which groups expect other
settings.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from common import serve_config, stop, wait_ready

from roundgate.deployment.local import DEFAULT_CONFIG, load_config

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-vllmtests"
# group -> the deployment args its vLLM module's launch flags mean (vLLM flag in the comment).
GROUP_ARGS: dict[str, dict[str, Any]] = {
    "core": {},
    "responses": {},
    "max-logprobs": {"max_logprobs": -1},  # test_chat_echo.py: --max-logprobs 151936
}


def needs(group: str) -> dict[str, Any]:
    return GROUP_ARGS.get(group, {})


@contextlib.contextmanager
def launched(group: str, base_url: str) -> Iterator[None]:
    """``roundgate serve`` with ``group``'s args on ``base_url``'s port, until the block ends."""
    cfg = load_config(DEFAULT_CONFIG)
    cfg["applications"][0]["args"].update(needs(group))
    port = urlsplit(base_url).port or 8000
    cfg["http_options"]["port"] = port
    with tempfile.TemporaryDirectory() as tmp:
        process = serve_config(cfg, Path(tmp) / f"{group}.yaml")
        try:
            print(f"launching roundgate serve for group {group} {needs(group)}", flush=True)
            wait_ready(f"http://127.0.0.1:{port}", process)
            yield
        finally:
            stop(process)


def run_pytest(work: Path, files: list[str], extra: list[str]) -> list[dict]:
    """pytest in the tests' venv; the shim records each test's outcome in ``results.json``."""
    flags = "-p no:cacheprovider -q -rN --continue-on-collection-errors -o verbosity_assertions=2"
    cmd = [str(VENV / "bin/python"), "-m", "pytest", *flags.split()]
    print("$", " ".join([*cmd, *extra, *files]), flush=True)
    subprocess.run([*cmd, *extra, *files], cwd=work)
    return json.loads((work / "results.json").read_text())


def report(work: Path, meta: dict, results: list[dict], groups: dict[str, str], out: Path) -> None:
    """Counts per group, printed; the JSON (everything) and markdown (failures) reports."""
    deselected = json.loads((work / "deselected.json").read_text())

    def bad(r: dict) -> bool:
        return r["outcome"] in ("failed", "error")

    counts: dict[str, dict[str, int]] = {}
    for r in results:
        c = counts.setdefault(groups.get(r["id"].split("::")[0], "core"), {})
        c[r["outcome"]] = c.get(r["outcome"], 0) + 1
    summary = [
        f"{g}: {c.get('passed', 0)} of {sum(c.values()) - c.get('skipped', 0)} pass {c}"
        for g, c in counts.items()
    ]
    meta = {**meta, "counts": counts, "deselected": deselected, "tests": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_entrypoints.json").write_text(json.dumps(meta, indent=1))
    md = [
        f"# vLLM entrypoint tests against roundgate, {time.strftime('%Y-%m-%d %H:%M UTC')}",
        f"\nvLLM `{meta['vllm']}` at `{meta['commit']}`; model `{meta['model']}`\n",
        *[f"- {line}" for line in summary],
        f"- deselected (vLLM internals, LoRA, vLLM's version): {len(deselected)}",
        "\n## Failures\n",
        *[f"- `{r['id']}` ({r['outcome']}): {r['message']}" for r in results if bad(r)],
    ]
    (out / "vllm_entrypoints.md").write_text("\n".join(md) + "\n")
    print("\n".join(summary), f"\nreport: {out}/vllm_entrypoints.md, .json", sep="")
