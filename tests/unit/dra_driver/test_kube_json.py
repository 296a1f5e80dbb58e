"""Bounded JSON decoding of API answers (kube.decode_json).

Proves:
1. Ordinary JSON decodes as `json.loads` does (str and bytes).
2. JSON nested deeper than the decoder takes raises TooDeep for a single object.
3. With `prune`, only the deep subtree is cut (replaced by kube.PRUNED at MAX_JSON_DEPTH); the
   object's other fields and the list's other objects arrive whole, strings that hold brackets
   and escaped quotes included.
"""

from __future__ import annotations

import json

import pytest

from dra_driver import kube


def _deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def test_ordinary_json_decodes_as_usual() -> None:
    assert kube.decode_json('{"x": [1, "]}"]}') == {"x": [1, "]}"]}
    assert kube.decode_json(b'{"x": {"y": null}}', prune=True) == {"x": {"y": None}}


def test_a_too_deep_object_raises_too_deep() -> None:
    with pytest.raises(kube.TooDeep, match="nested too deeply"):
        kube.decode_json(_deep(5000))


def test_pruning_cuts_only_the_deep_part() -> None:
    tricky = 'a "quoted" [bracket] {brace} \\\\'
    doc = json.dumps({"items": [{"metadata": {"name": "x", "note": tricky}}]})
    doc = doc[:-2] + ', {"metadata": {"name": "deep"}, "spec": ' + _deep(5000) + "}" + doc[-2:]
    decoded = kube.decode_json(doc, prune=True)
    first, deep = decoded["items"]
    assert first == {"metadata": {"name": "x", "note": tricky}}
    assert deep["metadata"] == {"name": "deep"}
    node, depth = deep["spec"], 3  # the document, items, the object: spec opens level 4
    while isinstance(node, dict):
        node, depth = node["a"], depth + 1
    assert node == kube.PRUNED
    assert depth == kube.MAX_JSON_DEPTH
