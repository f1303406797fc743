"""nccl-tests parser and verdict, table-driven over the repo's samples (tests/data/nccl-tests,
written here) and, when present, the real outputs in ../shared."""

from __future__ import annotations

import pytest
from nccl_samples import (
    EXPECTED,
    REPO_SAMPLES,
    SHARED_SAMPLES,
    VERDICTS,
    cases,
    needs_shared,
    read,
)

from roundgate.k8s.tools.nccl_tests import check_fabric, parse, parse_text
from roundgate.nccl_log.text import strip_prefix


def test_every_repo_sample_is_in_the_table() -> None:
    names = sorted(f"repo:{p.name}" for p in REPO_SAMPLES.glob("*.txt"))
    assert names == sorted(k for k in EXPECTED if k.startswith("repo:"))
    assert len(names) >= 4


@needs_shared
def test_every_shared_sample_is_in_the_table() -> None:
    assert SHARED_SAMPLES is not None
    names = sorted(f"shared:{p.name}" for p in SHARED_SAMPLES.glob("sample_*.txt"))
    assert names == sorted(k for k in EXPECTED if k.startswith("shared:"))


@pytest.mark.parametrize("key", cases(*sorted(EXPECTED)))
def test_parses_sample(key: str) -> None:
    collective, ranks, num_sizes, empty, first, last, avg, wrong = EXPECTED[key]
    result = parse(read(key))
    assert result.collective == collective
    assert result.num_ranks == ranks
    assert len(result.sizes) == num_sizes
    assert result.num_empty_rows == empty
    assert (result.sizes[0].num_bytes, result.sizes[-1].num_bytes) == (first, last)
    assert all(s.num_bytes > 0 for s in result.sizes)
    assert result.avg_busbw_gbps == avg
    assert result.has_footer == (avg is not None)
    assert sum(s.num_wrong or 0 for s in result.sizes) == wrong
    if avg is not None:
        # The footer is nccl-tests' mean over every printed busbw, size-0 rows included.
        assert result.mean_busbw_gbps == pytest.approx(avg, abs=0.005)


@pytest.mark.parametrize("key", cases(*sorted(VERDICTS)))
def test_verdict_on_sample(key: str) -> None:
    min_busbw, max_latency, ok, phrase = VERDICTS[key]
    verdict = check_fabric(parse(read(key)), min_busbw, max_small_latency_us=max_latency)
    assert verdict.ok == ok, verdict.summary()
    assert phrase in verdict.summary()


@pytest.mark.parametrize(
    ("key", "phrase"),
    cases(
        ("repo:allreduce_8gpu_wrong.txt", "1736570 wrong elements at 3 sizes"),
        ("shared:sample_6.txt", "3935945 wrong elements at 6 sizes"),
    ),
)
def test_corrupted_sample_fails_for_every_reason(key: str, phrase: str) -> None:
    verdict = check_fabric(parse(read(key)), 1.0, expected_ranks=EXPECTED[key][1])
    assert not verdict.ok
    assert any(phrase in r for r in verdict.reasons)
    assert any("footer" in r for r in verdict.reasons)
    assert not any("ranks reported" in r for r in verdict.reasons)


@pytest.mark.parametrize(
    ("key", "kwargs", "phrase"),
    cases(
        (
            "repo:allgather_4gpu_ok.txt",
            {"min_busbw_gbps": 110.0},
            "busbw 105.91 GB/s at 268435456 B is below",
        ),
        (
            "repo:allgather_4gpu_ok.txt",
            {"min_busbw_gbps": 1.0, "expected_ranks": 8},
            "4 ranks reported, expected 8",
        ),
        (
            "repo:allgather_4gpu_ok.txt",
            {"min_busbw_gbps": 1.0, "max_small_latency_us": 5.0},
            "latency 9.2 us is above",
        ),
        (
            "repo:allgather_4gpu_ok.txt",
            {"min_busbw_gbps": 1.0, "exit_code": 3},
            "exited with code 3",
        ),
        (
            "shared:sample_1.txt",
            {"min_busbw_gbps": 40.0},
            "busbw 36.67 GB/s at 1073741824 B is below",
        ),
        (
            "shared:sample_1.txt",
            {"min_busbw_gbps": 1.0, "expected_ranks": 8},
            "2 ranks reported, expected 8",
        ),
        (
            "shared:sample_1.txt",
            {"min_busbw_gbps": 1.0, "max_small_latency_us": 10.0},
            "latency 14.4 us is above",
        ),
        ("shared:sample_1.txt", {"min_busbw_gbps": 1.0, "exit_code": 3}, "exited with code 3"),
    ),
)
def test_verdict_reasons(key: str, kwargs: dict, phrase: str) -> None:
    verdict = check_fabric(parse(read(key)), **kwargs)
    assert not verdict.ok
    assert phrase in verdict.summary()


@pytest.mark.parametrize("key", cases("repo:allgather_4gpu_ok.txt", "shared:sample_1.txt"))
def test_launcher_prefixes_and_interleaved_nccl_lines_are_ignored(key: str) -> None:
    plain = read(key)
    noisy = []
    for index, line in enumerate(plain.splitlines()):
        noisy.append(f"[1,0]<stdout>:{line}")
        if index % 5 == 0:
            noisy.append(
                f"[1,1]<stdout>:host-1:1415:1520 [1] NCCL INFO Channel {index:02d}/0 : 1[1]"
            )
    noisy.append("  3: host-3:99:99 [3] NCCL WARN late line from another rank")
    assert parse_text("\n".join(noisy)) == parse_text(plain)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[1,0]<stdout>:#  Rank  0", "#  Rank  0"),
        ("[12,3]<stderr>:NCCL INFO x", "NCCL INFO x"),
        ("0: # nThread 1", "# nThread 1"),
        ("          32             4     float", "          32             4     float"),
    ],
)
def test_strip_prefix(line: str, expected: str) -> None:
    assert strip_prefix(line) == expected


HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
)
ROW = "        1024           256     float    none      -1    14.44    0.07    0.04      0    14.49    0.07    0.04      0\n"  # noqa: E501


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("just chatter\n", "no nccl-tests result table found"),
        (HEADER + ROW.replace("  0\n", "\n"), "line 2: expected 13 fields"),
        (HEADER + ROW.replace("0.04", "fast", 1), "line 2: column oop_busbw is not a number"),
        (HEADER + ROW + HEADER + ROW, "line 3: a second result table"),
        (HEADER.replace("#wrong", "#wrong  i_min", 1) + ROW, "per-iteration columns"),
    ],
)
def test_malformed_input_names_the_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_text(text)


def test_na_wrong_means_unvalidated() -> None:
    result = parse_text(
        HEADER + ROW.replace("  0    14.49", "N/A    14.49").replace("0\n", "N/A\n")
    )
    assert result.sizes[0].out_of_place.num_wrong is None
    assert result.sizes[0].num_wrong is None
    verdict = check_fabric(result, 0.01, require_footer=False)
    assert "validation was off" in verdict.summary()
    assert check_fabric(result, 0.01, require_footer=False, require_validation=False).ok


def test_wrong_counts_in_exponent_form() -> None:
    result = parse_text(HEADER + ROW.replace("  0    14.49", "1.23457e+06    14.49"))
    assert result.sizes[0].out_of_place.num_wrong == 1234570
