"""The offline engine: one rank in one process, no Ray. ``Engine(args).generate(...)``."""

from __future__ import annotations

from collections.abc import Sequence

from roundgate.actors.control.engine_core import EngineCore
from roundgate.actors.control.request import Request, SamplingParams
from roundgate.actors.server_args import ServerArgs

__all__ = ["Engine", "RequestsFailed", "SamplingParams"]


class Engine:
    """Runs the real scheduler loop (continuous batching, chunked prefill, the gate with dp=1)
    over the model runner of ``args.model``.
    """

    def __init__(self, args: ServerArgs) -> None:
        from roundgate.actors.model.runner import ModelRunner

        if args.dp_size != 1:
            raise ValueError(
                f"the offline Engine runs one rank: --dp-size must be 1, got {args.dp_size}"
            )
        self.args = args
        self.runner = ModelRunner(args)
        # The runner's args: its pool may be sized from the memory left (--gpu-memory-...).
        self.core = EngineCore(self.runner.args, self.runner)
        self._next_id = 0

    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        max_rounds: int = 1_000_000,
    ) -> list[list[int]]:
        """Output token ids per prompt, in prompt order."""
        if isinstance(sampling, SamplingParams) or sampling is None:
            params = [sampling or SamplingParams()] * len(prompt_token_ids)
        else:
            params = list(sampling)
            if len(params) != len(prompt_token_ids):
                raise ValueError("one SamplingParams per prompt, or a single one for all")
        requests = []
        for ids, sp in zip(prompt_token_ids, params, strict=True):
            requests.append(Request(f"offline-{self._next_id}", list(ids), sp))
            self._next_id += 1
        self.run(requests, max_rounds)
        outputs = [list(req.output_token_ids) for req in requests]
        failed = {i: req.error for i, req in enumerate(requests) if req.error is not None}
        if failed:
            raise RequestsFailed(failed, outputs)
        return outputs

    def run(self, requests: Sequence[Request], max_rounds: int = 1_000_000) -> None:
        """Run ``requests`` to their end (their outputs, logprobs included, are on them)."""
        for req in requests:
            self.core.submit(req)
        for _ in range(max_rounds):
            if not self.core.has_local_work:
                break
            self.core.step()
        else:
            raise RuntimeError(f"generate did not finish within {max_rounds} rounds")


class RequestsFailed(RuntimeError):
    """Some prompts of a ``generate`` call failed alone; ``outputs`` still holds every
    prompt's tokens (the others ran to the end), ``errors`` maps prompt index to why."""

    def __init__(self, errors: dict[int, str], outputs: list[list[int]]) -> None:
        first = next(iter(errors))
        super().__init__(f"{len(errors)} prompt(s) failed; prompt {first}: {errors[first]}")
        self.errors = errors
        self.outputs = outputs
