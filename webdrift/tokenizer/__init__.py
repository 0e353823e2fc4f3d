"""webdrift's tokenizer: pure-Python BPE whose ids equal HF `tokenizers` on any text.

What it is for: turning prompts into token ids and generated ids back into text, on the desktop and in
the browser (Pyodide), for byte-level BPE models (GPT-2 / SmolLM / Llama 3 / Qwen2 families, from GGUF
metadata or tokenizer.json) and SentencePiece-style BPE models (Gemma, Llama 2 family, from GGUF), plus
their chat templates and streaming detokenization.

What it must not do: import anything beyond the standard library and jinja2 (no `regex`, numpy,
`tokenizers` or `gguf` -- Pyodide has none of them offline), read model files itself beyond a
tokenizer.json path (GGUF metadata arrives as a dict from `webdrift.weights`), or silently accept a
tokenizer it cannot reproduce exactly: unsupported models, pre-tokenizers, normalizers and decoders raise
`TokenizerError`.

    tok = Tokenizer.from_gguf_metadata(metadata)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]))
    stream = tok.stream_decoder()
    text = "".join(stream.push(i) for i in generated) + stream.flush()
"""

from webdrift.tokenizer.decode import StreamDecoder
from webdrift.tokenizer.tokenizer import Tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]
