"""The docs against the code: every flag, config key, metric, route, path and module they name.

Each check reads README.md and docs/**/*.md line by line and collects what the line names; the
code side is derived at test time (the ``roundgate`` parsers, ``AppArgs``, the metric sets, the
FastAPI app, the repository's files), so a flag or route added to the code needs no edit here.
A failure lists ``file:line: the missing thing``.

What cannot be checked against this repository is named below, with whose it is: other tools'
flags (vLLM's, pip's, Ray's), and filesystem paths that are not routes.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# The repository's top-level folders: ``roundgate.<folder>`` when installed.
PACKAGES = (
    "actors", "bench", "cli", "dashboards", "deployment", "gate", "k8s", "kernels", "nccl_log",
    "routing", "sim",
)  # fmt: skip
# Folders and files a doc may name by a root-relative path.
ROOT_DIRS = (*PACKAGES, "benchmarks", "docs", "tests")

# Flags of other programs the docs quote beside ours: not ours to check.
FOREIGN_FLAGS = {
    "--no-deps": "pip (README's `make setup`)",
    "--enable-server-load-tracking": "vLLM's server flag",
    "--max-logprobs": "vLLM's server flag (ours is the max_logprobs config key)",
    "--head": "ray start",
}
# Other projects' paths the docs quote.
FOREIGN_PATHS = {"tests/entrypoints": "vLLM's OpenAI server tests (docs/api.md)"}
# Absolute filesystem paths the docs name: not HTTP routes.
FILESYSTEM_ROOTS = ("/tmp", "/proc", "/dev", "/sys", "/models", "/etc", "/usr", "/work")


# ---- the docs' side ------------------------------------------------------------------------


def doc_lines() -> Iterator[tuple[str, int, str]]:
    """(doc path relative to the repo, line number, line) of every doc, fenced blocks included."""
    for path in DOCS:
        name = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield name, number, line


def fenced_blocks(language: str) -> Iterator[tuple[str, int, str]]:
    """(doc, first line of the body, body) of every fenced block tagged ``language``."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        start = None
        for number, line in enumerate(lines, 1):
            if start is None and line.strip() == f"```{language}":
                start = number + 1
            elif start is not None and line.strip() == "```":
                yield str(path.relative_to(ROOT)), start, "\n".join(lines[start - 1 : number - 1])
                start = None


def missing(found: Iterator[tuple[str, int, str]], exists: Callable[[str], bool]) -> list[str]:
    """``doc:line: thing`` for each thing the docs name that ``exists`` refuses."""
    return [f"{doc}:{line}: {thing}" for doc, line, thing in found if not exists(thing)]


def report(kind: str, problems: list[str]) -> str:
    return f"{len(problems)} {kind} named in the docs do not exist:\n" + "\n".join(problems)


# ---- CLI flags -----------------------------------------------------------------------------

# `--flag`, `--[no-]flag`, or a family of flags: `--prefill-delayer-*`.
FLAG = re.compile(r"(?<![\w/.-])--(?:\[no-\])?[a-z0-9][a-z0-9-]*[a-z0-9](?:-\*)?")


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands' parsers."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def script_flags() -> set[str]:
    """The flags the repository's scripts declare: each ``add_argument("--x", ...)`` in a
    Python file (benchmarks and the tools beside the ``roundgate`` command), and each
    ``"--x"`` a shell script compares its arguments with."""
    found: set[str] = set()
    for path in (ROOT / "benchmarks").glob("*.sh"):
        found.update(re.findall(r"\"(--[a-z0-9-]+)\"", path.read_text()))
    sources = [*(ROOT / "benchmarks").glob("*.py")]
    for folder in PACKAGES:
        sources += (ROOT / folder).rglob("*.py")
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        found.add(arg.value)
    return found


@cache
def known_flags() -> frozenset[str]:
    """ServerArgs' flag table (its fields and the registered policies' flags), the ``roundgate``
    command's (built now: a flag added to a subcommand counts without an edit here), and the
    repository's scripts'."""
    from roundgate.actors.server_args import CORE_FIELDS
    from roundgate.cli.main import build_parser
    from roundgate.gate import registry

    engine = {"--" + name.replace("_", "-") for name in CORE_FIELDS}
    engine |= {flag.cli for flag, _ in registry.all_flags().values()}
    return frozenset(option_strings(build_parser()) | engine | script_flags())


def flag_exists(flag: str) -> bool:
    if flag in FOREIGN_FLAGS:
        return True
    flag = flag.replace("[no-]", "")
    flags = known_flags()
    if flag.endswith("-*"):
        return any(known.startswith(flag[:-1]) for known in flags)
    return flag in flags or ("--" + flag.removeprefix("--no-")) in flags


def test_every_flag_the_docs_name_exists() -> None:
    found = (
        (doc, line, match.group(0))
        for doc, line, text in doc_lines()
        for match in FLAG.finditer(text)
    )
    problems = missing(found, flag_exists)
    assert not problems, report("flags", problems)


# ---- config keys ---------------------------------------------------------------------------


@cache
def serve_schema_keys() -> dict[str, frozenset[str]]:
    """Ray Serve's own config keys: the top level, ``http_options`` and an application."""
    from ray.serve.schema import HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema

    return {
        "top": frozenset(ServeDeploySchema.model_fields),
        "http_options": frozenset(HTTPOptionsSchema.model_fields),
        "application": frozenset(ServeApplicationSchema.model_fields),
    }


@cache
def app_arg_keys() -> dict[str, frozenset[str]]:
    """``build_app``'s keys: ``AppArgs`` (router settings included) and the engine flags; a P/D
    role section's; ``autoscaling``'s."""
    from roundgate.actors.server_args import engine_arg_names
    from roundgate.deployment.autoscaling import GroupAutoscaling
    from roundgate.deployment.config import AppArgs
    from roundgate.deployment.pd_config import RoleArgs

    engine = frozenset(engine_arg_names())
    return {
        "args": frozenset(AppArgs.model_fields) | engine,
        "role": frozenset(RoleArgs.model_fields) - {"engine"} | engine,
        "autoscaling": frozenset(GroupAutoscaling.model_fields),
    }


def unknown_config_keys(config: object) -> list[str]:
    """The keys of a YAML config block that no schema declares: a whole ``serve run`` config
    (with ``applications``), or a bare ``args`` mapping."""
    if not isinstance(config, dict):
        return []
    if "applications" not in config:
        return unknown_args(config, "")
    serve = serve_schema_keys()
    unknown = [key for key in config if key not in serve["top"]]
    unknown += [
        f"http_options.{key}"
        for key in config.get("http_options") or {}
        if key not in serve["http_options"]
    ]
    for app in config["applications"] or []:
        unknown += [f"applications[].{key}" for key in app if key not in serve["application"]]
        unknown += unknown_args(app.get("args") or {}, "args.")
    return unknown


def unknown_args(args: dict[str, object], prefix: str) -> list[str]:
    keys = app_arg_keys()
    unknown = [prefix + key for key in args if key not in keys["args"]]
    for role in ("prefill", "decode"):
        section = args.get(role) or {}
        unknown += [f"{prefix}{role}.{key}" for key in section if key not in keys["role"]]
    autoscaling = args.get("autoscaling") or {}
    unknown += [
        f"{prefix}autoscaling.{key}" for key in autoscaling if key not in keys["autoscaling"]
    ]
    return unknown


def test_every_key_of_a_yaml_block_exists() -> None:
    problems = [
        f"{doc}:{line}: {key}"
        for doc, line, body in fenced_blocks("yaml")
        for key in unknown_config_keys(yaml.safe_load(body))
    ]
    assert not problems, report("config keys", problems)


def arg_table_keys() -> Iterator[tuple[str, int, str]]:
    """The keys in the first column of each ``| arg | what |`` table (the serve config's)."""
    for path in DOCS:
        in_table = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("| arg |"):
                in_table = True
            elif not line.startswith("|"):
                in_table = False
            elif in_table and not cells[0].startswith("---"):
                for key in re.findall(r"`([a-z_*]+)`", cells[0]):
                    yield str(path.relative_to(ROOT)), number, key


def app_key_exists(key: str) -> bool:
    keys = app_arg_keys()["args"]
    pattern = re.compile(re.escape(key).replace(r"\*", ".*") + "$")
    return any(pattern.match(name) for name in keys)


def test_every_serve_arg_in_a_table_exists() -> None:
    found = list(arg_table_keys())
    assert found, "no `| arg | what |` table found: did configuration.md change its layout?"
    problems = missing(iter(found), app_key_exists)
    assert not problems, report("serve config args", problems)


# ---- metrics -------------------------------------------------------------------------------

METRIC = re.compile(r"\broundgate_[a-z0-9_]*[a-z0-9]")


@cache
def metric_names() -> frozenset[str]:
    """Every series name the rank and the ingress export: families and their samples
    (``_total``, ``_bucket``, ``_sum``, ``_count``)."""
    from roundgate.actors.telemetry.metrics import RankMetricSet, RequestMetricSet

    names: set[str] = set()
    for metric_set in (RankMetricSet(), RequestMetricSet()):
        for family in metric_set.registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            # A labelled family has no samples until a label set is used: name them all.
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + end for end in ("_bucket", "_sum", "_count"))
    return frozenset(names)


def family_table_series() -> Iterator[tuple[str, int, str]]:
    """operations.md's metric families, named without the prefix in the table's series column
    (what is in parentheses is a label or a note)."""
    doc = "docs/operations.md"
    in_table = False
    for number, line in enumerate((ROOT / doc).read_text().splitlines(), 1):
        if line.startswith("| family | series |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("| ---"):
            series = line.strip().strip("|").split("|")[1]
            series = re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\([^()]*\)[^()]*\)", "", series))
            for name in re.findall(r"`([a-z_]+)`", series):
                yield doc, number, f"roundgate_{name}"


def test_every_metric_the_docs_name_is_defined() -> None:
    found = [
        (doc, line, match.group(0))
        for doc, line, text in doc_lines()
        for match in METRIC.finditer(text)
        if not text[match.end() :].startswith(("(", "*"))  # a PromQL/regex prefix
    ]
    table = list(family_table_series())
    assert table, "operations.md's `| family | series |` table not found"
    problems = missing(iter(found + table), metric_names().__contains__)
    assert not problems, report("metrics", problems)


# ---- HTTP routes ---------------------------------------------------------------------------

# `POST /v1/x`, `GET`/`DELETE /v1/x/{id}`, a bare `/health`, or a local URL's path.
ROUTE = re.compile(
    r"`(?:(?:GET|POST|DELETE|PUT|PATCH)`?(?:/`(?:GET|POST|DELETE|PUT|PATCH))? )?"
    r"(/[A-Za-z0-9_./{}-]*)`"
    r"|https?://(?:127\.0\.0\.1|localhost)(?::\d+)?(/[A-Za-z0-9_./{}-]*)"
)


@cache
def app_routes() -> tuple[str, ...]:
    """The paths registered on the FastAPI app (the OpenAPI document's, and FastAPI's own such
    as ``/openapi.json``), each ``{param}`` as ``{}``."""
    import roundgate.deployment.app  # noqa: F401  (registers the routes)
    from roundgate.deployment.openai.api import api

    paths = [*api.openapi()["paths"], *(getattr(route, "path", None) for route in api.routes)]
    return tuple(re.sub(r"\{[^}]*\}", "{}", path) for path in paths if path)


def route_exists(path: str) -> bool:
    path = re.sub(r"\{[^}]*\}", "{}", path)
    if path.endswith("/..."):  # a family: `/v1/...`
        return any(route.startswith(path[:-3]) for route in app_routes())
    return path in app_routes()


def doc_routes() -> Iterator[tuple[str, int, str]]:
    for doc, line, text in doc_lines():
        for match in ROUTE.finditer(text):
            path = match.group(1) or match.group(2)
            if not path or path == "/" or path.startswith(FILESYSTEM_ROOTS):
                continue
            if match.group(2) is not None and path in ("/v1", "/v1/"):  # an OpenAI base URL
                continue
            yield doc, line, path


def test_every_route_the_docs_name_is_served() -> None:
    problems = missing(doc_routes(), route_exists)
    assert not problems, report("HTTP routes", problems)


# ---- repository paths and module names -----------------------------------------------------

# A root-relative path; `{a,b}`, `*` and a capitalised placeholder (`seedS`, `DIR`) are globs.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:%s)/(?:[\w./*-]|\{[\w,.-]*\})*(?:\w|\}|\*))" % "|".join(ROOT_DIRS)  # noqa: UP031
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
WHOLE_LINK = re.compile(r"\[[^\]]*\]\([^)]*\)")  # checked as a link, from its doc's folder
MODULE = re.compile(r"(?<![\w./-])(roundgate(?:\.\w+)+)")
RUN_MODULE = re.compile(r"python -m ([\w.]+)")
# A module by its pre-package name (`deployment.app`, `sim.cost_fit:fit`): it must be roundgate's.
BARE_MODULE = re.compile(r"`(?:%s)\.[a-z_]\w*(?:\.\w+)*(?=[`:])" % "|".join(PACKAGES))  # noqa: UP031
FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".md", ".sh", ".toml", ".txt", ".png", ".log")


def repo_paths() -> Iterator[tuple[str, int, str]]:
    """Root-relative paths the docs name (``actors/x.py``, ``deployment/configs/``), and each
    Markdown link's target as a path from the repository root."""
    for doc, line, text in doc_lines():
        for match in REPO_PATH.finditer(WHOLE_LINK.sub("", text)):
            yield doc, line, match.group(1)
        for match in LINK.finditer(text):
            target = match.group(1).split("#")[0]
            if target and "://" not in target and not target.startswith("mailto:"):
                path = (ROOT / doc).parent / target
                yield doc, line, str(path.resolve().relative_to(ROOT))


def path_exists(path: str) -> bool:
    """The path is in the repository; a pattern matches something there for each of its
    ``{a,b}`` alternatives."""
    if path in FOREIGN_PATHS:
        return True
    return all(matches(pattern) for pattern in expand_braces(path))


def matches(pattern: str) -> bool:
    if (ROOT / pattern).exists():
        return True
    pattern = re.sub(r"(?<=[a-z_])[A-Z]+\b|\b[A-Z]+\b", "*", pattern)
    return "*" in pattern and any(ROOT.glob(pattern))


def expand_braces(path: str) -> list[str]:
    """``live_{below,past}.json`` as ``live_below.json`` and ``live_past.json``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    heads = (
        path[: match.start()] + part + path[match.end() :] for part in match.group(1).split(",")
    )
    return [full for head in heads for full in expand_braces(head)]


def test_every_repo_path_the_docs_name_exists() -> None:
    problems = missing(repo_paths(), path_exists)
    assert not problems, report("paths", problems)


@cache
def logger_names() -> frozenset[str]:
    """The ``logging.getLogger("roundgate....")`` names the code uses: a doc may name one."""
    names: set[str] = set()
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r"getLogger\(\"(roundgate[\w.]*)\"\)", path.read_text()))
    return frozenset(names)


def module_exists(name: str) -> bool:
    """``roundgate.<folder>...`` resolves to a module or package in the repository (a trailing
    attribute, ``roundgate.deployment.app.build_app``, is allowed), or is a logger's name."""
    if name in logger_names():
        return True
    parts = name.split(".")[1:]
    if not parts or parts[0] not in PACKAGES:
        return False
    path = ROOT.joinpath(*parts)
    if path.with_suffix(".py").is_file() or path.is_dir():
        return True
    # One trailing attribute of a module: ``roundgate.deployment.app.build_app``.
    return len(parts) > 1 and ROOT.joinpath(*parts[:-1]).with_suffix(".py").is_file()


def doc_modules() -> Iterator[tuple[str, int, str]]:
    for doc, line, text in doc_lines():
        for match in MODULE.finditer(text):
            yield doc, line, match.group(1).rstrip(".")
        for match in RUN_MODULE.finditer(text):  # `python -m x`: x must be roundgate's name
            if match.group(1).split(".")[0] in PACKAGES:
                yield doc, line, match.group(1)
        for match in BARE_MODULE.finditer(text):
            if not match.group(0).endswith(FILE_SUFFIXES):
                yield doc, line, match.group(0)[1:]


def test_every_module_the_docs_name_exists() -> None:
    problems = missing(doc_modules(), module_exists)
    assert not problems, report("modules", problems)


@pytest.mark.parametrize(
    ("check", "name"),
    [
        (flag_exists, "--dp-size"),
        (flag_exists, "--no-enable-prefix-caching"),
        (flag_exists, "--[no-]enable-prefix-caching"),
        (app_key_exists, "elastic_dp"),
        (app_key_exists, "max_grammar_*"),
        (route_exists, "/v1/responses/{id}/cancel"),
        (route_exists, "/v1/..."),
        (module_exists, "roundgate.deployment.app"),
        (module_exists, "roundgate.deployment.app.build_app"),
        (path_exists, "deployment/configs/local.yaml"),
    ],
)
def test_the_checks_accept_what_exists(check: Callable[[str], bool], name: str) -> None:
    assert check(name)


@pytest.mark.parametrize(
    ("check", "name"),
    [
        (flag_exists, "--no-such-flag"),
        (app_key_exists, "no_such_key"),
        (route_exists, "/v1/no-such-route"),
        (module_exists, "roundgate.deployment.no_such_module"),
        (module_exists, "deployment.app"),
        (lambda name: not list(BARE_MODULE.finditer(name)), "`sim.cost_fit`"),
        (path_exists, "actors/no_such_module.py"),
        (lambda name: name in metric_names(), "roundgate_no_such_series_total"),
    ],
)
def test_the_checks_refuse_what_does_not(check: Callable[[str], bool], name: str) -> None:
    assert not check(name)
