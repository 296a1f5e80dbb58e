"""The governor's rate controller is the hook's controller, number for number.

Why a parity test and not a ctypes call from the governor: the governor runs in the kubelet
plugin, which must not depend at run time on a native build artefact of the hook (libvgpu.so
hides these symbols, and the plugin image need not carry a second library). So the Python
mirror (kubelet_plugin.governor.Controller, balance_target) stays, and this test drives it and
the C code (vgpu_hook/src/bucket.c, built alone as build/libvgpuctl.so) with the same sample
sequences: open-loop random samples covering every branch (no cost, sub-resolution
utilisation, throttled or not, over and under target, learnt gain, windup bounds) and
closed-loop runs against a simulated GPU, where any difference would compound. Every returned
rate and every state value must agree to the last bits of rounding.
"""

from __future__ import annotations

import ctypes
import math
import random
import subprocess
from pathlib import Path

import pytest

from kubelet_plugin.governor import Controller, balance_target

REPO = Path(__file__).resolve().parents[3]
LIB = REPO / "vgpu_hook" / "build" / "libvgpuctl.so"


class CtlState(ctypes.Structure):
    _fields_ = (
        ("gain", ctypes.c_double),
        ("integral", ctypes.c_double),
        ("hold", ctypes.c_bool),
        ("weight", ctypes.c_double),
        ("spent", ctypes.c_double),
    )


class CtlSample(ctypes.Structure):
    _fields_ = (
        ("target", ctypes.c_double),
        ("util", ctypes.c_double),
        ("cost_rate", ctypes.c_double),
        ("dt", ctypes.c_double),
        ("throttled", ctypes.c_bool),
        ("aligned", ctypes.c_bool),
    )


@pytest.fixture(scope="module")
def c_lib() -> ctypes.CDLL:
    subprocess.run(["make", "-s", "-C", str(REPO / "vgpu_hook"), "build/libvgpuctl.so"], check=True)
    lib = ctypes.CDLL(str(LIB))
    lib.vgpu_ctl_step.restype = ctypes.c_double
    lib.vgpu_ctl_step.argtypes = (
        ctypes.POINTER(CtlState),
        ctypes.POINTER(CtlSample),
        ctypes.c_double,
    )
    lib.vgpu_balance_target.restype = ctypes.c_double
    lib.vgpu_balance_target.argtypes = (ctypes.c_uint32, ctypes.c_double, ctypes.c_double)
    return lib


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) or a == b


class _Pair:
    """One C state and one Python controller, stepped together."""

    def __init__(
        self, lib: ctypes.CDLL, gain: float = 0.0, integral: float = 0.0, weight: float = 0.0
    ) -> None:
        self.lib = lib
        self.c = CtlState(gain, integral, False, weight, 0.0)
        self.py = Controller(gain=gain, integral=integral, weight=weight)

    def step(
        self,
        *,
        target: float,
        util: float,
        cost_rate: float,
        throttled: bool,
        rate: float,
        aligned: bool = False,
        dt: float = 0.1,
    ) -> float:
        sample = CtlSample(target, util, cost_rate, dt, throttled, aligned)
        c_rate = self.lib.vgpu_ctl_step(ctypes.byref(self.c), ctypes.byref(sample), rate)
        py_rate = self.py.step(
            target=target,
            util=util,
            cost_rate=cost_rate,
            throttled=throttled,
            rate=rate,
            aligned=aligned,
            dt=dt,
        )
        context = (target, util, cost_rate, throttled, aligned, rate, self.c.gain, self.py.gain)
        assert _same(c_rate, py_rate), context
        assert _same(self.c.gain, self.py.gain), context
        assert _same(self.c.integral, self.py.integral), context
        assert self.c.hold == self.py.hold, context
        assert _same(self.c.weight, self.py.weight), context
        assert _same(self.c.spent, self.py.spent), context
        return py_rate


@pytest.mark.parametrize("seed", range(8))
def test_random_samples_give_the_same_rates(c_lib: ctypes.CDLL, seed: int) -> None:
    rnd = random.Random(seed)
    pair = _Pair(
        c_lib, gain=rnd.choice([0.0, 0.0, 1e-7, 0.1]), weight=rnd.choice([0.0, 4.0, 900.0])
    )
    rate = rnd.choice([0.0, 1.0, 5e7])
    for _ in range(400):
        util = rnd.choice([0.0, 0.3, 0.5, 0.51, 1.0, 1.49, 1.5, rnd.uniform(0, 100), 100.0])
        # The last one spends a share of the budget near the last window's (steady or not).
        cost_rate = rnd.choice(
            [0.0, rnd.uniform(1, 1e9), rnd.uniform(1e6, 1e8), rate * rnd.uniform(0.7, 1.1)]
        )
        target = rnd.choice([10.0, 30.0, 50.0, 70.0, rnd.uniform(5, 95)])
        rate = pair.step(
            target=target,
            util=util,
            cost_rate=cost_rate,
            throttled=rnd.random() < 0.6,
            rate=rate,
            aligned=rnd.random() < 0.5,
            dt=rnd.choice([0.01, 0.049, 0.05, 0.1, 0.17]),
        )


@pytest.mark.parametrize("cap", [10, 30, 50, 70])
def test_closed_loop_runs_stay_identical(c_lib: ctypes.CDLL, cap: int) -> None:
    """Against a simulated GPU (util = gain x admitted rate, noisy, saturating): 300 steps,
    including a kernel-mix change and pauses, with every intermediate rate equal."""
    rnd = random.Random(cap)
    pair = _Pair(c_lib)
    true_gain, demand, rate = 1.5e-7, 2e9, cap / 1e-6  # seeded as the hook seeds a new claim
    for step in range(300):
        if step == 150:
            true_gain *= 3
        admitted = min(rate, demand) if rate > 0 else demand
        if 100 <= step % 150 < 100 + cap // 10:  # a pause, then half a window back at work
            admitted *= 0.5 if step % 150 == 99 + cap // 10 else 0.0
        util = max(0.0, min(100.0, true_gain * admitted) + rnd.uniform(-1, 1))
        rate = pair.step(
            target=float(cap),
            util=round(util),
            cost_rate=admitted,
            throttled=0 < rate < demand,
            rate=rate,
            aligned=step < 20,  # a new claim's first steps poll fast (their windows aligned)
        )
    assert abs(true_gain * rate - cap) < 3  # and the pair actually controls the plant


def test_balance_targets_are_identical(c_lib: ctypes.CDLL) -> None:
    rnd = random.Random(1)
    for _ in range(500):
        cores = rnd.randint(1, 99)
        device, own = rnd.uniform(0, 110), rnd.uniform(0, 110)
        assert _same(
            c_lib.vgpu_balance_target(cores, device, own), balance_target(cores, device, own)
        )
