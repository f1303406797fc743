"""The ``vllm-lb`` router against vLLM's balancer rules (sim/vllm_lb.py): least
``4 x waiting + running`` on the last refreshed counts, each API server bumping its own view
by the server count and scanning from its own engine; the one-server router is the one the
gb200-dsv3 preset was fitted with."""

from __future__ import annotations

import pytest

from roundgate.sim.router import Router
from roundgate.sim.vllm_lb import VLLM_LB_REFRESH_S, VllmBalancer


class Scripted:
    """Stands in for the balancer's RNG: the API server each request reaches, in order."""

    def __init__(self, servers: list[int]) -> None:
        self.servers = iter(servers)

    def randrange(self, n: int) -> int:
        server = next(self.servers)
        assert 0 <= server < n
        return server


def routes(balancer: VllmBalancer, running: list[int], sends: int) -> list[int]:
    waiting = [0] * len(running)
    return [balancer.route(0.01 * i, waiting, running) for i in range(sends)]


def test_one_server_spreads_a_window_by_its_bumps_and_refreshes_on_the_tick() -> None:
    balancer = VllmBalancer(4)
    # 9 < 10: rank 0 first; each send adds 4 to its rank's score, so the window rotates.
    assert routes(balancer, [9, 10, 10, 10], 8) == [0, 1, 2, 3, 0, 1, 2, 3]
    # A refresh drops the bumps: only the reported counts speak (rank 3 is now the least).
    assert balancer.route(VLLM_LB_REFRESH_S, [1, 1, 1, 0], [10, 10, 10, 10]) == 3
    # Before the next tick the reported counts are not read again.
    assert balancer.route(VLLM_LB_REFRESH_S + 0.05, [0, 0, 0, 9], [0, 0, 0, 0]) == 0


def test_api_servers_herd_on_the_least_loaded_engine_between_refreshes() -> None:
    # Four servers, one send each, then again: no server sees the others' sends, so all
    # four first sends land on rank 0; each server's second send leaves its own bumped view
    # for the first engine of its own scan among the tied ones.
    balancer = VllmBalancer(4, api_servers=4)
    balancer._rng = Scripted([0, 1, 2, 3, 0, 1, 2, 3])  # type: ignore[assignment]
    assert routes(balancer, [9, 10, 10, 10], 8) == [0, 0, 0, 0, 1, 1, 2, 3]


def test_each_api_server_bumps_by_the_server_count() -> None:
    # One server's send stands for every server's: +4 waiting, i.e. +16 on the score.
    balancer = VllmBalancer(2, api_servers=4)
    balancer._rng = Scripted([0, 0, 0])  # type: ignore[assignment]
    assert routes(balancer, [0, 15], 3) == [0, 1, 0]


def test_ties_start_at_each_servers_own_engine() -> None:
    balancer = VllmBalancer(8, api_servers=4)
    balancer._rng = Scripted([0, 1, 2, 3])  # type: ignore[assignment]
    assert routes(balancer, [5] * 8, 4) == [0, 2, 4, 6]


def test_router_default_is_the_one_server_balancer_and_seeded() -> None:
    one = Router("vllm-lb", 4, seed=7)
    assert one.vllm_lb is not None and one.vllm_lb.api_servers == 1
    runs = []
    for _ in range(2):
        router = Router("vllm-lb", 4, seed=7, api_servers=4)
        runs.append([router.route_stale(0.01 * i, [0] * 4, [3, 1, 2, 1]) for i in range(12)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("servers", [0, -1, 1.5, True])
def test_bad_server_counts_are_refused_naming_the_flag(servers) -> None:
    with pytest.raises(ValueError, match="--lb-api-servers"):
        VllmBalancer(4, api_servers=servers)


def test_api_servers_belong_to_vllm_lb_only() -> None:
    with pytest.raises(ValueError, match="--lb-api-servers"):
        Router("least-loaded", 4, api_servers=2)
    with pytest.raises(ValueError, match="vllm-lb"):
        Router("least-loaded", 4).route_stale(0.0, [0] * 4, [0] * 4)
