"""The autotuner's L2-evicting dispatch (kernels/flush.py) reads its whole scratch buffer: each
invocation's loads reach its store, which only the marker value triggers."""

import numpy as np

from tests.gpu_util import device
from webdrift.kernels.flush import L2FlushKernel

MARK = np.array([0xdeadbeef, 0x0badf00d, 0x12345678, 0x9abcdef0], dtype=np.uint32)


def test_flush_reads_every_word():
    dev = device()
    k = L2FlushKernel(dev)
    assert k.nbytes <= dev.max_binding_size
    stride = k.workgroups()[0] * 256                 # vec4s between one invocation's loads
    n = stride + stride // 2 + 7                     # invocations < n - stride read two vec4s
    data = np.zeros((n, 4), dtype=np.uint32)
    data[5] = MARK                                   # invocation 5 alone: the marker
    data[40] = MARK ^ 1                              # invocation 40: marker ^ 1 then ...
    data[40 + stride] = 1                            # ... its second load makes it the marker
    data[41] = MARK                                  # invocation 41: marker, then ...
    data[41 + stride] = 2                            # ... a second load that spoils it
    buf = dev.create_buffer(n * 16, label="flush")
    dev.write_buffer(buf, data.tobytes())
    sync = dev.create_buffer(16, label="sync")
    dev.write_buffer(sync, np.full(4, 7, np.uint32).tobytes())
    dev.submit([k.dispatch({"buf": buf, "sync": sync}, k.workgroups())])
    got = np.frombuffer(dev.read_buffer_sync(buf), dtype=np.uint32).reshape(-1, 4)
    want = data.copy()
    want[5] = ~MARK
    want[40] = ~MARK
    assert (got == want).all()
    # the timed kernel's output is bound only to order the two dispatches: the markers write its
    # first word, nothing else
    assert np.frombuffer(dev.read_buffer_sync(sync), dtype=np.uint32)[1:].tolist() == [7, 7, 7]
