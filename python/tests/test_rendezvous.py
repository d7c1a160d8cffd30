"""Rendezvous.from_env() and braid.init() read the launcher's variables; without them, a clear braid.Error."""
import re

import pytest

import braid
from braid import Error, ErrorCode

from helpers import LAUNCHER_VARIABLES, run_python


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_from_env_without_launcher_names_the_variables(no_launcher):
    with pytest.raises(Error) as caught:
        braid.Rendezvous.from_env()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    message = str(caught.value)
    assert "torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)" in message and "braid-run" in message


def test_init_without_launcher_raises(no_launcher):
    with pytest.raises(Error, match="no launcher rendezvous") as caught:
        braid.init()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert not braid.is_initialized()


def test_torchrun_variables(no_launcher):
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("LOCAL_RANK", "1")
    no_launcher.setenv("MASTER_ADDR", "127.0.0.1")
    no_launcher.setenv("MASTER_PORT", "29500")
    r = braid.Rendezvous.from_env()
    assert (r.source, r.rank, r.size, r.local_rank) == ("torchrun", 1, 2, 1)
    assert (r.store_host, r.store_port, r.serve_store) == ("127.0.0.1", 29501, False)  # MASTER_PORT + 1
    no_launcher.setenv("WORLD_SIZE", "two")
    with pytest.raises(Error, match="WORLD_SIZE") as caught:
        braid.Rendezvous.from_env()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_store_host_and_explicit_rendezvous():
    store = braid.StoreHost()
    assert re.fullmatch(r"127\.0\.0\.1:\d+", store.address)
    r = braid.Rendezvous.at_store(store.address, 0, 1, False)
    assert (r.source, r.rank, r.size, r.serve_store) == ("explicit", 0, 1, False)


def test_communicator_of_one_rank():
    """Where there is no GPU, init fails with NO_DEVICE and braid's message; with one, a world of one works."""
    store = braid.StoreHost()
    try:
        comm = braid.Communicator.init(braid.Rendezvous.at_store(store.address, 0, 1, False), timeout_s=30)
    except Error as error:
        assert error.code is ErrorCode.NO_DEVICE, str(error)
        assert "Communicator::init" in str(error)
        return
    assert (comm.rank, comm.size) == (0, 1)
    comm.destroy()
    assert comm.destroyed
    with pytest.raises(Error, match="destroyed") as caught:
        comm.barrier()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_calls_without_init_raise(no_launcher):
    for call in (braid.barrier, braid.check, braid.get_rank, braid.get_world_size):
        with pytest.raises(Error, match="call braid.init") as caught:
            call()
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_init_twice_is_refused_without_gpu_or_works_with_one():
    """braid.init under torchrun variables for a world of one (in a fresh interpreter: it sets the default)."""
    code = """
import braid
try:
    braid.init(timeout_s=30)
except braid.Error as error:
    print('init', error.code.name)
    raise SystemExit(0)
try:
    braid.init()
except braid.Error as error:
    print('second', error.code.name, 'destroy() first' in str(error))
braid.destroy()
"""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {name: None for name in LAUNCHER_VARIABLES}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1))
    result = run_python(code, env=env)  # braid's store: MASTER_PORT + 1, the port just found free
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("init NO_DEVICE", "second INVALID_ARGUMENT True")
