"""Configuration files of one real bed node: containerd's TOML, the kubelet's YAML, CNI's JSON.

Pure functions of `NodeLayout` (every path of the node) and a few settings, so the choices are
in one place and unit-testable. Each setting that keeps a component inside the node's directory
or makes it work on this kind of host says why next to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vgpu_testbed.realnode.images import PAUSE

CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
NODE_SUBNET = "10.250.0"  # the bed bridge's /24: .1 the bridge, .2.. the nodes
KUBELET_PORT = 10250


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Every path of a real node; `root` doubles as the kubelet's --root-dir."""

    root: Path

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def cert_dir(self) -> Path:
        return self.root / "pki"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def run_dir(self) -> Path:
        """Ready files of the holder and forwarder, the holder's PID file."""
        return self.root / "run"

    def make(self) -> None:
        for directory in (
            self.containerd_dir,
            self.cert_dir,
            self.pod_logs,
            self.cni_conf_dir,
            self.cni_ipam_dir,
            self.cdi_dir,
            self.run_dir,
        ):
            directory.mkdir(parents=True, exist_ok=True, mode=0o750)


def node_ip(index: int) -> str:
    """Node N (0-based) gets .N+2 on the bed bridge."""
    return f"{NODE_SUBNET}.{index + 2}"


def containerd_config(layout: NodeLayout, runc: Path) -> str:
    c = layout.containerd_dir
    cni_bins = ", ".join(json.dumps(d) for d in CNI_BIN_DIRS if Path(d).is_dir())
    return f"""version = 3
root = "{c / "root"}"
state = "{c / "state"}"

[grpc]
  address = "{layout.containerd_socket}"
[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[plugins]
  # NRI's socket is fixed under /var/run; the bed does not use NRI.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  # Else /opt/containerd.
  [plugins.'io.containerd.internal.v1.opt']
    path = "{c / "opt"}"
  [plugins.'io.containerd.cri.v1.images']
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{PAUSE}"
  [plugins.'io.containerd.cri.v1.runtime']
    # The plugin's CDI root: claim specs and the simulated driver's toolkit-like spec.
    cdi_spec_dirs = ["{layout.cdi_dir}"]
    # This VM refuses negative oom_score_adj even for root (runc fails with an opaque error).
    restrict_oom_score_adj = true
    # Pod network namespaces as files under the state dir, not /var/run/netns.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{cni_bins}]
      conf_dir = "{layout.cni_conf_dir}"
      max_conf_num = 1
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{runc}"
          SystemdCgroup = false
  [plugins.'io.containerd.grpc.v1.cri']
    # exec/attach/port-forward streams stay on the node's loopback.
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""


def cni_config(layout: NodeLayout, index: int) -> str:
    """A bridge inside the node's network namespace; pods of node N get 10.251.N.0/24."""
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "bed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": f"10.251.{index}.0/24"}]],
                    # Else /var/lib/cni/networks.
                    "dataDir": str(layout.cni_ipam_dir),
                },
            }
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(
    layout: NodeLayout,
    *,
    cgroup_root: str,
    ip: str,
    client_ca: Path,
    serving: tuple[Path, Path] | None = None,
) -> str:
    conf: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This host: cgroup v1 without systemd, swap may be present.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "volumePluginDir": str(layout.root / "volume-plugins"),
        "podLogsDir": str(layout.pod_logs),
        "resolvConf": "",
        # The bed's images are imported, never pulled: image GC must not remove them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "64Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "maxPods": 110,
        # A pod status the API server refused (the node authorizer not yet knowing the pod's
        # binding) is resent at the next pod sync: every 10 s, not the default minute.
        "syncFrequency": "10s",
        "serializeImagePulls": False,
    }
    if serving is not None:
        # Signed by the bed CA for the node name and IP: the API server verifies it.
        conf["tlsCertFile"], conf["tlsPrivateKeyFile"] = str(serving[0]), str(serving[1])
    return yaml.safe_dump(conf, sort_keys=False)
