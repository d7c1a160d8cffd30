"""braid.init(group=...): the ranks meet through the process group's torch.distributed store (rank 0 serves
braid's store and publishes its address there). Without a GPU, Communicator.init then fails with NO_DEVICE."""
import threading

import pytest

import braid
from braid import Error, ErrorCode

from helpers import run_python


def test_exchange_through_a_torch_store():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    from braid._lifecycle import exchange_store_address
    store = dist.HashStore()
    results = {}

    def rank(r):
        results[r] = exchange_store_address(store, "braid/test/0", r, 3)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]  # readers first: get() waits
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    addresses = {r: (rv.store_host, rv.store_port) for r, (rv, _) in results.items()}
    assert len(set(addresses.values())) == 1 and addresses[0][0] == "127.0.0.1"
    assert [results[r][0].rank for r in range(3)] == [0, 1, 2] and all(results[r][0].size == 3 for r in range(3))
    assert results[0][1] is not None and results[1][1] is None  # rank 0 serves the store
    assert f"{addresses[0][0]}:{addresses[0][1]}" == results[0][1].address


def test_init_group_without_process_group(monkeypatch):
    pytest.importorskip("torch", reason="torch is not installed")
    with pytest.raises(Error, match="braid.init: argument 'group' names a process group, but torch.distributed is "
                       "not initialised") as caught:
        braid.init(group=object())
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_init_group_of_one():
    """A gloo world of one: the exchange runs, then init fails with NO_DEVICE without a GPU (or works with one)."""
    code = """
import torch.distributed as dist, braid
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    comm = braid.init(group=dist.group.WORLD, timeout_s=30)
    print('init', comm.rank, comm.size)
    braid.destroy()
except braid.Error as error:
    print('init', error.code.name, 'Communicator::init' in str(error))
dist.destroy_process_group()
"""
    result = run_python(code)
    if "No module named 'torch'" in result.stderr:
        pytest.skip("torch is not installed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("init NO_DEVICE True", "init 0 1")
