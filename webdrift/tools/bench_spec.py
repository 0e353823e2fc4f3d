"""`webdrift bench --speculative MODE`: speculative decoding against plain greedy decoding on
the tasks of issue 13's targets, with a real model and its tokenizer (drafts come from text).

Tasks (chat template, greedy, EOS ends a run like a user's request would):
  rewrite   a ~500-token passage with typos and "rewrite it with the typos fixed": most of the
            answer is already in the prompt (target: >= 1.6x decode tokens/s with "lookup")
  chat      a free-form request with nothing to copy (target: >= 0.95x: the engine backs off)
  story, explain   two more free-form requests (the fixed prompt set for "forecast:PATH", whose
            drafts come from the model's own forecast rather than from the prompt)
Per task: decode tokens/s without and with speculation, their ratio, draft tokens per
verification pass and accepted per pass, plain steps, and whether the two outputs are the same
tokens (they must be). Each run is repeated `repeats` times, the best kept.
Must not: import wgpu or js; be imported by the core.
"""

from __future__ import annotations

PASSAGE = (
    "The lighthouse stood at the edge of the cliff for more then two hundred years. Every night its lamp "
    "turned slowly, sweeping a long beam of light accross the dark water, and every night the ships that "
    "passed the rocks below were grateful for it. The keeper, an old man named Thomas, had lived in the small "
    "stone house beside the tower since he was a boy. His father had been the keeper before him, and his "
    "grandfather before that. Thomas knew every sound the sea could make: the soft hiss of the waves on a calm "
    "evening, the deep roar of a winter storm, and the strange silence that came just before the fog rolled "
    "in. Each morning he climbed the narow spiral staircase, one hundred and twelve steps, to clean the great "
    "glass lens and trim the wick. He wrote everything down in a thick leather book: the weather, the ships "
    "he saw, the birds that landed on the railing, and the days when nothing happend at all. One autumn a "
    "letter arrived from the government. The lighthouse was to be replaced by an automatic beacon that would "
    "need no keeper. Thomas read the letter three times, then folded it carefully and put it in his pocket. "
    "He did not tell anyone about it. That night the storm was the worst he had seen in many years. The wind "
    "screamed around the tower and the rain beat against the windows like stones. Near midnight Thomas saw "
    "the lights of a small fishing boat drifting toward the rocks; its engine had failed. He lit the "
    "emergency flares, rang the old bell, and kept the lamp turning by hand when the power went out. By "
    "morning the boat was safe in the harbour and its crew of four were drinking hot tea in Thomas's kitchen. "
    "The story was in every newspaper by the end of the week. The government sent a second letter. The "
    "automatic beacon would still be built, it said, but the keeper's house would remain his for as long as "
    "he wished to live there, and the old lens would stay in the tower, lit one night each year in his "
    "honour. Thomas put the second letter in the leather book, next to the first, and went upstairs to clean "
    "the glass, as he had done every mornign of his life.")

TASKS = {
    "rewrite": [{"role": "user", "content": "Here is a passage:\n\n" + PASSAGE + "\n\nRewrite the passage above "
                 "exactly, with the spelling mistakes corrected. Change nothing else."}],
    "chat": [{"role": "user", "content": "Give me three ideas for a weekend trip with children, with one "
              "sentence about each."}],
    "story": [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    "explain": [{"role": "user", "content": "Explain how a refrigerator keeps food cold, in simple words."}],
}


def run_speculative_bench(model: str, mode: str, new_tokens: int, repeats: int, log,
                          int8_activations: bool | None = None) -> list[dict]:
    """One row per task: plain vs `mode` on the same prompt (greedy); int8_activations: the
    engine option (None: auto)."""
    import webdrift
    eng = webdrift.load(model, int8_activations=int8_activations)
    rows = []
    for task, messages in TASKS.items():
        ids = eng.chat_prompt(messages)
        if len(ids) + new_tokens > eng.max_context:
            rows.append({"task": task, "mode": mode, "prompt_tokens": len(ids), "error": f"needs a context of "
                         f"{len(ids) + new_tokens}; the engine's is {eng.max_context}"})
            log(f"  {task}: skipped: {rows[-1]['error']}")
            continue
        eng.generate(ids, max_new_tokens=4, speculative=mode)            # compile + warm every kernel
        best = {}
        for spec in (None, mode):
            for _ in range(max(1, repeats)):
                out = eng.generate(ids, max_new_tokens=new_tokens, speculative=spec)
                if spec not in best or out.stats.decode_tokens_per_s > best[spec].stats.decode_tokens_per_s:
                    best[spec] = out
        plain, sp = best[None], best[mode]
        s = sp.stats
        ratio = s.decode_tokens_per_s / plain.stats.decode_tokens_per_s if plain.stats.decode_tokens_per_s else None
        rows.append({"task": task, "mode": mode, "prompt_tokens": len(ids), "new_tokens": s.new_tokens,
                     "plain_decode_tps": round(plain.stats.decode_tokens_per_s, 2),
                     "spec_decode_tps": round(s.decode_tokens_per_s, 2),
                     "speedup": round(ratio, 3) if ratio else None, "passes": s.spec_passes,
                     "drafted_per_pass": round(s.drafted_per_pass, 2),
                     "accepted_per_pass": round(s.accepted_per_pass, 2), "plain_steps": s.plain_steps,
                     "identical": sp.token_ids == plain.token_ids})
        r = rows[-1]
        log(f"  {task}: {r['prompt_tokens']} prompt tokens, {r['new_tokens']} new; plain {r['plain_decode_tps']} "
            f"tok/s, {mode} {r['spec_decode_tps']} tok/s ({r['speedup']}x); {r['accepted_per_pass']} of "
            f"{r['drafted_per_pass']} drafted accepted per pass, {r['passes']} passes, {r['plain_steps']} plain "
            f"steps; identical: {r['identical']}")
    return rows


def format_rows(rows: list[dict]) -> str:
    head = "task      prompt  new  plain tok/s  spec tok/s  speed-up  accepted/drafted per pass  identical"
    lines = [head]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['task']:<9} {r['prompt_tokens']:>6}  error: {r['error']}")
            continue
        lines.append(f"{r['task']:<9} {r['prompt_tokens']:>6} {r['new_tokens']:>4} {r['plain_decode_tps']:>12} "
                     f"{r['spec_decode_tps']:>11} {str(r['speedup']) + 'x':>9}  "
                     f"{r['accepted_per_pass']:>8} / {r['drafted_per_pass']:<15} {r['identical']}")
    return "\n".join(lines)
