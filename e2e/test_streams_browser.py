"""Several responses decoded together in the browser (issue 12): generate(prompt, {numResponses})
resolves to one result per stream with the desktop engine's greedy tokens, and onToken(piece,
stream) streams each response's pieces."""

from __future__ import annotations

import json
import subprocess
import sys

from e2e_util import REPO

PROMPT = "The capital of France is"
N, NEW = 3, 4


def desktop_streams(model_path) -> list[list[int]]:
    code = ("import json, webdrift\n"
            f"eng = webdrift.load({str(model_path)!r}, max_context=256)\n"
            f"rs = eng.generate({PROMPT!r}, max_new_tokens={NEW}, n={N}, stop_at_eos=False)\n"
            "print('RESULT ' + json.dumps([r.token_ids for r in rs]))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=1500,
                       check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads([x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])


def test_responses_match_desktop(chromium, engine_page, model_path):
    out = chromium.eval(engine_page, """async ([prompt, n, maxNewTokens]) => {
        const pieces = Array.from({ length: n }, () => []);
        const rs = await window.eng.generate(prompt, { maxNewTokens, temperature: 0, stopAtEos: false,
            numResponses: n, onToken: (p, s) => pieces[s].push(p) });
        return { rs, pieces };
    }""", [PROMPT, N, NEW], timeout_s=900)
    want = desktop_streams(model_path)
    assert [r["tokenIds"] for r in out["rs"]] == want
    assert len({tuple(w[:1]) for w in want}) == N                    # distinct first tokens
    for r, p in zip(out["rs"], out["pieces"]):
        assert "".join(p) == r["text"] and r["stats"]["finishReason"] == "length"


def test_bad_num_responses_is_rejected(chromium, engine_page):
    err = chromium.eval(engine_page, """async () => {
        try { await window.eng.generate("hi", { numResponses: 99 }); return null; }
        catch (e) { return { name: e.name, message: e.message }; }
    }""", timeout_s=300)
    assert err["name"] == "InvalidArgumentError" and "n=99" in err["message"], err
