"""The docs name what the code has, and the code has nothing the docs do not name.

Proves, for what a user types or reads:
1. flags: every flag of `vgpu-dra kubelet-plugin`, `controller` (the webhook's included) and the
   test bed's `demo` is in its doc's flag table, and every flag in those tables exists;
2. environment twins: where a table names a flag's environment variable (`[VAR]`), it is the one
   the code reads, and every twin the code reads is named;
3. names in the product's domain (`vgpu.dra.dev/<name>`: annotations, the gate, conditions,
   taint keys, attributes) that the docs mention exist in the code, and every policy annotation
   and alias the allocator reads is documented.
(Metrics: tests/unit/test_metrics_docs.py.)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from controller import main as controller_main
from controller.webhook import flags as webhook_flags
from dra_driver import cli_flags
from dra_driver.allocator import request
from kubelet_plugin import main as plugin_main
from vgpu_testbed.demo import cli as demo_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A flag table row: its first cell lists the flags (`--a` / `--no-a`, `--b`), then maybe [`VAR`].
ROW = re.compile(r"^\| (`--[^|]*)\|", re.MULTILINE)
FLAG = re.compile(r"`(--[a-z0-9-]+)")
TWIN = re.compile(r"\[`([A-Z0-9_]+)`\]")


def _parser_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """--flag -> dest, every long option of the parser (help excluded)."""
    return {
        option: action.dest
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def _table(doc: str, section: str | None = None) -> dict[str, str | None]:
    """--flag -> the environment twin its row names (None: none named), from `doc`'s flag tables
    (only those under the heading that starts with `section`, when given)."""
    text = (DOCS / doc).read_text()
    if section is not None:
        start = text.index("\n## " + section)
        end = text.find("\n## ", start + 1)
        text = text[start : end if end != -1 else len(text)]
    rows: dict[str, str | None] = {}
    for cell in ROW.findall(text):
        flags = FLAG.findall(cell)
        twin = TWIN.search(cell)
        for flag in flags:
            rows[flag] = twin.group(1) if twin else None
    return rows


PLUGIN = _parser_flags(plugin_main.build_parser({}))
CONTROLLER = _parser_flags(controller_main.build_parser({}))
_webhook_parser = argparse.ArgumentParser()
webhook_flags.add_arguments(_webhook_parser, {})
WEBHOOK = {f: d for f, d in CONTROLLER.items() if f in _parser_flags(_webhook_parser)}
CONTROLLER_OWN = {f: d for f, d in CONTROLLER.items() if f not in WEBHOOK}

CASES = {
    # name: (flags of the code, doc, section of the doc, twins the code reads by dest)
    "kubelet-plugin": (PLUGIN, "kubelet-plugin.md", "Flags", {**cli_flags.ENV, **plugin_main.ENV}),
    "controller": (
        CONTROLLER_OWN,
        "controller.md",
        "Flags",
        {**cli_flags.ENV, **controller_main.ENV},
    ),
    "webhook": (WEBHOOK, "webhook.md", "Flags", webhook_flags.ENV),
    "demo": (_parser_flags(demo_cli.build_parser()), "demo.md", None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_flag_is_documented_and_every_documented_flag_exists(name: str) -> None:
    flags, doc, section, _ = CASES[name]
    documented = _table(doc, section)
    assert not sorted(set(flags) - set(documented)), f"flags of {name} missing from {doc}"
    assert not sorted(set(documented) - set(flags)), f"{doc} documents flags {name} lacks"


@pytest.mark.parametrize("name", [n for n, case in sorted(CASES.items()) if case[3] is not None])
def test_documented_environment_twins_are_the_ones_read(name: str) -> None:
    flags, doc, section, twins = CASES[name]
    assert twins is not None
    documented = _table(doc, section)
    for flag, dest in flags.items():
        want = twins.get(dest)
        if flag.startswith("--no-"):
            continue  # the twin is named on the row's positive flag
        assert documented[flag] == want, f"{doc}: {flag} has twin {documented[flag]}, code {want}"


def _product_source() -> str:
    return "\n".join(
        path.read_text()
        for package in ("dra_driver", "kubelet_plugin", "controller", "vgpu_testbed")
        for path in (ROOT / package).rglob("*.py")
    )


def test_names_in_the_products_domain_exist_in_the_code() -> None:
    source = _product_source()
    texts = [*DOCS.glob("*.md"), ROOT / "README.md"]
    mentioned = {
        name
        for doc in texts
        for name in re.findall(r"`vgpu\.dra\.dev/([A-Za-z][A-Za-z-]*)", doc.read_text())
    }
    missing = sorted(
        name for name in mentioned if not re.search(rf"[\"'/]{re.escape(name)}[\"']", source)
    )
    assert not missing, f"the docs name vgpu.dra.dev/ names the code does not have: {missing}"


def test_every_policy_annotation_and_alias_is_documented() -> None:
    text = "\n".join(doc.read_text() for doc in DOCS.glob("*.md"))
    names = {*request.POLICY_ANNOTATIONS, *request.ALIASES.values(), request.MEMORY_PERCENTAGE}
    prefix = request.ANNOTATION_PREFIX  # tables under a `vgpu.dra.dev/...` heading name the rest
    missing = sorted(
        name
        for name in names
        if f"`{name}`" not in text and f"`{name.removeprefix(prefix)}`" not in text
    )
    assert not missing, f"annotations the allocator reads that no doc names: {missing}"
