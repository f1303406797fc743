"""No tracked file names a directory of one machine.

A report, script or test that records where one checkout lay (a home directory, the work
directory a session ran in, a scratch checkout under the temp directory) works only there and
tells a reader nothing: reports record repo-relative paths, scripts find their files from their
own location. This test reads every tracked text file (``git ls-files``) and names each
``file:line`` that holds such a path.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A path starts at a line's start or after a separator, never inside a URL or a longer path.
START = r"(?<![\w.~/-])"
# The brackets keep these patterns from matching their own source line.
HOME_OR_CHECKOUT = START + r"(?:[/]root[/]|[/]work[/]|[/]home[/][^/\s\"'`]+[/]|[/]Users[/])"


def tracked_files(root: Path) -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return [f for f in done.stdout.split("\0") if f]


def machine_path_pattern(files: list[str]) -> re.Pattern[str]:
    """Home and work directories anywhere; under the temp directory, only a checkout: a
    folder there holding one of this repo's top-level entries (``<tmp>/wt/deployment/...``).
    Scratch files under the temp directory (a report's ``--json``) are not checkouts."""
    tops = sorted({f.split("/", 1)[0] for f in files if "/" in f} | {".venv", ".git"})
    entries = "|".join(re.escape(t) for t in tops)
    tmp_checkout = START + r"[/]tmp[/](?:[^/\s\"'`]+[/])+?(?:" + entries + r")(?:[/\"'`\s]|$)"
    return re.compile(f"{HOME_OR_CHECKOUT}|{tmp_checkout}")


def machine_paths(root: Path, files: list[str], pattern: re.Pattern[str]) -> list[str]:
    """``file:line: text`` of each line of a tracked text file that names a machine's path."""
    found = []
    for name in files:
        path = root / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (images)
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


def test_no_tracked_file_names_a_machine_path() -> None:
    files = tracked_files(ROOT)
    found = machine_paths(ROOT, files, machine_path_pattern(files))
    assert not found, "paths of one machine in tracked files (use repo-relative ones):\n" + (
        "\n".join(found)
    )


@pytest.mark.parametrize(
    "line",
    [
        "fallback " + "/ro" + "ot/.venv/bin/python",
        'PYTHONPATH="/wo' + 'rk/main" python -m pytest',
        '"config": "/ho' + 'me/alice/roundgate/deployment/configs/local.yaml"',
        '"/Us' + 'ers/bob/src/x.py"',
        '"/tm' + 'p/wt16/deployment/cli.py",',
        "cd /tm" + "p/checkout/.venv && ls",
    ],
)
def test_a_planted_path_is_named_with_its_file_and_line(tmp_path: Path, line: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.json").write_text("{\n" + line + "\n}\n")
    pattern = machine_path_pattern(["docs/report.json", "deployment/cli.py"])
    found = machine_paths(tmp_path, ["docs/report.json"], pattern)
    assert len(found) == 1 and found[0].startswith("docs/report.json:2: "), found


@pytest.mark.parametrize(
    "line",
    [
        '"metrics_dir": "/tm' + 'p/live/below",',  # a scratch folder, not a checkout
        "ADD https://x.org/v1.tar.gz /tm" + "p/nccl-tests.tar.gz",
        "https://github.com/o/work/main/README.md",  # inside a URL
        '"json": "docs/bench/live_below.json"',
        "~/.cache/huggingface",
    ],
)
def test_paths_that_name_no_machine_pass(tmp_path: Path, line: str) -> None:
    (tmp_path / "notes.md").write_text(line + "\n")
    pattern = machine_path_pattern(["docs/report.json", "deployment/cli.py"])
    assert machine_paths(tmp_path, ["notes.md"], pattern) == []
