"""Starting and stopping throwaway clusters leaves nothing behind.

What this proves:
1. After `Cluster.stop()` no process the cluster started is alive — neither the four
   components, nor a spawned extra process, nor a child that extra process forked into its
   group — none of the cluster's ports accepts connections, and the directory is gone.
2. A component that dies during start-up (a broken kube-apiserver) makes `Cluster.start` fail
   with the component's name and the tail of its log, after stopping what had started (etcd):
   no process, no listening port, only `logs/` kept.
   Raised client limits (`client_qps`, `client_burst`) reach kube-scheduler's and
   kube-controller-manager's command lines, and the components start with them.
3. A starter that is SIGKILLed takes its components with it (PR_SET_PDEATHSIG), and a pytest
   session interrupted with Ctrl-C tears the `cluster` fixture down: no process, no port.
4. `vgpu-dra dev-cluster up` leaves a running cluster after the command exits (detached, in its
   own sessions), ends with `export KUBECONFIG=...`, `status` reports it healthy, a second
   `up` is refused, and `down` stops it all.
5. `up --agents` adds each node's simulated GPUs, kubelet plugin and kubelet stand-in (the
   node's GPUs are published) and the allocation controller as an install runs it (its own
   ServiceAccount token limited by the chart's RBAC, holding its Lease, healthy in `status`,
   the cluster default policies of --controller-args on its command line); the gated example
   pod it prints is placed by the controller and bound by kube-scheduler; `down` stops them
   all; an unknown profile or bad --controller-args are refused before anything starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.vgpu_testbed.policy_path import check_controller_identity, place_example
from tests.fixtures.cluster import require_binaries
from tests.fixtures.dev_cluster import run_vgpu_dra, short_dir, up_with_agents
from vgpu_testbed.cluster.control_plane import Cluster, default_bin_dir
from vgpu_testbed.cluster.health import ComponentDiedError
from vgpu_testbed.cluster.state import ClusterState
from vgpu_testbed.procs import ProcessRecord, is_alive

# Longer than the 60 s default: each test starts and stops clusters of its own, one through a nested
# pytest session.
pytestmark = pytest.mark.timeout(600)


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def listen_inodes(port: int) -> set[str]:
    """Socket inodes in LISTEN state on `port` (from /proc/net/tcp*).

    Read from the kernel's table rather than by connecting: a connect to a free port in the
    ephemeral range can succeed by connecting to itself (TCP self-connect)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                inodes.add(f"socket:[{inode}]")
    return inodes


def listening(port: int) -> bool:
    return bool(listen_inodes(port))


def listener_pids(port: int) -> set[int]:
    """PIDs holding a LISTEN socket on `port`."""
    inodes = listen_inodes(port)
    owners = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    owners.add(int(proc.name))
            except OSError:
                continue
    return owners


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def assert_all_gone(records: list[ProcessRecord], ports: list[int], root: Path) -> None:
    alive = [r.name for r in records if is_alive(r)]
    assert not alive, f"still running: {alive}"
    groups = {r.name: group_members(r.pid) for r in records}
    assert not any(groups.values()), f"process-group members left: {groups}"
    # Nothing anywhere still runs with this cluster's files (a child that left its group).
    strays = [
        p.name
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != os.getpid() and str(root) in cmdline(int(p.name))
    ]
    assert not strays, f"processes still using {root}: {[cmdline(int(p)) for p in strays]}"
    # A freed port may be taken at once by an unrelated process on this shared machine (the
    # kernel reuses ports): a listener only counts as ours if it is one of our processes.
    ours = {r.pid for r in records}
    for port in ports:
        if listening(port):
            owners = listener_pids(port)
            assert not owners & ours, f"port {port} still served by our pids {owners & ours}"
            assert not any(str(root) in cmdline(pid) for pid in owners), f"port {port}: {owners}"


def test_teardown_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    require_binaries()
    root = tmp_path / "throwaway"
    # Raised client limits on the way: the real binaries accept them (else start-up fails).
    cluster = Cluster.start(
        root, ["a10-pcie"], die_with_parent=True, client_qps=1000, client_burst=2000
    )
    try:
        for name in ("kube-scheduler", "kube-controller-manager"):
            pid = next(p.pid for p in cluster.processes if p.name == name)
            assert " --kube-api-qps=1000 --kube-api-burst=2000 " in cmdline(pid), name
        assert (cluster.state.client_qps, cluster.state.client_burst) == (1000, 2000)
        # An extra per-node process that forks a helper into its group, like a daemon would.
        extra = cluster.spawn("node-1-daemon", ["sh", "-c", "sleep 600 & sleep 600; wait"])
        assert is_alive(extra)
        records = cluster.processes
        ports = list(cluster.state.ports.values())
        assert {r.name for r in records} == {
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
            "node-1-daemon",
        }
        assert all(listening(cluster.state.ports[n]) for n in ("etcd-client", "kube-apiserver"))
        state_on_disk = (root / "state.json").read_text()
        assert '"node-1-daemon"' in state_on_disk
    finally:
        leftovers = cluster.stop()
    assert leftovers == []
    assert_all_gone(records, ports, root)
    assert not root.exists()


def test_component_dying_at_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    require_binaries()
    real = default_bin_dir()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name in ("etcd", "kube-scheduler", "kube-controller-manager"):
        (fake_bin / name).symlink_to(real / name)
    broken = fake_bin / "kube-apiserver"
    broken.write_text(
        "#!/bin/sh\necho 'E0000 broken apiserver: unknown flag --frobnicate' >&2\nexit 3\n"
    )
    broken.chmod(0o755)

    root = tmp_path / "half"
    started: list[ProcessRecord] = []
    original_spawn = Cluster.spawn

    def recording_spawn(self: Cluster, *args: object, **kwargs: object) -> ProcessRecord:
        record = original_spawn(self, *args, **kwargs)  # type: ignore[arg-type]
        started.append(record)
        return record

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Cluster, "spawn", recording_spawn)
        with pytest.raises(ComponentDiedError) as failure:
            Cluster.start(root, ["dgx-h100"], bin_dir=fake_bin, die_with_parent=True, timeout=30)
    message = str(failure.value)
    assert "kube-apiserver" in message and "unknown flag --frobnicate" in message
    assert [r.name for r in started] == ["etcd", "kube-apiserver"]
    etcd = started[0]
    assert etcd.port is not None
    assert_all_gone(started, [etcd.port], root)
    assert sorted(p.name for p in root.iterdir()) == ["logs"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_vgpu_dra("dev-cluster", *args, cwd=cwd, timeout=180)


def test_dev_cluster_cli_up_status_down(tmp_path: Path) -> None:
    require_binaries()
    root = tmp_path / ".dev-cluster"
    try:
        up = run_cli("up", "--nodes", "dgx-h100", cwd=tmp_path)
        assert up.returncode == 0, up.stderr
        lines = up.stdout.strip().splitlines()
        assert lines[-1] == f"export KUBECONFIG={root / 'kubeconfig'}"
        assert any("node-1" in line and "dgx-h100" in line for line in lines)

        # The command has exited; the components run on, detached from it.
        cluster = Cluster.attach(root)
        records = cluster.processes
        assert len(records) == 4 and all(is_alive(r) for r in records)
        for record in records:
            assert os.getpgid(record.pid) == record.pid  # own process group
            assert os.getsid(record.pid) == record.pid  # own session: survives the terminal

        status = run_cli("status", cwd=tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "overall: healthy" in status.stdout and "node-1" in status.stdout
        as_json = json.loads(run_cli("status", "--json", cwd=tmp_path).stdout)
        assert as_json["healthy"] is True
        assert {c["name"]: c["healthy"] for c in as_json["components"]} == {
            "etcd": True,
            "kube-apiserver": True,
            "kube-scheduler": True,
            "kube-controller-manager": True,
        }
        assert as_json["nodes"] == [
            {"name": "node-1", "profile": "dgx-h100", "exists": True, "ready": True}
        ]

        again = run_cli("up", cwd=tmp_path)
        assert again.returncode == 1 and "already running" in again.stderr

        env = run_cli("env", cwd=tmp_path)
        assert env.stdout.strip() == lines[-1]

        down = run_cli("down", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        assert_all_gone(records, list(cluster.state.ports.values()), root)
        assert not root.exists()

        gone = run_cli("status", cwd=tmp_path)
        assert gone.returncode == 1 and "no cluster state" in gone.stderr
    finally:
        if (root / "state.json").exists():
            Cluster.attach(root).stop()


CRASHING_STARTER = """
import sys
from pathlib import Path
from vgpu_testbed.cluster.control_plane import Cluster
cluster = Cluster.start(Path(sys.argv[1]), ["t4"], die_with_parent=True)
print("READY", flush=True)
sys.stdin.read()  # until killed
"""

INTERRUPTED_SESSION = """
import os, signal
from vgpu_testbed.cluster.control_plane import Cluster


def test_interrupted(cluster: Cluster) -> None:
    with open(os.environ["STATE_COPY"], "w") as out:
        out.write(cluster.state.model_dump_json())
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored:
    # this session's Ctrl-C must still reach it, as it does for a user at a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), signal.SIGINT)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}


def test_sigkilled_starter_takes_the_cluster_with_it(tmp_path: Path) -> None:
    # What a crashed (SIGKILLed) test session leaves: nothing, the kernel ends the components.
    require_binaries()
    root = tmp_path / "crash"
    starter = subprocess.Popen(
        [sys.executable, "-c", CRASHING_STARTER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert starter.stdout is not None
        assert starter.stdout.readline().strip() == "READY"
        cluster = Cluster.attach(root)
        records = cluster.processes
        assert len(records) == 4 and all(is_alive(r) for r in records)
        starter.kill()
        starter.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(is_alive(r) for r in records) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_all_gone(records, list(cluster.state.ports.values()), root)
    finally:
        if starter.poll() is None:
            starter.kill()
        if (root / "state.json").exists():
            Cluster.attach(root).stop()


def test_interrupted_pytest_session_tears_the_fixture_down(tmp_path: Path) -> None:
    # Ctrl-C in the middle of a session that uses the `cluster` fixture stops the cluster.
    require_binaries()
    suite = tmp_path / "suite"
    (suite / "tests" / "e2e").mkdir(parents=True)
    (suite / "tests" / "fixtures").mkdir()
    repo = Path(__file__).resolve().parents[3]
    for package in ("tests", "tests/e2e", "tests/fixtures"):
        (suite / package / "__init__.py").write_text("")
    (suite / "tests" / "fixtures" / "cluster.py").write_text(
        (repo / "tests/fixtures/cluster.py").read_text()
    )
    (suite / "tests" / "conftest.py").write_text('pytest_plugins = ("tests.fixtures.cluster",)\n')
    (suite / "tests" / "e2e" / "test_interrupted.py").write_text(INTERRUPTED_SESSION)
    state_copy = tmp_path / "state.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e"],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**_env(), "STATE_COPY": str(state_copy)},
    )
    assert run.returncode == 2, run.stdout + run.stderr  # pytest's "interrupted"
    assert "KeyboardInterrupt" in run.stdout + run.stderr
    state = ClusterState.model_validate_json(state_copy.read_text())
    assert len(state.processes) == 4
    assert_all_gone(state.processes, list(state.ports.values()), Path(state.root))
    # The fixture's own teardown ran (not just the kernel's parent-death signal): it removed
    # everything but the logs.
    assert sorted(p.name for p in Path(state.root).iterdir()) == ["logs"]


def test_dev_cluster_up_with_node_agents(tmp_path: Path) -> None:
    # `up --agents`: each node also gets simulated GPUs, the kubelet plugin and the kubelet
    # stand-in; they publish the node's GPUs, run detached, and `down` stops them too.
    require_binaries()
    from vgpu_testbed.fakegpu import simulator as fakegpu

    try:
        fakegpu.library_dir()
    except fakegpu.FakeGpuError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(str(err))
        pytest.skip(str(err))
    too_deep = run_cli("up", "--agents", "--dir", str(tmp_path / ("d" * 60)), cwd=tmp_path)
    assert too_deep.returncode == 1 and "too deep for node agents" in too_deep.stderr
    assert not (tmp_path / ("d" * 60)).exists()
    bad = run_cli("up", "--agents", "--controller-args", "--node-policy fullest", cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'fullest'" in bad.stderr, bad.stderr
    assert not (tmp_path / ".dev-cluster").exists()
    # Unix socket paths are limited to 107 characters: pytest's tmp_path is too deep.
    with short_dir("vd-") as short:
        root = short / "c"
        up = up_with_agents(
            root,
            "standin",
            "dgx-h100",
            "--controller-args",
            "--device-policy binpack",
            timeout=180,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        cluster = Cluster.attach(root)
        records = cluster.processes
        names = {r.name for r in records}
        assert {"kubelet-plugin-node-1", "kubelet-standin-node-1", "vgpu-dra-controller"} <= names
        controller = next(r for r in records if r.name == "vgpu-dra-controller")
        assert " --device-policy binpack" in cmdline(controller.pid)
        check_controller_identity(cluster)
        status = json.loads(run_cli("status", "--json", "--dir", str(root), cwd=short).stdout)
        assert {c["name"]: c["healthy"] for c in status["components"]}["vgpu-dra-controller"]
        assert all(is_alive(r) for r in records)

        from kubernetes import client

        api = cluster.api_client()
        try:
            slices = [
                s
                for s in client.ResourceV1Api(api).list_resource_slice().items
                if s.spec.node_name == "node-1"
            ]
        finally:
            api.close()
        # The dgx-h100 profile is an 8-GPU machine.
        assert sum(len(s.spec.devices or []) for s in slices) == 8
        # Binpack on an empty node: the first GPU.
        assert place_example(cluster, up.stdout) == ("node-1", "gpu-0")
        assert_legacy_pod_translated(cluster)

        down = run_cli("down", "--dir", str(root), cwd=short)
        assert down.returncode == 0, down.stderr
        assert_all_gone(records, list(cluster.state.ports.values()), root)
        assert not root.exists()


def assert_legacy_pod_translated(cluster: Cluster) -> None:
    """`up --agents` registered the admission webhook as the chart does: a vgpu-manager pod
    created unchanged comes back with a claim from a template the webhook made."""
    from dra_driver import kube

    client = kube.KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        legacy = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "legacy-vgpu-manager"},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {
                "nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10",
                "nvidia.com/vgpu-memory": "1024"}}}]},
        }  # fmt: skip
        created = client.create(kube.path("v1", "pods", namespace="default"), legacy)
        (claim,) = created["spec"]["resourceClaims"]
        assert "nvidia.com/vgpu-number" not in created["spec"]["containers"][0]["resources"].get(
            "limits", {}
        )
        client.get(
            kube.path(
                "resource.k8s.io/v1", "resourceclaimtemplates",
                claim["resourceClaimTemplateName"], namespace="default",
            )
        )  # fmt: skip
    finally:
        client.close()


def test_up_with_agents_refuses_an_unknown_profile_before_starting(tmp_path: Path) -> None:
    require_binaries()
    up = run_cli("up", "--agents", "--nodes", "dgx-h100,no-such-machine", cwd=tmp_path)
    assert up.returncode == 1
    assert "'no-such-machine': no such profile" in up.stderr
    assert not (tmp_path / ".dev-cluster").exists()
