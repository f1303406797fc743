"""Reader for the text table that every nccl-tests ``*_perf`` binary prints.

The layout (nccl-tests >= 2.13) is 13 whitespace-separated fields per row::

    size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
                                 out-of-place              in-place

Real logs are noisier than the table: launchers prefix every line (``[1,0]<stdout>:`` from
``mpirun --tag-output``, ``0:`` from ``srun -l``), NCCL INFO/WARN lines and script chatter land
between rows, all_gather prints rows of size 0 for tiny sizes, and ``-c 0`` prints ``N/A`` in
the #wrong columns. Anything that is not a row, a header or a footer is skipped; a line that
starts like a row inside the table but does not parse is an error that names the line.
"""

from __future__ import annotations

import re

from roundgate.nccl_log.result import (
    Measurement,
    NcclTestsResult,
    RankInfo,
    RunParams,
    SizeResult,
)

_HALF_FIELDS = ("time", "algbw", "busbw", "wrong")
ROW_FIELDS = (
    "size",
    "count",
    "type",
    "redop",
    "root",
    *(f"oop_{name}" for name in _HALF_FIELDS),
    *(f"ip_{name}" for name in _HALF_FIELDS),
)

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:\s)")
_HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s+(?:cpu)?time\s+algbw\s+busbw")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s")
_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_NCCL_VERSION = re.compile(r"NCCL version (\d[\w.+-]*)")
_RANK = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_PARAMS = re.compile(
    r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)\s.*?"
    r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)\s.*?validation:\s*(\d+)\s+graph:\s*(\d+)"
)
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_ERROR = re.compile(r"^#\s*error:\s*(.*?)\s*$")


def strip_prefix(line: str) -> str:
    """Drop one launcher prefix (``[1,0]<stdout>:`` or ``0:``) and the line ending."""
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1)


def parse_text(text: str) -> NcclTestsResult:
    """Parse one run's stdout; ``ValueError`` names the line of anything unreadable."""
    state = _TextState()
    for number, raw in enumerate(text.splitlines(), start=1):
        state.feed(number, strip_prefix(raw))
    return state.finish()


class _TextState:
    """Line-by-line accumulator; ``feed`` classifies one line, ``finish`` builds the result."""

    def __init__(self) -> None:
        self.sizes: list[SizeResult] = []
        self.ranks: list[RankInfo] = []
        self.params: RunParams | None = None
        self.collective: str | None = None
        self.nccl_tests_version: str | None = None
        self.nccl_version: str | None = None
        self.num_empty_rows = 0
        self.out_of_bounds: int | None = None
        self.avg_busbw: float | None = None
        self.errors: list[str] = []
        self.header_line: int | None = None
        self.in_table = False

    def feed(self, number: int, line: str) -> None:
        if self.in_table and _ROW_START.match(line):
            self._add_row(number, line)
        elif _HEADER.match(line):
            self._start_table(number, line)
        elif match := _OUT_OF_BOUNDS.match(line):
            self.out_of_bounds = int(match.group(1))
            self.in_table = False
        elif match := _AVG_BUSBW.match(line):
            self.avg_busbw = _number(match.group(1), number, "Avg bus bandwidth")
            self.in_table = False
        elif match := _RANK.match(line):
            rank, group, pid, host, device, bus, name = match.groups()
            self.ranks.append(
                RankInfo(int(rank), int(group), int(pid), host, int(device), bus, name)
            )
        elif match := _PARAMS.match(line):
            values = [int(v) for v in match.groups()]
            self.params = RunParams(*values[:6], validation=bool(values[6]), graph=values[7])
        elif match := _VERSION.match(line):
            self.nccl_tests_version = match.group(1)
        elif match := _STARTING.match(line):
            self.collective = match.group(1)
        elif match := _ERROR.match(line):
            if match.group(1):
                self.errors.append(match.group(1))
        elif self.nccl_version is None and (match := _NCCL_VERSION.search(line)):
            self.nccl_version = match.group(1)

    def _start_table(self, number: int, line: str) -> None:
        if "i_min" in line or "i_p99" in line:
            raise ValueError(
                f"line {number}: per-iteration columns are not supported; rerun without the "
                f"per-iteration report: {line.strip()!r}"
            )
        if self.header_line is not None:
            raise ValueError(
                f"line {number}: a second result table starts here (the first at line "
                f"{self.header_line}); the input holds more than one run, e.g. a launcher "
                "started independent single-process runs instead of one multi-rank job"
            )
        self.header_line = number
        self.in_table = True

    def _add_row(self, number: int, line: str) -> None:
        fields = line.split()
        if len(fields) != len(ROW_FIELDS):
            raise ValueError(
                f"line {number}: expected {len(ROW_FIELDS)} fields (size count type redop root, "
                f"then time algbw busbw #wrong out-of-place and in-place), got {len(fields)}: "
                f"{line.strip()!r}"
            )
        values = dict(zip(ROW_FIELDS, fields, strict=True))
        num_bytes = _integer(values["size"], number, "size")
        if num_bytes == 0:
            self.num_empty_rows += 1
            return
        halves = [
            Measurement(
                time_us=_number(values[f"{half}_time"], number, f"{half}_time"),
                algbw_gbps=_number(values[f"{half}_algbw"], number, f"{half}_algbw"),
                busbw_gbps=_number(values[f"{half}_busbw"], number, f"{half}_busbw"),
                num_wrong=_wrong(values[f"{half}_wrong"], number, f"{half}_wrong"),
            )
            for half in ("oop", "ip")
        ]
        self.sizes.append(
            SizeResult(
                num_bytes=num_bytes,
                count=_integer(values["count"], number, "count"),
                dtype=values["type"],
                redop=values["redop"],
                root=_integer(values["root"], number, "root"),
                out_of_place=halves[0],
                in_place=halves[1],
            )
        )

    def finish(self) -> NcclTestsResult:
        if self.header_line is None:
            raise ValueError(
                "no nccl-tests result table found: no '#  size  count  type  redop  root  time "
                "...' header line in the input"
            )
        return NcclTestsResult(
            sizes=tuple(self.sizes),
            ranks=tuple(self.ranks),
            params=self.params,
            collective=self.collective,
            nccl_tests_version=self.nccl_tests_version,
            nccl_version=self.nccl_version,
            num_empty_rows=self.num_empty_rows,
            out_of_bounds=self.out_of_bounds,
            avg_busbw_gbps=self.avg_busbw,
            errors=tuple(self.errors),
        )


def _integer(text: str, number: int, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"line {number}: column {column} is not an integer: {text!r}") from None


def _number(text: str, number: int, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"line {number}: column {column} is not a number: {text!r}") from None


def _wrong(text: str, number: int, column: str) -> int | None:
    # Printed with %g, so counts of a million and more arrive as "1.23457e+06".
    if text == "N/A":
        return None
    value = _number(text, number, column)
    if value < 0 or value != value:
        raise ValueError(f"line {number}: column {column} is not a count: {text!r}")
    return round(value)
