"""The stand-in for vLLM's test scaffolding, copied by ``benchmarks/vllm_entrypoints.py`` next
to the vLLM tests it extracts (as ``roundgate_shim.py``, loaded by a two-line ``conftest.py``
and re-exported by the ``tests/utils.py`` it writes). Never imported by the project itself.

WHY each piece:
- ``RemoteOpenAIServer``: vLLM's tests launch their own server with it; here it is a handle on
  the already-running roundgate server, so each test module's own ``server``/``client``
  fixtures run unchanged. Launch arguments are recorded and ignored.
- A stub for ``vllm`` (never installed): modules import cleanly; ``ModelConfig`` answers the
  served vocabulary size (the harness finds it through ``/detokenize``); any other vLLM object
  raises ``VllmInternalsError`` when used (the harness deselects such tests beforehand, so
  this is a backstop, and the failure names the object).
- ``vllm.tokenizers.get_tokenizer``: the served model's own tokenizer, loaded by
  ``transformers`` from the directory (or GGUF file) the harness was given with
  ``--tokenizer``; without one it is missing like any other vLLM object.
- ``huggingface_hub.snapshot_download``: only feeds LoRA paths to launch arguments; answers a
  path that does not exist, since nothing is downloaded here.
- ``pybase64`` is the stdlib's ``base64`` when not installed (the same API, slower).
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

HERE = Path(__file__).resolve().parent
CONFIG: dict[str, Any] = json.loads((HERE / "roundgate_harness.json").read_text())
STUBBED = ("vllm",)


class VllmInternalsError(RuntimeError):
    """A test reached a vLLM object the stand-in does not provide."""


class Missing:
    """Any vLLM name: importable, usable in annotations, an error when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise VllmInternalsError(f"{self._name} is vLLM internals, not provided by the stand-in")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class ModelConfig:
    """``vllm.config.ModelConfig`` as the tests use it: the vocabulary size of the model."""

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self.model = model

    def get_vocab_size(self) -> int:
        size = CONFIG.get("vocab_size")
        if size is None:
            raise VllmInternalsError("vocabulary size unknown (the harness found none)")
        return int(size)


def snapshot_download(repo_id: str, **kwargs: Any) -> str:
    return f"/nonexistent/hf/{repo_id}"


_TOKENIZER: list[Any] = []


def get_tokenizer(*args: Any, **kwargs: Any) -> Any:
    """The served model's tokenizer (whatever name the test asks for: it asks for its model)."""
    if not _TOKENIZER:
        from transformers import AutoTokenizer

        path = Path(CONFIG["tokenizer"])
        if path.suffix == ".gguf":
            _TOKENIZER.append(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
        else:
            _TOKENIZER.append(AutoTokenizer.from_pretrained(str(path)))
    return _TOKENIZER[0]


SHIMS: dict[str, Any] = {"vllm.config.ModelConfig": ModelConfig}
if CONFIG.get("tokenizer"):
    SHIMS["vllm.tokenizers.get_tokenizer"] = get_tokenizer


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every ``vllm.*`` (and ``huggingface_hub``) import with a stub package."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attr(name: str, _prefix: str = spec.name) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return SHIMS.get(f"{_prefix}.{name}", Missing(f"{_prefix}.{name}"))

        module.__getattr__ = attr  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _StubFinder())
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if importlib.util.find_spec("huggingface_hub") is None:
    sys.modules["huggingface_hub"] = types.ModuleType("huggingface_hub")
importlib.import_module("huggingface_hub").snapshot_download = snapshot_download  # type: ignore[attr-defined]
if importlib.util.find_spec("pybase64") is None:
    sys.modules["pybase64"] = base64


class RemoteOpenAIServer:
    """vLLM's test server launcher, pointed at the running roundgate server instead."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str] | None = None, **kwargs: Any):
        self.model = model
        self.args = list(vllm_serve_args or [])
        parts = urlsplit(CONFIG["url_root"])
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.uds = None

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    @property
    def url_root(self) -> str:
        return str(CONFIG["url_root"])

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def _client_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.setdefault("timeout", CONFIG.get("timeout", 120))
        return {"base_url": self.url_for("v1"), "max_retries": 0, **kwargs}

    def get_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(api_key=self.DUMMY_API_KEY, **self._client_kwargs(kwargs))

    def get_async_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(api_key=self.DUMMY_API_KEY, **self._client_kwargs(kwargs))


def tests_utils_getattr(name: str) -> Any:
    """``tests.utils``' other names (constants, decorators): vLLM internals."""
    if name.startswith("__"):
        raise AttributeError(name)
    return Missing(f"tests.utils.{name}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect what the harness listed (file -> {name pattern: reason}); record why."""
    rules: dict[str, dict[str, str]] = CONFIG.get("deselect", {})
    keep, dropped, record = [], [], []
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(HERE).as_posix()
        reason = next(
            (why for pat, why in rules.get(path, {}).items() if fnmatch(item.name, pat)), None
        )
        if reason is None:
            keep.append(item)
        else:
            dropped.append(item)
            record.append({"id": item.nodeid, "reason": reason})
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    (HERE / "deselected.json").write_text(json.dumps(record, indent=1))


RESULTS: dict[str, dict[str, Any]] = {}


def error_lines(report: pytest.TestReport) -> str:
    """pytest's ``E`` lines (the assertion and its diff), else its one-line crash message."""
    lines = [ln[1:].strip() for ln in report.longreprtext.splitlines() if ln.startswith("E ")]
    crash = getattr(report.longrepr, "reprcrash", None)
    text = " | ".join(ln for ln in lines[:15] if ln) or (crash.message if crash else "")
    return text[:1500]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's outcome and, for a failure, pytest's one-line crash message."""
    entry = RESULTS.setdefault(
        report.nodeid, {"id": report.nodeid, "outcome": "passed", "seconds": 0.0, "message": ""}
    )
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)
    if report.failed and entry["outcome"] in ("passed", "skipped"):
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["message"] = error_lines(report)
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["message"] = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else "")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A file that does not even import counts as one error (its tests are unknown)."""
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash else str(report.longrepr).strip().splitlines()[-1]
        RESULTS[report.nodeid] = {
            "id": report.nodeid, "outcome": "error", "seconds": 0.0, "message": message[:1000]
        }  # fmt: skip


def pytest_sessionfinish(session: pytest.Session) -> None:
    (HERE / "results.json").write_text(json.dumps(list(RESULTS.values()), indent=1))
