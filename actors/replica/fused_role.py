"""The fused role: a rank that prefills and decodes its own requests (``generate``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from roundgate.actors.control.messages import GenerateChunk, GenerateRequest
from roundgate.actors.control.rank_loop import RoundOutcome
from roundgate.actors.replica.intake import PromptIntake
from roundgate.actors.role import DisaggregationRole


class FusedRole:
    """``RankRole`` of a fused rank: prompts in through ``generate``, tokens streamed back."""

    name = DisaggregationRole.FUSED

    def __init__(self, intake: PromptIntake) -> None:
        self.intake = intake

    def after_round(self, outcome: RoundOutcome) -> None:
        """Nothing: a fused rank's rounds only make token events (the engine delivers them)."""

    async def start(self) -> None:
        """Nothing to join beyond the group."""

    async def generate(self, message: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the request's new tokens, ``stream_interval`` or more per chunk."""
        async for chunk in self.intake.stream(message.to_request()):
            yield chunk
