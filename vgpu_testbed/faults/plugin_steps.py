"""SIGKILL of the kubelet plugin at a chosen step of prepare or unprepare, not at a random time.

How: the fault makes a claim of its own (a named ResourceClaim, so its UID and therefore every
path of its files is known before the plugin sees it) and a pod on the node that uses it; strace
attaches to the running plugin (all its threads) with `-P` set to one of that claim's paths, and
at the first system call of the armed kinds on that path it skips the call and delivers SIGKILL:
the plugin dies exactly before that step had any effect. The paths, not the order of calls,
name the step, so the arms hold while the plugin's file code changes:

- prepare, before the claim dir: `mkdir` of `<state>/claims/<uid>`;
- prepare, before the region: the `openat` creating `<claim dir>/region`;
- prepare, before vgpu.conf: the `openat` (direct write into a new dir) or `rename` (atomic
  rewrite) of `<claim dir>/vgpu.conf`;
- prepare, before the CDI spec: the `rename` that would put a claim's CDI spec in place
  (strace's `-P` matches a rename's source only, and the temp file's name is random: this arm
  takes the first rename of any claim after the target pod is created, and strace's line says
  which claim it was);
- prepare, before the checkpoint record: the `write` to checkpoint.log (the first after the
  pod is created, so the target's, or a neighbour's on a busy node: strace's line says which);
- prepare, before the answer: the `fdatasync` of checkpoint.log (the record is written: a
  crash, not a power loss, keeps it);
- unprepare, before anything is removed: the `unlink` of the CDI spec (the pod deleted);
- unprepare, half removed: the `unlink` of the region (the spec is gone).

The plugin runs inside the node's PID namespace; strace runs on the host against its host PID
(`ChaosNode.inner_pid`).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from vgpu_testbed.faults.bed import CDI_CLAIM_PREFIX, ChaosNode


@dataclass(frozen=True, slots=True)
class Arm:
    """One step: the calls to stop, on which of the target claim's paths, and whether the
    target pod is deleted (unprepare) or created (prepare) to get there."""

    name: str
    syscalls: str  # strace's list, e.g. "openat,rename"
    path: str  # "claim_dir", "region", "conf", "spec", "journal", or "" (any path)
    unprepare: bool = False
    step: str = ""


ARMS = (
    Arm("before-claim-dir", "mkdir,mkdirat", "claim_dir",
        step="prepare: claim read and planned, no file written"),
    Arm("before-region", "openat", "region", step="prepare: claim dir made, no region"),
    Arm("before-vgpu-conf", "openat,rename", "conf",
        step="prepare: claim dir and region made, no vgpu.conf"),
    Arm("before-cdi-spec", "rename,renameat,renameat2", "",
        step="prepare: vgpu.conf in place, CDI spec not"),
    Arm("before-record", "write", "journal",
        step="prepare: files in place, checkpoint record not written"),
    Arm("before-answer", "fdatasync", "journal",
        step="prepare: checkpoint record written, kubelet not answered"),
    Arm("unprepare-before-removal", "unlink,unlinkat", "spec", unprepare=True,
        step="unprepare: nothing removed yet"),
    Arm("unprepare-half-removed", "unlink,unlinkat", "region", unprepare=True,
        step="unprepare: CDI spec removed, claim dir half removed"),
)  # fmt: skip
ARMS_BY_NAME = {a.name: a for a in ARMS}


@dataclass(frozen=True, slots=True)
class Hit:
    """Where the plugin died: the arm, the killed call as strace printed it, and the step."""

    arm: str
    call: str
    step: str


def target_path(node: ChaosNode, uid: str, which: str) -> Path:
    claim_dir = node.paths.state_dir / "claims" / uid
    return {
        "claim_dir": claim_dir,
        "region": claim_dir / "region",
        "conf": claim_dir / "vgpu.conf",
        "spec": node.paths.cdi_root / f"{CDI_CLAIM_PREFIX}{uid}.json",
        "journal": node.paths.state_dir / "checkpoint.log",
    }[which]


def describe(arm: Arm, killed: str) -> str:
    """The step a killed call stands for; the journal arms read the record strace printed."""
    if arm.path == "" and CDI_CLAIM_PREFIX not in killed:
        return "a rename that is not a CDI spec's (" + killed.split("(", 1)[0].strip() + ")"
    if arm.path != "journal":
        return arm.step
    if '"del"' in killed or '\\"del\\"' in killed:
        return arm.step.replace("prepare:", "unprepare:").replace("files in place", "files removed")
    return arm.step


class Armed:
    """strace attached to the node's plugin, armed; `wait` for the kill."""

    def __init__(self, node: ChaosNode, arm: Arm, uid: str, out: Path) -> None:
        pid = node.inner_pid(node.plugin_process)
        if pid is None:
            raise RuntimeError(f"{node.plugin_process} is not running")
        self.arm, self.out = arm, out
        first = arm.syscalls.split(",")
        traced = arm.syscalls + (",write" if arm.path == "journal" and "write" not in first else "")
        argv = [
            "strace",
            "-f",
            "-qq",
            "-p",
            str(pid),
            "-o",
            str(out),
            "-y",
            "-s",
            "96",
            "-e",
            f"trace={traced}",
            "-e",
            f"inject={arm.syscalls}:error=EIO:signal=SIGKILL:when=1",
        ]
        if arm.path:
            argv += ["-P", str(target_path(node, uid, arm.path))]  # fmt: skip
        self.tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # strace prints nothing once attached: give it the moment it needs to seize every thread.
        time.sleep(0.5)

    def wait(self, timeout: float) -> Hit | None:
        """The hit, or None when no such call came within `timeout` (strace detaches)."""
        deadline = time.monotonic() + timeout
        try:
            while self.tracer.poll() is None:
                if time.monotonic() > deadline:
                    self.tracer.send_signal(signal.SIGTERM)  # detaches: the plugin goes on
                    self.tracer.wait(timeout=10)
                    return None
                time.sleep(0.05)
        finally:
            if self.tracer.poll() is None:
                self.tracer.kill()
                self.tracer.wait(timeout=10)
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        if not any("killed by SIGKILL" in ln for ln in lines):
            err = self.tracer.stderr.read().decode() if self.tracer.stderr else ""
            raise RuntimeError(f"strace ended without killing the plugin: {err.strip()[-400:]}")
        calls = [ln for ln in lines if re.search(r"\w+\(", ln) and "+++" not in ln]
        killed = next((ln for ln in reversed(calls) if "= ?" in ln), calls[-1] if calls else "")
        return Hit(self.arm.name, killed.strip()[:300], describe(self.arm, killed))

    def cancel(self) -> None:
        if self.tracer.poll() is None:
            self.tracer.send_signal(signal.SIGTERM)
            self.tracer.wait(timeout=10)
