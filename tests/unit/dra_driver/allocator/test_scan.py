"""The Cython kernels (`dra_driver.allocator._scan`) against their pure-Python oracle
(reference.py), and the allocator's decisions against a brute-force one, on random inputs:

1. whole decision sequences (place, commit, place...) on random clusters and claims give the
   same placements and refusals with either pair of kernels, each placement passes
   `check_allocation`, and a claim is refused exactly when brute force finds no node;
2. the scan's keys are bit-identical and its closeness equal on random layouts;
3. the search finds the same alternative and devices in the same order on random node
   encodings (budget exhaustion included);
4. malformed arrays are refused with ValueError, never read blindly;
5. shareIDs are version-4 UUIDs, distinct per position, and keep their published values.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.allocator import allocate
from dra_driver.allocator.allocate import Allocator, Placement, Unschedulable
from dra_driver.allocator.cel import compile_selector
from dra_driver.allocator.model import DEV_FIELDS, DEV_MEM, ClusterModel
from dra_driver.allocator.quantity import parse_quantity
from dra_driver.allocator.request import MEMORY_PERCENTAGE, Policy, parse_claim
from tests.fixtures.allocation_check import check_allocation
from tests.fixtures.allocator_cluster import (
    DEVICE_CLASS,
    DRIVER,
    PRODUCTS,
    SHAPES,
    claim_obj,
    node_events,
)
from tests.unit.dra_driver.allocator import reference
from tests.unit.dra_driver.allocator.extension import kernels, needs_extension

pytestmark = needs_extension

CLASSES = {DRIVER: DEVICE_CLASS}
MiB = 1 << 20
SELECTORS = (
    None,
    f'device.attributes["{DRIVER}"].productName.contains("A100")',
    f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("30Gi"))',
    f'device.attributes["{DRIVER}"].index % 2 == 0',
    f'has(device.attributes["{DRIVER}"].nvlinkDomain)',
)
CONSTRAINTS = (None, ("match", f"{DRIVER}/nvlinkDomain"), ("distinct", f"{DRIVER}/numaNode"))

nodes_st = st.lists(
    st.tuples(st.sampled_from(PRODUCTS), st.sampled_from(sorted(SHAPES)), st.integers(1, 8)),
    min_size=1,
    max_size=6,
)
claim_st = st.tuples(
    st.integers(1, 4),  # count
    st.sampled_from([None, "1000", "1Gi", "10Gi", "30Gi", "79Gi"]),  # memory
    st.sampled_from([None, "0", "30", "70"]),  # cores
    st.sampled_from(SELECTORS),
    st.sampled_from(CONSTRAINTS),
    st.sampled_from(["binpack", "spread"]),  # node policy
    st.sampled_from(["binpack", "spread"]),  # device policy
    st.sampled_from(["none", "numa", "link", "numa-strict", "link-strict"]),
    st.sampled_from([None, None, 1, 25, 50, 99, 100]),  # memory-percentage annotation
)


def outcome(alloc: Allocator, claim: Any, policy: Policy) -> Placement | str:
    try:
        placement = alloc.place({"spec": {}}, [claim], policy)
    except Unschedulable as exc:
        return f"refused: {exc}"
    # Every placement is one the API allows (the same check the e2e test applies to
    # kube-scheduler's allocations).
    assert check_allocation(alloc.model, claim, placement.allocation(claim.uid)) == []
    alloc.commit(placement)
    return placement


def build(nodes: list[tuple[str, str, int]]) -> ClusterModel:
    model = ClusterModel()
    for n, (product, shape, gpus) in enumerate(nodes):
        for kind, obj in node_events(n, product, shape, gpus):
            model.apply(kind, obj)
    return model


def oracle_feasible(model: ClusterModel, raw: tuple[Any, ...], policy: Policy) -> bool:
    """Brute force: does any node have `count` distinct devices satisfying everything?"""
    count, memory, cores, selector, constraint, _, _, topology, percent = raw
    want_mem = None if memory is None else parse_quantity(memory)
    want_cores = None if cores is None else parse_quantity(cores)
    by_node: dict[str, list[Any]] = {}
    for device in model.devices.values():
        by_node.setdefault(device.node, []).append(device)
    for devices in by_node.values():
        ok = []
        for d in devices:
            if selector and not compile_selector(selector).matches(d.view):
                continue
            if not policy.admits(d.product, d.uuid) or model.is_held(d.key):
                continue
            used = model.device_used(d.key)
            mem_cap = d.capacity[f"{DRIVER}/memory"].value
            asked = want_mem
            if asked is None and percent is not None:  # the annotation only fills a gap
                asked = -(-percent * mem_cap // 100)
            take_mem = mem_cap if asked is None else max(MiB, -(-asked // MiB) * MiB)
            take_cores = 0 if want_cores is None else want_cores
            if used.get(f"{DRIVER}/memory", 0) + take_mem > mem_cap:
                continue
            if used.get(f"{DRIVER}/cores", 0) + take_cores > 100:
                continue
            ok.append(d)
        for combo in itertools.combinations(ok, count):
            if constraint is not None:
                values = [c.attribute(constraint[1]) for c in combo]
                if any(v is None for v in values):
                    continue
                if constraint[0] == "match" and len(set(values)) != 1:
                    continue
                if constraint[0] == "distinct" and len(set(values)) != len(values):
                    continue
            if topology.endswith("-strict"):
                groups = {(c.numa if topology.startswith("numa") else c.link) for c in combo}
                if len(groups) != 1 or -1 in groups:
                    continue
            return True
    return False


def claim_of(i: int, raw: tuple[Any, ...]) -> Any:
    count, memory, cores, selector, constraint, _, _, _, percent = raw
    obj = claim_obj(
        f"c{i}",
        count=count,
        memory=memory,
        cores=cores,
        selectors=(selector,) if selector else (),
        match=constraint[1] if constraint and constraint[0] == "match" else None,
        distinct=constraint[1] if constraint and constraint[0] == "distinct" else None,
    )
    if percent is not None:
        obj["metadata"]["annotations"] = {MEMORY_PERCENTAGE: str(percent)}
    return parse_claim(obj, CLASSES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_st, claims=st.lists(claim_st, min_size=1, max_size=8))
def test_decisions_match_the_oracle_and_are_right(
    nodes: list[tuple[str, str, int]], claims: list[tuple[Any, ...]]
) -> None:
    fast, slow = Allocator(build(nodes)), Allocator(build(nodes))
    slow.scan, slow.search = reference.scan, reference.search
    for i, raw in enumerate(claims):
        policy = Policy(node=raw[5], device=raw[6], topology=raw[7])
        feasible = oracle_feasible(slow.model, raw, policy)
        claim = claim_of(i, raw)
        a, b = outcome(fast, claim, policy), outcome(slow, claim, policy)
        assert a == b
        assert isinstance(a, Placement) == feasible, a


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    n_nodes=st.integers(1, 12),
    topo=st.integers(0, 2),
    strict=st.integers(0, 1),
    binpack=st.integers(0, 1),
)
def test_scan_keys_are_bit_identical(
    data: st.DataObject, n_nodes: int, topo: int, strict: int, binpack: int
) -> None:
    sizes = data.draw(st.lists(st.integers(0, 9), min_size=n_nodes, max_size=n_nodes))
    n_dev = sum(sizes)
    starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
    ends = (starts + np.asarray(sizes, dtype=np.int64)).astype(np.int64)
    ints = st.integers(0, 1 << 40)

    def arr(strategy: Any, n: int) -> Any:
        return np.asarray(data.draw(st.lists(strategy, min_size=n, max_size=n)), dtype=np.int64)

    total = arr(ints, n_dev)
    used = np.minimum(arr(ints, n_dev), total)
    cores_total = arr(st.sampled_from([0, 100]), n_dev)
    cores_used = np.minimum(arr(st.integers(0, 100), n_dev), cores_total)
    n_req = data.draw(st.integers(0, 3))
    masks = np.asarray(
        data.draw(st.lists(st.integers(0, 1), min_size=n_req * n_dev, max_size=n_req * n_dev)),
        dtype=np.int8,
    ).reshape(n_req, n_dev)

    def per_node(values: Any) -> Any:  # the layout's node sums of a device column
        return np.asarray(
            [int(values[s:e].sum()) for s, e in zip(starts, ends, strict=True)], dtype=np.int64
        )

    args = [
        starts,
        ends,
        arr(st.integers(0, 1), n_nodes).astype(np.int8),
        per_node(total),
        per_node(used),
        per_node(cores_total),
        per_node(cores_used),
        total,
        cores_total,
        np.minimum(arr(ints, n_dev), total),
        arr(st.integers(0, 100), n_dev),
        used,
        cores_used,
        arr(st.integers(0, 1), n_dev),
        arr(st.integers(-1, 2), n_dev),
        arr(st.integers(-1, 3), n_dev),
        arr(st.integers(0, 8), n_dev),
        masks,
        arr(st.integers(-1, 1 << 40), n_req),
        arr(st.sampled_from([0, 0, 1, 33, 50, 99, 100]), n_req),  # memory percentage
        arr(st.integers(-1, 100), n_req),
        arr(st.integers(-1, 5), n_req),
        arr(st.integers(0, 2), n_req),
    ]
    out = []
    for scan in (kernels().scan, reference.scan):
        keys = np.empty(n_nodes, dtype=np.float64)
        close = np.empty(n_nodes, dtype=np.int64)
        scan(*args, topo, strict, binpack, keys, close)
        out.append((keys.tobytes(), close.tolist()))
    assert out[0] == out[1]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), m=st.integers(1, 8), k_dims=st.integers(0, 3), n_req=st.integers(0, 3))
def test_search_picks_are_identical(data: st.DataObject, m: int, k_dims: int, n_req: int) -> None:
    """The exact search: same found/not found (budget included), same alternative, same devices
    in the same order, on random node encodings."""
    n_slots = data.draw(st.integers(0, 2))
    topo, strict, binpack = (data.draw(st.integers(lo, hi)) for lo, hi in ((0, 2), (0, 1), (0, 1)))
    budget = data.draw(st.sampled_from([1, 3, 10, 20_000]))

    def arr(strategy: Any, *shape: int, dtype: Any = np.int64) -> Any:
        size = int(np.prod(shape))
        values = data.draw(st.lists(strategy, min_size=size, max_size=size))
        return np.asarray(values, dtype=dtype).reshape(shape)

    dims = st.integers(-1, k_dims - 1)
    dev = np.concatenate(
        [
            arr(st.integers(0, 1), m, 3),  # multi, allocated, held
            arr(st.integers(-1, 2), m, 1),  # numa
            arr(st.integers(-1, 3), m, 1),  # link
            arr(st.integers(0, 8), m, 1),  # link size
            arr(dims, m, 2),  # memory, cores columns
        ],
        axis=1,
    )
    counts = data.draw(st.lists(st.integers(1, 3), min_size=n_req, max_size=n_req))
    ends = np.cumsum(counts, dtype=np.int64)
    reqs = np.stack([ends - np.asarray(counts, dtype=np.int64), ends], axis=1).reshape(n_req, 2)
    n_alt = int(sum(counts))
    alts = np.concatenate(
        [
            arr(st.integers(0, 1), n_alt, 1),  # all
            arr(st.integers(1, 4), n_alt, 1),  # count
            arr(st.integers(0, 1), n_alt, 1),  # admin
        ],
        axis=1,
    )
    inputs = [
        np.ascontiguousarray(dev),
        arr(st.integers(-1, 100), m, k_dims),  # cap
        arr(st.integers(0, 100), m, k_dims),  # used
        np.ascontiguousarray(reqs),
        np.ascontiguousarray(alts),
        arr(st.integers(0, 1), n_alt, m, dtype=np.int8),  # mask
        arr(st.integers(0, 1), n_alt, m, dtype=np.int8),  # servable
        arr(st.integers(0, 60), n_alt, m, k_dims),  # amount
        arr(st.integers(0, 1), n_req, n_slots, dtype=np.int8),  # applies
        arr(st.integers(0, 1), n_slots),  # distinct
        arr(st.integers(-1, m - 1), n_slots, m),  # cval
    ]
    out = []
    for search in (kernels().search, reference.search):
        chosen = np.zeros(n_req, dtype=np.int64)
        picks = np.zeros((n_req, m), dtype=np.int64)
        npicks = np.zeros(n_req, dtype=np.int64)
        found = search(*inputs, topo, strict, binpack, budget, chosen, picks, npicks)
        out.append(
            (found, [(int(chosen[i]), picks[i, : npicks[i]].tolist()) for i in range(n_req)])
            if found
            else (found, None)
        )
    assert out[0] == out[1]


def test_cython_search_refuses_malformed_arrays() -> None:
    """The Cython search reads raw pointers: wrong dtypes, non-contiguous arrays, disagreeing
    shapes and out-of-range indices are refused with ValueError instead of read blindly."""
    search = kernels().search
    m, k = 2, 1

    def good() -> list[Any]:
        return [
            np.zeros((m, DEV_FIELDS), dtype=np.int64),
            np.full((m, k), 10, dtype=np.int64),
            np.zeros((m, k), dtype=np.int64),
            np.asarray([[0, 1]], dtype=np.int64),
            np.asarray([[0, 1, 0]], dtype=np.int64),
            np.ones((1, m), dtype=np.int8),
            np.ones((1, m), dtype=np.int8),
            np.zeros((1, m, k), dtype=np.int64),
            np.zeros((1, 0), dtype=np.int8),
            np.zeros(0, dtype=np.int64),
            np.zeros((0, m), dtype=np.int64),
        ]

    def outputs() -> list[Any]:
        return [np.zeros(1, np.int64), np.zeros((1, m), np.int64), np.zeros(1, np.int64)]

    assert search(*good(), 0, 0, 0, 100, *outputs()) == 1
    bad_cases = []
    wrong_dtype = good()
    wrong_dtype[1] = wrong_dtype[1].astype(np.int32)
    bad_cases.append(wrong_dtype)
    strided = good()
    strided[5] = np.ones((1, 2 * m), dtype=np.int8)[:, ::2]
    bad_cases.append(strided)
    shapes = good()
    shapes[6] = np.ones((1, m + 1), dtype=np.int8)
    bad_cases.append(shapes)
    out_of_range = good()
    out_of_range[3] = np.asarray([[0, 5]], dtype=np.int64)
    bad_cases.append(out_of_range)
    column = good()
    column[0][0, DEV_MEM] = k
    bad_cases.append(column)
    for args in bad_cases:
        with pytest.raises((ValueError, BufferError)):
            search(*args, 0, 0, 0, 100, *outputs())


def test_cython_scan_refuses_malformed_arrays() -> None:
    """Disagreeing shapes and node ranges beyond the devices are refused with ValueError."""
    scan = kernels().scan
    col = np.zeros(2, dtype=np.int64)
    node = np.zeros(1, dtype=np.int64)

    def args(node_end: int = 2, mask_devices: int = 2) -> list[Any]:
        req = np.zeros(1, dtype=np.int64)
        return [
            node,
            np.asarray([node_end], dtype=np.int64),
            np.ones(1, dtype=np.int8),
            *(node,) * 4,
            *(col,) * 10,
            np.ones((1, mask_devices), dtype=np.int8),
            *(req,) * 5,
            0,
            0,
            1,
            np.zeros(1, dtype=np.float64),
            np.zeros(1, dtype=np.int64),
        ]

    scan(*args())
    for bad in (args(node_end=3), args(mask_devices=1)):
        with pytest.raises(ValueError):
            scan(*bad)


@settings(max_examples=200, deadline=None)
@given(
    uid=st.text(min_size=1, max_size=60).filter(
        lambda s: not any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)
    ),
    request=st.sampled_from(["gpu", "gpu/small", "a"]),
    positions=st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=6, unique=True),
)
def test_share_ids_are_uuids_distinct_per_position(
    uid: str, request: str, positions: list[int]
) -> None:
    base = allocate._share_base(uid, request)
    ids = [allocate._share_id(base, position) for position in positions]
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
    assert len(set(ids)) == len(ids)


def test_share_ids_keep_their_published_values() -> None:
    """shareIDs are written into claims: the same claim, request and position give the same ID
    in every version (docs/scheduling.md, "shareIDs")."""
    for uid, request, position, expected in (
        ("uid", "gpu", 0, "6389e0f8-ab59-42fc-bc3d-cf0adeab7218"),
        (
            "3f1e9a52-0b7c-4d0e-9a61-7c2f4b8d5e10",
            "gpu/small",
            3,
            "789a525e-f3e1-4344-a5a4-4cf545aa0f21",
        ),
    ):
        assert allocate._share_id(allocate._share_base(uid, request), position) == expected
    for position in (-1, 1 << 32):
        with pytest.raises(ValueError, match="position"):
            allocate._share_id(allocate._share_base("uid", "gpu"), position)
