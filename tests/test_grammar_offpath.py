"""Structured output never stalls a rank: grammars over the ingress's limits are a 400 naming
the limit; a compile runs outside the lock the engine thread takes; the compiled grammars are
a bounded LRU; a request waiting for its grammar sits in ``LOADING`` while the rank serves
everyone else."""

from __future__ import annotations

import json
import threading

import pytest
from builders import make_args, make_request
from ingress_fakes import complete, error_of, make_ingress

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import RequestStatus
from roundgate.actors.model.grammar import Grammars
from roundgate.deployment.openai.grammar_limits import GrammarLimits, check_grammar
from roundgate.sim.cost_executor import CostExecutor
from roundgate.sim.round_costs import TOY

MODEL = "smollm2-135m-instruct"


def schema(properties: int, depth: int = 1) -> str:
    node: dict = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(properties)},
    }
    for _ in range(depth - 1):
        node = {"type": "object", "properties": {"inner": node}}
    return json.dumps(node)


LIMITS = GrammarLimits()
CASES = {
    "bytes": (("json_schema", json.dumps({"description": "x" * 70_000})), "max_grammar_bytes"),
    "properties": (("json_schema", schema(513)), "max_grammar_properties"),
    "tool schema": (("tool_call", schema(600)), "max_grammar_properties"),
    "depth": (("json_schema", schema(1, depth=40)), "max_grammar_depth"),  # 81 JSON levels
    "regex": (("regex", "a" * 4097), "max_grammar_regex_chars"),
    "ebnf": (("ebnf", 'root ::= "' + "a" * 17_000 + '"'), "max_grammar_ebnf_chars"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_grammar_over_a_limit_is_a_400_naming_it(case: str) -> None:
    grammar, limit = CASES[case]
    err = error_of(lambda: check_grammar(grammar, LIMITS))
    assert err.status == 400 and limit in str(err) and err.code == "grammar_too_large"


@pytest.mark.parametrize(
    "grammar",
    [("json_schema", schema(512)), ("json_schema", schema(1, depth=30)), ("regex", "a" * 4096)],
    ids=["512 properties", "61 JSON levels", "4096-char regex"],
)
def test_a_grammar_just_under_the_limits_passes(grammar: tuple[str, str]) -> None:
    check_grammar(grammar, LIMITS)


def test_the_ingress_refuses_before_anything_reaches_a_rank() -> None:
    core, ranks = make_ingress(max_grammar_properties=8)
    big = json.loads(schema(9))
    err = error_of(lambda: complete(core, prompt="hi", max_tokens=4, guided_json=big))
    assert err.status == 400 and "max_grammar_properties" in str(err)
    assert ranks.payloads == []
    complete(core, prompt="hi", max_tokens=4, guided_json=json.loads(schema(8)))
    assert len(ranks.payloads) == 1


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars(MODEL, None, 49152, max_cached=2)  # 49152: the default model's vocab


def test_the_cache_is_a_bounded_lru(grammars: Grammars) -> None:
    a, b, c = (("regex", f"[0-9]{{{n}}}") for n in (1, 2, 3))
    grammars.compile(a)
    grammars.compile(b)
    grammars.compile(a)  # a is now the most recent
    grammars.compile(c)  # evicts b, the least recent
    assert grammars.is_compiled(a) and grammars.is_compiled(c)
    assert not grammars.is_compiled(b)
    assert grammars.num_cached == 2


def test_a_long_compile_does_not_hold_the_engine_threads_lock(grammars: Grammars) -> None:
    small = ("regex", "[ab]")
    grammars.compile(small)
    big = ("json_schema", schema(600))  # ~0.6-1 s to compile on this machine
    started, order = threading.Event(), []

    def compile_big() -> None:
        started.set()
        grammars.compile(big)
        order.append("big")

    worker = threading.Thread(target=compile_big)
    worker.start()
    started.wait()
    # What the engine thread does on a grammar request's first sample: a cached lookup.
    grammars.compile(small)
    order.append("engine")
    worker.join()
    assert order == ["engine", "big"]


def test_a_loading_request_waits_while_the_rank_serves_others() -> None:
    core = EngineCore(make_args(1, "none", num_kv_pages=64), CostExecutor(TOY))
    waiting = make_request("grammar", prompt_len=4, max_tokens=3)
    plain = make_request("plain", prompt_len=4, max_tokens=3)
    core.submit(waiting, loading=True)
    core.submit(plain)
    for _ in range(10):
        core.step()
    assert plain.status is RequestStatus.FINISHED_LENGTH
    assert waiting.status is RequestStatus.LOADING and waiting.output_token_ids == []
    core.mark_loaded("grammar")
    for _ in range(10):
        core.step()
    assert waiting.status is RequestStatus.FINISHED_LENGTH
    assert len(waiting.output_token_ids) == 3


def test_an_aborted_loading_request_leaves_nothing_behind() -> None:
    core = EngineCore(make_args(1, "none", num_kv_pages=64), CostExecutor(TOY))
    core.submit(make_request("grammar", prompt_len=4, max_tokens=3), loading=True)
    core.step()
    core.abort("grammar")  # its compile failed or timed out
    core.mark_loaded("grammar")  # a late mark is ignored
    for _ in range(3):
        core.step()
    assert not core.has_local_work
    core.scheduler.pool.check_integrity()
