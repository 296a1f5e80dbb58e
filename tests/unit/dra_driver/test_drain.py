"""`vgpu-dra drain` / `undrain` / `drains` against an in-memory API server.

Proves: the rule written (name from node and device, selector driver + the node's pool + device,
the `<driver>/drain` taint with the chosen effect, the reason as a label-safe value and in full
in an annotation); draining twice writes nothing, another effect or reason updates the rule; an
unknown device or node, a node without the driver's slices and an API without DeviceTaintRules
are errors that say what exists or what is needed; a foreign rule under our name is not
overwritten; undraining twice is fine; the listing shows our rules and others that can taint the
driver's devices, with the EvictionInProgress condition; the commands' exit codes and messages.
(The real API server, scheduler and eviction: tests/e2e/dra_driver/test_drain.py.)
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Mapping
from typing import Any

import pytest

from dra_driver import drain, kube, slices
from tests.fixtures.claimdata import inventory

JSON = dict[str, Any]
DRIVER = "vgpu.dra.dev"
GIB = 1 << 30
RULES = "/apis/resource.k8s.io/v1/devicetaintrules"


class Api:
    """Nodes, slices and DeviceTaintRules by path; the discovery document of resource.k8s.io/v1;
    every write recorded."""

    def __init__(self, *, serves_rules: bool = True, serves_group: bool = True) -> None:
        self.objects: dict[str, JSON] = {}
        self.writes: list[tuple[str, str]] = []
        self.serves_rules = serves_rules
        self.serves_group = serves_group
        self.rv = 0
        for node in ("node-1", "node-2"):
            self.objects[kube.path("v1", "nodes", node)] = {"metadata": {"name": node}}
        self.objects[kube.path("v1", "nodes", "cpu-only")] = {"metadata": {"name": "cpu-only"}}
        for node, count in (("node-1", 4), ("node-2", 2)):
            for obj in slices.build_slices(
                inventory(count=count, memory=80 * GIB),
                driver=DRIVER,
                node_name=node,
                node_uid=f"uid-{node}",
            ):
                name = f"{node}-{obj['metadata'].get('generateName', 's')}"
                obj["metadata"]["name"] = name
                self.objects[kube.path(kube.RESOURCE_API, "resourceslices", name)] = obj

    def get(self, path: str, **_: Any) -> JSON:
        if path == "/apis/resource.k8s.io/v1":
            if not self.serves_group:
                raise kube.NotFound(404, "NotFound", "the server could not find the resource")
            plurals = ["resourceslices", "resourceclaims"]
            plurals += ["devicetaintrules"] if self.serves_rules else []
            return {"kind": "APIResourceList", "resources": [{"name": p} for p in plurals]}
        if path not in self.objects:
            raise kube.NotFound(404, "NotFound", f"{path} not found")
        return copy.deepcopy(self.objects[path])

    def list(self, path: str, *, field_selector: str | None = None, **_: Any) -> list[JSON]:
        wanted = dict(f.split("=", 1) for f in (field_selector or "").split(",") if f)
        out = []
        for p, obj in self.objects.items():
            if p.rpartition("/")[0] != path:
                continue
            spec = obj.get("spec") or {}
            if all(spec.get(k.removeprefix("spec.")) == v for k, v in wanted.items()):
                out.append(copy.deepcopy(obj))
        return out

    def create(self, path: str, obj: Mapping[str, Any]) -> JSON:
        target = f"{path}/{obj['metadata']['name']}"
        if target in self.objects:
            raise kube.AlreadyExists(409, "AlreadyExists", target)
        self.writes.append(("create", target))
        return self._store(target, obj)

    def replace(self, path: str, obj: Mapping[str, Any]) -> JSON:
        assert (
            obj["metadata"]["resourceVersion"] == self.objects[path]["metadata"]["resourceVersion"]
        )
        self.writes.append(("replace", path))
        return self._store(path, obj)

    def delete(self, path: str, *, missing_ok: bool = True) -> None:
        if self.objects.pop(path, None) is None:
            if not missing_ok:
                raise kube.NotFound(404, "NotFound", path)
            return
        self.writes.append(("delete", path))

    def _store(self, path: str, obj: Mapping[str, Any]) -> JSON:
        stored = copy.deepcopy(dict(obj))
        self.rv += 1
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def close(self) -> None:
        pass


def rules(api: Api) -> list[JSON]:
    return api.list(RULES)


def target(text: str) -> drain.Target:
    return drain.parse_target(text)


def test_drain_writes_one_rule_selecting_the_device() -> None:
    api = Api()
    done = drain.drain(api, DRIVER, target("node-1/gpu-3"), reason="Fan failure, ticket #42")  # type: ignore[arg-type]
    (rule,) = rules(api)
    assert rule["metadata"]["name"] == "drain.node-1.gpu-3.vgpu.dra.dev"
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "node-1", "device": "gpu-3"},
        "taint": {
            "key": "vgpu.dra.dev/drain",
            "value": "fan-failure-ticket-42",
            "effect": "NoExecute",
        },
    }
    meta = rule["metadata"]
    assert meta["annotations"] == {"vgpu.dra.dev/drain-reason": "Fan failure, ticket #42"}
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "vgpu-dra"}
    assert (
        done == "drained node-1/gpu-3 (NoExecute): devicetaintrule/drain.node-1.gpu-3.vgpu.dra.dev"
    )


def test_drain_is_idempotent_and_updates_a_changed_effect_or_reason() -> None:
    api = Api()
    t = target("node-2/gpu-0")
    drain.drain(api, DRIVER, t, effect="NoSchedule")  # type: ignore[arg-type]
    again = drain.drain(api, DRIVER, t, effect="NoSchedule")  # type: ignore[arg-type]
    assert again.startswith("node-2/gpu-0 is already drained (NoSchedule)")
    assert [w for w, _ in api.writes] == ["create"]
    drain.drain(api, DRIVER, t, effect="NoExecute")  # type: ignore[arg-type]
    path = f"{RULES}/{drain.rule_name(DRIVER, t)}"
    api.objects[path]["spec"]["taint"]["timeAdded"] = "2026-07-01T10:00:00Z"  # the server's
    drain.drain(api, DRIVER, t, effect="NoExecute", reason="rma")  # type: ignore[arg-type]
    # Only the reason changed: the eviction clock (timeAdded) is kept.
    assert api.objects[path]["spec"]["taint"]["timeAdded"] == "2026-07-01T10:00:00Z"
    assert [w for w, _ in api.writes] == ["create", "replace", "replace"]
    (rule,) = rules(api)
    assert rule["spec"]["taint"] == {
        "key": "vgpu.dra.dev/drain",
        "value": "rma",
        "effect": "NoExecute",
        "timeAdded": "2026-07-01T10:00:00Z",
    }
    drain.drain(api, DRIVER, t, effect="NoExecute")  # type: ignore[arg-type]  # reason dropped
    (rule,) = rules(api)
    assert "value" not in rule["spec"]["taint"]
    assert "vgpu.dra.dev/drain-reason" not in rule["metadata"]["annotations"]


def test_unknown_device_node_and_nodes_without_gpus_say_what_exists() -> None:
    api = Api()
    with pytest.raises(drain.DrainError, match=r"node-2 has no device 'gpu-7' .*: gpu-0, gpu-1$"):
        drain.drain(api, DRIVER, target("node-2/gpu-7"))  # type: ignore[arg-type]
    with pytest.raises(drain.DrainError, match="node 'node-9' does not exist"):
        drain.drain(api, DRIVER, target("node-9/gpu-0"))  # type: ignore[arg-type]
    with pytest.raises(
        drain.DrainError, match=r"cpu-only publishes no devices .*: node-1, node-2\)"
    ):
        drain.drain(api, DRIVER, target("cpu-only/gpu-0"))  # type: ignore[arg-type]
    assert api.writes == []


def test_devices_are_read_from_the_newest_pool_generation() -> None:
    api = Api()
    for path, obj in list(api.objects.items()):
        if "resourceslices" in path and obj["spec"]["nodeName"] == "node-2":
            old = copy.deepcopy(obj)
            old["metadata"]["name"] += "-old"
            obj["spec"]["pool"]["generation"] = 2
            old["spec"]["pool"]["generation"] = 1
            old["spec"]["devices"].append({**old["spec"]["devices"][0], "name": "gpu-9"})
            api.objects[path + "-old"] = old
    with pytest.raises(drain.DrainError, match="gpu-9"):
        drain.drain(api, DRIVER, target("node-2/gpu-9"))  # type: ignore[arg-type]


@pytest.mark.parametrize("group", [True, False])
def test_an_api_without_device_taint_rules_names_the_version_needed(group: bool) -> None:
    api = Api(serves_rules=False, serves_group=group)
    for call in (
        lambda: drain.drain(api, DRIVER, target("node-1/gpu-0")),  # type: ignore[arg-type]
        lambda: drain.undrain(api, DRIVER, target("node-1/gpu-0")),  # type: ignore[arg-type]
        lambda: drain.list_drains(api, DRIVER),  # type: ignore[arg-type]
    ):
        with pytest.raises(drain.DrainError, match=r"Kubernetes 1\.37 .*DRADeviceTaintRules"):
            call()


def test_a_foreign_rule_under_our_name_is_not_overwritten() -> None:
    api = Api()
    name = drain.rule_name(DRIVER, target("node-1/gpu-0"))
    api.create(RULES, {"metadata": {"name": name}, "spec": {"deviceSelector": {"pool": "x"}}})
    with pytest.raises(drain.DrainError, match="not written by vgpu-dra drain"):
        drain.drain(api, DRIVER, target("node-1/gpu-0"))  # type: ignore[arg-type]
    assert [w for w, _ in api.writes] == ["create"]


def test_undrain_deletes_and_is_idempotent() -> None:
    api = Api()
    t = target("node-1/gpu-1")
    drain.drain(api, DRIVER, t)  # type: ignore[arg-type]
    assert drain.undrain(api, DRIVER, t).startswith("undrained node-1/gpu-1")  # type: ignore[arg-type]
    assert rules(api) == []
    assert "was not drained" in drain.undrain(api, DRIVER, t)  # type: ignore[arg-type]


def test_names_are_deterministic_per_driver_node_and_device_and_fit_the_api() -> None:
    a = drain.rule_name(DRIVER, target("node-1/gpu-1"))
    assert a == drain.rule_name(DRIVER, target("node-1/gpu-1"))
    assert a != drain.rule_name("other.example", target("node-1/gpu-1"))
    assert a != drain.rule_name(DRIVER, target("node-11/gpu-1"))
    long_node = "n" * 250
    long_name = drain.rule_name(DRIVER, target(f"{long_node}/gpu-1"))
    assert len(long_name) <= 253 and long_name != drain.rule_name(
        DRIVER, target(f"{long_node}/gpu-2")
    )
    assert drain.taint_value("  !! ") == ""
    assert drain.taint_value("x" * 80 + "!") == "x" * 63
    for bad in ("node-1", "/gpu-0", "node-1/", "a/b/c"):
        with pytest.raises(drain.DrainError, match="NODE/DEVICE"):
            drain.parse_target(bad)


def test_listing_shows_rules_that_can_taint_the_drivers_devices() -> None:
    api = Api()
    drain.drain(api, DRIVER, target("node-1/gpu-2"))  # type: ignore[arg-type]
    path = f"{RULES}/{drain.rule_name(DRIVER, target('node-1/gpu-2'))}"
    api.objects[path]["spec"]["taint"]["timeAdded"] = "2026-07-01T10:00:00Z"
    api.objects[path]["status"] = {
        "conditions": [
            {"type": "EvictionInProgress", "status": "True", "reason": "PodsPendingEviction",
             "message": "1 pod needs to be evicted in 1 namespace"}
        ]
    }  # fmt: skip
    taint = {"key": "maint", "effect": "NoSchedule"}
    api.create(
        RULES,
        {
            "metadata": {"name": "by-hand"},
            "spec": {"deviceSelector": {"pool": "node-2"}, "taint": taint},
        },
    )
    api.create(
        RULES,
        {
            "metadata": {"name": "other"},
            "spec": {"deviceSelector": {"driver": "x"}, "taint": taint},
        },
    )
    rows = drain.list_drains(api, DRIVER)  # type: ignore[arg-type]
    assert [(r.node, r.device, r.effect, r.ours) for r in rows] == [
        ("node-1", "gpu-2", "NoExecute", True),
        ("node-2", "*", "NoSchedule", False),
    ]
    assert rows[0].eviction == "True: 1 pod needs to be evicted in 1 namespace"
    assert rows[1].eviction == "-"
    table = drain.render_table(rows)
    assert table.splitlines()[0].split() == [
        "NODE",
        "GPU",
        "EFFECT",
        "TAINT",
        "SINCE",
        "EVICTION",
        "RULE",
    ]
    assert "2026-07-01T10:00:00Z" in table and "by-hand*" in table
    assert table.endswith("* not written by vgpu-dra drain\n")
    assert json.loads(drain.render_json(rows))["drains"][0]["rule"] == rows[0].rule
    assert drain.render_table([]) == "No DeviceTaintRules for this driver's devices.\n"


def test_commands_exit_codes_and_messages(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = Api()
    monkeypatch.setattr(kube.KubeClient, "from_kubeconfig", lambda *a, **k: api)
    out = io.StringIO()
    assert drain.main(["node-1/gpu-0", "--effect", "NoSchedule"], out) == 0
    assert drain.main(["node-1/gpu-0", "--effect", "NoSchedule"], out) == 0
    assert drain.list_main(["-o", "json"], out) == 0
    assert drain.main(["--list"], out) == 0
    assert drain.undrain_main(["node-1/gpu-0"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("drained node-1/gpu-0 (NoSchedule)")
    assert lines[1].startswith("node-1/gpu-0 is already drained")
    assert '"device": "gpu-0"' in out.getvalue()
    assert lines[-1].startswith("undrained node-1/gpu-0")
    assert drain.main(["node-1/gpu-8"], out) == 1
    assert "its devices: gpu-0, gpu-1, gpu-2, gpu-3" in capsys.readouterr().err
    for argv in (["node-1"], [], ["--list", "node-1/gpu-0"], ["node-1/gpu-0", "--effect", "None"]):
        with pytest.raises(SystemExit) as exc:
            drain.main(argv, out)
        assert exc.value.code == 2, argv


def test_forbidden_names_the_admin_right(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = Api()

    def forbidden(path: str, obj: Mapping[str, Any]) -> JSON:
        raise kube.KubeError(403, "Forbidden", 'devicetaintrules is forbidden: User "dev"')

    monkeypatch.setattr(api, "create", forbidden)
    monkeypatch.setattr(kube.KubeClient, "from_kubeconfig", lambda *a, **k: api)
    assert drain.main(["node-1/gpu-0"], io.StringIO()) == 1
    assert "cluster admins" in capsys.readouterr().err
