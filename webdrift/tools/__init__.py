"""webdrift's desktop tools, on top of the core: the `webdrift` command and what it runs.

    cli.py          `webdrift generate | chat | pull | bench | profile | perplexity | serve`
    bench.py        `webdrift bench`: ML Drift's protocol, the roofline, the report
    bench_peers.py  PyTorch peers for the bench, on the same GPU through CUDA
    profile.py      `webdrift profile`: host phases + GPU kernels, summary and Chrome trace
    serve.py        `webdrift serve`: the browser bundle and a model on a local web server
    perplexity.py   `webdrift perplexity`: llama-perplexity's recipe on webdrift's logits
    perplexity_ref.py  transformers' f32 perplexity on the same windows (the docs' reference)
    outputs.py      the output paths a tool writes after long work, checked before it starts

They build engines through the core's one assembly path (webdrift/runtime/loading.py) and use
the core's public modules only. Nothing here is in the browser bundle (build_wasm leaves this
package out of the wheel Pyodide installs).
Must not: be imported by the core (anything under webdrift/ outside tools/, except the
`python -m webdrift` entry point, webdrift/__main__.py); import wgpu or js (device facts come
from the device object).
"""
