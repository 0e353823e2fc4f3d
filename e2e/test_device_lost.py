"""A GPU device lost in the middle of a generation (Chromium's GPU process crashed through the
DevTools protocol's Browser.crashGpuProcess): the pending generate() rejects with an Error that says the device was lost,
and a new engine can be created afterwards. Runs in its own browser: the crash takes every
WebGPU device of that browser with it."""

from __future__ import annotations

from e2e_util import CHROMIUM_ARGS, MAX_CONTEXT, Chromium


def test_device_lost_mid_generation_rejects_clearly(server, record):
    c = Chromium(CHROMIUM_ARGS)
    try:
        pg = c.page(server["url"] + "/e2e/blank.html")
        c.eval(pg, """async (maxContext) => {
            const wd = await import("/webdrift.js");
            window.wd = wd;
            const eng = await wd.createEngine({ maxContext });
            let started;
            const first = new Promise((r) => { started = r; });
            window.gen = eng.generate("Once upon a time", { maxNewTokens: 200, temperature: 0, stopAtEos: false,
                                                           onToken: () => started() })
                .then((out) => ({ ok: true, n: out.tokenIds.length }),
                      (e) => ({ ok: false, name: e.name, message: String(e.message) }));
            await first;                       // the generation is under way
            return true;
        }""", MAX_CONTEXT, timeout_s=600)
        c.browser.new_browser_cdp_session().send("Browser.crashGpuProcess")
        res = c.eval(pg, "async () => await window.gen", timeout_s=300)
        record("device lost mid-generation: generate() settles with", res)
        assert res["ok"] is False, f"generate() should reject after the device was lost, got {res}"
        assert "lost" in res["message"].lower() or "gpu" in res["message"].lower(), res
        # a new engine (a new device in the restarted GPU process) works
        again = c.eval(pg, """async (maxContext) => {
            const eng = await window.wd.createEngine({ maxContext });
            const out = await eng.generate("Hi", { maxNewTokens: 2, temperature: 0, stopAtEos: false });
            await eng.dispose();
            return out.tokenIds.length;
        }""", MAX_CONTEXT, timeout_s=600)
        assert again == 2
    finally:
        c.close()
