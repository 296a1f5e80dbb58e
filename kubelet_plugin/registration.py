"""The kubelet's plugin-registration service: how the kubelet discovers this driver.

The kubelet watches its registrar directory, connects to `<driver>-reg.sock`, calls GetInfo to
learn the driver name, the DRA socket and the services offered there (first one it knows wins),
then reports the outcome with NotifyRegistrationStatus. Served by `kubelet_plugin.server`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from kubelet_plugin.proto import pluginregistration_v1_pb2 as reg_pb2

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def supported_services(*, health: bool) -> list[str]:
    """Advertised in this order: the kubelet picks the first DRA version it supports."""
    return [*DRA_SERVICES, *(HEALTH_SERVICES if health else ())]


class RegistrationServicer:
    """Answers the kubelet's plugin watcher; remembers whether registration succeeded."""

    def __init__(self, *, driver: str, endpoint: str, services: Sequence[str]) -> None:
        self._info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=list(services)
        )
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: reg_pb2.InfoRequest, context: Any) -> reg_pb2.PluginInfo:  # noqa: N802
        log.info(
            "kubelet asked for plugin info: %s at %s offering %s",
            self._info.name,
            self._info.endpoint,
            ", ".join(self._info.supported_versions),
        )
        return self._info

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg_pb2.RegistrationStatus, context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered driver %s", self._info.name)
            self.last_error = ""
            self.registered.set()
        else:
            log.error(
                "kubelet refused to register driver %s: %s",
                self._info.name,
                request.error or "(no reason given)",
            )
            self.last_error = request.error
            self.registered.clear()
        return reg_pb2.RegistrationStatusResponse()
