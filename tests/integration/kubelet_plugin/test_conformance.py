"""The kubelet plugin against the real things: the kubelet's own generated gRPC client
(k8s.io/kubelet v0.37.1, via hack/conformance/kubeletclient), claims served by a real
kube-apiserver, and the CDI reference library (hack/conformance/cdicheck) loading and injecting
every spec the plugin writes.

What this proves:
1. Registration: GetInfo answers type/name/endpoint/services as the kubelet expects, and
   NotifyRegistrationStatus is received (success and refusal); the health stream is readable
   with the kubelet's v1 and v1alpha1 DRAResourceHealth clients.
2. Prepare and unprepare round-trip over v1 and v1beta1 for claims allocated in the API server,
   with per-claim errors (a recreated claim's stale UID) that do not fail the batch.
3. Each CDI spec written loads without errors and injects the contract's env, mounts, device
   nodes and additional GIDs into an OCI spec.
"""

from __future__ import annotations

import stat
import uuid
from pathlib import Path
from typing import Any

from dra_driver import kube
from kubelet_plugin.checkpoint import CheckpointJournal
from kubelet_plugin.claims import ClaimRef
from tests.fixtures.claimdata import (
    GiB,
    config_entry,
    create_allocated_claim,
    gpu,
    result,
    vgpu_config,
)
from tests.integration.kubelet_plugin.conftest import (
    KIND,
    RunningPlugin,
    run_json,
)

SHARE = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def kubelet(bin_dir: Path, plugin: RunningPlugin, *args: str) -> dict[str, Any]:
    return run_json(
        [str(bin_dir / "kubeletclient"), "-registration-socket", plugin.sockets.registration, *args]
    )


def claims_arg(*refs: ClaimRef) -> str:
    return ",".join(f"{r.namespace}/{r.name}/{r.uid}" for r in refs)


def test_registration_as_the_kubelet_sees_it(conformance_bin: Path, plugin: RunningPlugin) -> None:
    out = kubelet(conformance_bin, plugin)
    assert out["info"] == {
        "type": "DRAPlugin",
        "name": "vgpu.dra.dev",
        "endpoint": plugin.sockets.dra,
        "supportedVersions": [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ],
    }
    assert plugin.server.registration.registered.is_set()
    kubelet(conformance_bin, plugin, "-registered=false", "-reg-error", "version mismatch")
    assert not plugin.server.registration.registered.is_set()
    assert plugin.server.registration.last_error == "version mismatch"


def test_health_stream_as_the_kubelet_reads_it(
    conformance_bin: Path, plugin: RunningPlugin
) -> None:
    for version in ("v1", "v1alpha1"):
        out = kubelet(conformance_bin, plugin, "-health", version)
        assert sorted((d["poolName"], d["deviceName"], d["health"]) for d in out["health"]) == [
            ("node-1", f"gpu-{i}", "HEALTHY") for i in range(4)
        ]
        assert all(d["timeoutSeconds"] == 60 and d["lastUpdated"] > 0 for d in out["health"])


def test_sockets_are_private(plugin: RunningPlugin) -> None:
    for sock in (plugin.sockets.dra, plugin.sockets.registration):
        mode = Path(sock).stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert stat.S_IMODE(Path(sock).parent.stat().st_mode) == 0o700


def test_prepare_unprepare_round_trip_v1(
    conformance_bin: Path, plugin: RunningPlugin, kube_client: kube.KubeClient, namespace: str
) -> None:
    ref = create_allocated_claim(
        kube_client,
        namespace,
        [result("gpu-2", memory="3Gi", cores=40, share_id=SHARE)],
        configs=[config_entry(vgpu_config(computePolicy="balance"))],
    )
    out = kubelet(conformance_bin, plugin, "-api", "v1", "-prepare", claims_arg(ref))
    assert out["prepare"] == {
        ref.uid: {
            "error": "",
            "devices": [
                {
                    "requestNames": ["gpu"],
                    "poolName": "node-1",
                    "deviceName": "gpu-2",
                    "cdiDeviceIDs": [f"{KIND}={ref.uid}-gpu-2-{SHARE}"],
                    "shareID": SHARE,
                }
            ],
        }
    }
    conf = (plugin.state_dir / "claims" / ref.uid / "vgpu.conf").read_text()
    assert f"device uuid={gpu(2).uuid} memory={3 * GiB} cores=40 policy=balance" in conf
    # a retry (the kubelet restarted) returns the same answer
    again = kubelet(conformance_bin, plugin, "-api", "v1", "-prepare", claims_arg(ref))
    assert again["prepare"] == out["prepare"]
    out = kubelet(conformance_bin, plugin, "-api", "v1", "-unprepare", claims_arg(ref))
    assert out["unprepare"] == {ref.uid: {"error": ""}}
    assert not plugin.spec_file(ref.uid).exists()
    assert not (plugin.state_dir / "claims" / ref.uid).exists()


def test_prepare_unprepare_round_trip_v1beta1_with_a_bad_claim(
    conformance_bin: Path, plugin: RunningPlugin, kube_client: kube.KubeClient, namespace: str
) -> None:
    good = create_allocated_claim(kube_client, namespace, [result("gpu-0")])
    stale = create_allocated_claim(kube_client, namespace, [result("gpu-1", memory="1Gi")])
    stale_ref = ClaimRef(stale.namespace, stale.name, "00000000-0000-0000-0000-000000000001")
    out = kubelet(
        conformance_bin, plugin, "-api", "v1beta1", "-prepare", claims_arg(good, stale_ref)
    )
    assert out["prepare"][good.uid]["error"] == ""
    [device] = out["prepare"][good.uid]["devices"]
    assert device["cdiDeviceIDs"] == [f"{KIND}={good.uid}-gpu-0"]
    assert "shareID" not in device  # v1beta1 has no share_id field
    assert "the claim was deleted and recreated" in out["prepare"][stale_ref.uid]["error"]
    assert stale_ref.uid not in plugin.preparer.prepared()
    out = kubelet(
        conformance_bin, plugin, "-api", "v1beta1", "-unprepare", claims_arg(good, stale_ref)
    )
    assert out["unprepare"] == {good.uid: {"error": ""}, stale_ref.uid: {"error": ""}}
    assert plugin.preparer.prepared() == {}


def test_every_written_spec_loads_and_injects_the_contract(
    conformance_bin: Path, plugin: RunningPlugin, kube_client: kube.KubeClient, namespace: str
) -> None:
    multi = create_allocated_claim(
        kube_client,
        namespace,
        [result("gpu-1", memory="2Gi", cores=10, share_id=SHARE), result("gpu-3", request="b")],
        configs=[config_entry(vgpu_config(logLevel="debug"), requests=["b"])],
    )
    single = create_allocated_claim(kube_client, namespace, [result("gpu-0", memory="1Gi")])
    out = kubelet(conformance_bin, plugin, "-prepare", claims_arg(multi, single))
    ids = [
        i for claim in out["prepare"].values() for d in claim["devices"] for i in d["cdiDeviceIDs"]
    ]
    assert len(ids) == 3

    check = run_json([str(conformance_bin / "cdicheck"), "-spec-dir", str(plugin.cdi_root), *ids])
    assert check["specErrors"] == {}
    assert check["error"] == "" and not check["unresolved"]
    assert sorted(check["devices"]) == sorted(ids)

    multi_ids = out["prepare"][multi.uid]["devices"]
    check = run_json(
        [
            str(conformance_bin / "cdicheck"),
            "-spec-dir",
            str(plugin.cdi_root),
            *(i for d in multi_ids for i in d["cdiDeviceIDs"]),
        ]
    )
    oci = check["oci"]
    env = oci["process"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in env
    assert not [e for e in env if e.startswith("VGPU_DRA_CLAIMS=")]
    assert "VGPU_LOG_LEVEL=debug" in env
    mounts = {m["destination"]: m for m in oci["mounts"]}
    claim_mount = mounts[f"/run/vgpu-dra/claims/{multi.uid}"]
    assert claim_mount["source"] == str(plugin.state_dir / "claims" / multi.uid)
    # The claim dir (vgpu.conf) is read-only; only the region file is mounted read-write over it.
    assert "ro" in claim_mount["options"]
    region_mount = mounts[f"/run/vgpu-dra/claims/{multi.uid}/region"]
    assert region_mount["source"] == str(plugin.state_dir / "claims" / multi.uid / "region")
    assert "rw" in region_mount["options"]
    assert mounts["/usr/local/vgpu-dra/lib/libvgpu.so"]["source"] == plugin.settings.spec.hook_path
    preload = mounts["/etc/ld.so.preload"]
    assert "ro" in preload["options"]
    assert Path(preload["source"]).read_text() == "/usr/local/vgpu-dra/lib/libvgpu.so\n"
    devices = {d["path"]: d for d in oci["linux"]["devices"]}
    assert (devices["/dev/nvidia1"]["major"], devices["/dev/nvidia1"]["minor"]) == (195, 1)
    assert (devices["/dev/nvidia3"]["major"], devices["/dev/nvidia3"]["minor"]) == (195, 3)
    assert (devices["/dev/nvidiactl"]["major"], devices["/dev/nvidiactl"]["minor"]) == (195, 255)
    assert "/dev/nvidia0" not in devices  # the other claim's GPU stays out
    assert oci["process"]["user"]["additionalGids"] == [4242]
    # the checkpoint on disk agrees with what the kubelet was told
    checkpoint = CheckpointJournal(str(plugin.state_dir)).load()
    assert sorted(checkpoint) == sorted([multi.uid, single.uid])


def test_overbooked_claim_is_refused_over_grpc(
    conformance_bin: Path, plugin: RunningPlugin, kube_client: kube.KubeClient, namespace: str
) -> None:
    first = create_allocated_claim(kube_client, namespace, [result("gpu-3", memory="10Gi")])
    second = create_allocated_claim(kube_client, namespace, [result("gpu-3", memory="7Gi")])
    out = kubelet(conformance_bin, plugin, "-prepare", claims_arg(first))
    assert out["prepare"][first.uid]["error"] == ""
    out = kubelet(conformance_bin, plugin, "-prepare", claims_arg(second))
    error = out["prepare"][second.uid]["error"]
    assert "would overbook device gpu-3" in error
    assert f"capacity {16 * GiB} bytes" in error


def test_256_claims_in_one_call(
    conformance_bin: Path, plugin: RunningPlugin, kube_client: kube.KubeClient, namespace: str
) -> None:
    # 4 GPUs x 16 GiB: 64 claims of 256 MiB and 1 core per GPU fit exactly
    refs = [
        create_allocated_claim(
            kube_client,
            namespace,
            [result(f"gpu-{i % 4}", memory="256Mi", cores=1, share_id=str(uuid.uuid4()))],
        )
        for i in range(256)
    ]
    out = kubelet(conformance_bin, plugin, "-prepare", claims_arg(*refs))
    assert len(out["prepare"]) == 256
    assert [uid for uid, c in out["prepare"].items() if c["error"]] == []
    ids = {i for c in out["prepare"].values() for d in c["devices"] for i in d["cdiDeviceIDs"]}
    assert len(ids) == 256
    assert len(CheckpointJournal(str(plugin.state_dir)).load()) == 256
    out = kubelet(conformance_bin, plugin, "-unprepare", claims_arg(*refs))
    assert all(c["error"] == "" for c in out["unprepare"].values())
    assert list(plugin.cdi_root.iterdir()) == []


def test_spec_without_extra_group_declares_a_version_the_library_accepts(
    conformance_bin: Path, tmp_path: Path
) -> None:
    from dra_driver import cdi

    uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # starts with a digit: needs CDI >= 0.5.0
    settings = cdi.SpecSettings(kind=KIND, state_dir="/var/lib/vgpu-dra", hook_path="/h.so")
    spec = cdi.build_claim_spec(
        settings=settings,
        claim_uid=uid,
        devices=[cdi.ClaimDevice(f"{uid}-gpu-0", 0)],
    )
    assert spec["cdiVersion"] == "0.5.0"
    (tmp_path / cdi.spec_file_name(KIND, uid)).write_bytes(cdi.encode_spec(spec))
    check = run_json(
        [str(conformance_bin / "cdicheck"), "-spec-dir", str(tmp_path), f"{KIND}={uid}-gpu-0"]
    )
    assert check["specErrors"] == {} and check["error"] == ""
    assert "additionalGids" not in check["oci"]["process"].get("user", {})
