"""The default park codecs follow the rule of docs/fidelity.md (issue #35).

`benchmarks/fidelity_real.py` parked agents of long multi-turn tool conversations
between every turn: 4-bit keys (`q4_0`) exceeded the rule's 0.01-nat mean KL per
reply token on both bundled models at every context length (0.041-0.130), while
`q8_0` keys (with f16, q8_0 or q4_0 values) stayed under it. A default that puts
keys in 4 bits would be a default the measurement refused.
"""

from __future__ import annotations

import math

import pytest

from agentmem import PoolConfig
from agentmem.codec import CodecSpec
from agentmem.policy.placement import PRIORITIES, AgentInfo, get_policy

FOUR_BIT = {"q4_0", "q4_1", "q5_0", "q5_1"}


def keys_of(spec: str) -> str:
    return CodecSpec.parse(spec).k


@pytest.mark.parametrize("field", ["park_codec", "background_codec", "cold_codec"])
def test_default_codecs_keep_keys_in_8_bits_or_more(field: str) -> None:
    assert keys_of(getattr(PoolConfig(), field)) not in FOUR_BIT


@pytest.mark.parametrize("priority", sorted(PRIORITIES))
@pytest.mark.parametrize("tier", ["warm", "cold"])
def test_default_placement_never_picks_4_bit_keys(priority: str, tier: str) -> None:
    cfg = PoolConfig()
    policy = get_policy(cfg.placement, warm_codec=cfg.park_codec, cold_codec=cfg.cold_codec,
                        background_codec=cfg.background_codec)
    agent = AgentInfo("a", "hot", 0, 4096, PRIORITIES[priority], 0.0, 1, math.inf)
    assert keys_of(policy.codec_for(agent, tier)) not in FOUR_BIT


def test_foreground_and_normal_agents_park_exactly_in_ram() -> None:
    """In RAM only background agents are quantized by default: the others come back exactly as never parked."""
    cfg = PoolConfig()
    policy = get_policy(cfg.placement, warm_codec=cfg.park_codec, cold_codec=cfg.cold_codec,
                        background_codec=cfg.background_codec)
    for priority in ("foreground", "normal"):
        assert policy.codec_for(AgentInfo("a", "hot", 0, 10, PRIORITIES[priority], 0.0, 1, math.inf), "warm") == "f16"
