"""AttentionKernel + AttentionCombineKernel (wgsl/attention.wgsl, attention_combine.wgsl), and the
one-pass prefill attention (AttentionPrefillKernel, wgsl/attention_prefill.wgsl), vs a
numpy causal softmax attention with GQA grouping: positions crossing the key chunks, sliding
windows, attention soft-capping and the score scale. The caches are filled with random values
directly: K (KVH, CAP, DH), V (KVH, DH, CAP); queries as q_rel (B = KVH, W = T * GROUP, C = DH)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu_util import cache_buffer, device, download, f32_buffer, read_f32, run, upload
from webdrift.errors import UnsupportedModelError
from webdrift.kernels.attention import AttentionCombineKernel, AttentionKernel, AttentionPrefillKernel
from webdrift.tensor import TensorDesc

SENTINEL = 3.25
# the kernels (AttentionKernel's variants; the split one's chunks, V prefetch, 4 lanes per key:
# its unrolled path on subgroups narrower than the default lanes, e.g. lavapipe's; and `adapt`)
VARIANTS = [pytest.param({"variant": v, **k}, id=i) for i, v, k in (
    ("head", "head", {}), ("grouped", "grouped", {}), ("split32", "split", {"chunk": 32}),
    ("split16pf", "split", {"chunk": 16, "prefetch_v": True}),
    ("split64pf_lanes4", "split", {"chunk": 64, "prefetch_v": True, "lanes": 4}),
    # several chunks a workgroup (adapt: at most that many partials a row), merged by an online softmax
    ("split16a3", "split", {"chunk": 16, "adapt": 3}),
    ("split32pf_a2_lanes4", "split", {"chunk": 32, "prefetch_v": True, "adapt": 2, "lanes": 4}),
    # tiled: `adapt` partials a row, each a run of 64-key tiles loaded a tile ahead (head_dim a power
    # of two from 64 on lavapipe, whose subgroups may be 4 lanes: else UnsupportedModelError)
    ("tiled_a3", "tiled", {"adapt": 3}), ("tiled_a1", "tiled", {"adapt": 1}),
    # the tiled kernel merging its partials itself (the last workgroup of a row's: no combine)
    # (2 and 4: the partials' weights by lane butterflies, 3 serially)
    ("tiled_a3c", "tiled", {"adapt": 3, "fused": True}), ("tiled_a1c", "tiled", {"adapt": 1, "fused": True}),
    ("tiled_a2c", "tiled", {"adapt": 2, "fused": True}), ("tiled_a4c", "tiled", {"adapt": 4, "fused": True}))]


def merged_into(variant, out_d) -> dict:
    """AttentionKernel's `out` where the variant merges its partials itself (fused)."""
    return {"out": out_d} if (variant or {}).get("fused") else {}


def attend(att, binds: dict, out_d, ob, T, pos0, streams=None) -> None:
    """Both phases into ob: the kernel's partials, then AttentionCombineKernel's merge, or a fused
    kernel's own merge (zeroed counters bound; they must be left zero)."""
    if not att.fused:
        run(att, binds, T, pos0=pos0, streams=streams)
        d = att.defines
        comb = AttentionCombineKernel(device(), out_d, att.group * att.n_kv, att.n_kv, d["DH"], att.nsplit,
                                      d["ROWS_CAP"])
        run(comb, {"part": binds["part"], "out": ob}, T, pos0=pos0, streams=streams)
        return
    n = att.defines["ROWS_CAP"] // att.group * att.n_kv      # (row, KV head) counters
    cnt = device().create_buffer(4 * n, label="cnt")
    run(att, binds | {"out": ob, "cnt": cnt}, T, pos0=pos0, streams=streams)
    assert (read_f32(cnt, n).view(np.uint32) == 0).all(), "the merge leaves its counters zero"


def unsupported(variant, DH, cap, make) -> bool:
    """Whether `variant` cannot take this head size or cache (the tiled one); then make() must
    raise UnsupportedModelError naming it."""
    if (variant or {}).get("variant") != "tiled" or AttentionKernel.tiled_supported(device(), DH, cap):
        return False
    with pytest.raises(UnsupportedModelError, match="tiled attention needs"):
        make()
    return True


def attention_ref(q_rel, kc, vc, pos0, group, scale, window=0, softcap=None, streams=None):
    """q_rel (KVH, T*G, DH), kc (KVH, CAP, DH), vc (KVH, DH, CAP) -> out (T, H*DH), float64.
    streams=(F, N): the T rows are streams at position pos0; row t's keys are cache rows [0, F)
    (positions 0 .. F-1) and its segment's rows F + t N .. (positions F ..)."""
    kvh_n, rows, dh = q_rel.shape
    T = rows // group
    out = np.zeros((T, kvh_n * group * dh))
    for kvh in range(kvh_n):
        for row in range(rows):
            t, g = divmod(row, group)
            p = pos0 if streams else pos0 + t
            lo = max(0, p + 1 - window) if window else 0
            cache_rows = np.arange(lo, p + 1)                  # a key's cache row, by position
            if streams:
                F, N = streams
                cache_rows = np.where(cache_rows < F, cache_rows, cache_rows + t * N)
            s = kc[kvh, cache_rows].astype(np.float64) @ q_rel[kvh, row].astype(np.float64) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            w /= w.sum()
            h = kvh * group + g
            out[t, h * dh:(h + 1) * dh] = vc[kvh, :, cache_rows].astype(np.float64).T @ w
    return out


def random_inputs(kvh, rows, dh, cap, seed, kv_f16=False):
    """q_rel, K and V caches; kv_f16: the caches' values are f16 ones (held as float32 here)."""
    rng = np.random.default_rng(seed)
    kvt = np.float16 if kv_f16 else np.float32
    return (rng.standard_normal((kvh, rows, dh)).astype(np.float32),                     # q_rel
            rng.standard_normal((kvh, cap, dh)).astype(kvt).astype(np.float32),          # K cache
            rng.standard_normal((kvh, dh, cap)).astype(kvt).astype(np.float32))          # V cache


def run_attention(H, KVH, DH, cap, pos0, T, scale=None, window=0, softcap=None, out_layout="linear",
                  q_layout="linear", t_cap=None, seed=0, variant=None, streams=None, kv_f16=False):
    group = H // KVH
    scale = scale if scale is not None else DH ** -0.5
    t_cap = t_cap or T
    rows_cap = t_cap * group
    q, kc, vc = random_inputs(KVH, T * group, DH, cap, seed, kv_f16)
    q_d = TensorDesc("q", DH, rows_cap, b=KVH, layout=q_layout)
    out_d = TensorDesc("out", H * DH, t_cap + 2, layout=out_layout)

    def make():
        return AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale, window, softcap, **(variant or {}),
                               kv_f16=kv_f16, **merged_into(variant, out_d))
    if unsupported(variant, DH, cap, make):
        return ()
    att = make()
    part = device().create_buffer(KVH * rows_cap * att.nsplit * (DH + 2) * 4, label="part")
    ob = upload(out_d, fill=SENTINEL)
    attend(att, {"q": upload(q_d, q), "kc": cache_buffer(kc, kv_f16), "vc": cache_buffer(vc, kv_f16), "part": part},
           out_d, ob, T, pos0, streams)
    got = download(out_d, ob)
    assert (got[T:] == SENTINEL).all(), "rows t >= n_tokens must not be written"
    return got[:T], attention_ref(q, kc, vc, pos0, group, scale, window, softcap, streams)


def assert_close(*got_ref):
    """got close to ref; nothing (no arguments) where the run was an unsupported shape whose
    error `unsupported` checked."""
    if got_ref:
        np.testing.assert_allclose(*got_ref, rtol=1e-4, atol=1e-5)


def run_prefill_attention(H, KVH, DH, cap, pos0, T, window=0, softcap=None, scale=None, t_cap=None, seed=0,
                          out_layout="linear", q_layout="linear", kernel=None, poison=False, kv_f16=False):
    """AttentionPrefillKernel over T rows at positions pos0.. (their keys: cache rows 0 .. pos0 + T - 1);
    poison: the cache rows past them hold NaN (what an earlier sequence may leave must not reach the sums)."""
    group = H // KVH
    scale = scale if scale is not None else DH ** -0.5
    t_cap = t_cap or T
    q, kc, vc = random_inputs(KVH, T * group, DH, cap, seed, kv_f16)
    if poison:
        kc[:, pos0 + T:] = np.nan
        vc[:, :, pos0 + T:] = np.nan
    q_d = TensorDesc("q", DH, t_cap * group, b=KVH, layout=q_layout)
    out_d = TensorDesc("out", H * DH, t_cap + 2, layout=out_layout)
    k = AttentionPrefillKernel(device(), q_d, out_d, H, KVH, DH, cap, t_cap * group, scale, window, softcap,
                               **(kernel or {}), kv_f16=kv_f16)
    ob = upload(out_d, fill=SENTINEL)
    run(k, {"q": upload(q_d, q), "kc": cache_buffer(kc, kv_f16), "vc": cache_buffer(vc, kv_f16), "out": ob}, T,
        pos0=pos0)
    got = download(out_d, ob)
    assert (got[T:] == SENTINEL).all(), "rows t >= n_tokens must not be written"
    return got[:T], attention_ref(q, kc, vc, pos0, group, scale, window, softcap)


@pytest.mark.parametrize("H,KVH,DH,pos0,T", [
    (9, 3, 64, 0, 37),        # SmolLM2's heads, a first chunk whose length is no multiple of the tokens a workgroup
    (9, 3, 64, 250, 20),      # a later chunk: keys before it, a window start that is no multiple of 4
    (32, 8, 64, 0, 64),       # Llama-3.2-1B's
    (8, 2, 128, 101, 9),      # 8B-like head size and grouping
    (4, 4, 32, 3, 5),         # MHA, small heads
    (4, 1, 256, 17, 6),       # MQA, Gemma-sized heads
    (8, 2, 80, 60, 7),        # head size 80: fewer lanes (its 20 vec4s)
])
def test_prefill_attention(H, KVH, DH, pos0, T):
    assert_close(*run_prefill_attention(H, KVH, DH, 512, pos0, T, t_cap=T + 3, q_layout="sliced" if DH == 80 else "linear"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_f16_caches(variant):
    """The caches as f16 (the engine's default where shader-f16 exists): every decode kernel reads
    them as f32, so the result is the reference over the f16 values."""
    assert_close(*run_attention(8, 2, 64, 256, 150, 3, variant=variant, kv_f16=True))


def test_prefill_attention_f16_caches():
    assert_close(*run_prefill_attention(8, 2, 128, 512, 101, 9, kv_f16=True))


def test_prefill_attention_block_past_the_cache():
    """Cache rows (500) no multiple of the key block: the last block loads zeros past them."""
    assert_close(*run_prefill_attention(4, 2, 64, 500, 470, 25, kernel={"keys": 4}))
    assert_close(*run_prefill_attention(9, 3, 64, 512, 100, 37, poison=True))
    dev = device()
    limit = int(dev.info.limits.get("max-compute-workgroup-storage-size", 16384))
    bk = AttentionPrefillKernel.block_keys(dev, 128, 8)
    assert bk in (8, 16, 32) and 2 * bk * 33 * 16 <= limit and (bk == 32 or 2 * 2 * bk * 33 * 16 > limit)


@pytest.mark.parametrize("window,pos0,T", [(16, 250, 20), (4, 0, 9), (300, 200, 120), (1, 10, 3)])
def test_prefill_attention_sliding_window(window, pos0, T):
    assert_close(*run_prefill_attention(4, 2, 32, 512, pos0, T, window=window, t_cap=120, out_layout="sliced"))


def test_prefill_attention_softcap_and_scale():
    got, ref = run_prefill_attention(4, 2, 32, 512, 250, 20, scale=1.0, softcap=5.0)
    assert_close(got, ref)
    assert np.abs(attention_ref(*random_inputs(2, 40, 32, 512, 0), 250, 2, 1.0) - ref).max() > 0.1


@pytest.mark.parametrize("lanes,keys,rows", [(1, 4, 64), (2, 8, 256), (4, 4, 128)])
def test_prefill_attention_knobs(lanes, keys, rows):
    """The tuning knobs (lanes a query row, keys an iteration, invocations a workgroup) change the
    speed, not the result; the workgroup holds whole tokens of every head."""
    got, ref = run_prefill_attention(9, 3, 64, 512, 250, 20, t_cap=20, kernel={"lanes": lanes, "keys": keys, "rows": rows})
    assert_close(got, ref)
    assert AttentionPrefillKernel.lanes(64) == 4 and AttentionPrefillKernel.lanes(40) == 2 and AttentionPrefillKernel.lanes(36) == 1
    k = AttentionPrefillKernel(device(), TensorDesc("q", 64, 60, b=3), TensorDesc("out", 9 * 64, 20), 9, 3, 64, 512, 60,
                               0.125, lanes=lanes, keys=keys, rows=rows)
    assert k.workgroups(37) == (-(-37 // k.bq), 3, 1) and k.bq == max(1, rows // (lanes * 3))
    with pytest.raises(ValueError, match="lanes"):
        AttentionPrefillKernel(device(), TensorDesc("q", 64, 60, b=3), TensorDesc("out", 9 * 64, 20), 9, 3, 64, 512, 60,
                               0.125, lanes=3)


@pytest.mark.parametrize("pos0,T", [(0, 1), (5, 1), (63, 1), (64, 1), (255, 1), (256, 1), (250, 20), (0, 7), (300, 11)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_gqa(pos0, T, variant):
    """SmolLM2's heads (H=9, KVH=3, DH=64), CAP=512: decode and prefill, across the 64-key splits."""
    assert_close(*run_attention(9, 3, 64, 512, pos0, T, t_cap=20, variant=variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_long_prefill_crossing_chunks(variant):
    """pos0 = 0, T = 300 with CAP = 512: early rows see one chunk, later rows two."""
    assert_close(*run_attention(2, 1, 32, 512, 0, 300, out_layout="sliced", variant=variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_decode_four_splits(variant):
    assert_close(*run_attention(4, 2, 64, 1024, 900, 1, variant=variant))


@pytest.mark.parametrize("H,KVH,DH,q_layout", [(4, 4, 32, "linear"), (4, 1, 128, "sliced"), (2, 1, 256, "linear"),
                                               (4, 2, 40, "linear"), (8, 2, 80, "sliced")])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_mha_mqa_head_sizes(H, KVH, DH, q_layout, variant):
    assert_close(*run_attention(H, KVH, DH, 512, 250, 9, q_layout=q_layout, variant=variant))


@pytest.mark.parametrize("window,pos0,T", [(16, 250, 20), (4, 0, 9), (300, 200, 120), (1, 10, 3)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_sliding_window(window, pos0, T, variant):
    """Key k is visible from position p iff p - WINDOW < k <= p (Gemma 3's local layers)."""
    assert_close(*run_attention(4, 2, 64, 512, pos0, T, window=window, t_cap=120, variant=variant))


@pytest.mark.parametrize("pos0,T", [(0, 4), (250, 20)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_softcap_and_scale(pos0, T, variant):
    """Large scores (scale 1) soft-capped at 5: the cap changes the result a lot."""
    got, ref = run_attention(4, 2, 64, 512, pos0, T, scale=1.0, softcap=5.0, t_cap=20, variant=variant)
    assert_close(got, ref)
    uncapped = attention_ref(*random_inputs(2, T * 2, 64, 512, 0), pos0, 2, 1.0)
    assert np.abs(uncapped - ref).max() > 0.1
    got2, ref_uncapped = run_attention(4, 2, 64, 512, pos0, T, scale=0.3, t_cap=20, variant=variant)
    assert_close(got2, ref_uncapped)


def test_attention_partials_layout():
    """Phase 1 writes part[(kvh, row, split)] = (sum_k e_k V[:, k], m, l) with m the chunk's max
    score and e_k = exp(s_k - m), l = sum e_k; a split with no visible key has m = -3e38, l = 0."""
    H, KVH, DH, cap, scale = 2, 2, 32, 768, 0.2
    q, kc, vc = random_inputs(KVH, 2, DH, cap, 3)
    q_d = TensorDesc("q", DH, 2, b=KVH)
    att = AttentionKernel(device(), q_d, H, KVH, DH, cap, 2, scale)
    C = att.CHUNK
    assert C == 64 and att.nsplit == 12          # 64-key chunks for head_dim <= 64
    ns = att.nsplit
    part = device().create_buffer(KVH * 2 * ns * (DH + 2) * 4)
    pos0 = 299                                   # rows at positions 299, 300: splits 0-4 visible
    run(att, {"q": upload(q_d, q), "kc": f32_buffer(kc), "vc": f32_buffer(vc), "part": part}, 2, pos0=pos0)
    got = read_f32(part, KVH * 2 * ns * (DH + 2)).reshape(KVH, 2, ns, DH + 2)
    for kvh in range(KVH):
        for row in range(2):
            p = pos0 + row
            for split in range(ns):
                k0, k1 = C * split, min(C * split + C, p + 1)
                if k0 > p:
                    assert got[kvh, row, split, DH] == np.float32(-3.0e38)
                    assert got[kvh, row, split, DH + 1] == 0
                    continue
                s = kc[kvh, k0:k1].astype(np.float64) @ q[kvh, row] * scale
                e = np.exp(s - s.max())
                np.testing.assert_allclose(got[kvh, row, split, DH], s.max(), rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(got[kvh, row, split, DH + 1], e.sum(), rtol=1e-5)
                np.testing.assert_allclose(got[kvh, row, split, :DH], vc[kvh, :, k0:k1] @ e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt,DH", [("q8", 64), ("q4", 64), ("q4", 128)])
def test_combine_writes_int8_blocks(fmt, DH):
    """AttentionCombineKernel(quant=fmt) writes the heads straight into QuantizeKernel's int8 row
    layout (the O projection's integer-dot input): the same words and scales as the f32 combine
    followed by QuantizeKernel, the block sums equal to float rounding."""
    from webdrift.kernels.quantize import QuantizeKernel, xq_desc
    H, KVH, cap, pos0, T = 4, 2, 256, 100, 3
    group, rows_cap = H // KVH, T * (H // KVH)
    q, kc, vc = random_inputs(KVH, T * group, DH, cap, 4)
    q_d = TensorDesc("q", DH, rows_cap, b=KVH)
    att = AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, DH ** -0.5)
    part = device().create_buffer(KVH * rows_cap * att.nsplit * (DH + 2) * 4, label="part")
    run(att, {"q": upload(q_d, q), "kc": f32_buffer(kc), "vc": f32_buffer(vc), "part": part}, T, pos0=pos0)
    out_d, xq_d = TensorDesc("out", H * DH, T), xq_desc("xq", H * DH, T)
    ob, want, got = upload(out_d), upload(xq_d), upload(xq_d)
    run(AttentionCombineKernel(device(), out_d, H, KVH, DH, att.nsplit, rows_cap), {"part": part, "out": ob}, T,
        pos0=pos0)
    run(QuantizeKernel(device(), out_d, xq_d, fmt), {"x": ob, "xq": want}, T)
    run(AttentionCombineKernel(device(), xq_d, H, KVH, DH, att.nsplit, rows_cap, quant=fmt), {"part": part, "out": got},
        T, pos0=pos0)
    w = np.frombuffer(device().read_buffer_sync(want), np.uint32).reshape(T, -1)
    g = np.frombuffer(device().read_buffer_sync(got), np.uint32).reshape(T, -1)
    nb = H * DH // 32
    nbp = (nb + 3) // 4 * 4
    np.testing.assert_array_equal(g[:, :8 * nb + nb], w[:, :8 * nb + nb])        # int8 words, scales
    np.testing.assert_allclose(g[:, 8 * nb + nbp: 8 * nb + nbp + nb].view(np.float32),
                               w[:, 8 * nb + nbp: 8 * nb + nbp + nb].view(np.float32), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of 32"):
        AttentionCombineKernel(device(), xq_desc("xq", H * 40, T), H, KVH, 40, 4, rows_cap, quant="q8")


@pytest.mark.parametrize("fmt,H,KVH,DH,adapt", [("q8", 8, 2, 64, 3), ("q4", 9, 3, 64, 5), ("q4", 4, 1, 128, 2)])
def test_fused_merge_writes_int8_blocks(fmt, H, KVH, DH, adapt):
    """The tiled kernel merging its partials itself (fused) writes the heads as the O projection's
    int8 row (quant) and the f32 rows (out_f, what LoRA's O shrink reads), decoded on the host as
    in test_kernels_quantize.py: the f32 rows within float rounding of numpy's attention, each
    block's scale its largest |value| / 127, every int8 value the f64 reference's rounded to the
    block's scale (within one step where the two roundings straddle a half), the block sums."""
    from webdrift.kernels.quantize import xq_desc
    cap, pos0, T = 512, 300, 3
    group, rows_cap, scale = H // KVH, T * (H // KVH), DH ** -0.5
    q, kc, vc = random_inputs(KVH, rows_cap, DH, cap, 7)
    q_d, xq_d, f_d = TensorDesc("q", DH, rows_cap, b=KVH), xq_desc("xq", H * DH, T), TensorDesc("f", H * DH, T)
    variant = {"variant": "tiled", "adapt": adapt, "fused": True}
    make = lambda: AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale, out=xq_d, quant=fmt,
                                   out_f=f_d, **variant)
    if unsupported(variant, DH, cap, make):
        return
    att = make()
    part = device().create_buffer(KVH * rows_cap * adapt * (DH + 2) * 4, label="part")
    qb, fb, cnt = upload(xq_d), upload(f_d), device().create_buffer(4 * T * KVH, label="cnt")
    run(att, {"q": upload(q_d, q), "kc": f32_buffer(kc), "vc": f32_buffer(vc), "part": part, "out": qb, "outf": fb,
              "cnt": cnt}, T, pos0=pos0)
    ref = attention_ref(q, kc, vc, pos0, group, scale)
    np.testing.assert_allclose(download(f_d, fb), ref, rtol=1e-4, atol=1e-5)
    words = np.frombuffer(device().read_buffer_sync(qb), np.uint32).reshape(T, -1)
    nb = H * DH // 32
    got = words[:, :8 * nb].copy().view(np.int8).reshape(T, nb, 32).astype(np.float64)
    if fmt == "q4":   # per 8 values: evens then odds
        got = got.reshape(T, nb, 4, 2, 4).transpose(0, 1, 2, 4, 3).reshape(T, nb, 32)
    nbp = (nb + 3) // 4 * 4
    d = words[:, 8 * nb: 8 * nb + nb].view(np.float32)
    blocks = ref.reshape(T, nb, 32)
    np.testing.assert_allclose(d, np.abs(blocks).max(-1) / 127, rtol=1e-4)
    assert np.abs(got - blocks / d[..., None]).max() <= 0.5 + 1e-3
    np.testing.assert_allclose(words[:, 8 * nb + nbp: 8 * nb + nbp + nb].view(np.float32), blocks.sum(-1),
                               rtol=1e-4, atol=1e-5)
    assert (read_f32(cnt, T * KVH).view(np.uint32) == 0).all()
    with pytest.raises(ValueError, match="tiled-attention option"):
        AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale, variant="split", adapt=2, fused=True,
                        out=xq_d, quant=fmt)


@pytest.mark.parametrize("pos0,F,N,T,window", [(70, 64, 128, 3, 0), (64, 64, 64, 4, 0), (5, 0, 64, 2, 0),
                                                (200, 128, 192, 3, 0), (150, 128, 128, 2, 40), (300, 256, 128, 1, 0)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_streams(pos0, F, N, T, window, variant):
    """The streams' cache layout (runtime/streams.py): T rows at one position, row t seeing the
    shared rows [0, F) and its own segment at F + t N (not the other streams'), with and without
    a sliding window; chunks of 64 keys (DH 64) so F and N are chunk multiples."""
    cap = F + T * N
    got, ref = run_attention(4, 2, 64, cap, pos0, T, window=window, variant=variant, streams=(F, N), seed=pos0)
    assert_close(got, ref)


# -- tree attention (kernels/tree.py): a block of query rows sees the cache below pos0 and, in
# the block, only its ancestors ------------------------------------------------------------------
def tree_parents(shape: str, n: int, seed: int = 0) -> list[int]:
    """Parent arrays (parents[0] = -1, each parent before its child) of several shapes."""
    rng = np.random.default_rng(seed)
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "star":
        return [-1] + [0] * (n - 1)
    if shape == "wide":       # (3, 2)-like: three children of the root, two of each, then chains
        par = [-1]
        for i in range(1, n):
            par.append(0 if i <= 3 else (i - 4) // 2 + 1 if i <= 9 else i - 6)
        return par
    return [-1] + [int(rng.integers(0, i)) for i in range(1, n)]


def tree_attention_ref(q_rel, kc, vc, pos0, parents, group, scale):
    """Row t (a node) sees keys [0, pos0) and pos0 + a for its ancestors a (itself included)."""
    kvh_n, rows, dh = q_rel.shape
    T = rows // group
    out = np.zeros((T, kvh_n * group * dh))
    for kvh in range(kvh_n):
        for row in range(rows):
            t, g = divmod(row, group)
            keys, a = list(range(pos0)), t
            anc = []
            while a >= 0:
                anc.append(pos0 + a)
                a = parents[a]
            keys += sorted(anc)
            s = kc[kvh, keys].astype(np.float64) @ q_rel[kvh, row].astype(np.float64) * scale
            w = np.exp(s - s.max())
            w /= w.sum()
            h = kvh * group + g
            out[t, h * dh:(h + 1) * dh] = vc[kvh][:, keys].astype(np.float64) @ w
    return out


def run_tree_attention(H, KVH, DH, cap, pos0, parents, t_cap, variant, seed=0):
    from webdrift.kernels.tree import pack_tree
    group, T = H // KVH, len(parents)
    rows_cap = t_cap * group
    scale = DH ** -0.5
    q, kc, vc = random_inputs(KVH, T * group, DH, cap, seed)
    q_d = TensorDesc("q", DH, rows_cap, b=KVH)
    out_d = TensorDesc("out", H * DH, t_cap)
    if unsupported(variant, DH, cap, lambda: AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale,
                                                              **variant, tree=True, **merged_into(variant, out_d))):
        return ()
    att = AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale, **(variant or {}), tree=True,
                          **merged_into(variant, out_d))
    part = device().create_buffer(KVH * rows_cap * att.nsplit * (DH + 2) * 4, label="part")
    tree = device().create_buffer(len(pack_tree([-1], 0, t_cap)) * t_cap, label="tree")
    device().write_buffer(tree, pack_tree(parents, pos0, t_cap))
    ob = upload(out_d, fill=SENTINEL)
    attend(att, {"q": upload(q_d, q), "kc": f32_buffer(kc), "vc": f32_buffer(vc), "part": part, "tree": tree},
           out_d, ob, T, pos0)
    got = download(out_d, ob)
    assert (got[T:] == SENTINEL).all()
    return got[:T], tree_attention_ref(q, kc, vc, pos0, parents, group, scale)


@pytest.mark.parametrize("shape,n,pos0", [("chain", 1, 0), ("chain", 9, 60), ("star", 7, 37), ("wide", 23, 250),
                                          ("random", 33, 100), ("random", 64, 190), ("random", 5, 0)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_tree_attention_shapes(shape, n, pos0, variant):
    """Trees of several shapes and odd sizes, blocks crossing the 64-key chunks, SmolLM2's GQA."""
    assert_close(*run_tree_attention(9, 3, 64, 512, pos0, tree_parents(shape, n, seed=n), 64, variant))


@pytest.mark.parametrize("H,KVH,DH", [(4, 2, 128), (6, 2, 40), (4, 4, 32), (8, 1, 64)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_tree_attention_head_sizes(H, KVH, DH, variant):
    assert_close(*run_tree_attention(H, KVH, DH, 512, 77, tree_parents("random", 19, seed=3), 20, variant))


def test_tree_chain_equals_causal():
    """A chain is ordinary causal attention over the block: the same output as tree=False."""
    got, _ = run_tree_attention(4, 2, 32, 256, 45, tree_parents("chain", 12), 12, None)
    causal, _ = run_attention(4, 2, 32, 256, 45, 12, seed=0)
    np.testing.assert_allclose(got, causal, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_tree_rows_are_bitwise_decode_steps(variant):
    """Each tree node's output is bit for bit the output of a one-token decode step at the node's
    position over a cache holding the node's path consecutively (what plain decoding would have
    written): the tree kernel reads its keys in that logical order (kernels/tree.py). Block from
    slot 250: paths cross the 64-key chunk boundary at 256 at other depths than their slots."""
    from webdrift.kernels.tree import depths, pack_tree
    H, KVH, DH, cap, pos0, t_cap = 9, 3, 64, 512, 250, 16
    group, scale = H // KVH, DH ** -0.5
    parents = [-1, 0, 0, 1, 2, 2, 4, 3, 6, 6, 8, 10, 11, 7]
    T, rows_cap = len(parents), t_cap * group
    q, kc, vc = random_inputs(KVH, T * group, DH, cap, seed=5)
    q_d, out_d = TensorDesc("q", DH, rows_cap, b=KVH), TensorDesc("out", H * DH, t_cap)

    def step_or_tree(qa, kca, vca, t, tree_records=None):
        att = AttentionKernel(device(), q_d, H, KVH, DH, cap, rows_cap, scale, **(variant or {}),
                              tree=tree_records is not None, **merged_into(variant, out_d))
        part = device().create_buffer(KVH * rows_cap * att.nsplit * (DH + 2) * 4, label="part")
        binds = {"q": upload(q_d, qa), "kc": f32_buffer(kca), "vc": f32_buffer(vca), "part": part}
        if tree_records is not None:
            tb = device().create_buffer(len(tree_records), label="tree")
            device().write_buffer(tb, tree_records)
            binds["tree"] = tb
        pos = pos0 if tree_records is not None else pos0 + t
        ob = upload(out_d, fill=SENTINEL)
        attend(att, binds, out_d, ob, T if tree_records is not None else 1, pos)
        return download(out_d, ob)

    tree_out = step_or_tree(q, kc, vc, 0, pack_tree(parents, pos0, t_cap))
    dep = depths(parents)
    for node in range(T):
        path, a = [], node
        while a >= 0:
            path.append(a)
            a = parents[a]
        path.reverse()
        kl, vl = kc.copy(), vc.copy()
        kl[:, pos0:pos0 + len(path)] = kc[:, [pos0 + r for r in path]]
        vl[:, :, pos0:pos0 + len(path)] = vc[:, :, [pos0 + r for r in path]]
        ql = np.zeros_like(q)
        ql[:, :group] = q[:, node * group:(node + 1) * group]
        step = step_or_tree(ql, kl, vl, dep[node])
        assert np.array_equal(tree_out[node], step[0]), (node, np.abs(tree_out[node] - step[0]).max())


def smallest_subgroup() -> int:
    """The smallest subgroup_size a dispatch of 256 invocations sees on this device (wgpu-native
    does not report it): lavapipe's is its SIMD width."""
    import struct

    dev = device()
    wg = dev._dev
    code = ("@group(0) @binding(0) var<storage, read_write> o: array<atomic<u32>>;\n"
            "@compute @workgroup_size(256) fn main(@builtin(subgroup_size) sg: u32) { atomicMin(&o[0], sg); }\n")
    pipe = wg.create_compute_pipeline(layout="auto", compute={"module": wg.create_shader_module(code=code),
                                                              "entry_point": "main"})
    buf = dev.create_buffer(16, label="sg")
    dev.write_buffer(buf, struct.pack("<4I", 1 << 30, 0, 0, 0))
    bg = wg.create_bind_group(layout=pipe.get_bind_group_layout(0),
                              entries=[{"binding": 0, "resource": {"buffer": buf.handle}}])
    enc = wg.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(4)
    cp.end()
    wg.queue.submit([enc.finish()])
    return struct.unpack("<I", dev.read_buffer_sync(buf, 0, 4))[0]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("case", ["decode", "prefill_rows", "window", "streams", "f16", "head_dim_32", "tree"])
def test_tiled_attention_eight_lanes(monkeypatch, case, fused):
    """The tiled kernel as GPUs whose subgroups have at least 8 lanes run it (8 lanes a K row and
    a V channel run, NVIDIA's path; the suite's other tiled runs take lavapipe's 4-lane path):
    forced where lavapipe's own subgroups hold 8 lanes."""
    sg = smallest_subgroup()
    if sg < 8:
        pytest.skip(f"this device's subgroups have {sg} lanes: the 8-lane path cannot run here")
    monkeypatch.setattr(type(device()), "min_subgroup", property(lambda self: 8))
    assert AttentionKernel.tiled_lanes(device()) == 8
    v = {"variant": "tiled", "adapt": 3, "fused": fused} if fused else {"variant": "tiled", "adapt": 3}
    if fused:      # the merge in the kernel, its weights by butterflies over 8 lanes
        v["adapt"] = 8
    if case == "tree":
        assert_close(*run_tree_attention(9, 3, 64, 512, 190, tree_parents("random", 64, seed=64), 64, v))
        return
    args = {"decode": ((32, 8, 128, 1024, 900, 1), {}), "prefill_rows": ((9, 3, 64, 512, 250, 20), {}),
            "window": ((4, 2, 64, 512, 200, 120), {"window": 300, "t_cap": 120}),
            "streams": ((4, 2, 64, 128 + 3 * 192, 200, 3), {"streams": (128, 192), "seed": 200}),
            "f16": ((8, 2, 64, 256, 150, 3), {"kv_f16": True}),
            "head_dim_32": ((4, 2, 32, 512, 63, 1), {})}[case]
    assert_close(*run_attention(*args[0], variant=v, **args[1]))


@pytest.mark.parametrize("H,KVH,DH,cap,pos0,T,window", [(4, 2, 64, 100, 99, 1, 0), (4, 2, 64, 68, 60, 8, 0),
                                                        (8, 2, 64, 132, 0, 132, 0), (4, 2, 64, 100, 50, 40, 7),
                                                        (16, 2, 64, 260, 259, 1, 0)])
@pytest.mark.parametrize("adapt", [2, 64])
def test_tiled_attention_last_tile_past_the_cache(H, KVH, DH, cap, pos0, T, window, adapt):
    """Caches whose rows are not a multiple of the 64-key tile (the last tile's loads clamped into
    the cache, its keys past it invisible), the last cache row queried, more partials than tiles,
    8 query heads a KV head."""
    assert_close(*run_attention(H, KVH, DH, cap, pos0, T, window=window, t_cap=T,
                                variant={"variant": "tiled", "adapt": adapt}))


def test_min_subgroup_and_tiled_lanes():
    """Device.min_subgroup: the adapter's own minimum where it reports one (browsers), else 32 on
    NVIDIA (by vendor id or name), else 4; the tiled attention takes 8 lanes a row from 8 up."""
    from types import MappingProxyType

    from webdrift.gpu.base import Device, DeviceInfo

    def dev(sizes=(), vendor="", adapter="", vendor_id=None):
        d = Device.__new__(Device)
        d.info = DeviceInfo(adapter=adapter, vendor=vendor, subgroup_sizes=sizes, features={"subgroups"})
        d.adapter_info = MappingProxyType({} if vendor_id is None else {"vendor_id": vendor_id})
        return d
    assert dev((16, 64)).min_subgroup == 16
    assert dev((4, 128), vendor="nvidia").min_subgroup == 4                       # the adapter's word first
    assert dev(vendor_id=0x10DE).min_subgroup == 32 and dev(adapter="NVIDIA H100").min_subgroup == 32
    assert dev(adapter="llvmpipe (LLVM 15.0.6, 256 bits)").min_subgroup == 4
    assert AttentionKernel.tiled_lanes(dev((8, 8))) == 8 and AttentionKernel.tiled_lanes(dev()) == 4
    assert AttentionKernel.tiled_supported(dev(vendor_id=0x10DE), 32, 512)
    assert not AttentionKernel.tiled_supported(dev(), 32, 512)                   # 4-lane groups: 64 channels a round
    assert not AttentionKernel.tiled_supported(dev(vendor_id=0x10DE), 80, 512)   # not a power of two
    assert not AttentionKernel.tiled_supported(dev(vendor_id=0x10DE), 64, 60)    # less than a tile of cache
