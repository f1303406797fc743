"""The files and data shapes one chat completion crosses, from the HTTP body to the scheduler
and back (issue 22: "the request path, shorter").

One chat completion, non-streamed and then streamed, is driven in-process through the real
route (``roundgate.deployment.app.OpenAIServer.chat``), the real ``Ingress`` and the real rank side:
a fused rank's ``generate`` (``FusedRole``; the Serve shell is skipped: no Ray actor, no
process group) over an
``EngineCore`` whose executor is the simulator's ``CostExecutor`` (no model weights). While it
runs, ``sys.setprofile`` records

- files: every project module (``co_filename`` under the repository) with a frame on the path;
- raw shapes: the type (with a container's element types) of every argument and return value
  of a frame in the request path's own modules (the HTTP layer, the ingress, the messages, the
  rank's intake and chunking), except objects that existed before the request (the ingress,
  tokenizer, scheduler...), scalars (``int``, ``str``, ...), callables and coroutines.

The counted shapes are what the request's data is carried as, by the rules of
``roundgate.bench.request_shapes`` (a container is its elements; per-request telemetry is not data).
Both lists are printed: the raw shapes (with what each counts as) and the counted ones.

Run from the repository root::

    PYTHONPATH=$PWD python benchmarks/request_path.py [--where] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import sys
import types
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from roundgate.bench.request_shapes import SCALARS, counted, describe

REPO = Path.cwd().resolve()
# The request path's own modules (shapes are recorded in their frames): the HTTP surface and
# ingress, the ingress <-> rank messages, the rank's intake and chunking. The scheduler's
# internals (round plans, pages) are the scheduler's, not the request's.
SHAPE_PARTS = ("deployment/", "actors/control/messages.py", "actors/replica/")
APP_ARGS = {"model": "tiny-moe", "dp_size": 1, "max_num_seqs": 4, "device": "cpu"}
BODY = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4}


def _is_flow(value: Any) -> bool:
    return isinstance(value, types.AsyncGeneratorType | types.GeneratorType | types.CoroutineType)


class Tracer:
    """Files with a frame on the path, and the shapes the request's data takes in them."""

    def __init__(self, existing: list[Any]) -> None:
        # gc tracks containers only: what they hold (tuples of ints, strings) is pre-existing too.
        self.existing = {id(o) for o in existing}
        self.existing.update(id(r) for o in existing for r in gc.get_referents(o))
        self._keep = existing  # held so no id is reused by a new object
        self.files: set[str] = set()
        self.shapes: dict[str, set[str]] = {}  # raw shape -> where it was seen
        self.counts_as: dict[str, set[str]] = {}  # raw shape -> the shapes it counts as

    def _note(self, value: Any, where: str) -> None:
        skip = (
            types.FunctionType,
            types.MethodType,
            types.BuiltinFunctionType,
            types.ModuleType,
            type,
            types.CoroutineType,
            types.AsyncGeneratorType,
            types.GeneratorType,
            BaseException,
            *SCALARS,
        )
        if isinstance(value, skip) or id(value) in self.existing:
            return
        if inspect.isawaitable(value) or callable(value) or hasattr(value, "__next__"):
            return  # control flow (iterators, wrapped awaitables), not data
        if type(value).__module__ == __name__ or type(value).__name__.endswith("wrapped_value"):
            return  # this script's stand-in for Serve's streaming handle; asyncio internals
        if isinstance(value, list | tuple | dict | set) and not value:
            return  # an empty container carries nothing of the request
        if isinstance(value, list) and all(_is_flow(v) for v in value):
            return  # a list of streams: control flow too
        if type(value) is tuple and len({type(v) for v in value}) > 1:
            return  # several return values at once (each is recorded where it is used)
        raw = describe(value)
        self.shapes.setdefault(raw, set()).add(where)
        self.counts_as.setdefault(raw, set()).update(counted(value))

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(str(REPO)) or path == __file__:
            return
        rel = str(Path(path).relative_to(REPO))
        if rel.startswith((".venv", "sim/")) or rel == "gate/costmodel.py":
            # The venv; the simulator's cost executor (and the toy cost model that prices its
            # forward) stands in for the model runner.
            return
        self.files.add(rel)
        if not rel.startswith(SHAPE_PARTS):
            return
        where = f"{rel}:{frame.f_code.co_name}"
        if event == "call":
            code = frame.f_code
            count = code.co_argcount + code.co_kwonlyargcount
            for name in code.co_varnames[:count]:
                if name in ("self", "cls"):
                    continue
                self._note(frame.f_locals.get(name), where)
        else:
            self._note(arg, where)


def _cost_executor() -> Any:
    from roundgate.sim.cost_executor import CostExecutor
    from roundgate.sim.round_costs import TOY

    return CostExecutor(TOY)


class _NoGroup:
    """A group of one that never pauses: the membership of the rank run here."""

    rank = 0
    row_rank = 0

    def wake(self) -> None:
        pass


class LocalRanks:
    """A rank deployment handle that runs a fused rank's ``generate`` (``FusedRole`` over a
    ``RankEngine``) on a local ``EngineCore``; the rounds run in a task, not a thread."""

    def __init__(self) -> None:
        from roundgate.actors.control.engine_core import EngineCore
        from roundgate.actors.replica.fused_role import FusedRole
        from roundgate.actors.replica.intake import PromptIntake
        from roundgate.actors.replica.rank_engine import RankEngine
        from roundgate.actors.server_args import ServerArgs

        args = ServerArgs(**APP_ARGS)
        group = _NoGroup()

        async def engine() -> RankEngine:  # its loop and outbox are set per run (``remote``)
            return RankEngine(args, group)

        self.engine = asyncio.run(engine())
        self.engine.core = EngineCore(args, _cost_executor(), on_event=self.engine.on_event)
        intake = PromptIntake(self.engine, None, group.wake, lambda request_id: None)
        self.role = FusedRole(intake)

    def options(self, **_: Any) -> LocalRanks:
        return self

    @property
    def generate(self) -> LocalRanks:
        return self

    def remote(self, message: Any) -> _Call:
        from roundgate.actors.replica.outbox import RoundOutbox

        loop = self.engine.loop = asyncio.get_running_loop()
        # A real rank builds its outbox at start, before any request: built here by hand, so
        # the per-run event loop it needs is not counted as one of the request's shapes.
        box = self.engine.outbox = object.__new__(RoundOutbox)
        box._loop, box._items = loop, []
        return _Call(self.engine, self.role, message)


class _Call:
    """One streaming call: the role's ``generate`` while a task steps its engine."""

    def __init__(self, engine: Any, role: Any, message: Any) -> None:
        self.engine = engine
        self.role = role
        self.message = message

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._run()

    async def _run(self) -> AsyncIterator[Any]:
        core = self.engine.core
        stop = asyncio.Event()

        async def step() -> None:
            while not stop.is_set():
                if core.has_local_work:
                    core.step()
                    self.engine.outbox.send()
                await asyncio.sleep(0)

        stepper = asyncio.create_task(step())
        try:
            async for chunk in self.role.generate(self.message):
                yield chunk
        finally:
            stop.set()
            await stepper

    def cancel(self) -> None:
        pass


def _http_request(body: dict[str, Any]) -> Any:
    from starlette.requests import Request

    raw = json.dumps(body).encode()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    return Request(scope, receive)


async def _one_chat(server: Any, stream: bool) -> str:
    """The response's body text, as the client would read it."""
    from starlette.responses import StreamingResponse

    out = await server.chat(_http_request({**BODY, "stream": stream}))
    if isinstance(out, StreamingResponse):
        parts = [p async for p in out.body_iterator]
        return "".join(p if isinstance(p, str) else p.decode() for p in parts)
    return json.dumps(out)


_SERVERS: list[Any] = []


def measure(stream: bool) -> tuple[Tracer, str]:
    """The tracer's record (files, shapes) of one chat completion, and the response text."""
    from roundgate.actors.role import DisaggregationRole
    from roundgate.deployment.app import OpenAIServer
    from roundgate.deployment.ingress import Ingress

    server = object.__new__(OpenAIServer)  # the route's class without Serve's wrapper
    _SERVERS.append(server)  # Serve's wrapper has an async ``__del__``: never collect it
    server.core = Ingress(dict(APP_ARGS), {DisaggregationRole.FUSED: LocalRanks()})
    asyncio.run(_one_chat(server, stream))  # warm-up: lazy imports and caches
    gc.collect()
    tracer = Tracer(gc.get_objects())
    sys.setprofile(tracer)
    try:
        text = asyncio.run(_one_chat(server, stream))
    finally:
        sys.setprofile(None)
    return tracer, text


def _why(raw: str, counts_as: list[str]) -> str:
    """What a raw shape counts as, in words."""
    if not counts_as:
        return "not counted: per-request telemetry"
    if counts_as == [raw]:
        return "counted"
    return f"counted as {' | '.join(counts_as)} (a container of it)"


def main() -> None:
    # The route classes are never collected by Serve here; their async ``__del__`` would warn.
    warnings.filterwarnings("ignore", message="coroutine .*__del__' was never awaited")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument("--where", action="store_true", help="where each shape was seen")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    for stream in (False, True):
        tracer, text = measure(stream)
        counts_as = {k: sorted(v) for k, v in sorted(tracer.counts_as.items())}
        report["streamed" if stream else "non_streamed"] = {
            "files": sorted(tracer.files),
            "raw_shapes": {k: sorted(v) for k, v in sorted(tracer.shapes.items())},
            "counts_as": counts_as,
            "shapes": sorted({s for v in counts_as.values() for s in v}),
            "response": text[:200],
        }
    parts = list(report.values())
    files = sorted({f for p in parts for f in p["files"]})
    raw = sorted({r for p in parts for r in p["raw_shapes"]})
    shapes = sorted({s for p in parts for s in p["shapes"]})
    report["both"] = {"files": files, "raw_shapes": raw, "shapes": shapes}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name, part in parts_named(report):
        print(
            f"== {name}: {len(part['files'])} files, {len(part['raw_shapes'])} raw shapes, "
            f"{len(part['shapes'])} counted"
        )
        for f in part["files"]:
            print(f"  {f}")
        print("  -- raw shapes")
        for shape, where in part["raw_shapes"].items():
            print(f"  {shape}    [{_why(shape, part['counts_as'][shape])}]")
            if args.where:
                print(f"      <- {', '.join(where)}")
        print(f"  -- counted shapes: {', '.join(part['shapes'])}")
    print(f"== both: {len(files)} files, {len(raw)} raw shapes: {', '.join(raw)}")
    print(f"== both: {len(shapes)} counted shapes: {', '.join(shapes)}")


def parts_named(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The two measured runs of ``report`` (not its ``both`` summary)."""
    return [(k, v) for k, v in report.items() if k != "both"]


if __name__ == "__main__":
    main()
