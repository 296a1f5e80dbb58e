"""The Grafana dashboard (deploy/grafana/vgpu-dra.json) asks only for what the components export.

The exported names and labels are taken from populated registries of the kubelet plugin and
of the controller (every family has samples; the controller's at `--metrics-detail gpu`), not
from a hand-kept list, so renaming a metric or a label without updating the dashboard fails
here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.fixtures.metric_registries import controller_registry, plugin_registry

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "vgpu-dra.json"
METRIC = re.compile(r"\b(vgpu_dra_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, from registries where every family has samples."""
    out: dict[str, set[str]] = {}
    for registry in (plugin_registry(), controller_registry()):
        for family in registry.collect():
            assert family.samples, f"{family.name} has no samples in this registry"
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, expr, legendFormat) of every panel target and templating query."""
    found: list[tuple[str, str, str]] = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"], target.get("legendFormat", "")))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"${variable['name']}", variable["query"]["query"], ""))
    return found


def test_every_query_names_exported_metrics_and_labels() -> None:
    names = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    found = queries(dashboard)
    assert len(found) > 20
    used: set[str] = set()
    for where, expr, legend in found:
        matches = METRIC.findall(expr)
        assert matches, f"{where}: {expr!r} names no vgpu_dra_ metric"
        labels_here: set[str] = set()
        for name, selector in matches:
            assert name in names, f"{where}: {name} is not exported (known: {sorted(names)})"
            used.add(name)
            labels_here |= names[name]
            for label in MATCHER.findall(selector):
                assert label in names[name], f"{where}: {name} has no label {label!r}"
        for group in GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in group.split(","))):
                assert label in labels_here, f"{where}: no metric of {expr!r} has {label!r}"
        for label in LEGEND.findall(legend):
            assert label in labels_here, f"{where}: legend uses unknown label {label!r}"
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in names}
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    assert families <= shown | {f for f in families if f.endswith("_created")}, (
        f"exported but on no panel: {sorted(families - shown)}"
    )


def test_dashboard_has_the_five_views() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Cluster overview", "Per node", "Per GPU", "Per tenant", "Controller"]
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "node", "gpu", "namespace"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
