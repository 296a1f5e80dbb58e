"""Property tests: the Cython scan and the pure-Python reference give identical decisions, and
every decision is right against a brute-force oracle, on random clusters and random requests."""

from __future__ import annotations

import gc
import itertools
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.allocator import allocate, kernel
from dra_driver.allocator import model as model_module

try:
    from dra_driver.allocator import _fastkernel
except ImportError:  # the module's tests are skipped then
    _fastkernel = None  # type: ignore[assignment]
from dra_driver.allocator.allocate import Allocator, Placement, Unschedulable
from dra_driver.allocator.model import ClusterModel
from dra_driver.allocator.quantity import parse_quantity
from dra_driver.allocator.request import MEMORY_PERCENTAGE, Policy, parse_claim
from dra_driver.allocator.verify import check_allocation
from tests.fixtures.allocator_cluster import (
    DEVICE_CLASS,
    DRIVER,
    PRODUCTS,
    SHAPES,
    claim_obj,
    node_events,
)

pytestmark = pytest.mark.skipif(allocate.FAST_KERNEL is None, reason="Cython kernel not built")

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
    from dra_driver.allocator.cel import compile_selector

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
def test_fast_and_reference_agree_and_are_right(
    nodes: list[tuple[str, str, int]], claims: list[tuple[Any, ...]]
) -> None:
    fast, slow = Allocator(build(nodes), fast=True), Allocator(build(nodes), fast=False)
    for i, raw in enumerate(claims):
        policy = Policy(node=raw[5], device=raw[6], topology=raw[7])
        feasible = oracle_feasible(slow.model, raw, policy)
        claim = claim_of(i, raw)
        a, b = outcome(fast, claim, policy), outcome(slow, claim, policy)
        assert a == b
        assert isinstance(a, Placement) == feasible, a
        # The fast path commits in C (`_fastkernel.Accountant`): the model ends up the same.
        assert_same_consumption(fast.model, slow.model)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=nodes_st,
    claims=st.lists(claim_st, min_size=2, max_size=10),
    log_size=st.sampled_from([1, 2, 3, 4096]),
    bound=st.lists(st.integers(0, 5), max_size=4),
)
def test_rank_reads_the_change_log_as_a_full_comparison_would(
    nodes: list[tuple[str, str, int]],
    claims: list[tuple[Any, ...]],
    log_size: int,
    bound: list[int],
) -> None:
    """The fast rank refreshes the nodes stamped since it last ran from the layout's change
    log, and compares every node's stamp when more stamps came than the log holds (tiny logs
    here): decisions stay the reference's, with bound pods changing nodes in between."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_module, "NODE_LOG", log_size)
        fast, slow = Allocator(build(nodes), fast=True), Allocator(build(nodes), fast=False)
        assert len(fast.model.layout().node_log) == log_size
    for i, raw in enumerate(claims):
        policy = Policy(node=raw[5], device=raw[6], topology=raw[7])
        claim = claim_of(i, raw)
        assert outcome(fast, claim, policy) == outcome(slow, claim, policy)
        if i < len(bound) and bound[i] < len(nodes):  # a pod bound between decisions
            pod = {
                "metadata": {"uid": f"pod-{i}"},
                "spec": {
                    "nodeName": f"node-{bound[i]:05d}",
                    "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                },
            }
            for alloc in (fast, slow):
                alloc.model.apply("Pod", pod)
        assert_same_consumption(fast.model, slow.model)


def counts(model: ClusterModel) -> dict[tuple[str, str, str], tuple[int, int]]:
    return {key: (used.allocations, used.exclusive) for key, used in model.used.items()}


def assert_same_consumption(one: ClusterModel, other: ClusterModel) -> None:
    """The models' consumption dictionaries and the layout columns derived from them agree."""
    assert one._claims == other._claims
    assert one.used == other.used
    assert counts(one) == counts(other)
    assert one.change_seq == other.change_seq
    first, second = one.layout(), other.layout()
    for column in (
        "mem_used",
        "cores_used",
        "busy",
        "used_by_dim",
        "dev",
        "node_mem_used",
        "node_cores_used",
        "node_seq",
    ):
        assert np.array_equal(getattr(first, column), getattr(second, column)), column


def test_the_accountant_stays_the_models_twin_across_recommits_and_layout_changes() -> None:
    """The fast commit keeps per-device slots for the layout it last saw: re-committing a claim
    (release, then add), a commit while no layout is built, a rebuilt layout and a release all
    leave the model as `ClusterModel.assume` does."""
    nodes = [(PRODUCTS[0], "two-islands", 8), (PRODUCTS[1], "pairs", 4)]
    fast, slow = Allocator(build(nodes), fast=True), Allocator(build(nodes), fast=False)
    policy = Policy(node="binpack", device="spread", topology="link")

    def place(i: int, count: int) -> tuple[Placement, Placement]:
        claim = claim_of(i, (count, "10Gi", "30", None, CONSTRAINTS[1], "", "", "", None))
        a, b = outcome(fast, claim, policy), outcome(slow, claim, policy)
        assert isinstance(a, Placement) and a == b
        assert_same_consumption(fast.model, slow.model)
        return a, b

    first, first_slow = place(0, 2)
    fast.commit(first)  # the same claim again: its old entries are released first
    slow.commit(first_slow)
    assert_same_consumption(fast.model, slow.model)
    node = next(
        obj for kind, obj in node_events(0, PRODUCTS[0], "two-islands", 8) if kind == "Node"
    )
    for alloc in (fast, slow):
        alloc.model.apply("Node", node)  # the layout goes stale: no layout until the next read
        assert alloc.model._layout is None
    fast.commit(first)  # committed while no layout is built (no rows to write)
    slow.commit(first_slow)
    assert_same_consumption(fast.model, slow.model)  # rebuilds both layouts
    place(1, 4)  # on the rebuilt layout: the slots of the old one are not used
    place(2, 1)
    assert fast._accountant is not None
    fast._accountant.set_claim(first.results[0][0].uid, [])  # released
    slow.model.assume(first.results[0][0].uid, [])
    assert_same_consumption(fast.model, slow.model)


def test_the_shortcut_decides_as_the_allocators_own_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fast allocator's `place` / `commit` are `_fastkernel.Shortcut`'s: its usual case gives
    the placement the Python method gives (same allocator, same moment), and every other case
    (a constrained pod, debug logging on, a refusal) is the Python method's own answer."""
    nodes = [(PRODUCTS[0], "two-islands", 8), (PRODUCTS[1], "pairs", 4)]
    fast, slow = Allocator(build(nodes), fast=True), Allocator(build(nodes), fast=False)
    assert isinstance(fast.place.__self__, _fastkernel.Shortcut)
    assert not isinstance(getattr(slow.place, "__self__", None), _fastkernel.Shortcut)
    policy = Policy(node="binpack", device="spread", topology="link")
    plain: dict[str, Any] = {"spec": {}}
    tolerant: dict[str, Any] = {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    for i in range(6):
        claim = claim_of(i, (2, "10Gi", "30", None, CONSTRAINTS[1], "", "", "", None))
        for pod in (plain, tolerant):
            # (the claim's own shape string each time: the shortcut's kept key compares equal)
            assert fast.place(pod, [claim], policy) == Allocator.place(fast, pod, [claim], policy)
        placement = fast.place(plain, [claim], policy)
        assert placement == slow.place(plain, [claim], policy)
        fast.commit(placement)
        slow.commit(placement)
        assert_same_consumption(fast.model, slow.model)
    big = claim_of(9, (9, "1Gi", None, None, None, "", "", "", None))  # no node has 9 GPUs
    with pytest.raises(Unschedulable) as refused:
        fast.place(plain, [big], policy)
    with pytest.raises(Unschedulable) as refused_slow:
        slow.place(plain, [big], policy)
    assert str(refused.value) == str(refused_slow.value)
    caplog.set_level(logging.DEBUG, logger=allocate.log.name)
    claim = claim_of(10, (1, "1Gi", None, None, None, "", "", "", None))
    placement = fast.place(plain, [claim], policy)
    assert placement == slow.place(plain, [claim], policy)
    logged = [r.getMessage().split()[:2] for r in caplog.records if r.name == allocate.log.name]
    assert logged == [["decision", placement.node]] * 2  # debug logging takes the Python method


def test_consumption_records_are_kept_out_of_the_cyclic_gc() -> None:
    """What a fast commit keeps (each device's `DeviceUsage`, which holds its names itself; each
    claim's list of records) holds no cycle and is not tracked: a cluster filling up would
    otherwise bring collections every few hundred decisions."""
    nodes = [(PRODUCTS[0], "two-islands", 8)]
    fast = Allocator(build(nodes), fast=True)
    policy = Policy(node="binpack", device="spread", topology="link")
    claim = claim_of(0, (2, "10Gi", "30", None, CONSTRAINTS[1], "", "", "", None))
    placement = outcome(fast, claim, policy)
    assert isinstance(placement, Placement)
    assert not gc.is_tracked(fast.model._claims[claim.uid])
    for key in (result.consumption.device for result in placement.results[0][1]):
        usage = fast.model.used[key]
        assert isinstance(usage, _fastkernel.DeviceUsage) and not gc.is_tracked(usage)
        assert len(usage) == 2


def test_the_accountant_releases_consumption_the_api_reported() -> None:
    """A claim whose allocation arrived as an API object (its device keys are new tuples,
    equal to the layout's but other objects) is released and re-committed by the fast path
    as by the model; so is a placement committed twice with the API's copy in between."""
    nodes = [(PRODUCTS[0], "two-islands", 8), (PRODUCTS[1], "pairs", 4)]
    fast, slow = Allocator(build(nodes), fast=True), Allocator(build(nodes), fast=False)
    policy = Policy(node="binpack", device="spread", topology="link")
    claim = claim_of(0, (2, "10Gi", "30", None, CONSTRAINTS[1], "", "", "", None))
    placement = outcome(fast, claim, policy)
    assert isinstance(placement, Placement) and outcome(slow, claim, policy) == placement
    allocation = placement.allocation(claim.uid)
    api = {"metadata": {"uid": claim.uid}, "status": {"allocation": allocation}}
    for _ in range(2):
        for alloc in (fast, slow):
            alloc.model.apply("ResourceClaim", api)  # the claim's update event
        assert_same_consumption(fast.model, slow.model)
        fast.commit(placement)  # releases the API's entries, then records its own
        slow.commit(placement)
        assert_same_consumption(fast.model, slow.model)
    # The address table holds the layout's own key objects only: one entry per device the
    # claim took, however many equal keys the API's copies brought
    assert fast._accountant is not None
    assert fast._accountant.table_count == len(placement.results[0][1])
    for alloc in (fast, slow):
        alloc.model.delete("ResourceClaim", api)
    assert_same_consumption(fast.model, slow.model)
    assert not any(any(used.values()) for used in fast.model.used.values())


@settings(max_examples=200, deadline=None)
@given(
    uid=st.text(min_size=1, max_size=60),
    request=st.text(min_size=1, max_size=80),
    positions=st.lists(
        st.one_of(st.integers(0, 16), st.integers(0, (1 << 32) - 1)), min_size=1, max_size=6
    ),
)
def test_share_ids_are_identical(uid: str, request: str, positions: list[int]) -> None:
    """Both twins give the same text at every position, and positions of one request differ
    (one hash per request, the position mixed into its last bytes)."""
    assume_utf8 = all(not 0xD800 <= ord(ch) <= 0xDFFF for ch in uid + request)
    if not assume_utf8:  # lone surrogates cannot be encoded by either twin
        return
    base = allocate._share_base(uid, request)
    ids = {}
    for position in positions:
        text = allocate._share_id(base, position)
        assert _fastkernel.share_id(uid, request, position) == text
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
        ids[position] = text
    assert len(set(ids.values())) == len(ids)


def test_share_id_positions_outside_32_bits_are_refused() -> None:
    for position in (-1, 1 << 32):
        with pytest.raises(ValueError, match="position"):
            _fastkernel.share_id("uid", "gpu", position)
        with pytest.raises(ValueError, match="position"):
            allocate._share_id(allocate._share_base("uid", "gpu"), position)


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
    for scan in (allocate.FAST_KERNEL, kernel.scan):
        assert scan is not None
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
    for search in (allocate.FAST_SEARCH, kernel.search):
        assert search is not None
        chosen = np.zeros(n_req, dtype=np.int64)
        picks = np.zeros((n_req, m), dtype=np.int64)
        npicks = np.zeros(n_req, dtype=np.int64)
        found = search(*inputs, topo, strict, binpack, budget, chosen, picks, npicks)
        out.append(
            (found, [(int(chosen[i]), picks[i, : npicks[i]].tolist()) for i in range(n_req)])
            if found
            else (found, None)
        )
    # The fast path's call: Engine.search over an Encoding that keeps its scratch between
    # calls; a first walk cut short by a budget of 1 leaves that scratch dirty, the second
    # must still answer like a fresh search.
    engine = allocate._fastkernel.Engine(one_node_layout(*inputs[:3]))
    enc = allocate._fastkernel.Encoding(*inputs[3:], k_dims)
    for first in (1, budget):
        engine.search(0, enc, topo, strict, binpack, first)
    found = engine.search(0, enc, topo, strict, binpack, budget)
    out.append((found, [(a, list(rows)) for a, rows in enc.picked()]) if found else (found, None))
    assert out[0] == out[1] == out[2]


def one_node_layout(dev: Any, cap: Any, used: Any) -> Any:
    """A layout of one node holding these devices, with what `_fastkernel.Engine` reads."""
    m = len(dev)
    column = np.zeros(m, dtype=np.int64)
    node = np.zeros(1, dtype=np.int64)
    return SimpleNamespace(
        node_start=node,
        node_end=np.asarray([m], dtype=np.int64),
        node_seq=node,
        node_mem_total=node,
        node_mem_used=node,
        node_cores_total=node,
        node_cores_used=node,
        mem_total=column,
        cores_total=column,
        mem_default=column,
        cores_default=column,
        mem_used=column,
        cores_used=column,
        busy=column,
        numa=column,
        link=column,
        link_size=column,
        cap=cap,
        used_by_dim=used,
        dev=dev,
        node_log=np.zeros(4, dtype=np.int64),
        node_log_count=np.zeros(1, dtype=np.int64),
    )


def test_cython_search_refuses_malformed_arrays() -> None:
    """The Cython search reads raw buffers: wrong dtypes, non-contiguous arrays, disagreeing
    shapes and out-of-range indices are refused with ValueError instead of read blindly."""
    search = allocate.FAST_SEARCH
    assert search is not None
    m, k = 2, 1

    def good() -> list[Any]:
        return [
            np.zeros((m, kernel.DEV_FIELDS), dtype=np.int64),
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
    column[0][0, kernel.DEV_MEM] = k
    bad_cases.append(column)
    for args in bad_cases:
        with pytest.raises((ValueError, BufferError)):
            search(*args, 0, 0, 0, 100, *outputs())


def test_cython_engine_and_encoding_refuse_what_does_not_fit_their_layout() -> None:
    """The fast path's Engine keeps pointers into the layout and reads encodings per node: a
    node out of range, an encoding made for another node's device count, mismatched node-fit
    or scan inputs are refused with ValueError, never read past an array. And `next` sets
    nodes aside for one decision only (the next `rank` counts them again)."""
    fk = allocate._fastkernel
    model = build([("NVIDIA A10", "pairs", 2), ("NVIDIA A10", "pairs", 4)])
    layout = model.layout()
    engine = fk.Engine(layout)
    n_dev, k = len(layout.devices), len(layout.dims)

    def encoding(m: int) -> Any:
        return fk.Encoding(
            np.asarray([[0, 1]], dtype=np.int64),
            np.asarray([[0, 1, 0]], dtype=np.int64),
            np.ones((1, m), dtype=np.int8),
            np.ones((1, m), dtype=np.int8),
            np.zeros((1, m, k), dtype=np.int64),
            np.zeros((1, 0), dtype=np.int8),
            np.zeros(0, dtype=np.int64),
            np.zeros((0, m), dtype=np.int64),
            k,
        )

    assert engine.search(0, encoding(2), 0, 0, 0, 100) == 1
    for node, enc in ((1, encoding(2)), (2, encoding(2)), (-1, encoding(2))):
        with pytest.raises(ValueError):
            engine.search(node, enc, 0, 0, 0, 100)
    with pytest.raises(ValueError):  # a negative device count would walk past the candidates
        fk.Encoding(encoding(2).arrays[0], np.asarray([[0, -1, 0]]), *encoding(2).arrays[2:], k)
    # The encoding keeps its own copy: writing the caller's arrays afterwards changes nothing.
    copied = encoding(2)
    copied.arrays[0][0, 1] = 5  # reqs now names alternatives that do not exist
    assert engine.search(0, copied, 0, 0, 0, 100) == 1
    with pytest.raises(ValueError):  # amount's capacity columns disagree with k_dims
        fk.Encoding(*encoding(2).arrays[:4], np.zeros((1, 2, k + 1)), *encoding(2).arrays[5:], k)

    def node_keys(n_req: int, masks_dev: int) -> Any:
        req = np.zeros(n_req, dtype=np.int64)
        masks = np.ones((n_req, masks_dev), dtype=np.int8)
        return fk.NodeKeys(masks, req, req, req, req + 1, req, 0, 0, 1, len(layout.nodes))

    ok = np.ones(len(layout.nodes), dtype=np.int8)
    ranked = node_keys(1, n_dev)
    assert engine.rank(ranked, ok, model.change_seq) == 0  # binpack: first of equals
    assert engine.next(ranked, 0) == 1  # the other node, once the first is set aside
    assert engine.next(ranked, 1) == -1
    # A new decision: the nodes set aside by the last one count again.
    assert engine.rank(ranked, ok, model.change_seq) == 0
    assert engine.next(ranked, 0) == 1
    for failed in (-1, len(layout.nodes)):
        with pytest.raises(ValueError):
            engine.next(ranked, failed)
    with pytest.raises(ValueError):
        engine.rank(node_keys(1, n_dev - 1), ok, model.change_seq)
    with pytest.raises(ValueError):
        engine.rank(node_keys(1, n_dev), ok[:1], model.change_seq)
    with pytest.raises(ValueError):
        fk.NodeKeys(
            np.ones((2, n_dev), dtype=np.int8),
            *(np.zeros(1, dtype=np.int64),) * 5,
            0,
            0,
            1,
            len(layout.nodes),
        )


def test_cython_plan_and_decide_refuse_what_does_not_fit_their_layout() -> None:
    """A `Plan` checks its layout-wide columns once (shapes, request and claim indices, device
    counts) and `Engine.decide` refuses a plan, node fit or claims that do not fit its layout
    with ValueError / TypeError instead of reading past an array; a valid plan decides."""
    fk = allocate._fastkernel
    model = build([("NVIDIA A10", "pairs", 2), ("NVIDIA A10", "pairs", 4)])
    layout = model.layout()
    engine = fk.Engine(layout)
    n_dev, k, n_nodes = len(layout.devices), len(layout.dims), len(layout.nodes)
    req = np.zeros(1, dtype=np.int64)
    node_keys = fk.NodeKeys(
        np.ones((1, n_dev), dtype=np.int8), req, req, req, req + 1, req, 0, 0, 1, n_nodes
    )
    keys = [device.key for device in layout.devices]
    inputs: dict[str, Any] = {
        "reqs": np.asarray([[0, 1]], dtype=np.int64),
        "alts": np.asarray([[0, 1, 0]], dtype=np.int64),
        "applies": np.zeros((1, 0), dtype=np.int8),
        "distinct": np.zeros(0, dtype=np.int64),
        "owners": np.zeros(1, dtype=np.int64),
        "mask_all": np.ones((1, n_dev), dtype=np.int8),
        "servable_all": np.ones((1, n_dev), dtype=np.int8),
        "amount_all": np.zeros((1, n_dev, k), dtype=np.int64),
        "cval_all": np.zeros((0, n_dev), dtype=np.int64),
        "multi": layout.multi,
        "alt_names": ("gpu",),
        "alt_admin": (False,),
        "alt_tolerations": ((),),
        "consumed": [[()] * n_dev],
        "keys": keys,
    }

    def plan(**changes: Any) -> Any:
        made = fk.Plan(
            node_keys,
            layout.nodes,
            0,
            0,
            0,
            100,
            Placement,
            allocate.DeviceResult,
            allocate.Consumption,
        )
        made.set_inputs(*{**inputs, **changes}.values())
        return made

    claim = SimpleNamespace(uid="u-1")
    ok = np.ones(n_nodes, dtype=np.int8)
    placement = engine.decide(plan(), ok, model.change_seq, (claim,))
    assert isinstance(placement, Placement)
    assert placement.node == layout.nodes[0]
    assert [r.device for _, results in placement.results for r in results] == [keys[0][2]]
    bad = (
        {"reqs": np.asarray([[0, 2]], dtype=np.int64)},  # names an alternative that is not
        {"alts": np.asarray([[0, -1, 0]], dtype=np.int64)},  # a negative device count
        {"owners": np.asarray([-1], dtype=np.int64)},
        {"mask_all": np.ones((1, n_dev - 1), dtype=np.int8)},
        {"consumed": [[()] * (n_dev - 1)]},
        {"keys": keys[:-1]},
        {"alt_names": ()},
    )
    for changes in bad:
        with pytest.raises(ValueError):
            plan(**changes)
    with pytest.raises(ValueError):  # node fit for another number of nodes
        engine.decide(plan(), ok[:1], model.change_seq, (claim,))
    with pytest.raises(ValueError):  # capacity columns this layout does not have
        engine.decide(plan(amount_all=np.zeros((1, n_dev, k + 1), dtype=np.int64)), ok, 0, (claim,))
    with pytest.raises(ValueError):  # a claim index beyond the claims given
        engine.decide(plan(owners=np.asarray([1], dtype=np.int64)), ok, 0, (claim,))
    with pytest.raises(ValueError):  # a plan whose columns were never set
        engine.decide(
            fk.Plan(node_keys, layout.nodes, 0, 0, 0, 100, Placement, tuple, tuple),
            ok,
            model.change_seq,
            (claim,),
        )
    with pytest.raises(ValueError):  # result types must be tuples (made in C)
        fk.Plan(node_keys, layout.nodes, 0, 0, 0, 100, Placement, dict, tuple)
    other = fk.Engine(build([("NVIDIA A10", "pairs", 2)]).layout())
    with pytest.raises(ValueError):  # a plan for another layout
        other.decide(plan(), np.ones(1, dtype=np.int8), 0, (claim,))
