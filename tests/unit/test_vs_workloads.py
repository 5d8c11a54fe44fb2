"""The interleaving of `benchmarks/_vs_workloads.py`: both servers called in turn (ABBA), bounded, counted right."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks._serving import CallResult, ServerProc
from benchmarks._vs_workloads import Pair, Server, histories, stats


class FakeServer(Server):
    """A server that answers at once and records who was called, with what."""

    def __init__(self, name: str, log: list[tuple[str, str, int]], prefilled: int) -> None:
        super().__init__(name, ServerProc(["true"], 1, Path("/dev/null")), agent_header=True,
                         extra_body={})
        self.log, self.prefilled = log, prefilled

    def call(self, client: httpx.Client, agent: str, messages: list[dict[str, str]], max_tokens: int) -> CallResult:
        self.log.append((self.name, agent, len(messages)))
        prompt = 10 * len(messages) + self.prefilled
        return CallResult(status=200, ttft_s=0.01, latency_s=0.02, text=f"{self.name} says hi", prompt_tokens=prompt,
                          cached_tokens=prompt - self.prefilled)

    def memory(self, client: httpx.Client) -> dict[str, Any]:
        return {}


def make_pair(deadline: float = 1e18) -> tuple[Pair, list[tuple[str, str, int]]]:
    log: list[tuple[str, str, int]] = []
    servers = [FakeServer("llama-server", log, prefilled=400), FakeServer("agentmem", log, prefilled=20)]
    return Pair(servers, httpx.Client(), max_tokens=8, deadline=deadline, settle_s=0.0), log


def test_each_agent_goes_to_both_servers_in_abba_order() -> None:
    pair, log = make_pair()
    hist = histories(4, 50, seed=0, names=["llama-server", "agentmem"])
    pair.phase("p", hist, list(hist["agentmem"]), "q?", reprefill_tokens=256)
    firsts = [log[i][0] for i in range(0, len(log), 2)]
    assert firsts == ["llama-server", "agentmem", "agentmem", "llama-server"], firsts
    assert [a for _, a, _ in log[0::2]] == [a for _, a, _ in log[1::2]]  # the same agent on both, step by step


def test_histories_grow_per_server_with_that_servers_reply() -> None:
    pair, log = make_pair()
    hist = histories(2, 50, seed=0, names=["llama-server", "agentmem"])
    ids = list(hist["agentmem"])
    pair.phase("first", hist, ids, "q0", reprefill_tokens=256)
    pair.phase("second", hist, ids, "q1", reprefill_tokens=256)
    assert hist["agentmem"][ids[0]][-1] == {"role": "assistant", "content": "agentmem says hi"}
    assert hist["llama-server"][ids[0]][-1]["content"] == "llama-server says hi"
    assert {n for _, _, n in log[-4:]} == {4}  # system, q0, reply, q1


def test_phase_stats_count_reprefills_and_ratio_inputs() -> None:
    pair, _ = make_pair()
    hist = histories(3, 50, seed=0, names=["llama-server", "agentmem"])
    out = pair.phase("p", hist, list(hist["agentmem"]), "q", reprefill_tokens=256)
    assert out["llama-server"]["reprefills"] == 3 and out["agentmem"]["reprefills"] == 0, out
    assert out["agentmem"]["prefilled_mean"] == 20.0
    assert out["load_start"] and out["load_end"] and pair.phases == [out]


def test_deadline_stops_both_servers_at_the_same_step() -> None:
    pair, log = make_pair(deadline=time.monotonic() - 1)
    hist = histories(3, 50, seed=0, names=["llama-server", "agentmem"])
    out = pair.phase("late", hist, list(hist["agentmem"]), "q", reprefill_tokens=256)
    assert log == [] and out["agentmem"]["calls"] == out["llama-server"]["calls"] == 0


@pytest.mark.parametrize("errors", [0, 2])
def test_stats_leave_failed_calls_out_of_the_percentiles(errors: int) -> None:
    ok = [CallResult(status=200, ttft_s=t, prompt_tokens=100, cached_tokens=90) for t in (0.1, 0.2, 0.3)]
    bad = [CallResult(status=500, ttft_s=9.0, error="boom")] * errors
    s = stats(ok + bad, 256)
    assert s["errors"] == errors and s["ttft_p50_s"] == 0.2 and s["ttft_first_s"] == 0.1
