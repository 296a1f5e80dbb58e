"""Names that users, manifests and other components rely on, in one place.

Two kinds. What derives from the configurable driver name (`--driver-name`, default
`vgpu.dra.dev`): the DeviceClass, the slices' driver, qualified capacity names, CDI kinds and
socket paths (built from it where used). What is the product's own API and stays fixed whatever
the driver is called: the `API_DOMAIN` prefix of pod annotations, the scheduling gate, the pod
and claim conditions and the opaque config's apiVersion; two installs under different driver
names still share these, as a Kubernetes API group would.

Change these only deliberately: they appear in ResourceSlices, DeviceClasses, CDI device IDs,
socket paths and pod annotations (see docs/ and shared ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DRIVER_NAME = "vgpu.dra.dev"
DEVICE_NAME_PREFIX = "gpu-"

# The product's own API (fixed; see above).
API_DOMAIN = "vgpu.dra.dev"
ANNOTATION_PREFIX = f"{API_DOMAIN}/"  # pod annotations the policy path reads
SCHEDULING_GATE = f"{API_DOMAIN}/policy"  # pods the allocation controller places
PLACEMENT_CONDITION = f"{API_DOMAIN}/Placement"  # pod condition: why a gated pod waits
CONFIG_API_VERSION = f"{API_DOMAIN}/v1alpha1"
# `vgpu-dra drain`: the free-text reason of a drain, on its DeviceTaintRule.
DRAIN_REASON_ANNOTATION = f"{API_DOMAIN}/drain-reason"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "vgpu-dra"
CONFIG_KIND = "VgpuConfig"
METRIC_PREFIX = "vgpu_dra_"
OTEL_SERVICE_KUBELET_PLUGIN = "vgpu-dra-kubelet-plugin"
OTEL_SERVICE_CONTROLLER = "vgpu-dra-controller"

# Device taint keys in the driver's domain (`<driver>/<key>`; the kubelet plugin's health taints
# are listed in kubelet_plugin/taints.py): an admin's drain (`vgpu-dra drain`, a DeviceTaintRule).
TAINT_DRAIN = "drain"

# Capacity names published per device (in the driver's domain).
CAPACITY_MEMORY = "memory"
CAPACITY_CORES = "cores"

# Standard attribute names defined by Kubernetes (qualified; not in the driver's domain).
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

DEFAULT_KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_ROOT = "/var/run/cdi"
DEFAULT_STATE_DIR = "/var/lib/vgpu-dra"

# Inside a container: where each claim's directory (hook config + shared region) is mounted,
# and where the hook library is mounted. The hook scans CONTAINER_CLAIMS_DIR/*/vgpu.conf.
CONTAINER_CLAIMS_DIR = "/run/vgpu-dra/claims"
CONTAINER_HOOK_PATH = "/usr/local/vgpu-dra/lib/libvgpu.so"


def device_name(index: int) -> str:
    """ResourceSlice device name of the GPU with this NVML index."""
    return f"{DEVICE_NAME_PREFIX}{index}"


@dataclass(frozen=True, slots=True)
class DriverNames:
    """Every name derived from one driver name, so a renamed driver stays consistent."""

    driver: str = DEFAULT_DRIVER_NAME

    @property
    def cdi_vendor(self) -> str:
        return f"k8s.{self.driver}"

    @property
    def cdi_class(self) -> str:
        return "claim"

    @property
    def cdi_kind(self) -> str:
        return f"{self.cdi_vendor}/{self.cdi_class}"

    @property
    def device_class(self) -> str:
        return self.driver

    def registration_socket(self, registrar_dir: str = DEFAULT_REGISTRAR_DIR) -> str:
        return f"{registrar_dir}/{self.driver}-reg.sock"

    def plugin_dir(self, plugins_dir: str = DEFAULT_KUBELET_PLUGINS_DIR) -> str:
        return f"{plugins_dir}/{self.driver}"

    def dra_socket(self, plugins_dir: str = DEFAULT_KUBELET_PLUGINS_DIR) -> str:
        return f"{self.plugin_dir(plugins_dir)}/dra.sock"

    def taint_key(self, name: str) -> str:
        """Device taint key in the driver's domain, e.g. `vgpu.dra.dev/drain`."""
        return f"{self.driver}/{name}"

    @property
    def drain_taint_key(self) -> str:
        return self.taint_key(TAINT_DRAIN)

    def annotation(self, name: str) -> str:
        """Pod annotation key in the driver's domain, e.g. `vgpu.dra.dev/compute-policy`."""
        return f"{self.driver}/{name}"
