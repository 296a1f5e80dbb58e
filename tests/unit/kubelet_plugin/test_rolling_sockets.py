"""Rolling-update pieces without processes: per-instance socket names, stale-socket removal, the
lock holder's advertised endpoint."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubelet_plugin.main import build_parser, socket_paths
from kubelet_plugin.server import (
    MAX_SOCKET_PATH,
    SocketPaths,
    remove_stale_sockets,
    short_instance,
)
from kubelet_plugin.statelock import StateDirLock, StateLockError

DRIVER = "vgpu.dra.dev"


def test_instance_names_follow_the_pod_uid() -> None:
    uid = "0f8e2c51-3d2b-4c8e-9a51-2f8d1b7e6a90"
    args = build_parser({}).parse_args(
        ["--plugin-dir", "/p", "--registrar-dir", "/r", "--instance-id", uid]
    )
    paths = socket_paths(args)
    assert paths.registration == f"/r/{DRIVER}-{uid}-reg.sock"
    assert paths.dra == f"/p/dra-{uid}.sock"
    env = build_parser({"VGPU_DRA_INSTANCE_ID": "x1"}).parse_args(["--plugin-dir", "/p"])
    assert socket_paths(env).dra == "/p/dra-x1.sock"


@pytest.mark.parametrize("bad", ["../x", "a/b", "a b", "x" * 64])
def test_instance_id_must_be_a_plain_token(bad: str) -> None:
    with pytest.raises(ValueError, match="instance id"):
        SocketPaths.for_instance(DRIVER, plugin_dir="/p", registrar_dir="/r", instance=bad)


def test_long_paths_use_the_short_instance_id() -> None:
    uid = "0f8e2c51-3d2b-4c8e-9a51-2f8d1b7e6a90"
    deep = "/" + "d" * 50
    paths = SocketPaths.for_instance(DRIVER, plugin_dir="/p", registrar_dir=deep, instance=uid)
    assert paths.dra == f"/p/dra-{uid}.sock"  # fits: the whole id
    short = short_instance(uid)
    assert len(short) == 11 and short != short_instance(uid + "x")
    assert paths.registration == f"{deep}/{DRIVER}-{short}-reg.sock"
    assert len(paths.registration) <= MAX_SOCKET_PATH


def test_too_long_socket_path_is_refused_naming_it() -> None:
    deep = "/" + "d" * (MAX_SOCKET_PATH - 20)
    with pytest.raises(ValueError, match="over the 107-byte limit"):
        SocketPaths.for_instance(DRIVER, plugin_dir="/p", registrar_dir=deep, instance="uid-1")


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    registrar, plugin = tmp_path / "r", tmp_path / "p"
    registrar.mkdir()
    plugin.mkdir()
    yield registrar, plugin


def _bound(path: Path, *, listen: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen(1)
    return sock


def test_only_dead_sockets_of_our_driver_are_removed(dirs: tuple[Path, Path]) -> None:
    registrar, plugin = dirs
    ours = SocketPaths.for_instance(
        DRIVER, plugin_dir=str(plugin), registrar_dir=str(registrar), instance="me"
    )
    live = [
        _bound(registrar / f"{DRIVER}-live-reg.sock", listen=True),
        _bound(plugin / "dra-live.sock", listen=True),
    ]
    dead_paths = [
        registrar / f"{DRIVER}-dead-reg.sock",
        registrar / f"{DRIVER}-reg.sock",  # an earlier version's fixed name
        plugin / "dra-dead.sock",
        plugin / "dra.sock",
    ]
    dead = [_bound(path, listen=False) for path in dead_paths]
    for sock in dead:
        sock.close()  # the file stays, nobody listens: a SIGKILLed instance's socket
    other_driver = _bound(registrar / "other.example.com-x-reg.sock", listen=False)
    other_driver.close()
    own = [_bound(Path(ours.registration), listen=False), _bound(Path(ours.dra), listen=False)]
    not_a_socket = registrar / f"{DRIVER}-file-reg.sock"
    not_a_socket.write_text("")
    try:
        removed = remove_stale_sockets(ours, DRIVER)
    finally:
        for sock in live + own:
            sock.close()
    assert sorted(removed) == sorted(str(p) for p in dead_paths)
    for path in dead_paths:
        assert not path.exists()
    for kept in (
        registrar / f"{DRIVER}-live-reg.sock",
        plugin / "dra-live.sock",
        registrar / "other.example.com-x-reg.sock",
        Path(ours.registration),
        Path(ours.dra),
        not_a_socket,
    ):
        assert kept.exists(), kept


def test_holder_advertises_its_endpoint(tmp_path: Path) -> None:
    holder, waiter = StateDirLock(str(tmp_path)), StateDirLock(str(tmp_path))
    assert waiter.holder_endpoint() is None  # no lock file yet
    holder.acquire()
    assert waiter.holder_endpoint() is None  # holds, serves nothing yet
    holder.advertise("/p/dra-old.sock")
    assert waiter.holder_endpoint() == "/p/dra-old.sock"
    holder.release()
    waiter.acquire()
    assert holder.holder_endpoint() is None  # the new holder has not advertised
    waiter.release()


def test_advertise_without_the_lock_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StateLockError, match="without holding"):
        StateDirLock(str(tmp_path)).advertise("/p/dra.sock")


def test_waiting_for_the_lock_ends_when_cancelled(tmp_path: Path) -> None:
    holder = StateDirLock(str(tmp_path))
    holder.acquire()
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            StateDirLock(str(tmp_path)).acquire(wait_s=60, cancel=cancel)
        except StateLockError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    cancel.set()
    waiter.join(timeout=5)
    holder.release()
    assert not waiter.is_alive()
    assert outcome and "stopped while waiting" in str(outcome[0])
