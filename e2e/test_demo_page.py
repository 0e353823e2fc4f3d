"""The demo page as a visitor uses it: it loads (progress, adapter), streams a chat reply, stops
on the Stop button and can chat again; a screenshot is saved to e2e/artifacts/demo.png.
The page-open-to-first-token time and tokens/s are printed."""

from __future__ import annotations

import time

from e2e_util import ARTIFACTS, MAX_CONTEXT


def test_demo_page_loads_streams_and_stops(chromium, server, engine_page, record):
    # engine_page loaded the default model first, so this visit reads it from the browser cache
    t_open = time.time()
    n_logs = len(chromium.logs)
    pg = chromium.page(server["url"] + f"/?maxContext={MAX_CONTEXT}&maxTokens=5&temperature=0")
    try:
        pg.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)", timeout=600_000)
        assert pg.evaluate("document.body.dataset.state") == "ready", pg.inner_text("#error")
        t_ready = time.time()
        assert "swiftshader" in pg.inner_text("#adapter").lower() or pg.inner_text("#adapter").strip() not in ("", "—")
        assert "layers" in pg.inner_text("#model-name")
        assert pg.evaluate("window.webdriftDemo.engine.info.fromCache") is True
        # ask, and stream the reply
        pg.fill("#prompt", "Hi")
        pg.click("#send")
        pg.wait_for_function("document.body.dataset.state === 'generating'", timeout=30_000)
        pg.wait_for_function("window.webdriftDemo.metrics.firstTokenMs !== undefined || "
                             "document.body.dataset.state !== 'generating'", timeout=600_000)
        t_first = time.time()
        assert pg.evaluate("window.webdriftDemo.metrics.firstTokenMs") is not None, pg.inner_text("#messages")
        # stop it: Stop is enabled while generating; the page returns to ready with partial text
        assert pg.is_enabled("#stop")
        pg.click("#stop")
        pg.wait_for_function("document.body.dataset.state === 'ready'", timeout=600_000)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "demo.png"), full_page=True)
        reply = pg.evaluate("window.webdriftDemo.replies[0]")
        stats_text = pg.inner_text("#stats")
        assert reply["text"] and reply["stats"]["finishReason"] in ("stopped", "eos", "length"), reply
        assert "tok/s" in stats_text
        first_ms = pg.evaluate("window.webdriftDemo.metrics.firstTokenMs")
        record("demo: page open -> ready (model from cache) s", round(t_ready - t_open, 1))
        record("demo: page open -> first token s", round(t_first - t_open, 1))
        record("demo: send -> first token s (chat prompt prefill)", round(first_ms / 1000, 1))
        record("demo: reply stats", f"{reply['stats']['promptTokens']} prompt tokens, prefill "
               f"{reply['stats']['prefillTokensPerS']:.2f} tok/s, decode {reply['stats']['decodeTokensPerS']:.2f} tok/s, "
               f"finish {reply['stats']['finishReason']}")
        # the conversation goes on after a stop
        pg.fill("#prompt", "Thanks")
        pg.press("#prompt", "Enter")
        pg.wait_for_function("window.webdriftDemo.replies.length === 2", timeout=600_000)
        assert len(pg.query_selector_all(".msg.user")) == 2
        # everything the page needs comes from this origin, within its Content-Security-Policy
        bad = [line for line in chromium.logs[n_logs:]
               if "Content Security Policy" in line or "Failed to load resource" in line or line.startswith("pageerror")]
        assert not bad, bad
    finally:
        pg.close()
