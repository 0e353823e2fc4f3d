"""The desktop's second WebGPU implementation: Dawn through wgpudawn (gpu/dawn.py, `--gpu-api dawn`).

Dawn does not run on Mesa's lavapipe; these tests run it on SwiftShader's Vulkan driver, the one
Chromium ships (installed for the e2e tests), in a child process whose VK_ICD_FILENAMES points at
it (the Vulkan loader reads it when an instance is made; this process's wgpu-native device stays
on lavapipe). The child loads small random HF models (tests/test_engine_hf.py's) on a Dawn device
and writes their logits and greedy tokens; they are checked here against transformers + PyTorch
fp32 with test_engine_hf.py's thresholds. The matrix-unit GEMM that Dawn offers on NVIDIA GPUs is
not on SwiftShader: its numbers against the SIMT GEMM on the H200 are in docs/BENCHMARKS.md
(session 31).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import webdrift
from webdrift.errors import GPUError, InvalidArgumentError
from webdrift.gpu import dawn
from webdrift.gpu.native import get_device
from webdrift.tools.cli import main as cli_main

from .test_engine_hf import (
    VOCAB,
    assert_greedy_up_to_near_ties,
    make_model,
    requantize_reference,
    torch_greedy,
)

CASES = ("llama_gqa_f32", "qwen2_bias_f16")   # GQA, tied embeddings, f32; q/k/v biases, f16 weights
IDS = [1, 504, 3458, 314, 260, 6911, 2381, 30]

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import webdrift
    from webdrift.gpu.native import get_device
    out, dirs, ids = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    dev = get_device("dawn")
    facts = {"backend": dev.info.backend, "version": dev.wgpu_version, "dp4a": dev.has_dp4a,
             "subgroups": dev.has_subgroups, "sizes": list(dev.info.subgroup_sizes), "cpu": dev.info.is_cpu,
             "steps_per_submit": dev.decode_steps_per_submit}
    arrays = {}
    rng = np.random.default_rng(1)
    long_ids = rng.integers(3, VOCAB, 150).tolist()
    for i, d in enumerate(dirs):
        fmt = "q8" if i == len(dirs) - 1 else None     # the last: re-quantized to q8 at load
        eng = webdrift.load(d, max_context=320, prefill_chunk=64, device=dev, weight_format=fmt,
                            int8_activations=False)
        arrays[f"logits{i}"] = eng.logits(long_ids)
        arrays[f"greedy{i}"] = np.array(eng.generate(ids, max_new_tokens=16, temperature=0.0,
                                                     stop_at_eos=False).token_ids)
        arrays[f"ids{i}"] = np.array(long_ids)
        del eng
    np.savez(out, **arrays)
    print(json.dumps(facts))
""").replace("VOCAB", str(VOCAB))


def _dawn_env(tmp_path) -> dict:
    """What a child process needs on top of this one's environment to run Dawn on SwiftShader."""
    icd = dawn.swiftshader_icd()
    assert dawn.available(), "wgpudawn is a test requirement (pip install -e '.[test]')"
    assert icd, "SwiftShader's Vulkan driver comes with Chromium (scripts/setup.sh --test)"
    return {"VK_ICD_FILENAMES": icd, "XDG_RUNTIME_DIR": "/tmp", "WEBDRIFT_CACHE": str(tmp_path / "cache")}


def test_models_on_dawn_match_transformers(tmp_path, hf_tokenizer_dir):
    """f32 and f16 checkpoints as stored, and the f32 one re-quantized to q8 at load (against
    transformers with gguf-py's Q8_0 quantize-dequantize of every matrix, as
    test_engine_hf.py's requantized test does)."""
    refs, dirs = [], []
    for case in CASES:
        d, ref = make_model(case, tmp_path, hf_tokenizer_dir)
        dirs.append(str(d))
        refs.append(ref)
    d, ref = make_model(CASES[0], tmp_path / "q8", hf_tokenizer_dir)
    requantize_reference(ref, "Q8_0")
    dirs.append(str(d))
    refs.append(ref)
    out = tmp_path / "dawn.npz"
    r = subprocess.run([sys.executable, "-c", CHILD, str(out), ",".join(dirs), json.dumps(IDS)],
                       env=dict(os.environ, **_dawn_env(tmp_path)), check=False, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["backend"] == "Dawn Vulkan" and facts["cpu"], facts          # SwiftShader through Dawn
    assert facts["dp4a"] and facts["subgroups"] and len(facts["sizes"]) == 2, facts
    assert facts["version"].startswith("wgpudawn ") and facts["steps_per_submit"] == 4, facts
    got = np.load(out)
    for i, (case, ref) in enumerate(zip((*CASES, CASES[0] + "_as_q8"), refs)):
        ids = got[f"ids{i}"].tolist()
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].numpy()
        lg = got[f"logits{i}"]
        assert lg.shape == want.shape == (150, VOCAB)
        cos = (lg * want).sum(1) / np.linalg.norm(lg, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= 0.999, (case, cos.min())
        assert (lg.argmax(1) == want.argmax(1)).mean() >= 0.98, case
        out = got[f"greedy{i}"].tolist()
        if i < len(CASES):
            assert out == torch_greedy(ref, IDS, 16), case
            continue
        assert_greedy_up_to_near_ties(ref, IDS, out)      # q8


def test_cli_runs_on_dawn(tmp_path):
    """`webdrift --gpu-api dawn generate` (the flag before or after the command) runs a GGUF model
    on Dawn and prints the same tokens as the Python API on Dawn; the report names the route."""
    from .tiny_model import write_tiny_gguf
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    code = textwrap.dedent(f"""
        import json, sys, io, contextlib
        import webdrift
        from webdrift.gpu.native import get_device
        from webdrift.tools.cli import main
        runs = []
        for argv in (["--gpu-api", "dawn", "generate"], ["generate", "--gpu-api", "dawn"]):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = main(argv + ["--model", {str(path)!r}, "--prompt", "the cat", "--max-new-tokens", "12",
                                  "--no-stop-at-eos", "--json", "--quiet"])
            runs.append((rc, json.loads(buf.getvalue())["token_ids"]))
        eng = webdrift.load({str(path)!r}, device=get_device("dawn"))
        api = eng.generate("the cat", max_new_tokens=12, temperature=0.0, stop_at_eos=False).token_ids
        print(json.dumps({{"runs": runs, "api": list(api), "backend": get_device().info.backend}}))
    """)
    env = dict(os.environ, **_dawn_env(tmp_path))
    env.pop("WEBDRIFT_GPU_API", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, check=False, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [rc for rc, _ in got["runs"]] == [0, 0]
    assert got["runs"][0][1] == got["runs"][1][1] == got["api"] and len(got["api"]) == 12
    assert got["backend"] == "Dawn Vulkan"     # the flag made Dawn the process's default device


def test_bad_gpu_api_and_missing_package(monkeypatch, capsys, tmp_path):
    from .tiny_model import write_tiny_gguf
    with pytest.raises(InvalidArgumentError, match="'metal' is not one of wgpu, dawn"):
        get_device("metal")
    monkeypatch.setenv("WEBDRIFT_GPU_API", "vulkan")
    with pytest.raises(InvalidArgumentError, match="WEBDRIFT_GPU_API"):
        webdrift.load(write_tiny_gguf(tmp_path / "tiny.gguf"))
    monkeypatch.delenv("WEBDRIFT_GPU_API")
    with pytest.raises(SystemExit):
        cli_main(["--gpu-api", "metal", "generate", "x"])
    assert "invalid choice: 'metal'" in capsys.readouterr().err
    monkeypatch.setattr(dawn, "wgpudawn", None)
    monkeypatch.setattr(dawn, "_import_error", ImportError("No module named 'wgpudawn'"), raising=False)
    with pytest.raises(GPUError, match="pip install wgpudawn"):
        dawn.DawnDevice()


def test_bench_reports_name_the_route():
    """A report's machine says which implementation ran (bench --compare puts routes side by side)."""
    from webdrift.gpu.base import Device, DeviceInfo
    from webdrift.tools.bench import machine_info

    class Fake(Device):
        def __init__(self, backend):
            self.info = DeviceInfo(adapter="NVIDIA H200", backend=backend)

    assert machine_info(Fake("Dawn Vulkan"))["route"] == "desktop (Dawn)"
    assert machine_info(Fake("Vulkan"))["route"] == "desktop (wgpu-native)"
    assert machine_info(get_device())["route"] == "desktop (wgpu-native)"


def test_sigint_during_generation_on_dawn(tmp_path):
    """Ctrl-C at 16 points of a generation on Dawn (tests/interrupt_child.py's sweep): each one
    surfaces as KeyboardInterrupt (also one that lands inside wgpudawn's map callback, which
    would otherwise swallow it and leave the map half done), and every next generation gives the
    reference tokens with the engine idle and the device's live bytes unchanged."""
    from .test_interrupt import check, run_child
    res = run_child("sweep", 16, timeout=300, env=_dawn_env(tmp_path) | {"WEBDRIFT_GPU_API": "dawn"})
    check(res, 16)
    assert sum(res["where"].values()) >= 8, res       # most signals land inside a generation
