"""Container Device Interface specs: what the container runtime injects for a prepared claim.

The kubelet plugin writes one transient spec per claim into the CDI root (`/var/run/cdi`) and
returns its device IDs to the kubelet; the runtime (containerd, CRI-O) then applies the spec's
edits to the container. Building the spec is pure (`build_claim_spec`); the few filesystem reads
(which control device nodes the host has, the NVIDIA Container Toolkit's spec) are thin helpers
here too, so `kubelet_plugin.prepare` only moves bytes. The spec layout follows the Go JSON tags
of tags.cncf.io/container-device-interface/specs-go (the loaders reject unknown fields).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from dra_driver import names

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_TOOLKIT_KIND = "nvidia.com/gpu"
# Lowest spec versions that accept what we write: a device name may start with a digit (a claim
# UID) from 0.5.0 on; spec-level additionalGids need 0.7.0.
CDI_VERSION_BASE = "0.5.0"
CDI_VERSION_WITH_GIDS = "0.7.0"
# NVIDIA_VISIBLE_DEVICES of every claim spec: GPUs come from the injected device nodes.
CDI_VISIBLE_DEVICES = "void"
_CLAIM_UID = re.compile(r"^[0-9A-Za-z][-0-9A-Za-z]*$")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A character device the container gets (explicit major/minor: no host stat needed)."""

    path: str
    major: int
    minor: int

    def to_spec(self) -> dict[str, Any]:
        return {"path": self.path, "type": "c", "major": self.major, "minor": self.minor}


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One CDI device of a claim spec: its name and the GPU's device node minor."""

    name: str
    minor: int


@dataclass(frozen=True, slots=True)
class SpecSettings:
    """Node-wide inputs of every claim spec (from the plugin's flags)."""

    kind: str  # e.g. "k8s.vgpu.dra.dev/claim"
    state_dir: str
    hook_path: str
    claim_gid: int = 0
    control_nodes: tuple[DeviceNode, ...] = (DeviceNode("/dev/nvidiactl", 195, 255),)

    @property
    def preload_file(self) -> str:
        return preload_path(self.state_dir)


def preload_path(state_dir: str) -> str:
    """Host file mounted over the container's /etc/ld.so.preload (one line: the hook)."""
    return os.path.join(state_dir, "hook", "ld.so.preload")


def claim_dir(state_dir: str, claim_uid: str) -> str:
    return os.path.join(state_dir, "claims", claim_uid)


REGION_FILE = "region"


def region_path(state_dir: str, claim_uid: str) -> str:
    """The claim's shared accounting region: the only file a container may write (see
    docs/security.md); the plugin creates it at its fixed layout size at prepare."""
    return os.path.join(claim_dir(state_dir, claim_uid), REGION_FILE)


def spec_file_name(kind: str, claim_uid: str) -> str:
    """`k8s.vgpu.dra.dev-claim_<uid>.json`: unique per claim, so runtimes never see stale data."""
    vendor, cls = kind.split("/", 1)
    return f"{vendor}-{cls}_{claim_uid}.json"


def valid_claim_uid(uid: str) -> bool:
    """Kubernetes UIDs are UUIDs; anything else (e.g. `../x`) must never reach a file path."""
    return len(uid) <= 128 and _CLAIM_UID.match(uid) is not None


def claim_uid_of_spec_file(kind: str, file_name: str) -> str | None:
    """The claim UID encoded in one of our spec file names; None for anyone else's file."""
    vendor, cls = kind.split("/", 1)
    prefix = f"{vendor}-{cls}_"
    if not file_name.startswith(prefix) or not file_name.endswith(".json"):
        return None
    uid = file_name[len(prefix) : -len(".json")]
    return uid if valid_claim_uid(uid) else None


def device_id(kind: str, device_name: str) -> str:
    """Fully qualified CDI device ID as returned to the kubelet: `vendor/class=name`."""
    return f"{kind}={device_name}"


def build_claim_spec(
    *,
    settings: SpecSettings,
    claim_uid: str,
    devices: Sequence[ClaimDevice],
    extra_env: Mapping[str, str] | None = None,
    mig_devices: Sequence[str] = (),
) -> dict[str, Any]:
    """The CDI spec of one prepared claim (see docs/kubelet-plugin.md for every edit's purpose).

    `mig_devices` (`MIG-<uuid>`, docs/mig.md): the claim's MIG instances, named in
    NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES as the NVIDIA stack names them; the parent
    GPU's device node alone would give the container the whole GPU's view.
    """
    # The GPUs a container sees are the device nodes its CDI devices inject (one per GPU of every
    # claim it uses), as with the NVIDIA toolkit's own CDI specs. Every claim therefore sets the
    # same value here ("void": the toolkit's runtime adds no GPU of its own), so a container with
    # several claims keeps all of them; a per-claim value would leave only the last claim's GPUs.
    env = [f"NVIDIA_VISIBLE_DEVICES={CDI_VISIBLE_DEVICES}"]
    if mig_devices:
        listed = ",".join(mig_devices)
        env = [f"NVIDIA_VISIBLE_DEVICES={listed}", f"CUDA_VISIBLE_DEVICES={listed}"]
    env += [f"{key}={value}" for key, value in sorted((extra_env or {}).items())]
    container_claim_dir = f"{names.CONTAINER_CLAIMS_DIR}/{claim_uid}"
    edits: dict[str, Any] = {
        "env": env,
        "deviceNodes": [node.to_spec() for node in settings.control_nodes],
        # The claim dir (vgpu.conf) read-only, then the region file alone read-write over it
        # (runtimes apply mounts parents first): a tenant can neither raise its cap nor create
        # files on the node's state filesystem.
        "mounts": [
            _bind(claim_dir(settings.state_dir, claim_uid), container_claim_dir, "ro"),
            _bind(
                region_path(settings.state_dir, claim_uid),
                f"{container_claim_dir}/{REGION_FILE}",
                "rw",
            ),
            _bind(settings.hook_path, names.CONTAINER_HOOK_PATH, "ro"),
            _bind(settings.preload_file, "/etc/ld.so.preload", "ro"),
        ],
    }
    # Group 0 would hand the container the host's root group; runtimes ignore it anyway.
    if settings.claim_gid > 0:
        edits["additionalGids"] = [settings.claim_gid]
    return {
        "cdiVersion": CDI_VERSION_WITH_GIDS if settings.claim_gid > 0 else CDI_VERSION_BASE,
        "kind": settings.kind,
        "devices": [
            {
                "name": device.name,
                "containerEdits": {
                    "deviceNodes": [
                        DeviceNode(
                            f"/dev/nvidia{device.minor}", NVIDIA_MAJOR, device.minor
                        ).to_spec()
                    ]
                },
            }
            for device in devices
        ],
        "containerEdits": edits,
    }


def _bind(host: str, container: str, access: str) -> dict[str, Any]:
    return {
        "hostPath": host,
        "containerPath": container,
        "type": "bind",
        "options": ["bind", access, "nosuid", "nodev"],
    }


def encode_spec(spec: Mapping[str, Any]) -> bytes:
    """The spec file's bytes. Compact on purpose: `indent` makes json fall back from its C
    encoder to the pure-Python one, about 0.4 ms of every prepare (runtimes read it, not people;
    `python -m json.tool` shows it indented)."""
    return (json.dumps(spec, separators=(",", ":")) + "\n").encode()


def control_device_nodes(
    proc_devices: str, *, dev_dir: str = "/dev", exists: Any = os.path.exists
) -> tuple[DeviceNode, ...]:
    """/dev/nvidiactl always; /dev/nvidia-uvm(-tools) when the host has them (major from
    /proc/devices, which the uvm module registers dynamically)."""
    nodes = [DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)]
    uvm_major = _char_major(proc_devices, "nvidia-uvm")
    if uvm_major is not None:
        for minor, leaf in ((0, "nvidia-uvm"), (1, "nvidia-uvm-tools")):
            if exists(os.path.join(dev_dir, leaf)):
                nodes.append(DeviceNode(f"/dev/{leaf}", uvm_major, minor))
    return tuple(nodes)


def _char_major(proc_devices: str, driver: str) -> int | None:
    in_char = False
    for line in proc_devices.splitlines():
        if line.strip().startswith("Character devices"):
            in_char = True
            continue
        if line.strip().startswith("Block devices"):
            in_char = False
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[1] == driver and parts[0].isdigit():
            return int(parts[0])
    return None


def nvidia_toolkit_ids(spec_dirs: Iterable[str]) -> dict[str, str]:
    """Map GPU index and UUID -> the NVIDIA Container Toolkit's CDI device ID for that GPU.

    The toolkit (`nvidia-ctk cdi generate`) names devices by index and by UUID; returning its IDs
    alongside ours makes the runtime inject the driver libraries and binaries. Returns {} when no
    `nvidia.com/gpu` spec is found. Unreadable or foreign files are skipped.
    """
    found: dict[str, str] = {}
    for directory in spec_dirs:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith((".json", ".yaml", ".yml")):
                continue
            spec = _load_spec(os.path.join(directory, entry))
            if spec is None or spec.get("kind") != NVIDIA_TOOLKIT_KIND:
                continue
            for device in spec.get("devices") or []:
                name = str((device or {}).get("name", ""))
                if name and name != "all":
                    found.setdefault(name, device_id(NVIDIA_TOOLKIT_KIND, name))
    return found


def _load_spec(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle) if path.endswith(".json") else yaml.safe_load(handle)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None
