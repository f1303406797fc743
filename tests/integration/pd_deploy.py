"""deployment/configs/pd.yaml served once for every P/D module, in place of the shared app.

Deploying pd.yaml (the real default model) costs about as much as the P/D tests themselves, so
conftest's session fixture ``pd_app`` deploys it once (``replace_with_pd``) under the shared
application's name and port, and the modules that use it run last in the session (conftest's
``pytest_collection_modifyitems``): nothing after them needs the fused app, so it is never put
back. Just before the swap the fused deployment (local.yaml with its own model, conftest's
``real_model``) answers the comparison's requests (``CASES``, ``SEEDED``): the reference that
test_served_pd.py holds the P/D answers to.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from helpers import sse_events, wait_for

PD_YAML = Path(__file__).resolve().parents[2] / "deployment" / "configs" / "pd.yaml"

LONG = (
    "Write a short note for a friend who is moving to a new city next month. Mention the "
    "weather, the food, the public transport, and one museum worth a visit on a rainy day."
)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
# Short and multi-page prompts, completions and chat; each is asked streamed and not.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("completions", {"prompt": "The capital of France is"}),
    "completion-long": ("completions", {"prompt": LONG}),
    "chat": ("chat/completions", {"messages": CHAT}),
    "chat-long": ("chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
}
GREEDY = {"max_tokens": 24, "temperature": 0, "return_token_ids": True}
SEEDED = {"prompt": LONG, "max_tokens": 12, "temperature": 0.8, "seed": 7, "n": 2, "logprobs": 2}

Answers = dict[tuple[str, bool], list[dict[str, Any]]]


@dataclass(frozen=True)
class PDApp:
    """The served pd.yaml and what the fused deployment answered before it took its place."""

    url: str
    # Each greedy case's choices, keyed (case, streamed), as ``run_all`` returns them.
    fused: Answers
    # The fused deployment's choices for ``SEEDED``, logprobs included.
    fused_seeded: list[dict[str, Any]]


def pd_config(port: int, **args: Any) -> dict[str, Any]:
    """pd.yaml on ``port``; ``args`` replace top-level args (a role section merges)."""
    from roundgate.deployment.local import load_config

    cfg = load_config(PD_YAML)
    cfg["http_options"]["port"] = port
    base = cfg["applications"][0]["args"]
    for key, value in args.items():
        if key in ("prefill", "decode"):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return copy.deepcopy(cfg)


def replace_with_pd(fused: Any) -> PDApp:
    """Record ``fused``'s answers (a conftest ``Deployment``), then serve pd.yaml as shipped
    in its place (same name and port) and wait until it answers."""
    from roundgate.deployment.local import deploy, wait_ready

    reference = run_all(fused.url)
    reference_seeded = seeded(fused.url)
    deploy(pd_config(fused.cfg["http_options"]["port"]))
    wait_ready(fused.url)
    return PDApp(fused.url, reference, reference_seeded)


def answer(url: str, endpoint: str, body: dict[str, Any], stream: bool) -> list[dict[str, Any]]:
    """Each choice's text, token ids and finish reason (a stream's deltas joined)."""
    with httpx.Client(timeout=300) as client:
        if not stream:
            r = client.post(f"{url}/v1/{endpoint}", json=body)
            assert r.status_code == 200, r.text
            return [_choice(c) for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
        joined: dict[int, dict[str, Any]] = {}
        with client.stream("POST", f"{url}/v1/{endpoint}", json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            for event in sse_events(r):
                if event == "[DONE]":
                    break
                for c in event["choices"]:
                    out = joined.setdefault(c["index"], {"text": "", "ids": [], "finish": None})
                    out["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
                    out["ids"] += c.get("token_ids") or []
                    out["finish"] = c.get("finish_reason") or out["finish"]
        return [joined[i] for i in sorted(joined)]


def _choice(c: dict[str, Any]) -> dict[str, Any]:
    text = c["text"] if "text" in c else c["message"]["content"]
    return {"text": text, "ids": c.get("token_ids") or [], "finish": c["finish_reason"]}


def run_all(url: str) -> Answers:
    """Every greedy case, streamed and not, one at a time."""
    return {
        (name, stream): answer(url, endpoint, {**body, **GREEDY}, stream)
        for name, (endpoint, body) in CASES.items()
        for stream in (False, True)
    }


def seeded(url: str) -> list[dict[str, Any]]:
    """The choices of ``SEEDED``: a seeded ``n = 2`` with logprobs."""
    r = httpx.post(f"{url}/v1/completions", json=SEEDED, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def role_call(
    role: str, method: str, *call_args: Any, rank: int = 0, timeout_s: float = 30.0
) -> Any:
    """``method`` on rank ``rank`` of ``role`` (``prefill`` or ``decode``)."""
    from ray import serve

    from roundgate.actors.control.messages import RankTarget

    handle = serve.get_deployment_handle(f"{role.capitalize()}Rank", app_name="roundgate")
    call = getattr(handle, method).remote(RankTarget(rank), *call_args)
    return call.result(timeout_s=timeout_s)


def pools_settled(timeout_s: float = 30.0, num_decode_ranks: int = 1) -> dict[str, dict[str, Any]]:
    """Both roles' ranks once idle: pools intact, no page held (nothing pinned or leaked).
    Keyed ``prefill`` and ``decode`` (rank 0), then ``decode-1``... for further decode ranks."""
    ranks = [("prefill", "prefill", 0)] + [
        ("decode" if r == 0 else f"decode-{r}", "decode", r) for r in range(num_decode_ranks)
    ]

    def settled() -> dict[str, dict[str, Any]] | None:
        stats = {key: role_call(role, "stats_snapshot", rank=r) for key, role, r in ranks}
        for _, role, r in ranks:
            assert role_call(role, "check_pool", rank=r) is True
        idle = all(s["kv_occupancy"] == 0 and s["running"] == 0 for s in stats.values())
        return stats if idle else None

    return wait_for(settled, timeout_s, "both roles idle with no page held")
