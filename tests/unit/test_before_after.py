"""`benchmarks/before_after.py`: its parsers and its table on canned benchmark results (no benchmark runs)."""

from __future__ import annotations

from typing import Any

from benchmarks.before_after import Metric, Runs, parse_serve, parse_switch, rows


def switch_result(median_ms: float, kv: dict[str, int]) -> dict[str, Any]:
    pool = {"median_ms": median_ms, "p95_ms": median_ms * 1.2, "n": 8, "restore_median_ms": 10.0, "kv": kv,
            "restores": 8, "parks": 8}
    return {"results": {"agentmem": pool, "resident": {**pool, "median_ms": 50.0, "kv": {"reused": 8}}}}


def by_metric(table: list[list[str]]) -> dict[str, list[str]]:
    return {r[1]: r for r in table}


def test_time_ratio_is_after_over_before_of_medians_and_flags_a_slowdown() -> None:
    runs = Runs()
    for before, after in ((100.0, 130.0), (120.0, 150.0), (110.0, 500.0)):
        runs.add("switch", "before", parse_switch(switch_result(before, {"restored": 8})))
        runs.add("switch", "after", parse_switch(switch_result(after, {"restored": 8})))
    row = by_metric(rows(runs))["TTFT median, park/restore per switch (ms)"]
    assert row[2:] == ["110", "150", "1.36 **!**"]  # medians 110 and 150; 1.36 > 1.15
    assert by_metric(rows(runs))["TTFT median, all resident (ms)"][4] == "1.00"


def test_check_rows_say_same_only_when_both_sides_saw_the_same_values() -> None:
    runs = Runs()
    runs.add("switch", "before", parse_switch(switch_result(100.0, {"restored": 8})))
    runs.add("switch", "after", parse_switch(switch_result(100.0, {"restored": 8})))
    runs.add("switch", "after", parse_switch(switch_result(100.0, {"restored": 7, "prefilled": 1})))
    table = by_metric(rows(runs))
    assert table["KV source per call, all resident"][4] == "same"
    row = table["KV source per call, park/restore"]
    assert row[4] == "DIFFERS" and "prefilled" in row[3] and "prefilled" not in row[2]
    runs.add("switch", "before", parse_switch(switch_result(100.0, {"restored": 7, "prefilled": 1})))
    assert by_metric(rows(runs))["KV source per call, park/restore"][4] == "same values (each varies run to run)"


def test_a_rate_is_flagged_when_it_drops_and_counts_are_not_judged() -> None:
    runs = Runs()
    runs.add("serve", "before", [Metric("requests/s", 10.0, "rate"), Metric("cached calls", 40, "count")])
    runs.add("serve", "after", [Metric("requests/s", 8.0, "rate"), Metric("cached calls", 10, "count")])
    table = by_metric(rows(runs))
    assert table["requests/s"][4] == "0.80 **!**"
    assert table["cached calls"][4] == "0.25"


def test_serve_parser_reads_the_fault_run_when_present() -> None:
    load = {"req_per_s": 2.0, "ttft_p50_s": 0.1, "lat_p50_s": 0.2, "lat_p99_s": 0.5, "ok": 48, "requests": 48,
            "cached_hits": 30}
    names = [m.name for m in parse_serve({"load": load})]
    assert "restart after SIGKILL (s)" not in names
    fault = {"restart_s": 1.5, "lost_agents": 0, "5xx": 0, "listed_after_restart": 16}
    got = {m.name: m for m in parse_serve({"load": load, "fault": fault})}
    assert got["lost agents, 5xx after SIGKILL"].value == "0, 0" and got["TTFT p50 (ms)"].value == 100.0
