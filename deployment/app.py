"""The Serve application: ``build_app(args)`` → ingress + one gang of rank replicas per group.

``serve run deployment/configs/local.yaml`` imports ``deployment.app:build_app`` and passes the
config's ``args``; they are validated (pydantic ``AppArgs``, which builds the one ``ServerArgs``)
before any replica starts.
"""

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve import Application
from ray.serve.config import GangSchedulingConfig, RequestRouterConfig

from actors.replica.rank_replica import RankReplica
from deployment.chat_response import ChatResponder
from deployment.choices import usage
from deployment.config import AppArgs
from deployment.http_api import api, json_body
from deployment.ingress import Ingress
from deployment.protocol import APIError, ChatRequest, CompletionRequest
from deployment.request_metrics import exposition
from deployment.responses import completion_logprobs
from deployment.routers import ROUTER_CLASSES
from deployment.serve_context import http_request_id
from deployment.streaming import drain, echo_texts, stream, token_ids_of
from deployment.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from deployment.tools import render_inputs


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

    @api.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/tokenize``: a prompt or chat messages to the ids generation would use."""
        core = self.core
        req = await core.read_request(request, TokenizeRequest)
        return tokenize(core, req)

    @api.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/detokenize``: token ids to text."""
        core = self.core
        req = await core.read_request(request, DetokenizeRequest)
        return detokenize(core, req)

    @api.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(self, request: Request) -> Any:
        core = self.core
        req = await core.read_request(request, CompletionRequest)
        if req.echo and req.logprobs is not None:
            raise APIError(
                400, "echo with logprobs needs prompt logprobs, which are not computed", "echo"
            )
        prompts = core.prompts_of(req)
        echoes = echo_texts(req, prompts, core.tokenizer) if req.echo else None
        texts = core.token_texts

        def logprobs(ids: Any, lps: Any, offsets: Any) -> Any:
            return None if lps is None else completion_logprobs(texts, ids, lps, offsets)

        rid, created = http_request_id(), int(time.time())
        choices, deltas = await core.generate(rid, prompts, req, req.max_tokens or 16, "prompt")
        head = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": core.model_name,
        }
        if req.stream:
            echoed: set[int] = set()

            def chunk(d: Any) -> dict[str, Any]:
                text = d.text
                if echoes is not None and d.index not in echoed:
                    echoed.add(d.index)
                    text = echoes[d.index // req.n] + text  # n choices per prompt
                delta = {
                    "index": d.index,
                    "text": text,
                    "logprobs": logprobs(d.token_ids, d.logprobs, d.text_offsets),
                    "finish_reason": d.finish_reason,
                }
                if req.return_token_ids:  # each chunk's new ids (a session client resends them)
                    delta["token_ids"] = d.token_ids
                return {**head, "choices": [delta]}

            return stream(deltas, chunk, head, choices, req)
        await drain(deltas)
        return {
            **head,
            "choices": [
                {
                    "index": c.index,
                    "text": c.text if echoes is None else echoes[c.index // req.n] + c.text,
                    "logprobs": logprobs(
                        c.output_token_ids,
                        c.logprobs if req.logprobs is not None else None,
                        c.text_offsets,
                    ),
                    "finish_reason": c.finish_reason,
                    **token_ids_of(c, req),
                }
                for c in choices
            ],
            "usage": usage(choices),
        }

    @api.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest))
    async def chat(self, request: Request) -> Any:
        core = self.core
        req = await core.read_request(request, ChatRequest)
        try:
            messages = [m.as_template_input() for m in req.messages]
            template = getattr(core.tokenizer, "chat_template", None)
            ids = core.tokenizer.render_chat(*render_inputs(messages, req.tools, template))
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
        responder = ChatResponder(head, req, core.token_texts)
        if req.stream:
            return stream(deltas, responder.chunk, head, choices, req)
        await drain(deltas)
        return responder.body(choices)


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
