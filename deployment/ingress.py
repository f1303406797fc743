"""The ingress's state and request logic: checks, tokens in, one ``GenerateRequest`` per prompt.

The routes (``roundgate.deployment.app``, bodies in ``roundgate.deployment.openai``) call into
``Ingress``: it checks the key and the model, checks the request against the model's limits (prompt
count, vocabulary, context length: here and nowhere else on this side), builds ``SamplingParams``,
forwards each prompt (its ``n`` choices) to a rank through the configured router and
detokenizes what streams back. A request whose rank dies continues on a live rank
(``roundgate.deployment.resume``); new requests are answered 503 with ``Retry-After`` for a few
seconds after a group failure.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.control.request import SamplingParams
from roundgate.actors.pd_roles import PD_ROLES
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.group_health import CachedRead, running_rank_replicas
from roundgate.deployment.openai.api import read_json
from roundgate.deployment.openai.choices import Choice, Delta, RequestFailed, merge
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.grammar_limits import GrammarLimits, check_grammar
from roundgate.deployment.openai.logprobs import TokenTexts
from roundgate.deployment.openai.prepare import Preparer
from roundgate.deployment.openai.protocol import parse
from roundgate.deployment.openai.responses_background import BackgroundResponses
from roundgate.deployment.openai.sampling import GenerateBody, check_logprobs, sampling_params
from roundgate.deployment.openai.server_load import ServerLoad
from roundgate.deployment.openai.stored_responses import StoredResponses
from roundgate.deployment.pd_route import PDRoute
from roundgate.deployment.request_metrics import RequestRecorder
from roundgate.deployment.resume import RankStream, ResumeFailed, ResumePolicy, Resumer
from roundgate.deployment.serve_context import client_request_id, rank_health, set_serve_request_id

if TYPE_CHECKING:  # Ray is not imported for a type (the ingress is tested without it)
    from ray.serve.handle import DeploymentHandle

    from roundgate.deployment.config import AppArgs

# Fields whose refusal by SamplingParams starts with their name (the 400's ``param``).
_SAMPLING_FIELDS = (
    "min_tokens",
    "logit_bias",
    "stop_token_ids",
    "logprobs",
    "prompt_logprobs",
)
RETRY_AFTER_S = 5
HEALTH_CACHE_S = 2.0
logger = logging.getLogger("roundgate.ingress")


Body = TypeVar("Body", bound=BaseModel)


def serve_replica_id() -> str | None:
    """This Serve replica's unique id (the owner of its background responses in the shared
    store: the id in Serve's logs and actor name), or None outside a replica."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not in a Serve replica (the ingress's own tests)
        return None


class FusedRoute:
    """The fused ranks' deployment: one ``generate`` stream per rank request (P/D's route
    over both roles: ``roundgate.deployment.pd_route``)."""

    def __init__(self, ranks: DeploymentHandle) -> None:
        self.ranks = ranks.options(stream=True)

    def stream(self, message: GenerateRequest) -> RankStream:
        return self.ranks.generate.remote(message)


class Ingress:
    """State and logic behind the routes; ``roundgate.deployment.app`` wraps it in a Serve
    deployment."""

    def __init__(
        self,
        app_args: AppArgs | dict[str, Any],
        handles: Mapping[DisaggregationRole, DeploymentHandle],
        responses: StoredResponses | None = None,
    ) -> None:
        """``app_args``: the bound ``AppArgs``; ``handles``: each rank deployment's handle, by
        the role it serves (``FUSED``; P/D: ``PREFILL`` and ``DECODE``); ``responses``: the
        Responses store every ingress replica shares (default: one in this process, for an
        ingress without Ray)."""
        from roundgate.actors.model.generation_config import read_generation_config
        from roundgate.actors.model.tokenizer import load_tokenizer, stop_token_ids
        from roundgate.deployment.config import AppArgs

        self.app_args = AppArgs.of(app_args)  # validated where build_app ran: not again
        # The roles the rank deployments serve: one fused group, or P/D's two.
        self.roles = PD_ROLES if self.app_args.is_pd else (DisaggregationRole.FUSED,)
        missing = [role for role in self.roles if role not in handles]
        if missing:
            raise ValueError(f"the ingress needs the {missing[0]} role's rank deployment handle")
        # P/D: the decode role's args (both roles share the model, template and context).
        args = self.engine_args = (
            self.app_args.role_args(DisaggregationRole.DECODE)
            if DisaggregationRole.DECODE in self.roles
            else self.app_args.server_args()
        )
        self.model_name = self.app_args.served_model_name
        self.api_keys = self.app_args.resolved_api_keys
        self.tokenizer = load_tokenizer(args.model, args.chat_template)
        # The ranks' own numbers (both resolve them from the same flags and model config).
        self.max_model_len = args.max_model_len
        self.vocab_size = args.model_config.vocab_size
        self.defaults = read_generation_config(args.model)  # read once: stops and defaults
        self.eos_token_ids = stop_token_ids(args.model_config, self.tokenizer, self.defaults)
        self._degraded_until = 0.0
        self._health: str | None = None  # why the ranks are not healthy, or None
        self._health_at = -HEALTH_CACHE_S
        # Elastic /health's count of running rank replicas: one controller read per
        # HEALTH_CACHE_S however many clients ask, off the event loop.
        self._running_ranks = CachedRead(running_rank_replicas, HEALTH_CACHE_S)
        self.metrics = RequestRecorder(self.model_name)
        self.load = ServerLoad()  # GET /load: generation requests in flight here
        # Where a rank request goes: the fused ranks' ``generate``, or P/D's two roles.
        self.route: FusedRoute | PDRoute = (
            PDRoute(
                handles[DisaggregationRole.PREFILL],
                handles[DisaggregationRole.DECODE],
                self.metrics,
            )
            if DisaggregationRole.PREFILL in self.roles
            else FusedRoute(handles[DisaggregationRole.FUSED])
        )
        # Fused and P/D alike: a P/D continuation is prefilled again and its handoff carries
        # the resumed tokens to the decode rank (docs/fault-tolerance.md).
        self.resume_policy = ResumePolicy()
        self.token_texts = TokenTexts(self.tokenizer)
        self.prepare = Preparer()  # renders and tokenizations, off the event loop
        self.grammar_limits = GrammarLimits(
            **{f.name: getattr(self.app_args, f.name) for f in fields(GrammarLimits)}
        )
        # /v1/responses: the store every replica shares (docs/responses-api.md), and this
        # replica's background responses (bounded per replica).
        self.responses = responses or StoredResponses()
        self.background = BackgroundResponses(
            self.responses,
            max_background=self.app_args.max_background_responses,
            timeout_s=self.app_args.background_timeout_s,
            owner=serve_replica_id(),
        )

    # ---- request checks ------------------------------------------------------------------

    def check_auth(self, request: Request) -> None:
        """Every protected route's one check: ``Authorization: Bearer <key>`` with any of the
        configured keys, else the same 401 body. The header is compared with every key in
        constant time (``secrets.compare_digest``, no early exit), so neither the timing nor
        the answer says which key, or how much of one, matched."""
        if not self.api_keys:
            return
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        matched = False
        for key in self.api_keys:
            matched |= secrets.compare_digest(given, f"Bearer {key}".encode())
        if not matched:
            raise APIError(
                401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key"
            )

    async def check_ranks_healthy(self) -> None:
        """503 unless every rank replica passes Serve's health checks (read at most every
        ``HEALTH_CACHE_S`` from the controller, which runs each replica's ``check_health``)."""
        now = time.monotonic()
        if now - self._health_at > HEALTH_CACHE_S:
            self._health = await asyncio.to_thread(rank_health)
            self._health_at = now
        if self._health is not None:
            raise APIError(
                503,
                self._health,
                code="ranks_unhealthy",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    async def elastic_health(self) -> dict[str, Any]:
        """An elastic deployment's ``/health`` body; 503 when no rank replica runs, or when
        the Serve controller cannot say (read at most every ``HEALTH_CACHE_S``)."""
        from roundgate.deployment.group_health import group_sizes, health_body
        from roundgate.deployment.request_metrics import exposition

        try:
            running = await self._running_ranks.get()
        except Exception as exc:  # the controller away or failing: a 503 naming it
            raise APIError(
                503,
                "cannot read the rank replicas' status from the Serve controller "
                f"({type(exc).__name__}); retry shortly",
                code="controller_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        if running == 0:
            raise APIError(
                503,
                "no rank replica is running",
                code="ranks_unhealthy",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        sizes = group_sizes((await exposition()).decode())
        cfg = self.app_args
        if not cfg.is_pd:
            dp = self.engine_args.dp_size
            return health_body(sizes, dp, running, cfg.num_groups * dp)
        # P/D: each role is a group of its own size, its id naming the role (pd_app.py).
        roles = {r.value: cfg.role_args(r).dp_size for r in PD_ROLES}
        return health_body(
            sizes,
            lambda group: next((n for r, n in roles.items() if f"-{r}-" in group), 0),
            running,
            sum(roles.values()),
        )

    def check_available(self) -> None:
        if time.monotonic() < self._degraded_until:
            raise APIError(
                503,
                "the DP group is restarting; retry shortly",
                code="group_restarting",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    async def read_request(
        self, request: Request, model: type[Body], body: object | None = None
    ) -> Body:
        """An endpoint's body: the caller's key checked first, then the JSON (``body`` when a
        dispatcher such as ``/invocations`` has read it already; else read here, size-capped)
        parsed into ``model`` and its ``model`` name checked."""
        self.check_auth(request)
        if body is None:
            body = await read_json(request, self.app_args.max_request_bytes)
        req = parse(model, body)
        self.check_model(getattr(req, "model", None))
        self.check_logprobs(req)
        return req

    def check_logprobs(self, req: object) -> None:
        """Top-logprob counts within ``max_logprobs`` (-1: this model's vocabulary), or 400."""
        limit = self.app_args.max_logprobs
        check_logprobs(req, self.vocab_size, self.vocab_size if limit == -1 else limit)

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist (serving {self.model_name!r})",
                param="model",
                code="model_not_found",
            )

    # ---- limits: each checked here, once, before any rank sees the request -------------

    def check_vocab(self, ids: Sequence[int], param: str, what: str = "token id") -> None:
        """A 400 naming the first id outside the model's vocabulary (vLLM's wording first:
        clients match on "out of vocabulary")."""
        vocab = self.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(
                400,
                f"Token id {bad} is out of vocabulary ({what}; the model's ids are [0, {vocab}))",
                param=param,
            )

    def sampling_of(
        self, req: GenerateBody, prompt_len: int, param: str, max_tokens: int | None
    ) -> SamplingParams:
        """The request's ``SamplingParams`` for a prompt of ``prompt_len`` tokens, built and
        checked against the context length and the vocabulary, here."""
        room = self.max_model_len - prompt_len
        if room < 1:
            raise APIError(
                400,
                f"prompt of {prompt_len} tokens exceeds the context length {self.max_model_len}",
                param=param,
                code="context_length_exceeded",
            )
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                400,
                f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceeds "
                f"the context length {self.max_model_len}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        # What the rank would refuse is refused here: an exception on the rank reads as a
        # group failure (503 for everyone), never as this client's mistake.
        self.check_logprobs(req)
        try:
            sampling = sampling_params(req, max_tokens or room, self.defaults, self.eos_token_ids)
            sampling.check_vocab(self.vocab_size)
        except ValueError as exc:
            param = next((f for f in _SAMPLING_FIELDS if str(exc).startswith(f)), None)
            raise APIError(400, str(exc), param=param) from None
        if sampling.grammar is not None:
            check_grammar(sampling.grammar, self.grammar_limits)
        return sampling

    # ---- generation ----------------------------------------------------------------------

    def _submit(self, message: GenerateRequest) -> RankStream:
        """Start one rank request's stream (fused: the rank deployment; P/D: both roles)."""
        set_serve_request_id(message.request_id)
        return self.route.stream(message)

    def _group_failed(self, exc: BaseException, message: GenerateRequest) -> None:
        """A rank under ``message`` was lost (or its call failed): logged, and new requests
        are refused with 503 for ``RETRY_AFTER_S`` while the group restarts."""
        # The details (Ray's task repr) go to the log; the client gets a plain sentence.
        logger.warning(
            "request %s (client id %s): DP group failed: %r",
            message.request_id,
            client_request_id(),
            exc,
        )
        if not self.app_args.elastic_dp:
            # A gang restarts whole: new requests would only meet the restarting group. An
            # elastic group serves on through a re-form, so new requests are routed as ever.
            self._degraded_until = time.monotonic() + RETRY_AFTER_S

    async def _choice_stream(
        self, choices: list[Choice], message: GenerateRequest
    ) -> AsyncIterator[Delta]:
        """The choices' deltas; a request whose rank dies continues on a live rank
        (``roundgate.deployment.resume``), so the client's stream carries on."""
        resumer = Resumer(
            self._submit,
            message,
            choices,
            self.resume_policy,
            on_loss=self._group_failed,
            on_resume=self.metrics.resumed,
        )
        timer = self.metrics.timer()
        deltas = resumer.deltas()
        try:
            async for delta in deltas:
                timer.tokens(len(delta.token_ids))
                yield delta
        except APIError:
            raise
        except RequestFailed as exc:  # this request alone: the group keeps serving
            raise APIError(exc.status, f"the request could not run: {exc}") from None
        except ResumeFailed as exc:
            raise APIError(
                503, str(exc), code=exc.code, headers={"Retry-After": str(RETRY_AFTER_S)}
            ) from None
        except Exception as exc:  # not a rank loss (``roundgate.deployment.resume``): not resumed
            self._group_failed(exc, message)
            raise APIError(
                503,
                "generation failed: the DP group is unavailable and restarting; retry shortly",
                code="group_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        finally:
            await deltas.aclose()  # the rank stream is cancelled now, not when collected
            first = choices[0]
            outputs = sum(len(c.output_token_ids) for c in choices)
            timer.finish(first.finish_reason, len(first.prompt_token_ids), outputs)

    def check_choices(self, num_prompts: int, req: GenerateBody) -> None:
        """``dp_rank`` within the group, and ``num_prompts`` x ``n`` choices within the cap."""
        if req.dp_rank is not None and DisaggregationRole.FUSED not in self.roles:
            raise APIError(
                400,
                "dp_rank is not supported by a P/D deployment yet: it routes each request "
                "itself (prefill by cached prefix, decode by load)",
                param="dp_rank",
            )
        if req.dp_rank is not None and req.dp_rank >= self.engine_args.dp_size:
            raise APIError(
                400, f"dp_rank must be < dp_size {self.engine_args.dp_size}", param="dp_rank"
            )
        cap, n = self.app_args.max_prompts_per_request, req.n
        if num_prompts * n > cap:
            raise APIError(
                400,
                f"{num_prompts} prompts x n={n} choices; at most {cap} (max_prompts_per_request)",
                param="n",
            )

    def _rank_request(
        self,
        rank_id: str,
        first_index: int,
        prompt_ids: list[int],
        req: GenerateBody,
        max_tokens: int | None,
        param: str,
    ) -> tuple[list[Choice], GenerateRequest]:
        """One prompt's ``n`` choices (indexed from ``first_index``) and the rank request that
        generates them, its sampling checked against the context length."""
        sampling = self.sampling_of(req, len(prompt_ids), param, max_tokens)
        n, stops = req.n, req.stop_strings
        # The n choices of a prompt share one rank request (one prefill); only the first
        # counts the prompt in usage.
        choices = [
            Choice(
                first_index + j,
                prompt_ids,
                self.tokenizer,
                stops,
                counts_prompt=j == 0,
                include_stop=req.include_stop_str_in_output,
                skip_special_tokens=req.skip_special_tokens,
                score_only=req.max_tokens == 0,  # scoring: the rank's one token is dropped
            )
            for j in range(n)
        ]
        message = GenerateRequest(
            request_id=rank_id,
            prompt_token_ids=tuple(prompt_ids),
            sampling=replace(sampling, n=n) if n > 1 else sampling,
            dp_rank=req.dp_rank,
            session_id=req.user,
        )
        return choices, message

    def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        req: GenerateBody,
        max_tokens: int | None,
        param: str,
    ) -> tuple[list[Choice], AsyncIterator[Delta]]:
        """One prompt's choices and their stream (a chat; a completion of one prompt).

        Every limit is checked and every choice built before anything streams (no partial
        work on a bad request). The rank request's id is ``request_id``, the response's, so
        the id a client sees is the one in the rank's scheduler, metrics and logs.
        """
        self.check_vocab(prompt_ids, param, "prompt token id")
        self.check_choices(1, req)
        choices, message = self._rank_request(request_id, 0, prompt_ids, req, max_tokens, param)
        self.check_available()
        return choices, self._choice_stream(choices, message)

    def generate_each(
        self,
        request_id: str,
        prompts: list[list[int]],
        req: GenerateBody,
        max_tokens: int | None,
        param: str,
    ) -> tuple[list[Choice], AsyncIterator[Delta]]:
        """A completion's prompts: one rank request per prompt, their deltas merged.

        As ``generate``, all checked up front; prompt ``i``'s rank request is
        ``{request_id}-{i}`` when there are several.
        """
        cap = self.app_args.max_prompts_per_request
        if len(prompts) > cap:
            raise APIError(
                400,
                f"{len(prompts)} prompts in one request; at most {cap} (max_prompts_per_request)",
                param="prompt",
            )
        if len(prompts) == 1:
            return self.generate(request_id, prompts[0], req, max_tokens, param)
        for ids in prompts:
            self.check_vocab(ids, param, "prompt token id")
        self.check_choices(len(prompts), req)
        plans = [
            self._rank_request(f"{request_id}-{i}", i * req.n, ids, req, max_tokens, param)
            for i, ids in enumerate(prompts)
        ]
        self.check_available()
        choices = [c for group, _ in plans for c in group]
        return choices, merge([self._choice_stream(g, m) for g, m in plans])
