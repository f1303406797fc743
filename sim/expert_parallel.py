"""A MoE round priced by its most-loaded rank: expert placement and EPLB in the simulator.

Under attention DP with expert parallelism every rank computes the routed experts it holds
for the tokens of *every* rank, and all ranks meet again at the combine: a MoE layer ends when
its most-loaded rank does. The cost presets price a round as if every rank carried the mean
expert load; this module says how much longer the expert part takes under a skewed
popularity (``roundgate.sim.expert_load``) and a placement of the experts over the ranks:

- ``static``: contiguous blocks, one copy of each expert (expert ``e`` on rank ``e // n``);
- ``eplb``: every ``interval_rounds`` busy rounds, re-place each layer from the loads measured
  over the last ``window_rounds`` busy rounds (DeepSeek's replicate-and-pack, with
  ``num_redundant_experts`` extra slots for copies of hot experts), optionally pausing the
  group ``rebalance_ms`` for the weight moves.

The placement arithmetic is ``roundgate.kernels.moe.eplb``'s, the same code the engine runs.

Pricing: a layer's imbalance is its max rank load over its mean rank load (``1 /
balancedness``); a round's is the mean over the simulated layers (the layers run one after
another, so their expert times add). The routed-expert share ``compute_share`` of the slowest
rank's forward stretches by that factor; attention, dispatch/combine, the gather and the
extend overhead do not. With uniform popularity every factor is 1 and the round costs what
the preset says, to the bit.

Loads are the popularity's expected tokens (``tokens x top_k x share``): no per-token sampling
noise, so the imbalance comes from skew and placement alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from roundgate.kernels.moe.eplb import (
    Layout,
    Placement,
    balancedness,
    initial_placement,
    rank_loads,
    replace_layer,
)
from roundgate.sim.expert_load import ExpertPopularity, PopularitySpec

PLACEMENTS = ("none", "static", "eplb")
# A stretch this close to 1 is the rounding of equal sums (every rank the same load), not
# imbalance: priced as none, so a balanced round costs exactly the preset's price.
_EVEN = 1e-12


@dataclass(frozen=True)
class MoeShape:
    """What the imbalance model needs of a MoE model: its routed experts and their use."""

    num_experts: int  # routed experts per MoE layer
    top_k: int  # experts each token is routed to
    num_moe_layers: int  # MoE layers in the model (the simulated ones sample these)


# DeepSeek-V3/R1: 256 routed experts, 8 per token, 58 of its 61 layers sparse.
DEEPSEEK_V3 = MoeShape(num_experts=256, top_k=8, num_moe_layers=58)
# The cost presets that price an attention-DP + expert-parallel MoE group, by ``--costs`` name.
# (gb200-qwen35-tep4 is one tensor-expert-parallel engine: no DP group to balance over.)
MOE_PRESETS: dict[str, MoeShape] = {"h100-dsv3": DEEPSEEK_V3, "gb200-dsv3": DEEPSEEK_V3}


@dataclass(frozen=True)
class ExpertSpec:
    """The expert-load model of one run: popularity, placement, and how the imbalance costs.

    Every refusal names the ``roundgate simulate`` flag that supplies the value.
    """

    placement: str  # "static" or "eplb" ("none" is no spec at all: mean-load pricing)
    dp_size: int
    shape: MoeShape = DEEPSEEK_V3
    num_redundant_experts: int = 0
    interval_rounds: int = 3000  # the engine's --eplb-interval-rounds default
    window_rounds: int = 1000  # the engine's --eplb-window-rounds default
    skew: float = 0.5
    drift: float = 0.005
    seed: int = 0
    # Share of a busy rank's forward in the routed experts' grouped GEMMs: an assumption for
    # DeepSeek-V3 decode under DeepEP, not a calibrated figure (docs: the expert-parallel page).
    compute_share: float = 0.4
    rebalance_ms: float = 0.0  # the group's pause for one rebalance's weight moves
    num_layers: int = 8  # MoE layers simulated, each with its own popularity

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS[1:]:
            raise ValueError(
                f"--expert-placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        checks = (
            ("--num-redundant-experts", self.num_redundant_experts, 0),
            ("--eplb-interval-rounds", self.interval_rounds, 1),
            ("--eplb-window-rounds", self.window_rounds, 1),
            ("--expert-layers", self.num_layers, 1),
        )
        for flag, value, least in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{flag} must be an integer >= {least}, got {value!r}")
        if self.window_rounds > self.interval_rounds:
            raise ValueError(
                f"--eplb-window-rounds ({self.window_rounds}) must be <= --eplb-interval-rounds "
                f"({self.interval_rounds}): a window measures one placement"
            )
        if self.placement == "static" and self.num_redundant_experts:
            raise ValueError(
                "--num-redundant-experts needs --expert-placement eplb (a static placement "
                "holds one copy of each expert)"
            )
        if not 0 <= self.compute_share <= 1:
            raise ValueError(f"--expert-compute-share must be in [0, 1], got {self.compute_share}")
        if not self.rebalance_ms >= 0:
            raise ValueError(f"--eplb-rebalance-ms must be >= 0, got {self.rebalance_ms}")
        slots = self.shape.num_experts + self.num_redundant_experts
        if self.dp_size < 1 or slots % self.dp_size:
            raise ValueError(
                f"--num-redundant-experts {self.num_redundant_experts}: {self.shape.num_experts} "
                f"experts + {self.num_redundant_experts} redundant = {slots} slots do not split "
                f"evenly over --dp-size {self.dp_size}"
            )
        self.popularity()  # refuses the skew and drift now, not when a run starts

    def layout(self) -> Layout:
        """The physical slots every simulated layer shares (one node: the global policy)."""
        return Layout(
            self.shape.num_experts,
            self.shape.num_experts + self.num_redundant_experts,
            self.dp_size,
        )

    def popularity(self) -> PopularitySpec:
        return PopularitySpec(
            self.shape.num_experts, self.num_layers, self.skew, self.drift, self.seed
        )


@dataclass(frozen=True)
class ExpertStats:
    """What a run's expert placement achieved, over its busy rounds."""

    placement: str
    num_redundant_experts: int
    rounds: int  # busy rounds priced
    mean_balancedness: float  # mean over rounds and layers of mean / max rank load
    mean_factor: float  # mean over rounds of the expert-time stretch (max / mean load)
    rebalances: int


class ExpertBalancer:
    """One run's expert load: the popularity, each layer's placement, EPLB's window.

    ``extra_ms`` is called once per busy round, in order; it advances the popularity and, for
    ``eplb``, re-places the layers at the end of every interval.
    """

    def __init__(self, spec: ExpertSpec) -> None:
        self.spec = spec
        self.layout = spec.layout()
        self.popularity = ExpertPopularity(spec.popularity())
        first = initial_placement(self.layout)
        self.placements: list[Placement] = [first] * spec.num_layers
        self._window = [[0.0] * spec.shape.num_experts for _ in range(spec.num_layers)]
        self._cached: tuple[float, float] | None = None  # (factor, balancedness) while unchanged
        self.rounds = 0
        self.rebalances = 0
        self._sum_balancedness = 0.0
        self._sum_factor = 0.0

    def imbalance(self) -> tuple[float, float]:
        """This round's ``(factor, balancedness)``: mean over layers of max/mean and of
        mean/max rank load. Scale-free, so the round's token count does not enter."""
        if self._cached is not None:
            return self._cached
        num_ranks = self.layout.num_ranks
        factor = balance = 0.0
        for placement, shares in zip(self.placements, self.popularity.shares(), strict=True):
            b = balancedness(rank_loads(placement, shares, num_ranks))
            factor += 1.0 / b
            balance += b
        layers = self.spec.num_layers
        result = (factor / layers, balance / layers)
        if not self.spec.drift:
            self._cached = result  # stays until a rebalance changes the placement
        return result

    def extra_ms(self, slowest_forward_ms: float, tokens: int) -> float:
        """What one busy round adds to the preset's price: the routed experts' stretch on the
        slowest rank's forward, plus the pause of a rebalance this round ends with."""
        spec = self.spec
        factor, balance = self.imbalance()
        self._sum_factor += factor
        self._sum_balancedness += balance
        self.rounds += 1
        extra = 0.0
        if factor - 1.0 > _EVEN:
            extra = spec.compute_share * slowest_forward_ms * (factor - 1.0)
        if spec.placement == "eplb":
            position = (self.rounds - 1) % spec.interval_rounds + 1
            if position > spec.interval_rounds - spec.window_rounds:
                self._measure(tokens * spec.shape.top_k)
            if position == spec.interval_rounds and self._rebalance():
                extra += spec.rebalance_ms
        self.popularity.advance()
        return extra

    def stats(self) -> ExpertStats:
        rounds = max(1, self.rounds)
        return ExpertStats(
            self.spec.placement,
            self.spec.num_redundant_experts,
            self.rounds,
            round(self._sum_balancedness / rounds, 6) if self.rounds else 1.0,
            round(self._sum_factor / rounds, 6) if self.rounds else 1.0,
            self.rebalances,
        )

    def _measure(self, routed: int) -> None:
        """Add this round's routed tokens per expert to the window's counts."""
        for counts, shares in zip(self._window, self.popularity.shares(), strict=True):
            for e, share in enumerate(shares):
                counts[e] += routed * share

    def _rebalance(self) -> bool:
        """Re-place every layer from its window's counts as the engine does
        (``eplb.replace_layer``: kept unless that evens the ranks by ``MIN_GAIN``); False when
        the window saw no tokens."""
        window = self._window
        self._window = [[0.0] * self.spec.shape.num_experts for _ in window]
        if not any(any(counts) for counts in window):
            return False
        self.placements = [
            replace_layer(old, counts, self.layout)
            for old, counts in zip(self.placements, window, strict=True)
        ]
        self._cached = None
        self.rebalances += 1
        return True
