"""Compute-cap accuracy runs on the simulated GPU (shared by the tests and bench/hook_bench.py).

Tenants are cuda_probe processes launching kernels back to back inside containers whose
claims carry `cores=<cap>`; a sampler process (same simulated node) reads NVML every 100 ms
(50 ms for settling runs): GPU utilisation and per-process SM utilisation, always with the
simulator's exact sampling, so it measures the truth. Optionally the node governor
(kubelet_plugin.governor, given the claims' caps as the plugin's prepared plans would give them)
runs in its own process (`python -m tests.integration.vgpu_hook.computecap governor ...`), otherwise
the hooks' in-process controller acts. Tenants and governor see NVML with `sampling`: "exact" or
"realistic" (per-period samples like real drivers, see docs/simulated-gpus.md), with optional
jitter of the period boundaries.

Result per tenant: mean utilisation and the mean absolute error from the cap over 0.5 s
windows, after a settling period; settling runs report the time from the first busy sample
until every tenant's 0.3 s mean stays within 3 points of its cap.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubelet_plugin.region import POLICY_BALANCE, POLICY_FIXED, Region, RegionError
from tests.integration.vgpu_hook.conftest import PROBE, UUIDS, Claim, Node
from vgpu_testbed.container import container_command

SETTLE_S = 2.0
WINDOW_S = 0.5
SETTLE_BAND = 3.0  # points
REALISTIC_JITTER_US = 20000
KERNEL = "busy__ns20000"  # 20 us per wave of 108 blocks
BLOCKS = "216"
_POLICY_CODES = {"fixed": POLICY_FIXED, "balance": POLICY_BALANCE}
GOVERNOR_READY = "governor: ticked"  # the governor child's first line, after its first tick
GOVERNOR_START_TIMEOUT_S = 60.0


def _sampler_main(uuid: str, seconds: float, interval: float) -> None:
    """Runs in a child process with the simulated node's env; prints JSON lines."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    end = time.monotonic() + seconds
    last_us = time.time_ns() // 1000
    while time.monotonic() < end:
        time.sleep(interval)
        device = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_us)
        except pynvml.NVMLError:
            samples = []
        last_us = time.time_ns() // 1000
        pids: dict[int, int] = {}
        for s in samples:
            pids[int(s.pid)] = pids.get(int(s.pid), 0) + int(s.smUtil)
        print(json.dumps({"t": time.monotonic(), "device": device, "pids": pids}), flush=True)


class RegionTracer(threading.Thread):
    """`run_tenants(trace=...)`: reads each claim's region every 3 ms (rate, cost, the
    controller's state) from construction until `finish()`, i.e. what either controller did,
    step by step, seen from outside (the release hook logs nothing), and has the governor log
    its steps (`env` gains VGPU_GOVERNOR_TRACE). Does nothing when `trace` is None."""

    FIELDS = (
        "rate",
        "rate_source",
        "launch_cost",
        "throttled_ns",
        "util_milli",
        "ctl_steps",
        "ctl_hold",
        "ctl_poll_fresh",
        "ctl_moved",
        "governor_stamp_ns",
    )

    def __init__(
        self,
        trace: dict[str, Any] | None,
        governor_log: Path,
        env: dict[str, str],
        claims: Sequence[Claim],
    ) -> None:
        super().__init__(daemon=True)
        self.trace = trace
        self.governor_log = governor_log
        self.paths = [c.dir / "region" for c in claims]
        self.stop = threading.Event()
        self.rows: list[dict[str, Any]] = []
        if trace is not None:
            env["VGPU_GOVERNOR_TRACE"] = str(governor_log)
            self.start()

    def run(self) -> None:
        regions: dict[int, Region] = {}
        try:
            while not self.stop.wait(0.003):
                now = time.monotonic()
                for i, path in enumerate(self.paths):
                    if i not in regions:
                        try:
                            regions[i] = Region(str(path))
                        except RegionError:
                            continue
                    d = regions[i].layout.devices[0]
                    row: dict[str, Any] = {"t": now, "claim": i}
                    row.update({f: getattr(d, f) for f in self.FIELDS})
                    row["gain"] = struct.unpack("<d", struct.pack("<Q", d.ctl_gain_bits))[0]
                    row["integral"] = struct.unpack("<d", struct.pack("<Q", d.ctl_integral_bits))[0]
                    self.rows.append(row)
        finally:
            for region in regions.values():
                region.close()

    def finish(self) -> None:
        self.stop.set()
        if self.is_alive():
            self.join()

    def report(self, truth: list[dict[str, Any]], pids: list[int]) -> None:
        if self.trace is None:
            return
        log = self.governor_log
        self.trace.update(
            truth=truth,
            pids=pids,
            regions=self.rows,
            governor=log.read_text().splitlines() if log.exists() else [],
        )


def _start_governor(
    node: Node, claims: Sequence[Claim], caps: Sequence[int], policy: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    """The node governor in its own process, given the claims' caps as prepared plans would."""
    caps_json = json.dumps(
        {
            c.uid: [[UUIDS[0], cap, _POLICY_CODES[policy]]]
            for c, cap in zip(claims, caps, strict=True)
        }
    )
    gov = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.vgpu_hook.computecap",
            "governor",
            str(node.state_dir),
            caps_json,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A node's governor runs before any claim is prepared. Started next to the tenants, its
    # Python start (0.5-1.1 s) raced their first launches: it arrived after the hook's own
    # controller had stepped and took the claim over mid-settling (a realistic `fixed` claim
    # then settled in 0.35-0.40 s instead of 0.15-0.25). Tenants start once it has ticked.
    assert gov.stdout is not None
    ready, _, _ = select.select([gov.stdout], [], [], GOVERNOR_START_TIMEOUT_S)
    if not ready or gov.stdout.readline().strip() != GOVERNOR_READY:
        gov.kill()
        _, err = gov.communicate()
        raise RuntimeError(f"the governor did not start: {err}")
    return gov


def _governor_main(state_dir: str, caps_json: str) -> None:
    """Runs the node governor in a child process until SIGTERM, over the claims in `caps_json`
    ({uid: [[uuid, cores, policy]]}), which stand in for the plugin's prepared plans."""
    from kubelet_plugin.governor import CappedDevice, Governor, NvmlUtilSource

    caps = {
        uid: [CappedDevice(u, int(cores), int(policy)) for u, cores, policy in devices]
        for uid, devices in json.loads(caps_json).items()
    }
    trace = os.environ.get("VGPU_GOVERNOR_TRACE")
    if trace:  # settle_trace.py: every controller step, with time stamps
        logging.basicConfig(filename=trace, level=logging.DEBUG, format="%(created).4f %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ticked: list[bool] = []

    def on_tick(_seconds: float) -> None:
        if not ticked:
            ticked.append(True)
            print(GOVERNOR_READY, flush=True)

    Governor(state_dir, NvmlUtilSource(), lambda: caps, on_tick=on_tick).run(stop)


def sampling_env(sampling: str) -> dict[str, str]:
    """The simulated NVML's sampling model for tenants and governor."""
    if sampling == "exact":
        return {"VGPU_SIM_UTIL_SAMPLING": "exact"}
    if sampling == "realistic":
        return {
            "VGPU_SIM_UTIL_SAMPLING": "realistic",
            "VGPU_SIM_UTIL_JITTER_US": str(REALISTIC_JITTER_US),
        }
    raise ValueError(f"unknown sampling {sampling!r} (exact or realistic)")


def settle_time(
    rows: list[dict[str, Any]], series: list[list[float]], caps: Sequence[int]
) -> float:
    """Seconds from the first busy sample until every tenant's 0.3 s mean stays in the band."""
    times = [float(r["t"]) for r in rows]
    busy = [i for i, _ in enumerate(rows) if any(s[i] > 0 for s in series)]
    if not busy or len(times) < 2:
        return float("nan")
    step = (times[-1] - times[0]) / (len(times) - 1)
    per = max(1, round(0.3 / step))
    start = times[busy[0]] - step
    settled_from: float | None = None
    # The last 0.3 s are left out, as for accuracy: the sampler's final poll may be partial.
    for i in range(busy[0], len(rows) - 2 * per + 1):
        inside = all(
            abs(sum(s[i : i + per]) / per - cap) <= SETTLE_BAND
            for s, cap in zip(series, caps, strict=True)
        )
        if inside and settled_from is None:
            settled_from = times[i] - step  # the window's start
        elif not inside:
            settled_from = None
    return round(settled_from - start, 3) if settled_from is not None else float("nan")


def run_tenants(
    node: Node,
    caps: Sequence[int],
    *,
    seconds: float,
    governor: bool,
    policy: str = "fixed",
    sync_every_launch: bool = False,
    settle_s: float = SETTLE_S,
    delays_ms: Sequence[int] | None = None,
    sampling: str = "exact",
    interval: float = 0.1,
    settling: dict[str, float] | None = None,
    trace: dict[str, Any] | None = None,
    work: Sequence[str] | None = None,
    truth: list[Any] | None = None,
    tenant_argv: Sequence[str] | None = None,
    tenant_env: dict[str, str] | None = None,
) -> list[dict[str, float]]:
    """Run one tenant per cap on GPU 0 at once; per tenant: mean util and MAE from its cap.

    `settling`, when given, receives {"seconds": time to settle, "peak": highest 0.3 s mean of
    any tenant above its cap in the first second} measured from the first busy sample.
    `trace`, when given (a debugging aid: tests/integration/vgpu_hook/settle_trace.py), receives
    the truth rows, each tenant's pid and its region's controller fields every few ms, and the
    governor's step log.
    `work`, when given, replaces each tenant's launch loop (cuda_probe steps; it must outlive
    the sampler's `seconds` + 1 s); `truth`, when given, receives the sample times and each
    tenant's utilisation series. `tenant_argv`, when given, replaces the whole tenant program
    (e.g. a torch loop, bench/torch_bench.py; it must outlive the sampler and print
    `run launches=N`), with `tenant_env` added to its environment.
    """
    tag = f"{'gov' if governor else 'hook'}-{'-'.join(map(str, caps))}-{time.monotonic_ns()}"
    claims = [
        node.claim(
            f"cc-{tag}-{i}",
            [f"device uuid={UUIDS[0]} memory={1 << 34} cores={cap} policy={policy}"],
        )
        for i, cap in enumerate(caps)
    ]
    env = dict(node.env, PROBE_KERNEL=KERNEL)
    controlled_env = dict(env, **sampling_env(sampling), **(tenant_env or {}))
    truth_env = dict(env, **sampling_env("exact"))
    tracer = RegionTracer(trace, node.root / f"{tag}-governor.log", controlled_env, claims)
    gov = _start_governor(node, claims, caps, policy, controlled_env) if governor else None
    # Tenants outlive the sampler, so every sample is taken while all of them run.
    run_step = f"run:{int(seconds) + 2}:{BLOCKS}:{1 if sync_every_launch else 0}"
    # The sampler needs about 0.3 s to start: tenants wait so their first launches are seen.
    delays = list(delays_ms) if delays_ms is not None else [0] * len(caps)
    if settling is not None:
        delays = [d + 600 for d in delays]
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.vgpu_hook.computecap",
            UUIDS[0],
            str(seconds + 1),
            str(interval),
        ],
        env=truth_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tenants = [
        subprocess.Popen(
            container_command(
                c.spec,
                c.device_names,
                list(tenant_argv)
                if tenant_argv is not None
                else [str(PROBE), "init", f"sleep:{delay}", *(work if work else [run_step])],
            ),
            env=controlled_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c, delay in zip(claims, delays, strict=True)
    ]
    try:
        sampled_out, sampled_err = sampler.communicate(timeout=seconds + 60)
        outputs = [t.communicate(timeout=seconds + 60) for t in tenants]
    finally:
        tracer.finish()
        if gov is not None:
            gov.terminate()
            gov.wait(timeout=30)
    for t, (out, err) in zip(tenants, outputs, strict=True):
        if t.returncode != 0 or "run launches=" not in out:
            raise RuntimeError(f"tenant {t.pid} failed ({t.returncode}): {out} {err}")
    if sampler.returncode != 0:
        raise RuntimeError(f"sampler failed: {sampled_err}")
    rows = [json.loads(line) for line in sampled_out.splitlines() if line.startswith("{")]
    tracer.report(rows, [t.pid for t in tenants])

    def series_of(tenant: subprocess.Popen[str], rows: list[dict[str, Any]]) -> list[float]:
        if len(caps) == 1:
            return (
                [float(r["device"]) for r in rows]
                if interval >= 0.15
                else [float(sum(r["pids"].values())) for r in rows]
            )
        return [float(r["pids"].get(str(tenant.pid), 0)) for r in rows]

    if truth is not None:
        truth.extend([[float(r["t"]) for r in rows], *(series_of(t, rows) for t in tenants)])
    if settling is not None:
        full = [series_of(t, rows) for t in tenants]
        settling["seconds"] = settle_time(rows, full, caps)
        busy = [i for i, _ in enumerate(rows) if any(s[i] > 0 for s in full)]
        first = busy[0] if busy else 0
        per = max(1, round(0.3 / interval))
        early = range(first, min(len(rows) - per + 1, first + round(1.0 / interval)))
        settling["peak_over_cap"] = round(
            max(
                (
                    sum(s[i : i + per]) / per - cap
                    for i in early
                    for s, cap in zip(full, caps, strict=True)
                ),
                default=float("nan"),
            ),
            2,
        )
    start = rows[0]["t"] + settle_s + (0.6 if settling is not None else 0.0) if rows else 0.0
    rows = [r for r in rows if r["t"] >= start and r["t"] <= rows[-1]["t"] - 0.3]
    results = []
    for tenant, cap in zip(tenants, caps, strict=True):
        series = series_of(tenant, rows)
        per = max(1, int(WINDOW_S / interval))
        windows = [sum(series[i : i + per]) / per for i in range(0, len(series) - per + 1, per)]
        mean = sum(series) / len(series) if series else float("nan")
        mae = sum(abs(w - cap) for w in windows) / len(windows) if windows else float("nan")
        results.append({"cap": cap, "mean_util": round(mean, 2), "mae": round(mae, 2)})
    return results


def measure_accuracy(node: Node, *, seconds: float, sampling: str = "exact") -> dict[str, Any]:
    table: dict[str, Any] = {
        "sampling": sampling,
        "window_s": WINDOW_S,
        "settle_s": SETTLE_S,
        "seconds": seconds,
    }
    for governor in (False, True):
        mode = "governor" if governor else "in_process"
        table[mode] = {
            "single": [
                run_tenants(node, [cap], seconds=seconds, governor=governor, sampling=sampling)[0]
                for cap in (10, 30, 50, 70)
            ],
            "pair_30_70": run_tenants(
                node, [30, 70], seconds=seconds, governor=governor, sampling=sampling
            ),
        }
    return table


def new_claim_settling(
    node: Node, *, governor: bool, sampling: str
) -> tuple[dict[str, float], dict[str, float]]:
    """A new claim (fixed, cap 30) run for 3 s, sampled every 50 ms: its result and its settling
    (seconds into the band, overshoot above the cap in the first second)."""
    settling: dict[str, float] = {}
    (result,) = run_tenants(
        node,
        [30],
        seconds=3,
        governor=governor,
        sampling=sampling,
        interval=0.05,
        settle_s=1.0,
        settling=settling,
    )
    return result, settling


BURST_ON_MS, BURST_OFF_MS = 300, 200  # bursty inference: launches for 0.3 s, idle for 0.2 s
BURST_STEADY_S = 2  # a steady start first (whole seconds: cuda_probe run:), then the bursts
BURST_SECONDS = 3
BURST_MEAN_SAMPLES = 3  # 0.15 s means (at 50 ms samples) inside a burst


def burst_figures(
    times: Sequence[float], series: Sequence[float], cap: int, from_t: float
) -> dict[str, float]:
    """Over the bursts from `from_t` on: the highest 0.15 s mean above the cap, and the share
    of such means within the settling band. A burst is a run of busy samples; its first and last
    samples are left out (they hold part of an idle gap), so every mean is all launching, the
    first one starting 50-100 ms after the resume."""
    bursts: list[list[float]] = []
    current: list[float] = []
    for when, util in zip(times, series, strict=True):
        if when >= from_t and util > 0:
            current.append(util)
        elif current:
            bursts.append(current)
            current = []
    per = BURST_MEAN_SAMPLES
    means = [
        sum(inner[i : i + per]) / per
        for burst in bursts
        for inner in [burst[1:-1]]
        for i in range(len(inner) - per + 1)
    ]
    if not means:
        return {"bursts": len(bursts), "peak_over_cap": float("nan"), "in_band": float("nan")}
    return {
        "bursts": len(bursts),
        "peak_over_cap": round(max(means) - cap, 2),
        "in_band": round(sum(abs(m - cap) <= SETTLE_BAND for m in means) / len(means), 3),
    }


def bursty_claim(node: Node, *, governor: bool, sampling: str) -> dict[str, float]:
    """A `fixed` 30 claim that launches steadily for BURST_STEADY_S, then in bursts
    (BURST_ON_MS on, BURST_OFF_MS idle) for BURST_SECONDS; truth sampled every 50 ms."""
    truth: list[Any] = []
    seconds = BURST_STEADY_S + BURST_SECONDS
    run_tenants(
        node,
        [30],
        seconds=seconds,
        governor=governor,
        sampling=sampling,
        interval=0.05,
        work=[
            f"run:{BURST_STEADY_S}:{BLOCKS}:0",
            f"bursty:{BURST_SECONDS + 3}:{BLOCKS}:{BURST_ON_MS}:{BURST_OFF_MS}",
        ],
        truth=truth,
    )
    times, series = truth[0], truth[1]
    busy = [when for when, util in zip(times, series, strict=True) if util > 0]
    if not busy:
        raise RuntimeError("the bursty claim never showed on the GPU")
    return burst_figures(times, series, 30, busy[0] + BURST_STEADY_S + 0.1)


def measure_settling(node: Node, *, sampling: str = "exact") -> dict[str, Any]:
    """Settling of a new claim (fixed, cap 30) and of two `balance` tenants (30/70) starting
    together, for both controllers: seconds from the first busy sample into the 3-point band,
    and the worst overshoot above the cap in the first second."""
    table: dict[str, Any] = {"sampling": sampling, "band_points": SETTLE_BAND, "interval_s": 0.05}
    for governor in (False, True):
        mode = "governor" if governor else "in_process"
        _, fixed = new_claim_settling(node, governor=governor, sampling=sampling)
        balance: dict[str, float] = {}
        run_tenants(
            node,
            [30, 70],
            seconds=4,
            governor=governor,
            policy="balance",
            sampling=sampling,
            interval=0.05,
            settle_s=1.5,
            settling=balance,
        )
        table[mode] = {"fixed_30": fixed, "balance_30_70": balance}
    return table


if __name__ == "__main__":
    if sys.argv[1] == "governor":
        _governor_main(sys.argv[2], sys.argv[3])
    else:
        _sampler_main(
            sys.argv[1], float(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
        )
