"""The webhook in a process of its own: `vgpu-dra webhook`, and the controller's child.

Why a process: CPython runs one thread of a process at a time (the GIL). Inside the controller an
admission waits for it behind the informers, which decode every pod event (and a burst of pod
creations is exactly when admissions arrive), and behind allocation; the tail of the webhook's
own time is that wait, not its ~0.3 ms of work (bench/webhook_bench.py measures both ways). A
child process has an interpreter and a GIL of its own, and the kernel schedules it apart.

The controller starts the child with the webhook flags as the controller parsed them
(`child_argv`; the child's environment loses their `VGPU_DRA_*` twins, so the command line is
the one source), so a flag means the same in both. The child serves admissions and keeps the
certificate current; the controller keeps the template collection (it knows whether it leads).
The two are joined by a socket pair (the child's end is `--parent-fd`). It is the child's
lifeline: at EOF (the controller is gone, even by SIGKILL) the child stops, so no orphan keeps
serving. And it carries the child's metrics: for each byte the controller sends, the child
answers with its Prometheus exposition (8-byte length, then the text), which the controller's
`/metrics` serves as its own (`ChildMetrics`), so one scrape still sees the admission histogram.
A child that exits is started again after a back-off (1 s, doubling to 30 s); meanwhile the
controller's readiness reports `webhook` failing, so the Service sends admissions elsewhere.

Supervision (`dra_driver.supervision`): in the controller, the watch over the child is the loop
`webhook-child` of the controller's Supervisor. In the child, its loops (`webhook-facts`,
`webhook-certs`, the transport's, `webhook-parent-link`) belong to a Supervisor of its own: a
step that raises is logged with its traceback and counted (`vgpu_dra_loop_failures_total` on the
webhook port's `/metrics`), and a loop that stalls ends the child (exit 70), which the
controller then starts again: a stuck webhook does not keep a port that answers nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from controller.webhook import flags
from dra_driver import cli_flags, logsetup, tracing
from dra_driver.lifecycle import stop_on_signals
from dra_driver.supervision import LoopCollector, Supervisor

log = logging.getLogger("vgpu-dra.webhook.process")

BACKOFF_S = (1.0, 30.0)  # first and longest wait before starting an exited child again
HEALTHY_RUN_S = 60.0  # a child that ran this long starts again after the first back-off
STOP_TIMEOUT_S = 10.0  # beyond the child's drain (--webhook-drain)
# Flags of the webhook's parser that the controller does not forward to its child.
_NOT_FORWARDED = frozenset({"help", "parent_fd", "webhook_process"})
SCRAPE_TIMEOUT_S = 2.0
_LENGTH = 8  # bytes of the big-endian length before each exposition
CHILD_LOOP = "webhook-child"
CHILD_POLL_S = 0.5
CHILD_DEADLINE_S = 60.0  # a poll, or a start of the child, takes far less
LINK_LOOP = "webhook-parent-link"
STALLED_EXIT = 70  # EX_SOFTWARE: the child ends itself when one of its loops stalls
# The loop families of the child's own Supervisor: not forwarded to the controller's registry,
# which has its own families of these names (one family per name in a scrape). They stay on the
# webhook port's /metrics.
_CHILD_ONLY = frozenset({"vgpu_dra_loop_failures", "vgpu_dra_loop_stalled"})


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = dict(os.environ if env is None else env)
    parser = argparse.ArgumentParser(
        prog="vgpu-dra webhook",
        description="The admission webhook of vgpu-dra on its own (docs/webhook.md): translates "
        "legacy GPU pods and validates GPU configurations. `vgpu-dra controller` starts it as "
        "a child process; the template collection stays in the controller.",
    )
    cli_flags.add_kubeconfig(parser, env)
    cli_flags.add_logging(parser, env)
    cli_flags.add_otlp_endpoint(parser, env)
    parser.add_argument(
        "--parent-fd",
        type=int,
        default=-1,
        help="a connected socket inherited from the controller that started this process: stop "
        "at its EOF, answer each byte read with the metrics exposition (set by the controller)",
    )
    flags.add_arguments(parser, env)
    return parser


def _flag_text(value: object) -> str:
    if isinstance(value, dt.timedelta):
        return f"{value.total_seconds()}s"
    if isinstance(value, list):
        return ",".join(f"{name}={number}" for name, number in value)
    return str(value)


def child_argv(args: argparse.Namespace) -> list[str]:
    """The webhook's flags with the values `args` holds (parsed by the controller's parser,
    which has them all), as a `vgpu-dra webhook` command line."""
    argv = []
    for action in build_parser({})._actions:
        if not action.option_strings or action.dest in _NOT_FORWARDED:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == []:
            continue  # the webhook's own default is the same "nothing"
        argv.append(f"{action.option_strings[0]}={_flag_text(value)}")
    return argv


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the twins of the forwarded flags: the command line alone decides."""
    twins = set(flags.ENV.values()) | set(cli_flags.ENV.values())
    return {name: value for name, value in environ.items() if name not in twins}


class ChildWebhook:
    """The `vgpu-dra webhook` child of a controller: started, watched, started again, stopped."""

    def __init__(self, args: argparse.Namespace, command: Sequence[str] | None = None) -> None:
        self._argv = list(command or [sys.executable, "-m", "dra_driver.cli", "webhook"])
        self._argv += child_argv(args)
        self._env = child_env(os.environ)
        self.drain_s = args.webhook_drain.total_seconds()
        host = str(args.webhook_bind)
        self._probe = ("127.0.0.1" if host in ("", "0.0.0.0", "::") else host, args.webhook_port)
        self._process: subprocess.Popen[bytes] | None = None
        self._link: socket.socket | None = None
        self._started = 0.0
        self._lock = threading.Lock()
        self._scrape_lock = threading.Lock()

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            with self._lock:
                # Output goes where the controller's goes (one log stream per pod).
                self._process = subprocess.Popen(
                    [*self._argv, f"--parent-fd={theirs.fileno()}"],
                    stdin=subprocess.DEVNULL,
                    env=self._env,
                    pass_fds=(theirs.fileno(),),
                )
                old, self._link = self._link, ours
                self._started = time.monotonic()
        finally:
            theirs.close()  # the child holds it now: its EOF is ours closing
        if old is not None:
            old.close()
        log.info("webhook child process %d started", self._process.pid)

    def scrape(self) -> bytes:
        """The child's metrics exposition; empty when it does not answer in time."""
        with self._scrape_lock:
            with self._lock:
                link = self._link
            if link is None:
                return b""
            try:
                link.settimeout(SCRAPE_TIMEOUT_S)
                link.sendall(b"m")
                size = int.from_bytes(_read(link, _LENGTH), "big")
                return _read(link, size)
            except (OSError, EOFError) as exc:
                log.debug("cannot read the webhook child's metrics: %s", exc)
                return b""

    def running(self) -> bool:
        """The child runs and accepts connections on the webhook port (readiness)."""
        with self._lock:
            process = self._process
        if process is None or process.poll() is not None:
            return False
        try:
            # A bare connect: the server drops it at the handshake, logged at debug only.
            socket.create_connection(self._probe, timeout=1.0).close()
        except OSError:
            return False
        return True

    def supervise(
        self, stop: threading.Event, *, supervisor: Supervisor | None = None
    ) -> threading.Thread:
        """Start the child again whenever it exits, until `stop`: the supervised loop
        `webhook-child` of `supervisor` (a private one when None)."""
        restarts = _Restarts(BACKOFF_S[0])
        return (supervisor or Supervisor()).run(
            CHILD_LOOP,
            lambda: self._watch(restarts),
            stop,
            period_s=CHILD_POLL_S,
            deadline_s=CHILD_DEADLINE_S,
        )

    def _watch(self, restarts: _Restarts) -> None:
        """One look at the child: an exit schedules a start after the back-off, which a later
        look makes once it is due."""
        with self._lock:
            process, started = self._process, self._started
        code = process.poll() if process is not None else None
        if code is None:
            return
        now = time.monotonic()
        if restarts.due is None:
            if now - started >= HEALTHY_RUN_S:
                restarts.backoff = BACKOFF_S[0]
            log.error(
                "webhook child process exited with %s; starting it again in %.0f s",
                code,
                restarts.backoff,
            )
            restarts.due = now + restarts.backoff
            return
        if now < restarts.due:
            return
        restarts.due = None
        restarts.backoff = min(restarts.backoff * 2, BACKOFF_S[1])
        try:
            self.start()
        except OSError as exc:  # the next look sees the old exit again: another back-off
            log.error("cannot start the webhook child process: %s", exc)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S + self.drain_s)
        except subprocess.TimeoutExpired:
            log.warning("webhook child process %d ignored SIGTERM; killing it", process.pid)
            process.kill()
            process.wait()
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()


@dataclass
class _Restarts:
    """The back-off of `ChildWebhook.supervise`: the next wait, and when the pending start is
    due (None: none pending)."""

    backoff: float
    due: float | None = None


class ChildMetrics(Collector):
    """The webhook's families for the controller's registry: the child's (admission histogram,
    templates created), except those named in `local`, which come from the controller's own
    `local_registry` instead (templates collected: the collector runs in the controller)."""

    def __init__(
        self, child: ChildWebhook, local_registry: CollectorRegistry, local: Iterable[str]
    ) -> None:
        self._child = child
        self._local_registry = local_registry
        self._local = frozenset(local)

    def collect(self) -> Iterator[Metric]:
        text = self._child.scrape().decode("utf-8", "replace")
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as exc:  # a garbled exposition: this scrape goes without the child's
            log.warning("unreadable metrics from the webhook child: %s", exc)
            families = []
        for family in families:
            if family.name not in self._local and family.name not in _CHILD_ONLY:
                yield family
        for family in self._local_registry.collect():
            if family.name in self._local:
                yield family


def _read(link: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = link.recv(min(left, 1 << 16))
        if not chunk:
            raise EOFError("the webhook child closed the link")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _serve_parent(
    fd: int,
    stop: threading.Event,
    exposition: Callable[[], bytes],
    orphaned: threading.Event,
    *,
    supervisor: Supervisor | None = None,
) -> None:
    """The child's end of the link: metrics on request, and stop at EOF (`orphaned` set first:
    no drain then, there is no controller to wait for it and its replica is gone anyway).

    It waits for the controller's requests, so it beats only when one comes (the loop
    `webhook-parent-link` has no deadline); an exposition that raises is logged with its
    traceback, counted, and answered empty, and the link goes on."""
    link = socket.socket(fileno=fd)
    beats = (supervisor or Supervisor()).register(LINK_LOOP, math.inf)

    def answer() -> bytes:
        try:
            payload = exposition()
        except Exception:
            beats.beat(failed=True)
            log.exception("webhook metrics exposition failed; answering an empty one")
            return b""
        beats.beat()
        return payload

    def loop() -> None:
        try:
            while link.recv(1):
                payload = answer()
                link.sendall(len(payload).to_bytes(_LENGTH, "big") + payload)
        except OSError as exc:
            log.debug("link to the controller failed: %s", exc)
        except BaseException:
            beats.ended = True  # a stall at once: the watchdog ends the process
            raise
        log.info("the controller is gone (its link closed): stopping")
        orphaned.set()
        stop.set()

    threading.Thread(target=loop, name=LINK_LOOP, daemon=True).start()


def _stalled(names: list[str]) -> None:
    """The child's watchdog: a loop stopped making progress; end the process (the controller
    starts it again)."""
    log.critical(
        "webhook loop(s) %s stopped making progress; exiting so that the controller starts this "
        "process again",
        ", ".join(names),
    )
    logging.shutdown()
    os._exit(STALLED_EXIT)


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    logsetup.configure_logging(args.log_level, args.log_format)
    if args.webhook_port <= 0:
        parser.error("--webhook-port: a port to serve on is required")
    client = cli_flags.connect(args.kubeconfig, log)
    if client is None:
        return 1
    provider = tracing.configure_tracing("vgpu-dra-webhook", args.otlp_endpoint)
    stop = threading.Event()
    stop_on_signals(stop, log)
    from controller.webhook import run  # run imports this module (ChildWebhook)

    supervisor = Supervisor()
    try:
        try:
            running = run.serve(args, client, stop, supervisor=supervisor)
        except Exception as exc:  # certificate, API or bind failures: say which, exit 1
            log.error("cannot start the webhook on port %d: %s", args.webhook_port, exc)
            return 1
        running.metrics.registry.register(LoopCollector(supervisor))
        orphaned = threading.Event()
        if args.parent_fd >= 0:
            _serve_parent(
                args.parent_fd, stop, running.metrics.exposition, orphaned, supervisor=supervisor
            )
        supervisor.watchdog(stop, _stalled)
        # What start-up allocated (modules, the client, certificates) lives as long as the
        # process: out of the collector's sight, a full collection has only admissions' objects
        # to walk (fewer, shorter pauses in the middle of an admission).
        gc.collect()
        gc.freeze()
        stop.wait()
        drain_s = 0.0 if orphaned.is_set() else running.drain_s
        log.info("shutting down (answering for %.1f s more)", drain_s)
        running.stop(drain_s)
        return 0
    finally:
        client.close()
        tracing.shutdown_tracing(provider)
