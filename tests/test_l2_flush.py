"""The autotuner's L2-evicting dispatch (kernels/flush.py) writes its whole scratch buffer."""

import numpy as np

from tests.gpu_util import device
from webdrift.kernels.flush import L2FlushKernel


def test_flush_writes_every_word():
    dev = device()
    k = L2FlushKernel(dev)
    assert k.nbytes <= dev.max_binding_size
    n = (1 << 20) + 48   # not a multiple of the grid's stride
    buf = dev.create_buffer(n, label="flush")
    dev.submit([k.dispatch({"buf": buf}, k.workgroups())])
    got = np.frombuffer(dev.read_buffer_sync(buf), dtype=np.uint32).reshape(-1, 4)
    assert (got == np.arange(n // 16, dtype=np.uint32)[:, None]).all()
