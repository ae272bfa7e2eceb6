"""contrib/grafana/kvcache.json: every query names metrics the real exporter exports."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import KVLayout, PrefixCache

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from kvcache import metrics

DASHBOARD = Path(__file__).resolve().parent.parent / "contrib" / "grafana" / "kvcache.json"
METRIC = re.compile(r"\bkvcache_\w+")


def queries(node: object) -> Iterator[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


@pytest.fixture
def exported(make_pool: Callable[..., kvcache.Pool]) -> set[str]:
    """The series names of the real exposition (a family without samples, such as the remote
    tier's of a pool without one, still counts: its HELP and TYPE are there)."""
    pool = make_pool("1M", page_size="4K")
    pc = PrefixCache(pool, "m", KVLayout(1, 1, 4, "float32"), chunk_tokens=4)
    pc.store(np.arange(4), np.ones((1, 2, 1, 4, 4), np.float32))
    pc.retrieve(np.arange(4))
    text = metrics.exposition(pools=[pool.name])
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in suffixes[family.type]
    }


def test_every_query_names_an_exported_metric(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    found = list(queries(dashboard))
    assert len(found) >= 10
    for query in found:
        names = set(METRIC.findall(query))
        assert names, f"a query that names no kvcache metric: {query}"
        assert names <= exported, f"{query}: not exported: {names - exported}"


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    text = " ".join(queries(dashboard))
    for needed in (
        "kvcache_prefix_hit_tokens_total",  # hit rate in tokens ...
        "kvcache_prefix_query_tokens_total",  # ... over tokens queried
        "kvcache_used_bytes",  # bytes per tier
        "by (pool, reason)",  # evictions by reason
        "kvcache_operation_duration_seconds_bucket",  # latency
    ):
        assert needed in text
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel["targets"] for panel in dashboard["panels"])
