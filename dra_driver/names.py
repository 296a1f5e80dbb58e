"""Names that users, manifests and other components rely on; all derive from the driver name.

Change these only deliberately: they appear in ResourceSlices, DeviceClasses, CDI device IDs,
socket paths and pod annotations (see docs/ and shared ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DRIVER_NAME = "vgpu.dra.dev"
DEVICE_NAME_PREFIX = "gpu-"
CONFIG_API_VERSION = "vgpu.dra.dev/v1alpha1"
CONFIG_KIND = "VgpuConfig"
METRIC_PREFIX = "vgpu_dra_"
OTEL_SERVICE_KUBELET_PLUGIN = "vgpu-dra-kubelet-plugin"
OTEL_SERVICE_CONTROLLER = "vgpu-dra-controller"

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

    def annotation(self, name: str) -> str:
        """Pod annotation key in the driver's domain, e.g. `vgpu.dra.dev/compute-policy`."""
        return f"{self.driver}/{name}"
