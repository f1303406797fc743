"""``python -m k8s.tools.nccl_tests FILE --min-busbw X``: one line of verdict, non-zero if bad.

Exit codes: 0 the fabric passed, 1 it failed a check, 2 the input could not be read or parsed.
``FILE`` may be ``-`` to read stdin, so a Job can pipe the benchmark straight in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roundgate.k8s.tools.nccl_tests import check_fabric, parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k8s.tools.nccl_tests",
        description="Check an nccl-tests run (text or -J JSON) against fabric thresholds.",
    )
    parser.add_argument("file", help="nccl-tests output file, or - for stdin")
    parser.add_argument(
        "--min-busbw", type=float, required=True, help="GB/s required at the largest size"
    )
    parser.add_argument("--ranks", type=int, default=None, help="expected number of ranks")
    parser.add_argument(
        "--max-latency-us", type=float, default=None, help="upper bound on small-size latency"
    )
    parser.add_argument(
        "--exit-code", type=int, default=None, help="the benchmark's exit code, when known"
    )
    parser.add_argument(
        "--allow-no-footer",
        action="store_true",
        help="accept output that stops before the summary footer",
    )
    args = parser.parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        result = parse(text)
    except (OSError, ValueError) as exc:
        print(f"ERROR: {args.file}: {exc}")
        return 2
    verdict = check_fabric(
        result,
        args.min_busbw,
        expected_ranks=args.ranks,
        max_small_latency_us=args.max_latency_us,
        exit_code=args.exit_code,
        require_footer=not args.allow_no_footer,
    )
    print(verdict.summary())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
