"""The ``all_gather_perf`` command line for one node's GPUs (built here, run by the preflight Job).

One process drives every GPU of the node (``-g N``), which is the shape of one DP group per pod:
no MPI launcher is needed and the result has exactly N ranks.
"""

from __future__ import annotations


def all_gather_command(
    num_gpus: int,
    *,
    min_bytes: str = "8",
    max_bytes: str = "1G",
    step_factor: int = 2,
    iters: int = 20,
    warmup_iters: int = 5,
    validate: bool = True,
    json_path: str | None = None,
    binary: str = "all_gather_perf",
) -> list[str]:
    """argv for ``all_gather_perf``; sizes take nccl-tests suffixes (``8``, ``1K``, ``1G``).

    >>> all_gather_command(8)[:9]
    ['all_gather_perf', '-b', '8', '-e', '1G', '-f', '2', '-g', '8']
    """
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    if step_factor < 2:
        raise ValueError(f"step_factor must be >= 2, got {step_factor}")
    argv = [binary, "-b", min_bytes, "-e", max_bytes, "-f", str(step_factor), "-g", str(num_gpus)]
    argv += ["-n", str(iters), "-w", str(warmup_iters), "-c", "1" if validate else "0"]
    if json_path is not None:
        argv += ["-J", json_path]  # nccl-tests >= 2.17.3
    return argv
