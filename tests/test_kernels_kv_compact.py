"""KVCompactKernel (wgsl/kv_compact.wgsl) vs numpy: the accepted path's K/V rows move to
consecutive slots in place, every other slot untouched; pack_moves refuses unsafe move lists."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import cache_buffer, device, read_cache
from webdrift.kernels.kv_compact import KVCompactKernel, moves_bytes, pack_moves


@pytest.mark.parametrize("KVH,DH,moves", [(3, 64, [(12, 11), (15, 12), (20, 13)]),
                                          (1, 40, [(7, 6)]),
                                          (2, 128, [(31, 2), (32, 3), (40, 4), (63, 5)]),
                                          (2, 32, [])])
@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
def test_kv_compact(KVH, DH, moves, f16):
    cap = 64
    rng = np.random.default_rng(len(moves) + DH)
    kc0 = rng.standard_normal((KVH, cap, DH)).astype(np.float16 if f16 else np.float32).astype(np.float32)
    vc0 = rng.standard_normal((KVH, DH, cap)).astype(np.float16 if f16 else np.float32).astype(np.float32)
    kcb, vcb = cache_buffer(kc0, f16), cache_buffer(vc0, f16)
    mb = device().create_buffer(moves_bytes(8), label="moves")
    device().write_buffer(mb, pack_moves(moves, 8))
    k = KVCompactKernel(device(), KVH, DH, cap, 8, kv_f16=f16)
    device().submit([k.dispatch({"moves": mb, "kc": kcb, "vc": vcb}, k.workgroups())])
    kc_want, vc_want = kc0.copy(), vc0.copy()
    for s, d in moves:                       # sequential moves, as the host meant them
        kc_want[:, d] = kc_want[:, s]
        vc_want[:, :, d] = vc_want[:, :, s]
    np.testing.assert_array_equal(read_cache(kcb, kc0.size, f16).reshape(kc0.shape), kc_want)
    np.testing.assert_array_equal(read_cache(vcb, vc0.size, f16).reshape(vc0.shape), vc_want)
    for s, d in moves:                       # the rows moved are the original source rows
        np.testing.assert_array_equal(kc_want[:, d], kc0[:, s])


def test_pack_moves_refuses_unsafe_lists():
    with pytest.raises(ValueError, match="ascend"):
        pack_moves([(5, 3), (6, 3)], 8)
    with pytest.raises(ValueError, match="below"):
        pack_moves([(3, 5)], 8)
    with pytest.raises(ValueError, match="holds"):
        pack_moves([(9, 1), (10, 2)], 1)
