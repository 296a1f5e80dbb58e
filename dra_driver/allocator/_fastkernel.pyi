from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

def scan(
    node_start: Any,
    node_end: Any,
    node_ok: Any,
    node_mem_total: Any,
    node_mem_used: Any,
    node_cores_total: Any,
    node_cores_used: Any,
    mem_total: Any,
    cores_total: Any,
    mem_default: Any,
    cores_default: Any,
    mem_used: Any,
    cores_used: Any,
    busy: Any,
    numa: Any,
    link: Any,
    link_size: Any,
    masks: Any,
    req_mem: Any,
    req_pct: Any,
    req_cores: Any,
    req_count: Any,
    req_group: Any,
    topo: int,
    strict: int,
    binpack: int,
    keys: Any,
    closeness: Any,
) -> None: ...
def search(
    dev: Any,
    cap: Any,
    used: Any,
    reqs: Any,
    alts: Any,
    mask: Any,
    servable: Any,
    amount: Any,
    applies: Any,
    distinct: Any,
    cval: Any,
    topo: int,
    strict: int,
    binpack: int,
    budget: int,
    chosen_alt: Any,
    picks: Any,
    npicks: Any,
) -> int: ...

class Encoding:
    arrays: tuple[Any, ...]
    def __init__(
        self,
        reqs: Any,
        alts: Any,
        mask: Any,
        servable: Any,
        amount: Any,
        applies: Any,
        distinct: Any,
        cval: Any,
        k_dims: int,
    ) -> None: ...
    def picked(self) -> list[tuple[int, tuple[int, ...]]]: ...

class NodeKeys:
    keys: Any
    closeness: Any
    filled: bool
    def __init__(
        self,
        masks: Any,
        req_mem: Any,
        req_pct: Any,
        req_cores: Any,
        req_count: Any,
        req_group: Any,
        topo: int,
        strict: int,
        binpack: int,
        n_nodes: int,
    ) -> None: ...
    def key(self, node: int) -> float: ...

class Plan:
    node_keys: NodeKeys
    encodings: list[Encoding | None]
    def __init__(
        self,
        node_keys: NodeKeys,
        node_names: list[str],
        topo: int,
        strict: int,
        binpack: int,
        budget: int,
        placement_type: type,
        result_type: type,
        consumption_type: type,
    ) -> None: ...
    def set_inputs(
        self,
        reqs: Any,
        alts: Any,
        applies: Any,
        distinct: Any,
        owners: Any,
        mask_all: Any,
        servable_all: Any,
        amount_all: Any,
        cval_all: Any,
        multi: Any,
        alt_names: tuple[str, ...],
        alt_admin: tuple[bool, ...],
        alt_tolerations: tuple[Any, ...],
        consumed: list[Any],
        keys: list[Any],
    ) -> None: ...

class Engine:
    tried: int
    def __init__(self, layout: Any) -> None: ...
    def decide(self, plan: Plan, node_ok: Any, seq: int, claims: tuple[Any, ...]) -> Any: ...
    def rank(self, nk: NodeKeys, node_ok: Any, seq: int) -> int: ...
    def next(self, nk: NodeKeys, failed: int) -> int: ...
    def search(
        self, node: int, enc: Encoding, topo: int, strict: int, binpack: int, budget: int
    ) -> int: ...

class LayoutWriter:
    def __init__(self, layout: Any) -> None: ...
    def account(
        self,
        row: int,
        seq: int,
        mem: int,
        cores: int,
        held: int,
        allocated: int,
        columns: list[int],
        values: list[int],
    ) -> None: ...

def share_id(uid: str, request: str, position: int) -> str: ...

class Accountant:
    table_count: int
    def __init__(self, model: Any, name_of: Any) -> None: ...
    def commit(self, results: tuple[Any, ...]) -> bool: ...
    def set_claim(self, uid: str, consumption: list[Any]) -> None: ...

class Shortcut:
    def __init__(
        self,
        allocator: Any,
        logger: Any,
        slow_place: Callable[..., Any],
        slow_commit: Callable[[Any], None],
    ) -> None: ...
    def place(
        self, pod: Any, claims: Any, policy: Any, pod_resources: tuple[int, int] = (0, 0)
    ) -> Any: ...
    def commit(self, placement: Any) -> None: ...

class DeviceUsage(MutableMapping[str, int]):
    allocations: int
    exclusive: int
    def __init__(self) -> None: ...
    def __getitem__(self, name: str) -> int: ...
    def __setitem__(self, name: str, value: int) -> None: ...
    def __delitem__(self, name: str) -> None: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
