"""Machine profiles (vgpu_testbed.fakegpu.profiles): every shipped profile loads and describes the
machine it claims to; every kind of invalid profile is refused with a message naming the profile,
the GPU and the field; the text rendering the C side reads carries every field."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vgpu_testbed.fakegpu import simulator as fakegpu
from vgpu_testbed.fakegpu.profiles import ProfileError, load_profile, parse_profile, profile_names

SHIPPED = ["a10-pcie", "a100-2x4", "a100-80gb-2", "dgx-h100", "l4-2", "mixed"]


def test_shipped_profiles_are_listed() -> None:
    assert profile_names() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.driver_version == "580.95.05"
    assert profile.cuda_driver_version == 13000 and profile.cuda_version == "13.0"
    assert profile.gpus
    for gpu in profile.gpus:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", gpu.uuid)


def test_dgx_h100_matches_the_machine() -> None:
    p = load_profile("dgx-h100")
    assert len(p.gpus) == 8
    assert {g.product for g in p.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.sm_count for g in p.gpus} == {132}
    assert [g.numa_node for g in p.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pcie_root for g in p.gpus}) == 8
    for i, g in enumerate(p.gpus):
        assert sorted(g.nvlink_peers) == [j for j in range(8) if j != i]
        assert g.architecture == "hopper" and g.compute_capability == "9.0"


def test_a100_2x4_has_two_islands_without_links_between() -> None:
    p = load_profile("a100-2x4")
    assert {g.product for g in p.gpus} == {"NVIDIA A100-SXM4-40GB"}
    assert {g.sm_count for g in p.gpus} == {108}
    for i, g in enumerate(p.gpus):
        island = set(range(4)) if i < 4 else set(range(4, 8))
        assert set(g.nvlink_peers) == island - {i}
        assert g.nvlink_count == 12


def test_pcie_profiles_have_no_nvlink() -> None:
    a10 = load_profile("a10-pcie")
    assert [g.numa_node for g in a10.gpus] == [0, 0, 1, 1]
    assert all(g.nvlink == [] and g.sm_count == 72 for g in a10.gpus)
    l4 = load_profile("l4-2")
    assert len(l4.gpus) == 2 and all(g.sm_count == 58 and not g.nvlink for g in l4.gpus)


def test_mixed_has_two_products() -> None:
    assert len({g.product for g in load_profile("mixed").gpus}) >= 2


def test_uuids_and_bus_ids_are_unique_across_shipped_profiles() -> None:
    uuids = [g.uuid for name in SHIPPED for g in load_profile(name).gpus]
    assert len(uuids) == len(set(uuids))


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "copy.yaml"
    path.write_text((fakegpu.PROFILES_DIR / "l4-2.yaml").read_text())
    assert load_profile(path).name == "l4-2"


# ---- invalid profiles ------------------------------------------------------------------------


def _doc() -> dict[str, Any]:
    """A small valid profile as a YAML document (2 NVLinked GPUs)."""
    gpu = {
        "product": "NVIDIA Test",
        "brand": "nvidia",
        "architecture": "hopper",
        "compute_capability": "9.0",
        "memory_bytes": 1 << 30,
        "sm_count": 132,
        "pci_device_id": 0x233010DE,
        "numa_node": 0,
        "pcie_root": "pci0000:15",
    }
    return {
        "name": "tiny",
        "driver_version": "580.95.05",
        "cuda_driver_version": 13000,
        "gpu_defaults": gpu,
        "gpus": [
            {
                "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                "serial": "1",
                "pci_bus_id": "00000000:18:00.0",
                "minor": 0,
                "nvlink": [{"peer": 1, "links": 2}],
            },
            {
                "uuid": "GPU-00000000-0000-0000-0000-000000000001",
                "serial": "2",
                "pci_bus_id": "00000000:2A:00.0",
                "minor": 1,
                "nvlink": [{"peer": 0, "links": 2}],
            },
        ],
    }


def _error(doc: dict[str, Any]) -> str:
    with pytest.raises(ProfileError) as info:
        parse_profile(yaml.safe_dump(doc), source="tiny.yaml")
    return str(info.value)


def test_the_base_document_is_valid() -> None:
    p = parse_profile(yaml.safe_dump(_doc()), source="tiny.yaml")
    assert [g.nvlink_peers for g in p.gpus] == [[1], [0]]


def test_unknown_gpu_field_is_named() -> None:
    doc = _doc()
    doc["gpus"][1]["sm_cnt"] = 10
    msg = _error(doc)
    assert "tiny.yaml" in msg and "gpu 1" in msg and "sm_cnt" in msg and "not permitted" in msg


def test_unknown_top_level_field_is_named() -> None:
    doc = _doc()
    doc["drivers"] = "x"
    msg = _error(doc)
    assert "drivers" in msg


def test_missing_field_is_named() -> None:
    doc = _doc()
    del doc["gpus"][0]["uuid"]
    msg = _error(doc)
    assert "gpu 0: field 'uuid'" in msg and "required" in msg.lower()


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("uuid", "GPU-1234", "uuid"),
        ("pci_bus_id", "18:00.0", "pci_bus_id"),
        ("pcie_root", "root0", "pcie_root"),
        ("memory_bytes", 0, "memory_bytes"),
        ("brand", "radeon", "brand"),
        ("architecture", "hoppr", "architecture"),
        ("compute_capability", "9", "compute_capability"),
    ],
)
def test_bad_values_are_named(field: str, value: Any, expect: str) -> None:
    doc = _doc()
    doc["gpus"][1][field] = value
    msg = _error(doc)
    assert f"gpu 1: field '{expect}'" in msg


@pytest.mark.parametrize("field", ["uuid", "pci_bus_id", "minor"])
def test_duplicates_are_refused(field: str) -> None:
    doc = _doc()
    doc["gpus"][1][field] = doc["gpus"][0][field]
    msg = _error(doc)
    assert f"gpu 1: field '{field}': duplicate value" in msg
    assert f"gpu 0: field '{field}': duplicate value" in msg


def test_duplicate_bus_id_ignores_case() -> None:
    doc = _doc()
    doc["gpus"][0]["pci_bus_id"] = "00000000:2a:00.0"
    assert "duplicate value" in _error(doc)


def test_link_to_missing_gpu() -> None:
    doc = _doc()
    doc["gpus"][0]["nvlink"] = [{"peer": 1, "links": 2}, {"peer": 5, "links": 1}]
    msg = _error(doc)
    assert "gpu 0: field 'nvlink': peer 5 does not exist" in msg


def test_link_to_itself() -> None:
    doc = _doc()
    doc["gpus"][0]["nvlink"] = [{"peer": 0, "links": 2}]
    assert "gpu 0: field 'nvlink': a link to itself" in _error(doc)


def test_asymmetric_links() -> None:
    doc = _doc()
    doc["gpus"][1]["nvlink"] = [{"peer": 0, "links": 3}]
    msg = _error(doc)
    assert "gpu 0: field 'nvlink': 2 links to GPU 1, but GPU 1 has 3 links back" in msg
    one_way = _doc()
    one_way["gpus"][1]["nvlink"] = []
    assert "GPU 1 has 0 links back" in _error(one_way)


def test_too_many_links() -> None:
    doc = _doc()
    doc["gpus"][0]["nvlink"] = [{"peer": 1, "links": 10}]
    doc["gpus"][1]["nvlink"] = [{"peer": 0, "links": 10}]
    doc["nvlink_domains"] = [{"gpus": [0, 1], "links_per_peer": 9}]
    msg = _error(doc)
    assert "at most 18" in msg or "listed 2 times" in msg


def test_nvlink_domain_naming_a_missing_gpu() -> None:
    doc = _doc()
    doc["nvlink_domains"] = [{"gpus": [0, 4], "links_per_peer": 1}]
    msg = _error(doc)
    assert "nvlink_domains[0]: GPU 4 does not exist" in msg


def test_too_many_gpus() -> None:
    doc = _doc()
    base = doc["gpus"][0]
    doc["gpus"] = []
    for i in range(17):
        g = copy.deepcopy(base)
        g.update(
            uuid=f"GPU-00000000-0000-0000-0000-{i:012x}",
            pci_bus_id=f"00000000:{i + 1:02X}:00.0",
            minor=i,
            serial=str(i),
            nvlink=[],
        )
        doc["gpus"].append(g)
    assert "gpus" in _error(doc)


def test_not_yaml_and_not_a_mapping() -> None:
    with pytest.raises(ProfileError, match="not valid YAML"):
        parse_profile("gpus: [", source="broken.yaml")
    with pytest.raises(ProfileError, match="mapping"):
        parse_profile("- 1\n- 2\n", source="list.yaml")


def test_unknown_profile_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("dgx-h200")
    assert "no such profile" in str(info.value) and "dgx-h100" in str(info.value)


# ---- the text the C side reads -----------------------------------------------------------------


def test_sim_profile_text_carries_every_field() -> None:
    p = load_profile("a100-2x4")
    text = fakegpu.render_sim_profile(p)
    kv = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert kv["gpu.count"] == "8"
    assert kv["node.cuda_driver_version"] == "13000"
    assert kv["gpu.5.uuid"] == p.gpus[5].uuid
    assert kv["gpu.5.memory_bytes"] == str(p.gpus[5].memory_bytes)
    assert kv["gpu.5.nvlink"] == "4:4,6:4,7:4"
    assert kv["gpu.0.pci_device_id"] == "0x20b010de"
    assert kv["gpu.0.power_limit_mw"] == "400000"
    assert kv["gpu.0.mig_capable"] == "1"
    fields = {k.split(".", 2)[2] for k in kv if k.startswith("gpu.0.")}
    assert len(fields) == 21
