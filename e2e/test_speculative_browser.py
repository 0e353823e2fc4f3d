"""Speculative decoding in the browser (issue 13): on the tiny GGUF model (tests/tiny_model.py),
in the Pyodide worker on the page's WebGPU device, greedy tokens with tree verification (trees
that hide the desktop's continuation among distractors, so paths are accepted and compacted;
and generate()'s JS option {speculative: "lookup"}) equal the desktop engine's plain greedy
tokens for the same file; passes run command buffers encoded during the pass before."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from e2e_util import REPO

from tests.tiny_model import write_tiny_gguf

PROMPTS = [[40, 41, 42, 43, 44], [7, 100, 7, 100, 7, 100, 7], [200]]
N_NEW = 24

WORKER_CODE = """
import base64, json
from webdrift.browser_api import sampling_from_options
from webdrift.runtime.loading import load_browser
from webdrift.runtime.options import EngineOptions
from webdrift.runtime.speculative import Drafter, DraftTree
args = json.loads(ARGS)

class Oracle(Drafter):   # the desktop's continuation, under a distractor branch
    def __init__(self, truth): self.truth = truth
    def reset(self, context): self.ctx = list(context)
    def append(self, token): self.ctx.append(token)
    def propose(self, max_nodes, max_depth):
        n = len(self.ctx)
        true = self.truth[n:n + min(6, max_depth)]
        if not true: return None
        tokens, parents = [self.ctx[-1], (true[0] + 1) % 266, 5], [-1, 0, 1]
        node = 0
        for t in true:
            tokens.append(t); parents.append(node); node = len(tokens) - 1
        return DraftTree(tokens[:max_nodes], parents[:max_nodes])

eng = await load_browser(base64.b64decode(args["model"]), EngineOptions(max_context=128, autotune=False))
out = {"plain": [], "oracle": [], "lookup": [], "passes": 0, "ahead": 0}
real_submit_encoded = eng.dev.submit_encoded
def counted(enc):   # passes that run the command buffer encoded during the pass before
    out["ahead"] += 1
    return real_submit_encoded(enc)
eng.dev.submit_encoded = counted
for ids, want in zip(args["prompts"], args["desktop"]):
    sp = sampling_from_options({"maxNewTokens": args["n"], "temperature": 0, "stopAtEos": False})
    out["plain"].append((await eng.agenerate(ids, sp)).token_ids)
    sp = sampling_from_options({"maxNewTokens": args["n"], "temperature": 0, "stopAtEos": False})
    sp.speculative = Oracle(ids + want)
    r = await eng.agenerate(ids, sp)
    out["oracle"].append(r.token_ids)
    out["passes"] += r.stats.spec_passes
    sp = sampling_from_options({"maxNewTokens": args["n"], "temperature": 0, "stopAtEos": False,
                                "speculative": "lookup"})
    out["lookup"].append((await eng.agenerate(ids, sp)).token_ids)
json.dumps(out)
"""


def desktop_greedy(path: str) -> list[list[int]]:
    code = ("import json, sys, webdrift\n"
            f"eng = webdrift.load({path!r}, max_context=128, autotune=False)\n"
            f"print('RESULT ' + json.dumps([eng.generate(p, max_new_tokens={N_NEW}, stop_at_eos=False).token_ids "
            f"for p in {PROMPTS!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])


def test_speculative_greedy_matches_desktop(chromium, server, tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", eos=False)
    desktop = desktop_greedy(path)
    args = {"model": base64.b64encode(Path(path).read_bytes()).decode(), "prompts": PROMPTS, "desktop": desktop,
            "n": N_NEW}
    pg = chromium.page(server["url"] + "/e2e/blank.html")
    try:
        out = chromium.eval(pg, """async (code) => {
            const wd = await import("/webdrift.js");
            const rt = await wd.createRuntime();
            try { return JSON.parse(await rt.runPython(code)); } finally { await rt.dispose(); }
        }""", f"ARGS = {json.dumps(json.dumps(args))}\n" + WORKER_CODE, timeout_s=600)
    finally:
        pg.close()
    assert out["plain"] == desktop
    assert out["oracle"] == desktop and out["passes"] > 0 and 0 < out["ahead"] < out["passes"]
    assert out["lookup"] == desktop
