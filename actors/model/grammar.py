"""Structured output: grammars compiled by xgrammar, their token masks for the sampler.

A request's ``SamplingParams.grammar`` is ``(kind, spec)``: ``("json_object", "")``,
``("json_schema", schema JSON)`` (no property beyond the schema's: xgrammar's strict mode),
``("json_schema_open", schema JSON)`` (``strict: false``: JSON Schema's own rule for undeclared
properties), ``("regex", pattern)``, ``("choice", JSON list)``,
``("ebnf", grammar)``, or ``("tool_call", schema JSON)`` (``tool_choice``: one Hermes-style
``<tool_call>`` block whose JSON follows the schema). The rank compiles each distinct grammar
once (``Grammars.compile``: in the rank replica on a worker thread with a time limit while the
request waits in the scheduler's ``LOADING`` state, so a bad or huge grammar is that request's
error and never stalls the engine thread; the compiled grammars are an LRU of
``--max-grammar-cache`` entries), and keeps one matcher per request on the request itself (executor
state: it lives and dies with the request, survives retraction, and a forked sequence builds
its own by replaying its tokens). xgrammar was chosen over llguidance by per-token mask time
(``benchmarks/bench_grammar.py``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from roundgate.actors.control.request import Request

KINDS = ("json_object", "json_schema", "json_schema_open", "regex", "choice", "ebnf", "tool_call")
_BITS = 32


def choice_ebnf(choices: Sequence[str]) -> str:
    """A grammar accepting exactly one of ``choices`` (as JSON-escaped string literals)."""
    literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return f"root ::= {literals}"


def _tool_call_grammar(schema: str) -> Any:
    """``<tool_call>\n`` + JSON following ``schema`` + ``\n</tool_call>``."""
    import xgrammar as xgr

    return xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'),
        xgr.Grammar.from_json_schema(schema, any_whitespace=False),
        xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"'),
    )


class Grammars:
    """One rank's grammar compiler and compiled-grammar cache (built on first use: the
    tokenizer is only loaded when a request asks for structured output)."""

    def __init__(
        self, model: str, chat_template: str | None, vocab_size: int, max_cached: int = 256
    ) -> None:
        self.model = model
        self.chat_template = chat_template
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        self._compiler: Any = None
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        # Guards the cache and the compiler's creation only, never a compile: compiles run on
        # worker threads, and the engine thread takes this lock on a grammar's first sample.
        self._lock = threading.Lock()

    def _build(self) -> Any:
        import xgrammar as xgr

        from roundgate.actors.model.tokenizer import load_tokenizer

        tok = load_tokenizer(self.model, self.chat_template)
        hf = getattr(tok, "_tok", None)
        if hf is None:
            raise ValueError("structured output needs the model's own tokenizer")
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size)
        return xgr.GrammarCompiler(info, max_threads=1)

    def is_compiled(self, grammar: tuple[str, str]) -> bool:
        """Whether ``grammar`` is in the cache (a request with it needs no compile)."""
        with self._lock:
            return grammar in self._compiled

    def compile(self, grammar: tuple[str, str]) -> Any:
        """The compiled grammar (cached); a ValueError naming what is wrong with it.

        The compile itself runs outside the lock (xgrammar releases the GIL while it works), so
        a long compile holds up nobody else: two threads compiling one grammar at once both
        finish, and the first result is kept.
        """
        kind, spec = grammar
        if kind not in KINDS:
            raise ValueError(f"unknown grammar kind {kind!r}")
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled
            if self._compiler is None:
                self._compiler = self._build()
            compiler = self._compiler
        try:
            if kind == "json_object":
                compiled = compiler.compile_builtin_json_grammar()
            elif kind == "json_schema":
                compiled = compiler.compile_json_schema(spec, any_whitespace=False)
            elif kind == "json_schema_open":  # ``strict: false``: JSON Schema's own rule
                compiled = compiler.compile_json_schema(
                    spec, any_whitespace=False, strict_mode=False
                )
            elif kind == "regex":
                compiled = compiler.compile_regex(spec)
            elif kind == "choice":
                compiled = compiler.compile_grammar(choice_ebnf(json.loads(spec)))
            elif kind == "tool_call":
                compiled = compiler.compile_grammar(_tool_call_grammar(spec))
            else:
                compiled = compiler.compile_grammar(spec)
        except Exception as exc:  # xgrammar's own errors too: this request's, not the rank's
            raise ValueError(f"{kind}: the grammar does not compile: {exc}") from None
        with self._lock:
            compiled = self._compiled.setdefault(grammar, compiled)
            self._compiled.move_to_end(grammar)
            while len(self._compiled) > self.max_cached:
                self._compiled.popitem(last=False)
        return compiled

    @property
    def num_cached(self) -> int:
        return len(self._compiled)

    def matcher(self, request: Request) -> Any:
        """The request's matcher, built (and fed the tokens it already has) on first use."""
        state = request.grammar_state
        if state is None:
            import xgrammar as xgr

            # The grammar ends on the request's own stop tokens (EOS, stop_token_ids).
            stops = list(request.sampling.stop_token_ids) or None
            state = xgr.GrammarMatcher(
                self.compile(request.sampling.grammar), override_stop_tokens=stops
            )
            # A continuation's resumed tokens (the prompt's tail) were output too.
            resumed = request.prompt_token_ids[
                request.num_prompt_tokens - request.num_resumed_tokens :
            ]
            for token in [*resumed, *request.output_token_ids]:
                if not state.is_terminated():
                    state.accept_token(token)
            request.grammar_state = state
        return state

    def allowed(self, owners: Sequence[Request], device: torch.device) -> torch.Tensor | None:
        """``[rows, vocab]`` booleans: each grammar row's allowed tokens (others all True)."""
        rows = [i for i, r in enumerate(owners) if r.sampling.grammar is not None]
        if not rows:
            return None
        words = -(-self.vocab_size // _BITS)
        bitmask = torch.full((len(owners), words), -1, dtype=torch.int32)
        masks: dict[int, int] = {}  # a request forking n rows fills its mask once
        for i in rows:
            key = id(owners[i])
            if key in masks:
                bitmask[i] = bitmask[masks[key]]
                continue
            matcher = self.matcher(owners[i])
            # A finished grammar (its stop accepted, yet the request goes on: ignore_eos)
            # constrains nothing more.
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, i)
            masks[key] = i
        shifts = torch.arange(_BITS, dtype=torch.int32)
        bits = (bitmask[:, :, None] >> shifts) & 1
        return bits.view(len(owners), -1)[:, : self.vocab_size].bool().to(device)

    def accept(self, requests: Sequence[Request], tokens: Sequence[int]) -> None:
        """Advance each grammar request's matcher by its sampled token."""
        for request, token in zip(requests, tokens, strict=True):
            if request.sampling.grammar is not None:
                matcher = self.matcher(request)
                if not matcher.is_terminated():
                    matcher.accept_token(token)
