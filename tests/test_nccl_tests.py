"""nccl-tests parser and verdict, table-driven over the real outputs in ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.tools.nccl_tests import check_fabric, parse, parse_text
from nccl_log.text import strip_prefix

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "nccl-tests-samples"
needs_samples = pytest.mark.skipif(
    not SAMPLES.is_dir(),
    reason=f"nccl-tests samples not found at {SAMPLES} (shared/ must sit beside the repo)",
)

# name: (collective, ranks, sizes, empty rows, first B, last B, footer avg, total wrong)
EXPECTED = {
    "sample_1.txt": (None, 2, 26, 2, 32, 1 << 30, 12.5463, 0),
    "sample_2.txt": (None, 2, 24, 0, 1024, 8 << 30, 15.5188, 0),
    "sample_3.txt": (None, 16, 31, 0, 8, 8 << 30, 70.742, 0),
    "sample_4.txt": (None, 16, 5, 0, 1 << 30, 16 << 30, 467.089, 0),
    "sample_5.txt": (None, 0, 28, 4, 128, 16 << 30, 207.963, 0),
    "sample_6.txt": ("all_reduce_perf", 16, 28, 0, 1, 128 << 20, None, 3935945),
    "sample_7.txt": ("all_reduce_perf", 16, 24, 0, 1024, 8 << 30, 21.8363, 0),
}
# name: (min busbw GB/s, max small latency us, expected ok, a phrase the failure must contain)
VERDICTS = {
    "sample_1.txt": (30.0, 20.0, True, ""),
    "sample_2.txt": (30.0, 40.0, True, ""),
    "sample_3.txt": (300.0, 150.0, True, ""),
    "sample_4.txt": (450.0, None, True, ""),
    "sample_5.txt": (600.0, 20.0, True, ""),
    "sample_6.txt": (50.0, None, False, "wrong elements"),
    "sample_7.txt": (40.0, 100.0, True, ""),
}


def read(name: str) -> str:
    return (SAMPLES / name).read_text()


@needs_samples
def test_every_sample_is_in_the_table() -> None:
    assert sorted(p.name for p in SAMPLES.glob("sample_*.txt")) == sorted(EXPECTED)


@needs_samples
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parses_sample(name: str) -> None:
    collective, ranks, num_sizes, empty, first, last, avg, wrong = EXPECTED[name]
    result = parse(read(name))
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


@needs_samples
@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_verdict_on_sample(name: str) -> None:
    min_busbw, max_latency, ok, phrase = VERDICTS[name]
    verdict = check_fabric(parse(read(name)), min_busbw, max_small_latency_us=max_latency)
    assert verdict.ok == ok, verdict.summary()
    assert phrase in verdict.summary()


@needs_samples
def test_corrupted_sample_fails_for_every_reason() -> None:
    verdict = check_fabric(parse(read("sample_6.txt")), 1.0, expected_ranks=16)
    assert not verdict.ok
    assert any("3935945 wrong elements at 6 sizes" in r for r in verdict.reasons)
    assert any("footer" in r for r in verdict.reasons)


@needs_samples
@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"min_busbw_gbps": 40.0}, "busbw 36.67 GB/s at 1073741824 B is below"),
        ({"min_busbw_gbps": 1.0, "expected_ranks": 8}, "2 ranks reported, expected 8"),
        ({"min_busbw_gbps": 1.0, "max_small_latency_us": 10.0}, "latency 14.4 us is above"),
        ({"min_busbw_gbps": 1.0, "exit_code": 3}, "exited with code 3"),
    ],
)
def test_verdict_reasons(kwargs: dict, phrase: str) -> None:
    verdict = check_fabric(parse(read("sample_1.txt")), **kwargs)
    assert not verdict.ok
    assert phrase in verdict.summary()


@needs_samples
def test_launcher_prefixes_and_interleaved_nccl_lines_are_ignored() -> None:
    plain = read("sample_1.txt")
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
