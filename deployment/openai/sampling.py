"""An OpenAI request's ``SamplingParams``: its fields translated, the model's defaults filled in.

The ingress checks the request against the model's limits and calls ``sampling_params`` once
per prompt; a field that cannot be translated is a 400 naming it. Structured output:
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs`` (``json``,
``regex``, ``choice``, ``grammar``: EBNF, ``json_object``) and the older vendor fields
``guided_json``, ``guided_regex`` and ``guided_choice`` each become ``SamplingParams.grammar``
(compiled and enforced on the rank, see ``roundgate.actors.model.grammar``); at most one may be
given. An EBNF grammar or a regex that does not parse is a 400 naming its field, here.
"""

from __future__ import annotations

import json
from typing import Any

from roundgate.actors.control.request import SamplingParams
from roundgate.actors.model.generation_config import GenerationConfig
from roundgate.deployment.openai.api import parse_json_text
from roundgate.deployment.openai.errors import APIError
from roundgate.deployment.openai.protocol import ChatRequest, CompletionRequest, StructuredOutputs
from roundgate.deployment.openai.tool_calls import tool_grammar

GenerateBody = CompletionRequest | ChatRequest


def sampling_params(
    req: GenerateBody,
    max_tokens: int,
    defaults: GenerationConfig,
    eos_token_ids: tuple[int, ...],
) -> SamplingParams:
    """``req``'s sampling: ``generation_config.json``'s ``defaults`` fill what it left unset,
    and the model's EOS ids stop it unless ``ignore_eos``. ``SamplingParams`` refuses what
    no rank could run (``ValueError``, its message starting with the field's name)."""
    stop_ids = list(req.stop_token_ids or [])
    if not req.ignore_eos:
        stop_ids += eos_token_ids
    given = req.model_fields_set
    temperature = req.temperature
    if "temperature" not in given and defaults.temperature is not None:
        temperature = defaults.temperature
    top_p = req.top_p if "top_p" in given or defaults.top_p is None else defaults.top_p
    top_k = req.top_k if "top_k" in given or defaults.top_k is None else defaults.top_k
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(0, top_k),
        seed=req.seed,
        stop_token_ids=tuple(dict.fromkeys(stop_ids)),
        min_p=req.min_p,
        min_tokens=req.min_tokens,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=logit_bias_of(req.logit_bias),
        logprobs=logprobs_of(req),
        prompt_logprobs=prompt_logprobs_of(req),
        grammar=grammar_of(req),
    )


def grammar_of(req: GenerateBody) -> tuple[str, str] | None:
    """``(kind, spec)`` for the request's one structured-output field, or None."""
    given: list[tuple[str, tuple[str, str]]] = []
    fmt = req.response_format if isinstance(req, ChatRequest) else None
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", ("json_object", "")))
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        if schema is None:
            raise APIError(
                400, "response_format json_schema needs json_schema.schema", "response_format"
            )
        # ``strict: false`` keeps JSON Schema's own rule for undeclared properties.
        kind = "json_schema_open" if fmt.json_schema.strict is False else "json_schema"
        given.append(("response_format", (kind, _dump(schema))))
    if req.guided_json is not None:
        given.append(("guided_json", ("json_schema", _dump(req.guided_json))))
    if req.guided_regex is not None:
        given.append(("guided_regex", ("regex", req.guided_regex)))
    if req.guided_choice is not None:
        given.append(("guided_choice", ("choice", json.dumps(req.guided_choice))))
    if req.structured_outputs is not None:
        given.append(("structured_outputs", _structured(req.structured_outputs)))
    tool = tool_grammar(req.tools, req.tool_choice) if isinstance(req, ChatRequest) else None
    if tool is not None:
        given.append(("tool_choice", tool))
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise APIError(400, f"give at most one of {names}", param=given[1][0])
    if not given:
        return None
    name, grammar = given[0]
    _check_parses(name, grammar)
    return grammar


def _structured(so: StructuredOutputs) -> tuple[str, str]:
    """vLLM's ``structured_outputs`` (one constraint, checked by its model) as a grammar."""
    if so.json_ is not None:
        schema = (
            parse_json_text(so.json_, "structured_outputs.json", "structured_outputs")
            if isinstance(so.json_, str)
            else so.json_
        )
        return "json_schema", _dump(schema)
    if so.regex is not None:
        return "regex", so.regex
    if so.choice is not None:
        return "choice", json.dumps(so.choice)
    if so.grammar is not None:
        return "ebnf", so.grammar
    return "json_object", ""


def _check_parses(name: str, grammar: tuple[str, str]) -> None:
    """A 400 naming ``name`` when an EBNF grammar or a regex does not parse (xgrammar's
    parser, no tokenizer needed); the rank compiles what parses."""
    kind, spec = grammar
    if kind not in ("ebnf", "regex"):
        return
    import xgrammar as xgr

    try:
        if kind == "ebnf":
            xgr.Grammar.from_ebnf(spec)
        else:
            xgr.Grammar.from_regex(spec)
    except Exception as exc:  # xgrammar raises RuntimeError with the parser's position
        detail = str(exc).splitlines()[-1] if str(exc).strip() else type(exc).__name__
        detail = detail.split("] ", 1)[-1]  # drop xgrammar's timestamp and source path
        raise APIError(400, f"{name}: the {kind} does not parse: {detail}", param=name) from None


def _dump(schema: dict[str, Any]) -> str:
    """One compact spelling per schema as the client wrote it (the rank's compiled-grammar cache
    keys on it). Keys keep their order: the grammar generates properties in the order it reads
    them, and a schema's property order is part of what the client asked for."""
    return json.dumps(schema, separators=(",", ":"))


def logit_bias_of(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ``(id, bias)`` pairs; a key that is no id is a 400
    (``"1"`` and ``"01"`` are the same id twice: ``SamplingParams`` refuses that)."""
    if not bias:
        return ()
    pairs, bad = [], []
    for key, value in bias.items():
        try:
            pairs.append((int(key), value))
        except ValueError:
            bad.append(repr(key))
    if bad:  # every bad key named, not only the first
        what = f"key {bad[0]} is" if len(bad) == 1 else f"keys {', '.join(bad)} are"
        raise APIError(400, f"logit_bias: {what} not a token id", param="logit_bias")
    return tuple(pairs)  # a repeated id is refused by ``SamplingParams``


def check_logprobs(req: object, vocab_size: int, max_logprobs: int) -> None:
    """How many top logprobs ``req`` asks for per token (``logprobs``, ``top_logprobs`` with
    ``logprobs: true``, ``prompt_logprobs``), against the deployment's ``max_logprobs``.

    vLLM's ``-1`` is the whole vocabulary, ``vocab_size``, set on ``req``. More than
    ``max_logprobs`` is a 400 in vLLM's words (as vLLM's ``--max-logprobs``, default 20): a
    whole vocabulary is up to hundreds of thousands of entries per token, an operator's
    choice, and nothing fewer than asked is ever returned silently."""
    names = [("logprobs", "sample"), ("prompt_logprobs", "prompt")]
    if getattr(req, "logprobs", None) is True:  # without it, logprobs_of names the mistake
        names.append(("top_logprobs", "sample"))
    for name, what in names:
        value = getattr(req, name, None)
        if type(value) is not int:  # chat's logprobs is a bool
            continue
        if value == -1:
            value = vocab_size
        if value > max_logprobs:
            raise APIError(
                400,
                f"Requested {what} logprobs of {value}, which is greater than max "
                f"allowed: {max_logprobs}",
                param=name,
            )
        setattr(req, name, value)


def prompt_logprobs_of(req: GenerateBody) -> int | None:
    """How many top logprobs a request wants per prompt token (None: none): its
    ``prompt_logprobs``, and ``echo`` with ``logprobs`` asks for the prompt's too (vLLM)."""
    k = req.prompt_logprobs
    if isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None:
        k = max(k or 0, req.logprobs)
    return k


def logprobs_of(req: GenerateBody) -> int | None:
    """How many top logprobs a request wants per token (None: no logprobs at all)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    if req.top_logprobs and not req.logprobs:  # vLLM's rule (0 asks for nothing) and wording
        raise APIError(
            400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    return (req.top_logprobs or 0) if req.logprobs else None
