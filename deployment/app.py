"""The Serve application: ``build_app(args)`` → ingress + one gang of rank replicas per group.

``serve run deployment/configs/local.yaml`` imports ``deployment.app:build_app`` and passes the
config's ``args``; they are validated (pydantic ``AppArgs``, which builds the one ``ServerArgs``)
before any replica starts.
"""

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve import Application
from ray.serve.config import GangSchedulingConfig, RequestRouterConfig

from actors.replica.rank_replica import RankReplica
from deployment.choices import usage
from deployment.config import AppArgs
from deployment.http_api import api, json_body, read_json, sse
from deployment.ingress import Ingress
from deployment.protocol import APIError, ChatRequest, CompletionRequest, parse
from deployment.request_metrics import exposition
from deployment.routers import ROUTER_CLASSES
from deployment.serve_context import http_request_id


def _ids(choice: Any, req: Any) -> dict[str, Any]:
    if not req.return_token_ids:
        return {}
    return {"prompt_token_ids": choice.prompt_token_ids, "token_ids": choice.output_token_ids}


async def _drain(deltas: Any) -> None:
    async for _ in deltas:
        pass


def _stream(deltas: Any, chunk: Any, head: dict, choices: list, req: Any) -> StreamingResponse:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def body() -> Any:
        try:
            async for d in deltas:
                yield sse(chunk(d))
        except APIError as exc:
            # Headers are already sent: the error travels as a final event.
            yield sse(exc.body())
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage(choices)})
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


@serve.ingress(api)
class OpenAIServer:
    """HTTP front door; holds a handle to the rank deployment."""

    def __init__(self, ranks: Any, app_args: dict[str, Any]) -> None:
        self.core = Ingress(ranks, app_args)

    @api.get("/health")
    async def health(self) -> dict[str, str]:
        """200 only while every rank replica passes its health checks; 503 says why."""
        self.core.check_available()
        await self.core.check_ranks_healthy()
        return {"status": "ok"}

    @api.get("/metrics")
    async def metrics(self) -> Response:
        """Every process's series, merged: ranks, groups and all ingress replicas."""
        return Response(await exposition(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        self.core.check_auth(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": self.core.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "roundgate",
                    "max_model_len": self.core.max_model_len,
                }
            ],
        }

    @api.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(self, request: Request) -> Any:
        core = self.core
        core.check_auth(request)
        req = parse(CompletionRequest, await read_json(request, core.app_args.max_request_bytes))
        core.check_model(req.model)
        for name in ("echo", "suffix"):
            if getattr(req, name):
                raise APIError(400, f"{name} is not supported", param=name)
        for name in ("logprobs", "best_of"):
            if getattr(req, name) not in (None, 0, 1):
                raise APIError(400, f"{name} is not supported", param=name)
        prompts = core.prompts_of(req)
        rid, created = http_request_id(), int(time.time())
        choices, deltas = await core.generate(rid, prompts, req, req.max_tokens or 16, "prompt")
        head = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": core.model_name,
        }
        if req.stream:

            def chunk(d: Any) -> dict[str, Any]:
                delta = {
                    "index": d.index,
                    "text": d.text,
                    "logprobs": None,
                    "finish_reason": d.finish_reason,
                }
                if req.return_token_ids:  # each chunk's new ids (a session client resends them)
                    delta["token_ids"] = d.token_ids
                return {**head, "choices": [delta]}

            return _stream(deltas, chunk, head, choices, req)
        await _drain(deltas)
        return {
            **head,
            "choices": [
                {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    **_ids(c, req),
                }
                for c in choices
            ],
            "usage": usage(choices),
        }

    @api.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest))
    async def chat(self, request: Request) -> Any:
        core = self.core
        core.check_auth(request)
        req = parse(ChatRequest, await read_json(request, core.app_args.max_request_bytes))
        core.check_model(req.model)
        if req.logprobs:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        try:
            messages = [m.as_template_input() for m in req.messages]
            ids = core.tokenizer.render_chat(messages, req.tools)
        except ValueError as exc:  # a non-text part, no template, or the template refused
            raise APIError(400, str(exc), param="messages") from None
        max_tokens = req.max_completion_tokens or req.max_tokens
        rid, created = http_request_id(), int(time.time())
        choices, deltas = await core.generate(rid, [ids], req, max_tokens, "messages")
        head = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": core.model_name,
        }
        if req.stream:
            first = [True]

            def chunk(d: Any) -> dict[str, Any]:
                delta = {"content": d.text}
                if first[0]:
                    delta["role"] = "assistant"
                    first[0] = False
                return {
                    **head,
                    "choices": [
                        {
                            "index": d.index,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": d.finish_reason,
                        }
                    ],
                }

            return _stream(deltas, chunk, head, choices, req)
        await _drain(deltas)
        return {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": c.index,
                    "logprobs": None,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    **_ids(c, req),
                }
                for c in choices
            ],
            "usage": usage(choices),
        }


def build_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` and bind the ingress to ``num_groups`` gangs of ``dp_size`` ranks."""
    cfg = AppArgs.model_validate(args)
    engine = cfg.server_args()
    router_kwargs = cfg.router_kwargs()
    ranks = serve.deployment(
        RankReplica,
        name="RankReplica",
        num_replicas=cfg.num_groups * engine.dp_size,
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus_per_rank, "num_gpus": cfg.num_gpus_per_rank},
        gang_scheduling_config=GangSchedulingConfig(gang_size=engine.dp_size),
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASSES[cfg.router],
            request_router_kwargs=router_kwargs,
            request_routing_stats_period_s=0.5,
        ),
        health_check_period_s=2.0,
        health_check_timeout_s=max(10.0, engine.collective_timeout_s),
        graceful_shutdown_timeout_s=5.0,
    ).bind(engine.to_dict())
    ingress = serve.deployment(
        OpenAIServer,
        name="OpenAIServer",
        num_replicas=cfg.ingress_replicas,
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": 0.25},
    )
    return ingress.bind(ranks, cfg.model_dump())


__all__ = ["JSONResponse", "OpenAIServer", "build_app"]
