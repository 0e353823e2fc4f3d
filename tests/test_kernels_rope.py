"""RopeQKVKernel (wgsl/rope_qkv.wgsl) vs numpy: both rotation conventions, QK-norm, GQA / MHA / MQA
and head sizes 32..256; the q_rel relayout (B = KVH, W = T * GROUP, C = DH), the K cache rows and
V cache columns at positions pos0 .. pos0 + T - 1, and every other cache position untouched."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import cache_buffer, device, download, f32_buffer, read_cache, read_f32, run, upload
from webdrift.kernels.rope import RopeQKVKernel
from webdrift.tensor import TensorDesc

THETA = 10000.0
CACHE_FILL = -5.5
T_CAP = 8


def inv_freq(dh, theta=THETA):
    return (theta ** (-np.arange(0, dh, 2, dtype=np.float64) / dh)).astype(np.float32)


def rope_ref(x, pos, style, dh):
    """x (T, heads, DH) float64, rotated at positions pos (T,). half: HF rotate_half;
    interleaved: pairs (2i, 2i+1) (GPT-J / llama.cpp GGUF order)."""
    ang = pos[:, None].astype(np.float64) * inv_freq(dh).astype(np.float64)[None, :]   # (T, DH/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if style == "half":
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    out = np.empty_like(x)
    a, b = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def head_rms_norm(x, w, eps, w_offset):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + w_offset)


CONFIGS = [  # (H, KVH, DH)
    (9, 3, 64),     # GQA (SmolLM2-135M)
    (4, 4, 32),     # MHA
    (4, 1, 128),    # MQA
    (2, 1, 256),    # Gemma-sized heads
]


@pytest.mark.parametrize("kv_f16", [False, True], ids=["kv32", "kv16"])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("H,KVH,DH", CONFIGS)
@pytest.mark.parametrize("T,pos0,cap", [(5, 37, 64), (1, 63, 64)])
def test_rope_qkv(T, pos0, cap, H, KVH, DH, style, qk_norm, kv_f16):
    """kv_f16: the caches hold f16 (the appended K and V rounded to it, the other rows untouched)."""
    group = H // KVH
    eps, w_offset = 1e-6, (1.0 if qk_norm else 0.0)
    rng = np.random.default_rng(H * 1000 + DH + pos0)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * DH)).astype(np.float32)
    qn, kn = (rng.standard_normal((2, DH)) * 0.3).astype(np.float32)
    # the accessors make the kernel layout-agnostic: a sliced qkv for one config, a sliced q_rel for another
    qkv_d = TensorDesc("qkv", (H + 2 * KVH) * DH, T_CAP, layout="sliced" if DH == 32 else "linear")
    q_d = TensorDesc("q", DH, T_CAP * group, b=KVH, layout="sliced" if DH == 128 else "linear")
    kvt = np.float16 if kv_f16 else np.float32
    kc0 = rng.standard_normal((KVH, cap, DH)).astype(kvt).astype(np.float32)     # (KVH, CAP, DH)
    vc0 = rng.standard_normal((KVH, DH, cap)).astype(kvt).astype(np.float32)     # (KVH, DH, CAP)
    qb = upload(q_d, fill=CACHE_FILL)
    kcb, vcb = cache_buffer(kc0, kv_f16), cache_buffer(vc0, kv_f16)
    bufs = {"qkv": upload(qkv_d, qkv), "q": qb, "kc": kcb, "vc": vcb, "inv_freq": f32_buffer(inv_freq(DH))}
    if qk_norm:
        bufs |= {"qn": f32_buffer(qn), "kn": f32_buffer(kn)}
    k = RopeQKVKernel(device(), qkv_d, q_d, H, KVH, DH, cap, style == "half", qk_norm, eps, w_offset, kv_f16=kv_f16)
    run(k, bufs, T, pos0=pos0)

    x = qkv.astype(np.float64)
    q = x[:, : H * DH].reshape(T, H, DH)
    kk = x[:, H * DH: (H + KVH) * DH].reshape(T, KVH, DH)
    v = x[:, (H + KVH) * DH:].reshape(T, KVH, DH)
    if qk_norm:
        q, kk = head_rms_norm(q, qn, eps, w_offset), head_rms_norm(kk, kn, eps, w_offset)
    pos = pos0 + np.arange(T)
    q, kk = rope_ref(q, pos, style, DH), rope_ref(kk, pos, style, DH)
    tol = {"rtol": 1e-4, "atol": 2e-4}

    # q_rel[kvh, t * GROUP + g, :] = q head kvh * GROUP + g of token t
    q_rel_ref = q.reshape(T, KVH, group, DH).transpose(1, 0, 2, 3).reshape(KVH, T * group, DH)
    got_q = download(q_d, qb, squeeze=False)
    np.testing.assert_allclose(got_q[:, : T * group], q_rel_ref, **tol)
    assert (got_q[:, T * group:] == CACHE_FILL).all()

    kc = read_cache(kcb, kc0.size, kv_f16).reshape(kc0.shape)
    vc = read_cache(vcb, vc0.size, kv_f16).reshape(vc0.shape)
    if kv_f16:   # f16 keeps 11 significant bits: a value within half a unit of the last (2^-11 of it)
        np.testing.assert_allclose(kc[:, pos], kk.transpose(1, 0, 2), rtol=2 ** -11 + 1e-4, atol=2e-4)
        np.testing.assert_allclose(vc[:, :, pos], v.transpose(1, 2, 0), rtol=2 ** -11, atol=0)
        assert (vc[:, :, pos] != v.transpose(1, 2, 0).astype(np.float32)).any(), "the values are rounded to f16"
    else:
        np.testing.assert_allclose(kc[:, pos], kk.transpose(1, 0, 2), **tol)
        np.testing.assert_array_equal(vc[:, :, pos], v.transpose(1, 2, 0).astype(np.float32))
    others = np.setdiff1d(np.arange(cap), pos)
    np.testing.assert_array_equal(kc[:, others], kc0[:, others])
    np.testing.assert_array_equal(vc[:, :, others], vc0[:, :, others])


def test_rope_qkv_large_position():
    """pos0 = 1000 (angles of hundreds of radians): still within f32 accuracy of the reference."""
    H, KVH, DH, T, pos0, cap = 2, 1, 64, 2, 1000, 1024
    rng = np.random.default_rng(11)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * DH)).astype(np.float32)
    qkv_d = TensorDesc("qkv", (H + 2 * KVH) * DH, T_CAP)
    q_d = TensorDesc("q", DH, T_CAP * 2, b=KVH)
    qb, kcb, vcb = upload(q_d), device().create_buffer(KVH * cap * DH * 4), device().create_buffer(KVH * cap * DH * 4)
    k = RopeQKVKernel(device(), qkv_d, q_d, H, KVH, DH, cap, True)
    run(k, {"qkv": upload(qkv_d, qkv), "q": qb, "kc": kcb, "vc": vcb, "inv_freq": f32_buffer(inv_freq(DH))}, T, pos0=pos0)
    pos = pos0 + np.arange(T)
    q = rope_ref(qkv[:, : H * DH].reshape(T, H, DH).astype(np.float64), pos, "half", DH)
    np.testing.assert_allclose(download(q_d, qb, squeeze=False)[0, :T * 2], q.reshape(T * 2, DH), rtol=1e-3, atol=1e-3)
    kref = rope_ref(qkv[:, H * DH: (H + 1) * DH].reshape(T, 1, DH).astype(np.float64), pos, "half", DH)
    kc = read_f32(kcb, cap * DH).reshape(cap, DH)
    np.testing.assert_allclose(kc[pos], kref[:, 0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_qkv_tree_positions(style):
    """tree=True: row t is rotated by its tree record's position (pos0 + its depth), but still
    written at cache slot pos0 + t."""
    from webdrift.kernels.tree import depths, pack_tree
    H, KVH, DH, cap, pos0 = 4, 2, 32, 64, 20
    parents = [-1, 0, 0, 1, 2, 2, 4]                     # depths 0 1 1 2 2 2 3
    T, group = len(parents), H // KVH
    rng = np.random.default_rng(7)
    qkv = rng.standard_normal((T, (H + 2 * KVH) * DH)).astype(np.float32)
    qkv_d = TensorDesc("qkv", (H + 2 * KVH) * DH, T_CAP)
    q_d = TensorDesc("q", DH, T_CAP * group, b=KVH)
    kcb, vcb = f32_buffer(np.zeros((KVH, cap, DH))), f32_buffer(np.zeros((KVH, DH, cap)))
    qb = upload(q_d)
    tree = device().create_buffer(4096, label="tree")
    device().write_buffer(tree, pack_tree(parents, pos0, T_CAP))
    k = RopeQKVKernel(device(), qkv_d, q_d, H, KVH, DH, cap, style == "half", tree=True)
    run(k, {"qkv": upload(qkv_d, qkv), "q": qb, "kc": kcb, "vc": vcb, "inv_freq": f32_buffer(inv_freq(DH)),
            "tree": tree}, T, pos0=pos0)
    x = qkv.astype(np.float64)
    pos = pos0 + np.array([0, 1, 1, 2, 2, 2, 3])
    assert list(pos - pos0) == depths(parents)
    q = rope_ref(x[:, : H * DH].reshape(T, H, DH), pos, style, DH)
    kk = rope_ref(x[:, H * DH: (H + KVH) * DH].reshape(T, KVH, DH), pos, style, DH)
    tol = {"rtol": 1e-4, "atol": 2e-4}
    got_q = download(q_d, qb, squeeze=False)[:, : T * group]
    np.testing.assert_allclose(got_q, q.reshape(T, KVH, group, DH).transpose(1, 0, 2, 3).reshape(KVH, -1, DH), **tol)
    kc = read_f32(kcb, KVH * cap * DH).reshape(KVH, cap, DH)
    np.testing.assert_allclose(kc[:, pos0: pos0 + T], kk.transpose(1, 0, 2), **tol)   # slots pos0 + t
    vc = read_f32(vcb, KVH * DH * cap).reshape(KVH, DH, cap)
    np.testing.assert_array_equal(vc[:, :, pos0: pos0 + T],
                                  x[:, (H + KVH) * DH:].reshape(T, KVH, DH).transpose(1, 2, 0).astype(np.float32))
