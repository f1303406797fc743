"""The Serve application: ``build_app(args)`` → ingress + one gang of rank replicas per group.

``serve run deployment/configs/local.yaml`` imports ``roundgate.deployment.app:build_app`` and
passes the config's ``args``; they are validated (pydantic ``AppArgs``, which builds the one
``ServerArgs``) before any replica starts.
"""

import uuid
from typing import Any

import ray
from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from roundgate.actors.replica.rank_replica import RankReplica
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.config import AppArgs
from roundgate.deployment.ingress import Ingress
from roundgate.deployment.ingress_placement import INGRESS_CPUS, check_head_room, ingress_resources
from roundgate.deployment.openai.api import api, json_body
from roundgate.deployment.openai.chat import create_chat_completion
from roundgate.deployment.openai.chat_batch import create_batch_chat_completion
from roundgate.deployment.openai.completions import create_completion
from roundgate.deployment.openai.invocations import invocations
from roundgate.deployment.openai.models import list_models, server_version
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest
from roundgate.deployment.openai.responses import create_response
from roundgate.deployment.openai.responses_background import (
    cancel_response,
    delete_response,
    retrieve_response,
)
from roundgate.deployment.openai.responses_request import ResponsesRequest
from roundgate.deployment.openai.tokenization import (
    DetokenizeRequest,
    TokenizeRequest,
    detokenize_route,
    tokenize_route,
    tokenizer_info,
)
from roundgate.deployment.pd_app import build_roles
from roundgate.deployment.request_metrics import exposition
from roundgate.deployment.response_store_actor import shared_responses
from roundgate.deployment.routing.routers import ROUTER_CLASSES
from roundgate.deployment.serve_context import RANK_DEPLOYMENT_OF


@serve.ingress(api)
class OpenAIServer:
    """HTTP front door; holds a handle to each rank deployment, by the role it serves
    (``fused``; P/D: ``prefill`` and ``decode``). Each route's body lives in its endpoint
    family's module of ``roundgate.deployment.openai``."""

    def __init__(
        self,
        app_args: AppArgs | dict[str, Any],
        fused: DeploymentHandle | None = None,
        prefill: DeploymentHandle | None = None,
        decode: DeploymentHandle | None = None,
    ) -> None:
        handles = {
            DisaggregationRole.FUSED: fused,
            DisaggregationRole.PREFILL: prefill,
            DisaggregationRole.DECODE: decode,
        }
        self.core = Ingress(
            app_args,
            {r: h for r, h in handles.items() if h is not None},
            responses=shared_responses(),  # every ingress replica's one store
        )

    def __del__(self) -> None:
        """Serve's shutdown hook (a replaced or scaled-down replica)."""
        if hasattr(self, "core"):
            self.core.metrics.close()
            self.core.prepare.close()

    @api.get("/health")
    async def health(self) -> dict[str, Any]:
        """200 only while every rank replica passes its health checks; 503 says why. An
        elastic deployment: 200 while some rank serves, the body naming the groups short of
        ranks (``roundgate.deployment.group_health``)."""
        self.core.check_available()
        if self.core.app_args.elastic_dp:
            return await self.core.elastic_health()
        await self.core.check_ranks_healthy()
        return {"status": "ok"}

    @api.get("/metrics")
    async def metrics(self) -> Response:
        """Every process's series, merged: ranks, groups and all ingress replicas."""
        return Response(await exposition(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        self.core.check_auth(request)
        return list_models(self.core)

    @api.get("/version")
    async def version(self) -> dict[str, str]:
        return server_version()

    @api.get("/load")
    async def load(self) -> dict[str, int]:
        """vLLM's server load: generation requests this ingress replica is serving."""
        return self.core.load.snapshot()

    @api.get("/tokenizer_info")
    async def tokenizer_info(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/tokenizer_info``: the tokenizer's configuration and chat template."""
        self.core.check_auth(request)
        return tokenizer_info(self.core)

    @api.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/tokenize``: a prompt or chat messages to the ids generation would use."""
        return await tokenize_route(self.core, request)

    @api.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/detokenize``: token ids to text."""
        return await detokenize_route(self.core, request)

    @api.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(self, request: Request) -> Any:
        # ``Any``: FastAPI reads a route's return annotation as its response model, and a
        # body-or-stream union is none (the body: ``create_completion``'s annotation).
        return await self.core.load.track(create_completion(self.core, request))

    @api.post("/v1/chat/completions", openapi_extra=json_body(ChatRequest))
    async def chat(self, request: Request) -> Any:
        # ``Any`` for FastAPI, as for ``completions``.
        return await self.core.load.track(create_chat_completion(self.core, request))

    @api.post("/v1/responses", openapi_extra=json_body(ResponsesRequest))
    async def responses(self, request: Request) -> Any:
        """OpenAI's Responses API on the chat path (``roundgate.deployment.openai.responses``)."""
        return await self.core.load.track(create_response(self.core, request))

    @api.get("/v1/responses/{response_id}")
    async def get_response(self, response_id: str, request: Request) -> dict[str, Any]:
        """A stored response as it stands (a background one: queued until it ends).
        ``?stream`` is read here, not declared: FastAPI's own 422 is not the OpenAI body."""
        self.core.check_auth(request)
        stream = request.query_params.get("stream")
        return await retrieve_response(self.core.responses, response_id, stream)

    @api.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(self, response_id: str, request: Request) -> dict[str, Any]:
        """Stop a background response that has not ended."""
        self.core.check_auth(request)
        return await cancel_response(self.core.responses, self.core.background, response_id)

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(self, response_id: str, request: Request) -> dict[str, Any]:
        """Forget a stored response (cancelling it if it still runs)."""
        self.core.check_auth(request)
        return await delete_response(self.core.responses, self.core.background, response_id)

    @api.post("/v1/chat/completions/batch")
    async def chat_batch(self, request: Request) -> dict[str, Any]:
        """vLLM's batched chat: a list of conversations, one choice each."""
        return await self.core.load.track(create_batch_chat_completion(self.core, request))

    @api.post("/invocations")
    async def invocations(self, request: Request) -> Any:
        """SageMaker's entry point: a chat or a completion, by the body's shape (vLLM's)."""
        return await self.core.load.track(invocations(self.core, request))


def build_app(args: dict[str, Any]) -> Application:
    """Validate ``args`` and bind the ingress to ``num_groups`` gangs of ``dp_size`` ranks
    (P/D: to a prefill group and a decode group, ``roundgate.deployment.pd_app``)."""
    cfg = AppArgs.of(args)  # validated here, once: the object itself goes to every replica
    resources = ingress_resources(
        cfg.ingress_resources, "ingress_resources" in cfg.model_fields_set, cfg.gang_placement
    )
    if ray.is_initialized():
        check_head_room(resources, cfg.ingress_replicas, ray.nodes())
    ingress = serve.deployment(
        OpenAIServer,
        name="OpenAIServer",
        num_replicas=cfg.ingress_replicas,
        max_ongoing_requests=cfg.max_ongoing_requests,
        # Bounded at the proxies, not on the ingress's handle to the ranks: a rank handle's
        # backpressure error inside the ingress would read as a group failure (a 503 for
        # everyone while the group "restarts"), the proxy's is this request's 503 alone.
        max_queued_requests=cfg.max_queued_requests,
        ray_actor_options={
            "num_cpus": INGRESS_CPUS,
            **({"resources": resources} if resources else {}),
        },
    )
    if cfg.is_pd:
        prefill, decode = build_roles(cfg)
        return ingress.bind(cfg, prefill=prefill, decode=decode)
    engine = cfg.server_args()
    router_kwargs = cfg.router_kwargs()
    # Elastic DP: plain replicas (Serve replaces a dead one alone), seats and epochs from the
    # rendezvous store, a fresh id per deploy so no replica meets the last deploy's seats.
    elastic = (
        {
            "deployment": uuid.uuid4().hex[:12],
            "num_groups": cfg.num_groups,
            "spread": cfg.gang_placement == "spread",
            "window_s": min(2.0, max(0.5, engine.collective_timeout_s / 4)),
        }
        if cfg.elastic_dp
        else None
    )
    ranks = serve.deployment(
        RankReplica,
        name=RANK_DEPLOYMENT_OF[DisaggregationRole.FUSED],
        **cfg.replica_options(engine.dp_size),
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options=cfg.rank_actor_options(
            cfg.num_cpus_per_rank, cfg.num_gpus_per_rank, cfg.resources_per_rank
        ),
        **cfg.placement(engine.dp_size, cfg.elastic_dp),
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASSES[cfg.router],
            request_router_kwargs=router_kwargs,
            request_routing_stats_period_s=0.5,
        ),
        health_check_period_s=2.0,
        health_check_timeout_s=max(10.0, engine.collective_timeout_s),
        graceful_shutdown_timeout_s=5.0,
    ).bind(cfg.rank_args(), elastic)
    return ingress.bind(cfg, fused=ranks)
