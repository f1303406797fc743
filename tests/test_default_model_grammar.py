"""Structured output on the default model, offline: the grammar's mask in the batched sampler.

Each output must match its grammar exactly (regex full match, one of the choices, JSON that
validates against the schema) and end on a stop token; a forked ``n > 1`` sequence follows the
grammar too (its matcher replays its first token); a grammar that does not compile is refused
at submit, before it reaches the engine thread.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import jsonschema
import pytest
import torch

from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.engine import Engine
from roundgate.actors.model.generation_config import read_generation_config
from roundgate.actors.model.tokenizer import load_tokenizer, stop_token_ids
from roundgate.actors.server_args import ServerArgs

MODEL = "smollm2-135m-instruct"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "population", "is_capital"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def setup() -> tuple[Engine, Any, tuple[int, ...]]:
    torch.set_num_threads(1)
    engine = Engine(ServerArgs(model=MODEL, device="cpu", num_kv_pages=128, max_num_seqs=8))
    tok = load_tokenizer(MODEL)
    stops = stop_token_ids(engine.args.model_config, tok, read_generation_config(MODEL))
    return engine, tok, stops


def chat(tok: Any, text: str) -> list[int]:
    return tok.render_chat([{"role": "user", "content": text}])


@pytest.mark.parametrize(
    ("prompt", "grammar", "check"),
    [
        ("Give me a phone number.", ("regex", r"[0-9]{3}-[0-9]{4}"), "regex"),
        ("Is the sky blue?", ("choice", json.dumps(["yes", "no", "maybe"])), "choice"),
        ("Describe Paris as JSON.", ("json_schema", json.dumps(SCHEMA)), "schema"),
        ("Reply with a short JSON object with a name and an age.", ("json_object", ""), "object"),
    ],
)
def test_output_follows_the_grammar_and_stops(setup, prompt, grammar, check) -> None:
    engine, tok, stops = setup
    sampling = SamplingParams(max_tokens=40, stop_token_ids=stops, grammar=grammar)
    req = Request(f"g-{check}", chat(tok, prompt), sampling)
    engine.run([req])
    assert req.output_token_ids[-1] in stops, "the grammar completed: only a stop may follow"
    text = tok.decode(req.output_token_ids[:-1])
    if check == "regex":
        assert re.fullmatch(grammar[1], text), text
    elif check == "choice":
        assert text in json.loads(grammar[1])
    elif check == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert isinstance(json.loads(text), dict)


def test_forked_sequences_follow_the_grammar(setup) -> None:
    engine, tok, stops = setup
    choices = ["red", "green", "blue", "yellow"]
    grammar = ("choice", json.dumps(choices))
    sampling = SamplingParams(
        max_tokens=8, temperature=1.0, seed=3, n=4, stop_token_ids=stops, grammar=grammar
    )
    outputs = defaultdict(list)
    engine.core.on_event = lambda e: (
        e.token_id is not None and outputs[e.request.index].append(e.token_id)
    )
    try:
        engine.run([Request("g-n", chat(tok, "Name a color."), sampling)])
    finally:
        engine.core.on_event = None
    assert sorted(outputs) == [0, 1, 2, 3]
    for ids in outputs.values():
        assert tok.decode(ids[:-1]) in choices and ids[-1] in stops


def test_a_grammar_that_does_not_compile_is_refused_at_submit(setup) -> None:
    engine, tok, _ = setup
    bad = SamplingParams(max_tokens=4, grammar=("regex", "(unclosed"))
    with pytest.raises(ValueError, match="regex: the grammar does not compile"):
        engine.core.submit(Request("g-bad", chat(tok, "x"), bad))
    assert not engine.core.has_local_work


def test_a_finished_grammar_constrains_nothing_more_when_eos_is_ignored(setup) -> None:
    engine, tok, _ = setup
    grammar = ("choice", json.dumps(["yes", "no"]))
    req = Request("g-free", chat(tok, "Yes or no?"), SamplingParams(max_tokens=6, grammar=grammar))
    engine.run([req])
    assert req.finish_reason == "length" and len(req.output_token_ids) == 6
    assert tok.decode(req.output_token_ids).startswith(("yes", "no"))
