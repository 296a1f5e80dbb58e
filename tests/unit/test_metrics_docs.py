"""docs/observability.md is the metrics reference: every metric the plugin and the controller
export is listed there with its type and exactly its labels.

The families come from the same populated registries as the dashboard test (every family has
samples; the controller's at `--metrics-detail gpu`), so adding, renaming or relabelling a metric
without updating the reference fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.fixtures.metric_registries import controller_registry, plugin_registry

DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
ROW = re.compile(r"^\| `(vgpu_dra_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """Metric name -> (type, labels) from the reference tables ("(same)": the row above's)."""
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    previous: frozenset[str] = frozenset()
    for name, kind, labels_text in ROW.findall(DOCS.read_text()):
        text = labels_text.strip()
        if text == "(same)":
            labels = previous
        elif text in ("-", ""):
            labels = frozenset()
        else:
            labels = frozenset(part.strip() for part in text.split(","))
        assert name not in rows, f"{name} is documented twice"
        rows[name] = (kind, labels)
        previous = labels
    return rows


def test_every_exported_metric_is_documented_with_its_type_and_labels() -> None:
    docs = documented()
    exported: set[str] = set()
    for registry in (plugin_registry(), controller_registry()):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            exported.add(name)
            labels = {
                label
                for sample in family.samples
                for label in sample.labels
                if label not in ("le", "quantile")
            }
            assert name in docs, f"{name} ({family.type}) is not in {DOCS.name}"
            kind, doc_labels = docs[name]
            assert kind == family.type, f"{name}: documented as {kind}, exported as {family.type}"
            assert doc_labels == labels, (
                f"{name}: documented labels {sorted(doc_labels)}, exported {sorted(labels)}"
            )
    # The webhook's own metrics (vgpu_dra_webhook_*) come with its module and registry.
    stale = {n for n in set(docs) - exported if not n.startswith("vgpu_dra_webhook_")}
    assert not stale, f"documented but not exported: {sorted(stale)}"
