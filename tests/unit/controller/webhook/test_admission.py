"""What the webhook answers (controller.webhook.admission), the GPU facts it validates against
(controller.webhook.facts) and its flags (controller.webhook.flags), without a cluster.

Proves: a legacy pod CREATE is answered with the translation's patch (base64 JSONPatch) and
warnings, after its templates were ensured in the request's namespace, but never on a dry run; a
legacy pod the validation refuses (more memory than any GPU) is refused, naming the legacy field,
before any template is made; a Refusal is allowed:false with code 400 and the refusal's words; a
template that cannot be created refuses the pod (code 500) naming the reason; pods without legacy
fields, other kinds and other operations pass untouched; validation refuses with code 422 and
every message, only for the kinds it knows, and never on DELETE; facts take the largest
allocatable memory and product names of the driver's devices only; flags parse durations and
shared resources and refuse bad ones naming the value.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from controller.main import build_parser
from controller.webhook.admission import Admission
from controller.webhook.facts import facts_from
from controller.webhook.flags import duration, shared_memory, shared_resources
from controller.webhook.run import translation_settings
from controller.webhook.templates import Template, TemplateError
from controller.webhook.translate import TranslationSettings, translate_pod
from controller.webhook.validation import ClusterFacts

JSON = dict[str, Any]
SETTINGS = TranslationSettings()
FACTS = ClusterFacts(largest_gpu_memory_mib=24576)


class Ensurer:
    """Records what the admission asked to exist; fails when told to."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail

    def ensure(self, namespace: str, templates: Iterable[Template]) -> None:
        if self.fail:
            raise TemplateError(self.fail)
        self.calls.append((namespace, [t.name for t in templates]))


def admission(ensurer: Ensurer) -> Admission:
    return Admission(SETTINGS, ensurer, lambda: FACTS)  # type: ignore[arg-type]


def legacy_pod(**annotations: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations} if annotations else {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {
            "nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1024"}}}]},
    }  # fmt: skip


def request(obj: JSON, operation: str = "CREATE", **extra: Any) -> JSON:
    return {"uid": "u", "kind": {"kind": obj["kind"]}, "operation": operation,
            "namespace": "tenant", "object": obj, **extra}  # fmt: skip


def test_a_legacy_pod_gets_the_translations_patch_after_its_templates() -> None:
    ensurer = Ensurer()
    pod = legacy_pod()
    response, decision = admission(ensurer).mutate(request(pod))
    translation = translate_pod(pod, SETTINGS)
    assert translation is not None
    assert decision == "patched"
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == translation.patch
    assert jsonpatch.apply_patch(pod, patch)["spec"]["resourceClaims"]
    assert response["warnings"] == translation.warnings
    assert ensurer.calls == [("tenant", [t.name for t in translation.templates])]


def test_a_dry_run_is_translated_without_side_effects() -> None:
    ensurer = Ensurer()
    response, decision = admission(ensurer).mutate(request(legacy_pod(), dryRun=True))
    assert (decision, response["allowed"]) == ("patched", True)
    assert ensurer.calls == []


def test_a_refusal_and_a_failed_template_deny() -> None:
    bad = legacy_pod(**{"nvidia.com/node-scheduler-policy": "fastest"})
    response, decision = admission(Ensurer()).mutate(request(bad))
    assert decision == "denied"
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "allowed values are binpack, spread" in response["status"]["message"]
    response, decision = admission(Ensurer(fail="quota exceeded")).mutate(request(legacy_pod()))
    assert (decision, response["status"]["code"]) == ("error", 500)
    assert response["status"]["message"] == "quota exceeded"


def test_a_legacy_pod_asking_more_memory_than_any_gpu_is_refused_naming_the_field() -> None:
    ensurer = Ensurer()
    pod = legacy_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/vgpu-memory"] = "30000"
    response, decision = admission(ensurer).mutate(request(pod))
    assert (decision, response["status"]["code"]) == ("denied", 422)
    assert "limits[nvidia.com/vgpu-memory]=30000 MiB" in response["status"]["message"]
    assert "largest: 24576 MiB" in response["status"]["message"]
    assert ensurer.calls == []  # refused before any template was made


def test_what_needs_no_translation_passes_untouched() -> None:
    ensurer = Ensurer()
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}  # fmt: skip
    hook = admission(ensurer)
    assert hook.mutate(request(plain)) == ({"allowed": True}, "allowed")
    assert hook.mutate(request(legacy_pod(), operation="UPDATE")) == ({"allowed": True}, "allowed")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert hook.mutate(request(other)) == ({"allowed": True}, "allowed")
    assert ensurer.calls == []


def test_validation_denies_with_every_message() -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "vgpu.dra.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "vgpu.dra.dev", "parameters": {
                "apiVersion": "vgpu.dra.dev/v1alpha1", "kind": "VgpuConfig",
                "computePolicy": "turbo"}}}]}},
    }  # fmt: skip
    hook = admission(Ensurer())
    response, decision = hook.validate(request(claim))
    assert decision == "denied" and response["status"]["code"] == 422
    assert "field 'computePolicy' has invalid value 'turbo'" in response["status"]["message"]
    assert hook.validate(request(claim, operation="DELETE")) == ({"allowed": True}, "allowed")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert hook.validate(request(other)) == ({"allowed": True}, "allowed")


def slice_of(driver: str, *devices: tuple[str, str | None, int]) -> JSON:
    return {"spec": {"driver": driver, "devices": [
        {"name": f"gpu-{n}", "attributes": {"productName": {"string": product},
                                            "memoryBytes": {"int": memory_bytes}},
         **({"capacity": {"memory": {"value": capacity}}} if capacity else {})}
        for n, (product, capacity, memory_bytes) in enumerate(devices)]}}  # fmt: skip


def test_facts_come_from_the_drivers_devices_only() -> None:
    slices = [
        slice_of(
            "vgpu.dra.dev", ("NVIDIA A10", "23028Mi", 24 << 30), ("NVIDIA A10", None, 1 << 30)
        ),
        slice_of("other.example.com", ("Other GPU", "200Gi", 200 << 30)),
        slice_of("vgpu.dra.dev", ("NVIDIA H100 80GB HBM3", None, 80 << 30)),
    ]
    classes = [
        {"metadata": {"name": "a10"}, "spec": {"selectors": [{"cel": {"expression":
            'device.driver == "vgpu.dra.dev" && device.attributes["vgpu.dra.dev"].x'}}]}},
        {"metadata": {"name": "theirs"}, "spec": {"selectors": [{"cel": {"expression":
            'device.driver == "other.example.com"'}}]}},
    ]  # fmt: skip
    facts = facts_from(slices, classes, "vgpu.dra.dev")
    assert facts.largest_gpu_memory_mib == 80 * 1024  # memoryBytes when no capacity is published
    assert facts.gpu_types == {"NVIDIA A10", "NVIDIA H100 80GB HBM3"}
    assert facts.device_classes == {"vgpu.dra.dev", "a10"}
    assert facts_from([], [], "vgpu.dra.dev").largest_gpu_memory_mib is None  # unknown: no check


def test_flags() -> None:
    assert duration("90s") == dt.timedelta(seconds=90)
    assert duration("1.5h") == dt.timedelta(minutes=90)
    assert duration("365d") == dt.timedelta(days=365)
    assert duration("30") == dt.timedelta(seconds=30)
    for bad in ("0s", "-1h", "1w", "", "²s"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive duration"):
            duration(bad)
    assert shared_resources("a.com/x=4, b.com/y=2") == [("a.com/x", 4), ("b.com/y", 2)]
    for bad in ("a.com/x", "a.com/x=0", "=4", "a.com/x=²"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=REPLICAS"):
            shared_resources(bad)
    env = {"VGPU_DRA_SHARED_RESOURCES": "a.com/x=4"}
    assert dict(build_parser(env).parse_args([]).shared_resource) == {"a.com/x": 4}
    args = build_parser(env).parse_args(
        ["--shared-resource", "b.com/y=2,c.com/z=8", "--shared-resource", "d.com/w=3"]
    )  # the command line replaces the environment's list, repeated flags add up
    assert dict(args.shared_resource) == {"b.com/y": 2, "c.com/z": 8, "d.com/w": 3}
    assert build_parser({}).parse_args([]).webhook_port == 0  # off unless asked for
    env = {"VGPU_DRA_SHARED_MEMORY": "a.com/x=6144"}
    assert dict(build_parser(env).parse_args([]).shared_memory) == {"a.com/x": 6144}
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=MIB"):
        shared_memory("a.com/x=lots")


def test_contradicting_shared_settings_stop_the_controller_naming_them(tmp_path: Path) -> None:
    args = build_parser({}).parse_args(
        ["--shared-resource", "a.com/x=4", "--shared-memory", "a.com/x=1024,b.com/y=512"]
    )
    with pytest.raises(ValueError, match=r"--shared-memory names \['b.com/y'\]"):
        translation_settings(args)
    settings = translation_settings(build_parser({}).parse_args(
        ["--shared-resource", "a.com/x=4", "--shared-memory", "a.com/x=1024"]))  # fmt: skip
    assert settings.shared_memory_mib == {"a.com/x": 1024}
    # As a process: exit 1 with the reason, before touching the API server.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: not-a-secret}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "controller", "--kubeconfig", str(kubeconfig),
         "--health-address", "127.0.0.1:0", "--webhook-port", "1",
         "--shared-memory", "b.com/y=512"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot start the webhook on port 1: --shared-memory names ['b.com/y']" in (
        done.stdout + done.stderr
    )
