"""A kubelet stand-in: the kubelet's side of plugin registration and DRA, for the test bed.

The test bed has no kubelet (no container runtime on this machine), yet the kubelet plugin must be
driven exactly as a kubelet drives it. This process does that for one node, over the real gRPC
protocols and with the node's own credentials:

1. Registration (the kubelet's plugin watcher): poll the registrar dir for `*-reg.sock`; for each
   new socket (or a re-created one: the plugin restarted) call `Registration.GetInfo`, validate
   the answer (type `DRAPlugin`, a driver name, an absolute endpoint that exists, a DRA service
   version we speak), pick the FIRST advertised version we know (`v1.DRAPlugin`, then
   `v1beta1.DRAPlugin`) and call `NotifyRegistrationStatus` with the outcome.
2. Pods (the kubelet's pod workers): every poll, list pods bound to the node. For a running pod
   whose claims are all allocated and reserved for it, call `NodePrepareResources` for the claims
   not yet prepared ({namespace, uid, name} per claim), record the result in
   `<state-dir>/pods/<namespace>_<pod>.json` and mark the pod Running through the status
   subresource. One call per poll carries every claim that became ready (so a burst of pods
   arrives as a real batch, which the crash tests rely on); the kubelet calls per pod — the
   wire protocol is the same.
3. Teardown: a prepared claim that no remaining active pod uses is unprepared with
   `NodeUnprepareResources`; a terminating pod (deletionTimestamp set) whose claims are released
   is then deleted for good (grace period 0), as a kubelet confirms a pod's termination.

The set of prepared claims survives a restart of the stand-in (`<state-dir>/prepared.json`).
Failed calls (plugin restarting, socket gone, a claim's own error) are retried on the next poll.
Started per node by `vgpu_testbed.standin.node_agents`; `python -m vgpu_testbed.standin.kubelet
--help`. Decisions live in `vgpu_testbed.standin.rules` (pure), gRPC in
`vgpu_testbed.standin.plugins`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_driver import kube
from dra_driver.atomicfile import write_atomic
from dra_driver.kube import RESOURCE_API, KubeClient, KubeError
from vgpu_testbed.standin.plugins import Plugin, register, rpc_text
from vgpu_testbed.standin.rules import (
    JSON,
    ClaimRef,
    claim_drivers_if_ready,
    claims_to_unprepare,
    is_finished,
    is_terminating,
    pod_claim_names,
)

log = logging.getLogger("kubelet-standin")

DEFAULT_CALL_TIMEOUT_S = 45.0  # the kubelet's default for DRA calls
MAX_BATCH = 256


@dataclass
class PodView:
    """One pod as seen in one poll: its claims once all are ready (else None)."""

    pod: JSON
    claims: list[ClaimRef] | None = None
    drivers: dict[str, str] = field(default_factory=dict)  # claim uid -> driver


class KubeletStandin:
    def __init__(
        self,
        client: KubeClient,
        *,
        node_name: str,
        registrar_dir: Path,
        state_dir: Path,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        mark_running: bool = True,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.registrar_dir = registrar_dir
        self.state_dir = state_dir
        self.pods_dir = state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self.call_timeout_s = call_timeout_s
        self.mark_running = mark_running
        self.plugins: dict[str, Plugin] = {}  # driver -> plugin
        self._reg_sockets: dict[str, int] = {}  # reg socket path -> identity registered
        self.prepared: dict[str, ClaimRef] = {}
        self.prepared_driver: dict[str, str] = {}
        self._load_prepared()

    # -- persistence

    @property
    def _prepared_file(self) -> Path:
        return self.state_dir / "prepared.json"

    def _load_prepared(self) -> None:
        try:
            doc = json.loads(self._prepared_file.read_text())
        except FileNotFoundError:
            return
        for entry in doc.get("claims", []):
            ref = ClaimRef(entry["namespace"], entry["name"], entry["uid"])
            self.prepared[ref.uid] = ref
            self.prepared_driver[ref.uid] = entry.get("driver", "")

    def _save_prepared(self) -> None:
        claims = [
            {**ref.to_json(), "driver": self.prepared_driver.get(uid, "")}
            for uid, ref in sorted(self.prepared.items())
        ]
        _write_json(self._prepared_file, {"claims": claims})

    def pod_record_path(self, namespace: str, name: str) -> Path:
        return self.pods_dir / f"{namespace}_{name}.json"

    # -- registration

    def scan_registrations(self) -> None:
        present: dict[str, int] = {}
        try:
            entries = list(os.scandir(self.registrar_dir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.name.endswith("-reg.sock"):
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                # inode and change time: a re-created socket (plugin restart) may reuse the inode
                present[entry.path] = hash((info.st_ino, info.st_ctime_ns))
        for path, inode in present.items():
            if self._reg_sockets.get(path) == inode:
                continue
            try:
                plugin = register(path, inode)
            except grpc.RpcError as exc:
                log.warning("registration at %s failed (will retry): %s", path, rpc_text(exc))
                continue
            self._reg_sockets[path] = inode
            if plugin is not None:
                old = self.plugins.pop(plugin.driver, None)
                if old is not None:
                    old.close()
                self.plugins[plugin.driver] = plugin
        for path in set(self._reg_sockets) - set(present):
            inode = self._reg_sockets.pop(path)
            for driver, plugin in list(self.plugins.items()):
                if plugin.reg_inode == inode:
                    log.info("driver %s unregistered (socket %s gone)", driver, path)
                    plugin.close()
                    del self.plugins[driver]

    # -- pods

    def _node_pods(self) -> list[JSON]:
        return self.client.list(
            kube.path("v1", "pods"), field_selector=f"spec.nodeName={self.node_name}"
        )

    def _view(self, pod: JSON, claim_cache: dict[tuple[str, str], JSON | None]) -> PodView:
        view = PodView(pod)
        names = pod_claim_names(pod)
        if names is None:
            return view
        namespace = pod["metadata"]["namespace"]
        uid = pod["metadata"]["uid"]
        refs: list[ClaimRef] = []
        for name in names:
            key = (namespace, name)
            if key not in claim_cache:
                try:
                    claim_cache[key] = self.client.get(
                        kube.path(RESOURCE_API, "resourceclaims", name, namespace=namespace)
                    )
                except KubeError as exc:
                    log.debug("claim %s/%s not readable yet: %s", namespace, name, exc)
                    claim_cache[key] = None
            claim = claim_cache[key]
            if claim is None:
                return view
            drivers = claim_drivers_if_ready(claim, uid)
            if drivers is None:
                return view
            ref = ClaimRef(namespace, name, claim["metadata"]["uid"])
            ours = sorted(d for d in drivers if d)
            if ours:
                view.drivers[ref.uid] = ours[0]
            refs.append(ref)
        view.claims = refs
        return view

    def step(self) -> None:
        """One poll: registrations, prepares, unprepares, confirmed deletions."""
        self.scan_registrations()
        pods = self._node_pods()
        cache: dict[tuple[str, str], JSON | None] = {}
        active = [p for p in pods if not is_terminating(p) and not is_finished(p)]
        views = [self._view(p, cache) for p in active]
        self._prepare_ready(views)
        in_use = {
            ref.uid for view in views for ref in view.claims or [] if ref.uid in self.prepared
        }
        # A pod whose claims are not all readable yet still holds what it had prepared.
        for view in views:
            if view.claims is None:
                in_use |= self._claims_recorded_for(view.pod)
        self._unprepare_unused(in_use)
        self._finish_terminating([p for p in pods if is_terminating(p)], in_use)
        self._forget_vanished(pods)

    def _claims_recorded_for(self, pod: JSON) -> set[str]:
        meta = pod["metadata"]
        try:
            record = json.loads(self.pod_record_path(meta["namespace"], meta["name"]).read_text())
        except (FileNotFoundError, ValueError):
            return set()
        return {str(c["uid"]) for c in record.get("claims", [])}

    def _prepare_ready(self, views: list[PodView]) -> None:
        needed: dict[str, list[ClaimRef]] = {}
        for view in views:
            for ref in view.claims or []:
                driver = view.drivers.get(ref.uid)
                if driver and ref.uid not in self.prepared:
                    batch = needed.setdefault(driver, [])
                    if ref not in batch:
                        batch.append(ref)
        results: dict[str, JSON] = {}
        for driver, refs in needed.items():
            plugin = self.plugins.get(driver)
            if plugin is None:
                log.info("%d claim(s) wait for driver %s to register", len(refs), driver)
                continue
            for start in range(0, len(refs), MAX_BATCH):
                batch = refs[start : start + MAX_BATCH]
                results.update(self._call_prepare(plugin, batch))
        for view in views:
            if view.claims is None:
                continue
            self._record_pod(view, results)

    def _call_prepare(self, plugin: Plugin, refs: list[ClaimRef]) -> dict[str, JSON]:
        started = time.monotonic()
        try:
            results = plugin.prepare(refs, self.call_timeout_s)
        except grpc.RpcError as exc:
            log.warning(
                "NodePrepareResources(%d claims) to %s failed (will retry): %s",
                len(refs),
                plugin.driver,
                rpc_text(exc),
            )
            return {}
        elapsed_ms = (time.monotonic() - started) * 1000
        failed = 0
        for ref in refs:
            result = results.get(ref.uid)
            if result is None:
                log.error("plugin returned no result for claim %s/%s", ref.namespace, ref.name)
                failed += 1
            elif result["error"]:
                log.error(
                    "prepare of claim %s/%s failed: %s", ref.namespace, ref.name, result["error"]
                )
                failed += 1
            else:
                self.prepared[ref.uid] = ref
                self.prepared_driver[ref.uid] = plugin.driver
        self._save_prepared()
        log.info(
            "NodePrepareResources: %d claim(s) to %s in %.1f ms, %d failed",
            len(refs),
            plugin.driver,
            elapsed_ms,
            failed,
        )
        return results

    def _record_pod(self, view: PodView, results: Mapping[str, JSON]) -> None:
        meta = view.pod["metadata"]
        assert view.claims is not None
        record_path = self.pod_record_path(meta["namespace"], meta["name"])
        claims = []
        for ref in view.claims:
            entry: JSON = {**ref.to_json(), "driver": view.drivers.get(ref.uid, "")}
            if ref.uid in results:
                entry.update(results[ref.uid])
            claims.append(entry)
        ready = all(ref.uid in self.prepared or ref.uid not in view.drivers for ref in view.claims)
        previous = _read_json(record_path)
        if previous is not None and previous.get("uid") == meta["uid"] and previous.get("ready"):
            return  # already recorded as running; nothing new
        if not ready and not any(ref.uid in results for ref in view.claims):
            return  # nothing happened to this pod in this poll
        if previous and previous.get("uid") == meta["uid"]:
            # keep device results from earlier polls for claims not in this call
            earlier = {c["uid"]: c for c in previous.get("claims", [])}
            for entry in claims:
                if "devices" not in entry and entry["uid"] in earlier:
                    entry.update({k: v for k, v in earlier[entry["uid"]].items() if k != "uid"})
        record = {
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
            "ready": ready,
            "claims": claims,
            "time": time.time(),
        }
        _write_json(record_path, record)
        if ready:
            log.info("pod %s/%s: all claims prepared", meta["namespace"], meta["name"])
            if self.mark_running:
                self._mark_running(view.pod)

    def _mark_running(self, pod: JSON) -> None:
        meta = pod["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                ],
                "startTime": now,
            }
        }
        try:
            self.client.merge_patch(
                kube.path(
                    "v1", "pods", meta["name"], namespace=meta["namespace"], subresource="status"
                ),
                patch,
            )
        except KubeError as exc:
            log.warning(
                "could not mark pod %s/%s Running: %s", meta["namespace"], meta["name"], exc
            )

    def _unprepare_unused(self, in_use: set[str]) -> set[str]:
        """Unprepare claims nobody uses; returns the uids released in this poll."""
        released: set[str] = set()
        todo = claims_to_unprepare(self.prepared, in_use)
        by_driver: dict[str, list[ClaimRef]] = {}
        for ref in todo:
            by_driver.setdefault(self.prepared_driver.get(ref.uid, ""), []).append(ref)
        for driver, refs in by_driver.items():
            plugin = self.plugins.get(driver)
            if plugin is None:
                log.info("%d claim(s) wait for driver %s to unprepare", len(refs), driver)
                continue
            try:
                errors = plugin.unprepare(refs, self.call_timeout_s)
            except grpc.RpcError as exc:
                log.warning(
                    "NodeUnprepareResources to %s failed (will retry): %s", driver, rpc_text(exc)
                )
                continue
            for ref in refs:
                error = errors.get(ref.uid)
                if error is None or error:
                    log.error("unprepare of claim %s/%s failed: %s", ref.namespace, ref.name, error)
                    continue
                del self.prepared[ref.uid]
                self.prepared_driver.pop(ref.uid, None)
                released.add(ref.uid)
                log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
        if released:
            self._save_prepared()
        return released

    def _finish_terminating(self, pods: list[JSON], in_use: set[str]) -> None:
        """Delete terminating pods for good once their claims are released.

        After `_unprepare_unused`, a claim still prepared is either used by an active pod (it
        stays prepared for that pod; fine) or failed to unprepare (the pod must wait).
        """
        for pod in pods:
            meta = pod["metadata"]
            held = self._claims_recorded_for(pod)
            if any(uid in self.prepared and uid not in in_use for uid in held):
                continue
            try:
                self.client.request(
                    "DELETE",
                    kube.path("v1", "pods", meta["name"], namespace=meta["namespace"]),
                    body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                )
            except KubeError as exc:
                if exc.status not in (404, 409):
                    log.warning(
                        "could not delete pod %s/%s: %s", meta["namespace"], meta["name"], exc
                    )
                    continue
            log.info("pod %s/%s terminated", meta["namespace"], meta["name"])

    def _forget_vanished(self, pods: list[JSON]) -> None:
        """Remove records of pods that no longer exist (their claims were handled above)."""
        live = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
        for path in self.pods_dir.glob("*.json"):
            namespace, _, name = path.stem.partition("_")
            if (namespace, name) not in live:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        for plugin in self.plugins.values():
            plugin.close()
        self.plugins.clear()

    def run(self, stop: threading.Event, interval_s: float) -> None:
        while not stop.is_set():
            try:
                self.step()
            except KubeError as exc:
                log.warning("poll failed: %s", exc)
            except Exception:
                log.exception("poll failed unexpectedly")
            stop.wait(interval_s)


# ---------------------------------------------------------------- helpers and main


def _read_json(path: Path) -> JSON | None:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    # A test record, not durable state: atomic for readers, no fsync.
    write_atomic(
        str(path), json.dumps(doc, indent=1, sort_keys=True).encode(), mode=0o640, sync=False
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubelet_standin", description="Drive a DRA kubelet plugin as the kubelet would."
    )
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", required=True, help="credentials (the node's, ideally)")
    parser.add_argument("--registrar-dir", required=True, type=Path)
    parser.add_argument("--state-dir", required=True, type=Path, help="pod records, prepared set")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds (default 0.5)")
    parser.add_argument("--call-timeout", type=float, default=DEFAULT_CALL_TIMEOUT_S)
    parser.add_argument(
        "--no-mark-running", action="store_true", help="do not set prepared pods to Running"
    )
    args = parser.parse_args(argv)
    if args.poll_interval <= 0:
        parser.error(f"--poll-interval must be > 0, got {args.poll_interval}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    client = KubeClient.from_kubeconfig(args.kubeconfig)
    standin = KubeletStandin(
        client,
        node_name=args.node_name,
        registrar_dir=args.registrar_dir,
        state_dir=args.state_dir,
        call_timeout_s=args.call_timeout,
        mark_running=not args.no_mark_running,
    )
    log.info("kubelet stand-in for node %s watching %s", args.node_name, args.registrar_dir)
    try:
        standin.run(stop, args.poll_interval)
    finally:
        standin.close()
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
