"""docs/migration.md names every legacy field the webhook knows (the table: webhook/legacy.py)."""

from __future__ import annotations

from pathlib import Path

from controller.webhook import legacy

DOC = Path(__file__).parents[4] / "docs" / "migration.md"


def test_every_legacy_name_is_documented() -> None:
    text = DOC.read_text()
    assert [name for name in legacy.legacy_names() if f"`{name}" not in text] == []


def test_our_own_annotation_names_are_documented() -> None:
    text = DOC.read_text()
    ours = [a.key for a in legacy.ANNOTATIONS if a.system == "vgpu-dra"]
    # Short aliases appear as `(node-policy)` next to the long name.
    assert [k for k in ours if f"`{k}`" not in text and f"`{k.split('/')[1]}`" not in text] == []
