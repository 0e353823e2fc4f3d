"""Generation in the browser: greedy ids equal the desktop engine's, tokens stream, generations
can be cancelled (AbortSignal, engine.stop()) and leave the engine usable, over-long prompts are
rejected, and two engines in two pages run side by side (the second loads from the cache)."""

from __future__ import annotations

import time

import pytest

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
N_NEW = 8


@pytest.fixture(scope="module")
def reference(desktop_reference):
    return desktop_reference(PROMPTS, N_NEW)


def test_greedy_ids_match_desktop(chromium, engine_page, reference, record):
    """The issue's check: createEngine() (the server's default model) + generate(prompt,
    {maxNewTokens: 8, temperature: 0, stopAtEos: false}) gives the desktop engine's tokenIds."""
    for k, prompt in enumerate(PROMPTS):
        t0 = time.time()
        out = chromium.eval(engine_page, """async (prompt) => {
            const pieces = [];
            const t0 = performance.now();
            let first = null;
            const out = await window.eng.generate(prompt, { maxNewTokens: 8, temperature: 0, stopAtEos: false,
                onToken: (p) => { if (first === null) first = performance.now() - t0; pieces.push(p); } });
            out.pieces = pieces;
            out.firstTokenMs = first;
            return out;
        }""", prompt, timeout_s=600)
        s = out["stats"]
        record(f"greedy[{k}] prompt tokens / generate() -> first token s / prefill tok/s / decode tok/s / wall s",
               f"{s['promptTokens']} / {out['firstTokenMs'] / 1000:.1f} / {s['prefillTokensPerS']:.2f} / "
               f"{s['decodeTokensPerS']:.2f} / {time.time() - t0:.1f}")
        assert out["tokenIds"] == reference[k], f"prompt {prompt!r}: browser {out['tokenIds']} != desktop {reference[k]}"
        assert "".join(out["pieces"]) == out["text"]          # streamed pieces make up the text
        assert s["newTokens"] == N_NEW and s["finishReason"] == "length"


def test_cancel_leaves_engine_usable(chromium, engine_page, reference):
    r = chromium.eval(engine_page, """async (prompt) => {
        const eng = window.eng;
        // 1. AbortSignal: abort at the first token -> AbortError with the partial output
        const ctrl = new AbortController();
        let aborted = null;
        try {
            await eng.generate(prompt, { maxNewTokens: 40, temperature: 0, stopAtEos: false, signal: ctrl.signal,
                                         onToken: () => ctrl.abort() });
        } catch (e) { aborted = { name: e.name, message: e.message, partial: e.partial }; }
        // 2. a request aborted before it starts never runs
        const pre = new AbortController(); pre.abort();
        let preName = null;
        try { await eng.generate(prompt, { signal: pre.signal }); } catch (e) { preName = e.name; }
        // 3. engine.stop(): resolves with what was generated so far
        let n = 0;
        const stopped = await eng.generate(prompt, { maxNewTokens: 40, temperature: 0, stopAtEos: false,
                                                     onToken: () => { if (++n === 1) eng.stop(); } });
        // 4. the engine still works and is still greedy-exact
        const after = await eng.generate(prompt, { maxNewTokens: 3, temperature: 0, stopAtEos: false });
        return { aborted, preName, stopped, after };
    }""", PROMPTS[0], timeout_s=600)
    assert r["aborted"] and r["aborted"]["name"] == "AbortError", r
    partial = r["aborted"]["partial"]
    assert 1 <= len(partial["tokenIds"]) < 40 and partial["stats"]["finishReason"] == "stopped"
    assert partial["tokenIds"] == reference[0][: len(partial["tokenIds"])]
    assert r["preName"] == "AbortError"
    st = r["stopped"]
    assert st["stats"]["finishReason"] == "stopped" and 1 <= len(st["tokenIds"]) < 40
    assert st["tokenIds"] == reference[0][: len(st["tokenIds"])]
    assert r["after"]["tokenIds"] == reference[0][:3]


def test_prompt_longer_than_context_is_rejected(chromium, engine_page):
    r = chromium.eval(engine_page, """async () => {
        const out = {};
        try { await window.eng.generate("hello world ".repeat(200), { maxNewTokens: 4 }); }
        catch (e) { out.long = { name: e.name, message: e.message }; }
        try { await window.eng.generate("hi", { maxNewTokens: -1 }); }
        catch (e) { out.bad = { name: e.name, message: e.message }; }
        try { await window.eng.generate({ not: "a prompt" }); }
        catch (e) { out.type = { name: e.name, message: e.message }; }
        return out;
    }""", timeout_s=120)
    assert r["long"]["name"] == "ContextLengthError", r
    assert "256" in r["long"]["message"] and "tokens" in r["long"]["message"]
    assert r["bad"]["name"] == "InvalidArgumentError" and "max_new_tokens" in r["bad"]["message"]
    assert r["type"]["name"] == "InvalidArgumentError"


def test_two_engines_side_by_side(chromium, engine_page, server, reference, record):
    """A second page loads its own engine (from the browser cache: no download) and both generate
    at the same time; each gets the desktop's ids."""
    other = chromium.page(server["url"] + "/e2e/blank.html")
    try:
        t0 = time.time()
        info = chromium.eval(other, """async (maxContext) => {
            const wd = await import("/webdrift.js");
            window.eng = await wd.createEngine({ maxContext });
            return window.eng.info;
        }""", 256, timeout_s=600)
        record("second_engine_load_from_cache_s", round(time.time() - t0, 1))
        assert info["fromCache"] is True, info
        start = """async (prompt) => { window.pending = window.eng.generate(prompt, { maxNewTokens: 3, temperature: 0,
                                                                               stopAtEos: false }); return true; }"""
        chromium.eval(engine_page, start, PROMPTS[1])
        chromium.eval(other, start, PROMPTS[0])
        wait = "async () => (await window.pending).tokenIds"
        assert chromium.eval(other, wait, timeout_s=600) == reference[0][:3]
        assert chromium.eval(engine_page, wait, timeout_s=600) == reference[1][:3]
        chromium.eval(other, "async () => { await window.eng.dispose(); return true; }")
    finally:
        other.close()
