"""Incremental detokenization and stop strings: the streamed deltas always join to the
non-streamed text, whatever the chunking, multi-byte characters included."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from roundgate.actors.control.messages import GenerateChunk, Usage
from roundgate.actors.model.detokenizer import Detokenizer
from roundgate.actors.model.tokenizer import ByteTokenizer
from roundgate.deployment.openai.choices import Choice, run_choices

TOK = ByteTokenizer()


def reference(ids: list[int], stops: list[str]) -> tuple[str, bool]:
    """The text a server returns when the tokens arrive one character at a time: cut at the
    start of the first stop string to complete."""
    text = TOK.decode(ids)
    for end in range(1, len(text) + 1):
        done = [len(s) for s in stops if text[:end].endswith(s)]
        if done:
            return text[: end - max(done)], True
    return text, False


def chunks_of(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in itertools.pairwise(bounds) if b > a] or [[]]


async def stream(parts: list[list[int]]) -> AsyncIterator[GenerateChunk]:
    sent = 0
    for i, part in enumerate(parts):
        sent += len(part)
        last = i == len(parts) - 1
        yield GenerateChunk(
            token_ids=tuple(part),
            finish_reason="length" if last else None,
            usage=Usage(prompt_tokens=3, completion_tokens=sent),
        )


def run(parts: list[list[int]], stops: list[str]) -> tuple[list[str], Choice]:
    async def go() -> tuple[list[str], Choice]:
        choice = Choice(0, [1, 2, 3], TOK, stops)
        deltas = [d.text async for d in run_choices(stream(parts), [choice])]
        return deltas, choice

    return asyncio.run(go())


TEXT = st.text(alphabet=st.sampled_from(list("ab é☕日\n")), min_size=1, max_size=24)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.lists(st.integers(0, 100), max_size=8), st.lists(TEXT, max_size=3))
def test_streamed_deltas_join_to_the_non_streamed_text(text: str, cuts, stops) -> None:
    ids = TOK.encode(text)
    deltas, choice = run(chunks_of(ids, cuts), stops)
    expected, stopped = reference(ids, stops)
    assert "".join(deltas) == choice.text == expected
    assert choice.finish_reason == ("stop" if stopped else "length")
    assert all("\ufffd" not in d for d in deltas)  # never half a character


def test_the_repeated_text_bug_of_a_multi_character_stop_string() -> None:
    # The rank sends " Par", then "is.": the stop string "is." cuts the text to " Par",
    # which was already sent; nothing may be sent twice.
    parts = [TOK.encode(" Par"), TOK.encode("is.")]
    deltas, choice = run(parts, ["is."])
    assert "".join(deltas) == choice.text == " Par"


def test_a_multi_byte_character_split_over_chunks_is_held_until_complete() -> None:
    detok = Detokenizer(TOK)
    first, second = TOK.encode("☕")[:2], TOK.encode("☕")[2:]
    assert detok.add(first) == ""
    assert detok.add(second) == "☕"
    assert detok.add(TOK.encode("!")) == "!" and detok.text == "☕!"


def test_a_broken_tail_is_flushed_at_the_end() -> None:
    detok = Detokenizer(TOK)
    assert detok.add([0xE6, 0x97]) == ""
    assert detok.add([], final=True) == "\ufffd"


def test_each_step_decodes_a_window_not_the_whole_sequence() -> None:
    class Counting(ByteTokenizer):
        def __init__(self) -> None:
            self.decoded = 0

        def decode(self, token_ids):  # type: ignore[override]
            self.decoded += len(token_ids)
            return super().decode(token_ids)

    tok = Counting()
    detok = Detokenizer(tok)
    for t in TOK.encode("x" * 2000):
        detok.add([t])
    assert detok.text == "x" * 2000
    assert tok.decoded < 4 * 2000  # O(1) ids per token, not O(n)
