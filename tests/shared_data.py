"""Where the tests find data: the repo's own small copies, and ``../shared`` when present.

A fresh clone has no ``../shared``, so every test that reads data runs on what the repo ships
(``tests/data/``) and only the extra cases over ``../shared``'s larger, real files skip.
``ROUNDGATE_SHARED`` moves the folder; point it at a missing path to run as a fresh clone:
``ROUNDGATE_SHARED=/nonexistent pytest tests/test_nccl_tests.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED = Path(os.environ.get("ROUNDGATE_SHARED", REPO.parent / "shared"))


def shared_dir(name: str) -> Path | None:
    """``../shared/<name>`` when it is there, else None."""
    path = SHARED / name
    return path if path.is_dir() else None
