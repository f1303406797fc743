"""vLLM's own OpenAI-entrypoint tests, the subset that needs no vLLM internals, run unchanged
against an already-running roundgate server (issue 38, deliverable 1).

WHY a harness and not a copy: vLLM's code is never committed here. This script takes a vLLM
tree (``--vllm``: a checkout, or a bare git directory such as a ``fetch`` mirror), extracts the
chosen test files into a scratch directory outside the repository, and swaps vLLM's server
launcher for a stand-in of ours: ``tests/utils.py``'s ``RemoteOpenAIServer`` becomes a handle on
the running server (launch arguments ignored), so each module's own ``server``/``client``
fixtures run as written. One mechanical edit is made to the copies, listed in the report: the
test model's name becomes the served model's (the server refuses an unknown ``model``).
``vllm`` itself is never installed: its imports resolve to stubs (``ModelConfig`` answers the
served vocabulary size, found through ``/detokenize``; ``get_tokenizer`` the served model's
tokenizer when ``--tokenizer`` names it); a test that calls any other vLLM object is
deselected before it runs, with the names it needs.

    python benchmarks/vllm_entrypoints.py --vllm /path/to/vllm [--base-url URL] [--setup]

The tests run with pytest in ``.venv-vllmtests`` (``--setup`` builds it from local wheels);
the counts print, and ``out/vllm_entrypoints.{json,md}`` list each failure with its message.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from vllm_entrypoints_run import GROUP_ARGS, VENV, launched, needs, report, run_pytest

REPO = Path(__file__).resolve().parents[1]
# Only what the chosen tests import (torch: module-level in test_chat/test_prompt_validation;
# fastapi: test_basic's module-level import). Pinned to the project venv's versions.
VENV_PACKAGES = (
    "pytest==9.2.0 pytest-asyncio==1.4.0 pytest-timeout==2.4.0 openai==3.60.0 requests==2.34.2 "
    "jsonschema==4.26.0 regex==2026.11.19 fastapi==0.165.0 httpx==0.29.0 pydantic torch==2.13.0 "
    "transformers==5.24.0"
)
OPENAI = "tests/entrypoints/openai"


@dataclass(frozen=True)
class Pick:
    """One chosen test file: its paths under tests/entrypoints ("|"-separated: the newest layout
    first, then earlier ones), why it is in, and name patterns (fnmatch on the pytest item
    name) deselected with the reason."""

    where: str
    why: str
    skip: dict[str, str] = field(default_factory=dict)
    group: str = "core"

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f"tests/entrypoints/{p}" for p in self.where.split("|"))


LORA = "a LoRA adapter loaded at launch (roundgate serves no adapters)"
PICKS: tuple[Pick, ...] = (
    Pick(
        "openai/chat_completion/test_chat.py|openai/test_chat.py",
        "chat completions: logprobs, streaming, stream_options, structured outputs, custom "
        "roles, seeds, /invocations, n",
        {"*zephyr-lora*": LORA},
    ),
    Pick(
        "openai/chat_completion/test_chat_echo.py|openai/basic/test_chat_echo.py",
        "echo with continue_final_message, prompt_logprobs=-1, top_logprobs=-1",
        group="max-logprobs",  # launched with --max-logprobs past the vocabulary
    ),
    Pick(
        "openai/chat_completion/test_chat_completion.py",
        "invalid json_schema / regex / grammar refused with 400",
    ),
    Pick(
        "openai/chat_completion/test_chat_logit_bias_validation.py"
        "|openai/basic/test_chat_logit_bias_validation.py",
        "logit_bias ids checked against the vocabulary",
    ),
    Pick(
        "openai/chat_completion/test_batched_chat_completions.py",
        "a list of conversations in one chat request (vLLM's batched chat)",
    ),
    Pick(
        "openai/completion/test_completion.py|openai/test_completion.py",
        "completions: logprobs, prompt_logprobs, streaming, stream_options, batches, echo, "
        "invalid structured-output specs",
        {"*zephyr-lora*": LORA, "*opt125*lora*": LORA},
    ),
    Pick(
        "openai/completion/test_prompt_validation.py|openai/test_prompt_validation.py",
        "empty prompt and out-of-vocabulary ids refused with vLLM's messages",
    ),
    Pick("openai/test_chunked_prompt.py", "long prompts with stream_options and logprobs"),
    Pick("openai/test_async_tokenization.py", "concurrent requests, with and without truncation"),
    Pick(
        "openai/test_return_token_ids.py|openai/basic/test_return_token_ids.py",
        "return_token_ids (vLLM's extension) on completions and chat",
    ),
    Pick(
        "serve/tokenize/test_tokenization.py|openai/test_tokenization.py",
        "/tokenize, /detokenize and /tokenizer_info",
    ),
    Pick("openai/responses/test_basic.py", "POST /v1/responses basics", group="responses"),
    Pick("openai/responses/test_stateful.py", "previous_response_id, store", group="responses"),
    Pick("openai/responses/test_structured_output.py", "text.format", group="responses"),
    Pick("openai/responses/test_function_call.py", "function tools", group="responses"),
    Pick(
        "serve/instrumentator/test_basic.py|openai/basic/test_basic.py|openai/test_basic.py",
        "/health, wrong content type, request cancellation, /load (last: the cancellation "
        "test floods the server with 200 requests)",
        {"test_show_version*": "compares /version with vLLM's own version string"},
    ),
)
# Files extracted because the picks need them: package markers and vLLM's (light) fixtures.
SUPPORT = ("tests/__init__.py", "tests/entrypoints/__init__.py", "tests/entrypoints/conftest.py")

# Every other file under tests/entrypoints/openai: "|"-separated patterns, first match wins; a
# file matching nothing is reported as unclassified (a new upstream file to look at).
INTERNALS = "unit tests of vLLM's own classes (protocol models, serving objects, parsers)"
EXCLUDED: tuple[tuple[str, str], ...] = (
    ("*/__init__.py", "package marker"),
    ("*/conftest.py", "fixtures only (extracted when a pick needs them)"),
    (f"{OPENAI}/utils.py", "helpers for vLLM's unit tests"),
    ("*/test_serving_*.py", INTERNALS),
    ("*/test_*_error.py", INTERNALS + " with a mocked engine"),
    ("*/test_lora_resolvers.py", INTERNALS + ": LoRA resolvers"),
    ("*/test_cli_args.py", "vLLM's argument parser"),
    ("*/test_fingerprint.py", INTERNALS + ": vllm.entrypoints.openai.fingerprint"),
    ("*/test_mm_serde.py", INTERNALS + ": multimodal serialization"),
    ("*/test_run_batch.py", "vLLM's offline batch runner (python -m vllm...run_batch)"),
    ("*/test_tool_call*_serialization.py|*/test_tool_choice_content_none.py", INTERNALS),
    ("*/parser/*", INTERNALS + ": harmony parser"),
    ("*/tool_parsers/*", INTERNALS + ": tool parsers of specific model families"),
    ("*/responses/test_*harmony*|*/test_harmony.py", "gpt-oss (harmony format) model"),
    ("*/responses/test_mcp_tools.py", "gpt-oss model with MCP tool servers"),
    ("*/responses/test_parsable_context.py", "Qwen3 reasoning parser and tool server"),
    ("*/responses/test_simple.py", "Qwen3 reasoning output (--reasoning-parser qwen3)"),
    ("*/responses/test_*", INTERNALS + ": responses protocol/serving"),
    ("*audio*|*video*|*vision*|*image*", "multimodal input: roundgate serves a text-only model"),
    ("*embeds*", "prompt embeddings as input (vLLM's --enable-prompt-embeds)"),
    ("*mm_loras*", "multimodal LoRA"),
    ("*/test_multi_api_servers.py", "vLLM's --api-server-count process layout"),
    ("*/test_shutdown.py", "signals to a vLLM process it launches"),
    ("*/test_uds.py", "vLLM's --uds unix-socket launch"),
    ("*/test_root_path.py", "vLLM's --root-path launch flag"),
    ("*/test_enable_force_include_usage.py", "vLLM's --enable-force-include-usage flag"),
    ("*/test_tensorizer_entrypoint.py", "tensorizer weight loading"),
    ("*/test_oot_registration.py", "an out-of-tree model registered into vLLM"),
    ("*/test_token_in_token_out.py", "downloads vLLM's model weights to a local dir"),
    ("*/test_thinking_token_budget*.py", "reasoning models and vLLM's thinking budget"),
    ("*reasoning*", "reasoning models and vLLM's --reasoning-parser"),
    ("*/test_completion_with_function_calling.py", "Qwen3 tool calling with hermes parser"),
    ("*/correctness/*", "accuracy runs (lm-eval, mteb) of vLLM's model"),
    ("*/models/test_models.py", LORA),
    ("*/test_return_tokens_as_ids.py", LORA),
    ("*/test_openai_schema.py", "schemathesis fuzzing of vLLM's own openapi.json"),
    ("*/generative_scoring/*", "vLLM's generative scoring endpoint (not an OpenAI API)"),
    ("*/basic/test_chat_template.py", "vLLM's chat-template loader (vllm.entrypoints.chat_utils)"),
)
# vLLM names the stand-in answers for real (the shim); a test using any other is deselected.
# ``get_tokenizer`` only with --tokenizer (the served model's tokenizer, loaded by transformers).
SHIMMED = frozenset({"ModelConfig"})
# Copied next to the extracted tests as ``roundgate_shim.py`` (never imported here).
SHIM = Path(__file__).resolve().parent / "vllm_entrypoints_shim.py"


# ---- the vLLM tree --------------------------------------------------------------------------


def is_bare_git(path: Path) -> bool:
    return (
        (path / "HEAD").is_file() and (path / "objects").is_dir() and not (path / "tests").exists()
    )


def tree_files(vllm: Path, rev: str) -> list[str]:
    """Every file path under tests/entrypoints in the tree."""
    if is_bare_git(vllm):
        out = subprocess.run(
            ["git", f"--git-dir={vllm}", "ls-tree", "-r", "--name-only", rev, "tests/entrypoints"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return out.stdout.split()
    return sorted(
        p.relative_to(vllm).as_posix() for p in (vllm / "tests/entrypoints").rglob("*.py")
    )


def tree_commit(vllm: Path, rev: str) -> str:
    git = ["git", f"--git-dir={vllm}"] if is_bare_git(vllm) else ["git", "-C", str(vllm)]
    out = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True)
    return out.stdout.strip() or "unknown (not a git tree)"


def extract(vllm: Path, rev: str, paths: list[str], dest: Path) -> None:
    """Copy ``paths`` out of the tree into ``dest``, keeping their relative paths."""
    if is_bare_git(vllm):
        archive = subprocess.run(
            ["git", f"--git-dir={vllm}", "archive", "--format=tar", rev, "--", *paths],
            capture_output=True, check=True,
        )  # fmt: skip
        with tempfile.TemporaryFile() as tmp:
            tmp.write(archive.stdout)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp) as tar:
                tar.extractall(dest, filter="data")
        return
    for rel in paths:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(vllm / rel, dest / rel)


def matches(path: str, patterns: str) -> bool:
    return any(fnmatch.fnmatch(path, pat) for pat in patterns.split("|"))


def classify(files: list[str]) -> tuple[list[tuple[Pick, str]], list[dict], list[str]]:
    """The picks found in the tree (with the path used), the excluded files with their
    reasons, and the test files neither picked nor excluded."""
    present = set(files)
    picked = [
        (p, next(x for x in p.paths if x in present)) for p in PICKS if present & set(p.paths)
    ]
    used = {path for _, path in picked}
    excluded, unclassified = [], []
    for f in files:
        if not f.startswith(OPENAI + "/") or f in used or not f.endswith(".py"):
            continue
        reason = next((why for pats, why in EXCLUDED if matches(f, pats)), None)
        if reason is not None:
            excluded.append({"file": f, "reason": reason})
        elif f.rsplit("/", 1)[-1].startswith("test_"):
            unclassified.append(f)
    return picked, excluded, unclassified


# ---- the two edits to each copy --------------------------------------------------------------


def model_literals(tree: ast.Module) -> set[str]:
    """The test model's names: ``*MODEL*`` constants, ``model_name = "..."`` locals, and the
    literal first argument of ``RemoteOpenAIServer(...)``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any("MODEL" in n or n == "model_name" for n in names):
                found.add(node.value.value) if isinstance(node.value.value, str) else None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "RemoteOpenAIServer" and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def rewrite_models(source: str, served: str) -> tuple[str, list[str]]:
    """The source with every test-model literal replaced by the served model's name."""
    literals = sorted(model_literals(ast.parse(source)) - {served})
    for lit in literals:
        source = source.replace(f'"{lit}"', json.dumps(served)).replace(
            f"'{lit}'", json.dumps(served)
        )
    return source, literals


def vllm_names(tree: ast.Module) -> set[str]:
    """Names bound to vLLM objects at module level (from ``vllm.*``, and ``tests.utils`` or
    ``tests.conftest`` names other than the server), less the ones the stand-in answers."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            scaffolding = module in ("tests.utils", "tests.conftest") or (
                node.level > 1 and module in ("utils", "conftest")
            )
            if module.split(".")[0] == "vllm" or scaffolding:
                names |= {a.asname or a.name for a in node.names} - {"RemoteOpenAIServer"}
        elif isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("vllm")
            }
    return names


def internal_tests(source: str, shimmed: frozenset[str]) -> dict[str, str]:
    """Test functions that use a vLLM object (directly, through a module-level helper, or by
    importing one inside the test): {name pattern: reason}."""
    tree = ast.parse(source)
    bad = vllm_names(tree) - shimmed
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    def uses(fn: ast.AST) -> set[str]:
        hit = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in bad}
        hit |= {
            f"{n.module}" for n in ast.walk(fn)
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm"
        }  # fmt: skip
        return hit

    changed = True
    while changed:  # helpers that reach a vLLM object are vLLM objects themselves
        changed = False
        for name, fn in funcs.items():
            if name not in bad and not name.startswith("test") and uses(fn):
                bad.add(name)
                changed = True
    rules: dict[str, str] = {}
    for name, fn in funcs.items():
        if name.startswith("test") and uses(fn):
            why = "calls vLLM's " + ", ".join(sorted(uses(fn)))
            rules[name] = rules[f"{name}[[]*"] = why  # the test, and each of its parameters
    return rules


# ---- the server -----------------------------------------------------------------------------


def get_json(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, {}


def served_model(base_url: str) -> str:
    status, body = get_json(f"{base_url}/models")
    if status != 200 or not body.get("data"):
        sys.exit(f"no model at {base_url}/models (status {status}): is the server up?")
    return str(body["data"][0]["id"])


def vocab_size(url_root: str, model: str) -> int | None:
    """The served vocabulary's size: the first id ``/detokenize`` refuses (binary search)."""

    def ok(token: int) -> bool:
        return get_json(f"{url_root}/detokenize", {"model": model, "tokens": [token]})[0] == 200

    lo, hi = 0, 1 << 22
    if not ok(lo) or ok(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi


# ---- the run --------------------------------------------------------------------------------


def setup_venv() -> None:
    """``.venv-vllmtests``: pytest and what the chosen tests import, never vLLM."""
    if not (VENV / "bin/python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin/python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), *VENV_PACKAGES.split()], check=True)


def write_scratch(work: Path, config: dict) -> None:
    """Our stand-ins next to the extracted tests: the shim, a conftest that loads it, a
    ``tests/utils.py`` that re-exports it, pytest's settings and the run's configuration."""
    shutil.copy(SHIM, work / "roundgate_shim.py")
    (work / "conftest.py").write_text('pytest_plugins = ("roundgate_shim",)\n')
    (work / "tests/utils.py").write_text(
        "from roundgate_shim import RemoteOpenAIServer  # noqa: F401\n"
        "from roundgate_shim import tests_utils_getattr as __getattr__  # noqa: F401\n"
    )
    (work / "pytest.ini").write_text(
        "[pytest]\npythonpath = .\nasyncio_mode = strict\n"
        "asyncio_default_fixture_loop_scope = function\n"
        f"timeout = {config['timeout'] * 2}\n"
        "filterwarnings = ignore::pytest.PytestUnknownMarkWarning\n"
    )
    (work / "roundgate_harness.json").write_text(json.dumps(config, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=Path, required=True, help="a vLLM checkout or bare git dir")
    ap.add_argument("--rev", default="HEAD", help="the revision, for a git tree")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument(
        "--groups",
        default=",".join(GROUP_ARGS),
        help=f"comma list of {', '.join(GROUP_ARGS)} (vllm_entrypoints_run.py)",
    )
    ap.add_argument(
        "--launch",
        action="store_true",
        help="start roundgate serve per group with its settings (else use --base-url's server)",
    )
    ap.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "roundgate-vllm-tests"
    )
    ap.add_argument("--out", type=Path, default=REPO / "out")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per request")
    ap.add_argument("--setup", action="store_true", help="build .venv-vllmtests first")
    ap.add_argument("--tokenizer", help="the served model's HF tokenizer dir or GGUF file")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args(argv)
    if args.setup or not (VENV / "bin/python").exists():
        setup_venv()
    vllm = args.vllm.resolve()
    files = tree_files(vllm, args.rev)
    picked, excluded, unclassified = classify(files)
    groups = [g for g in GROUP_ARGS if g in args.groups.split(",")]
    picked = [(p, path) for p, path in picked if p.group in groups]
    results: list[dict] = []
    for i, group in enumerate(groups):
        paths = [path for p, path in picked if p.group == group]
        if not args.launch and needs(group):
            print(f"group {group} expects a server with {needs(group)} (or use --launch)")
        with launched(group, args.base_url) if args.launch else contextlib.nullcontext():
            if i == 0:  # the served model names the rewrites: after the first launch
                meta = start(args, vllm, files, picked, excluded, unclassified)
            results += run_pytest(args.work, paths, args.pytest_args)
    report(args.work, meta, results, {path: p.group for p, path in picked}, args.out)


def start(
    args: argparse.Namespace,
    vllm: Path,
    files: list[str],
    picked: list[tuple[Pick, str]],
    excluded: list[dict],
    unclassified: list[str],
) -> dict:
    """The run's scratch directory, from the served model's name and vocabulary."""
    url_root = args.base_url.rsplit("/v1", 1)[0]
    model = served_model(args.base_url)
    shimmed = SHIMMED | ({"get_tokenizer"} if args.tokenizer else set())
    rewrites, deselect = prepare(vllm, args.rev, files, picked, args.work, model, shimmed)
    meta = {
        "vllm": str(args.vllm), "commit": tree_commit(vllm, args.rev), "base_url": args.base_url,
        "model": model, "vocab_size": vocab_size(url_root, model), "rewrites": rewrites,
        "picked": {path: p.why for p, path in picked}, "excluded": excluded,
        "unclassified": unclassified, "tokenizer": args.tokenizer,
    }  # fmt: skip
    config = {**meta, "url_root": url_root, "timeout": args.timeout, "deselect": deselect}
    write_scratch(args.work, config)
    print(f"model {model}, vocab {meta['vocab_size']}, {len(picked)} files; new: {unclassified}")
    return meta


def prepare(
    vllm: Path,
    rev: str,
    files: list[str],
    picked: list[tuple[Pick, str]],
    work: Path,
    model: str,
    shimmed: frozenset[str],
) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """Extract the picks (and the conftests beside them) into a fresh ``work``, deselect their
    tests that need vLLM, and rename the test model: (rewrites, deselect rules) by file."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    conftests = {f"{Path(path).parent}/conftest.py" for _, path in picked} & set(files)
    conftests -= set(SUPPORT)
    support = [f for f in SUPPORT if f in files] + sorted(conftests)
    extract(vllm, rev, support + [path for _, path in picked], work)
    for init in {Path(path).parent for _, path in picked}:  # packages for relative imports
        for pkg in [init, *init.parents][:-1]:
            (work / pkg / "__init__.py").touch()
    rewrites, deselect = {}, {}
    skips = {path: pick.skip for pick, path in picked}
    for path in [*skips, *sorted(conftests)]:  # responses/conftest.py launches its own model
        source = (work / path).read_text()
        if path in skips:
            deselect[path] = {**skips[path], **internal_tests(source, shimmed)}
        source, rewrites[path] = rewrite_models(source, model)
        (work / path).write_text(source)
    return rewrites, deselect


if __name__ == "__main__":
    main()
