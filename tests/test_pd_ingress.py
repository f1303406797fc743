"""The ingress's P/D route without Ray: prefill rank, then decode rank, read as one stream.

Fake role handles stand in for the Serve handles (as ``ingress_fakes`` does for a fused
group): the prefill side answers a ``PrefillResult``, the decode side a ``TransferReport``
followed by chunks.
"""

from __future__ import annotations

from typing import Any

from ingress_fakes import FakeStream, complete, error_of, tokens

from roundgate.actors.control.handoff import Handoff
from roundgate.actors.control.messages import GenerateRequest
from roundgate.actors.replica.pd_messages import (
    DecodeRequest,
    PrefillResult,
    ReleaseHandoff,
    TransferReport,
)
from roundgate.actors.role import DisaggregationRole
from roundgate.deployment.ingress import Ingress

DECODE = DisaggregationRole.DECODE
PREFILL = DisaggregationRole.PREFILL

PD_ARGS = {
    "model": "tiny-moe",
    "device": "cpu",
    "max_model_len": 512,
    "prefill": {"dp_size": 1},
    "decode": {"dp_size": 1, "max_num_seqs": 4},
}


class Call:
    """``handle.method.remote(message)``: records the message, answers with ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.messages: list[Any] = []

    def remote(self, message: Any) -> Any:
        self.messages.append(message)
        answer = self.reply(message)
        if answer is None or isinstance(answer, FakeStream):
            return answer  # fire and forget, or a stream

        async def result() -> Any:
            return answer

        return result()


class FakeRole:
    def __init__(self, **methods: Any) -> None:
        for name, reply in methods.items():
            setattr(self, name, Call(reply))

    def options(self, **_: Any) -> FakeRole:
        return self


def handoff_of(message: GenerateRequest) -> Handoff:
    prompt = message.prompt_token_ids
    return Handoff(
        request_id=message.request_id,
        prompt_token_ids=prompt,
        sampling=message.sampling,
        first_token_ids=(7,),
        first_logprobs=(None,),
        prompt_logprobs=(),
        page_ids=(0,),
        num_kv_tokens=len(prompt),
    )


def make_pd(prefill_reply: Any, decode_items: list[Any]) -> tuple[Ingress, FakeRole, FakeRole]:
    prefill = FakeRole(prefill=prefill_reply, release_handoff=lambda m: None)
    decode = FakeRole(decode=lambda m: FakeStream(list(decode_items)))
    return Ingress(PD_ARGS, {PREFILL: prefill, DECODE: decode}), prefill, decode


def test_the_decode_ranks_chunks_follow_the_handoff_and_its_report_is_recorded() -> None:
    report = TransferReport(decode_wait_s=0.25, transfer_s=0.5, num_pages=1, num_bytes=4096)
    items = [report, tokens(7, prompt=3), tokens(8, finish="length", prompt=3, done=1)]
    core, prefill, decode = make_pd(lambda m: PrefillResult(handoff=handoff_of(m)), items)
    choices, _ = complete(core, prompt=[1, 2, 3], max_tokens=2)
    assert choices[0].output_token_ids == [7, 8]
    (sent,) = decode.decode.messages
    assert isinstance(sent, DecodeRequest) and sent.handoff.first_token_ids == (7,)
    assert sent.dp_rank is None  # the decode role's router picks the least-loaded rank
    assert prefill.release_handoff.messages == []  # the decode rank asked for the pages
    assert core.metrics.set.kv_transfer_time.labels(core.model_name)._sum.get() == 0.5
    assert core.metrics.set.decode_wait.labels(core.model_name)._sum.get() == 0.25


def test_a_request_that_ends_on_the_prefill_rank_never_reaches_decode() -> None:
    def whole(message: GenerateRequest) -> PrefillResult:
        return PrefillResult(handoff=None, chunks=(tokens(9, finish="length", prompt=3),))

    core, _, decode = make_pd(whole, [])
    choices, _ = complete(core, prompt=[1, 2, 3], max_tokens=1)
    assert choices[0].output_token_ids == [9] and decode.decode.messages == []


def test_a_handoff_no_decode_rank_took_is_released_when_the_stream_ends() -> None:
    """The decode rank refused it (its error chunk, no report): the prefill pages go back."""
    refusal = tokens(prompt=3)
    refusal = type(refusal)(
        token_ids=(), finish_reason="error", usage=refusal.usage, error="no room"
    )
    core, prefill, _ = make_pd(lambda m: PrefillResult(handoff=handoff_of(m)), [refusal])
    error = error_of(lambda: complete(core, prompt=[1, 2, 3], max_tokens=2))
    assert error.status == 400
    (release,) = prefill.release_handoff.messages
    assert release == ReleaseHandoff(request_id=release.request_id, dp_rank=0)


def test_dp_rank_is_refused_naming_it() -> None:
    core, _, _ = make_pd(lambda m: PrefillResult(handoff=handoff_of(m)), [])
    error = error_of(lambda: complete(core, prompt=[1, 2, 3], max_tokens=2, dp_rank=0))
    assert error.status == 400 and error.param == "dp_rank"
    assert "P/D" in str(error.message)


def test_a_pd_ingress_reads_the_decode_roles_args() -> None:
    core, _, _ = make_pd(lambda m: PrefillResult(handoff=handoff_of(m)), [])
    assert core.roles == (PREFILL, DECODE) and core.engine_args.disaggregation_mode == DECODE
