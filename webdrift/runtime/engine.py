"""Engine: a loaded model + tokenizer, and generation (the host loop).

The host loop does almost nothing per token: a decode step is one 64-byte uniform write and a
prebuilt dispatch list; the sampled token stays on the GPU as the next step's embedding input;
step t+1 is submitted before step t's token is read back (through a ring of staging buffers),
and stop conditions are handled with that one-step lag (the extra step's output is discarded).
The core is async (`agenerate`) because in the browser a GPU read must be awaited; the
desktop's sync API (`generate`, `stream`) drives it with a private event loop.
Must not: import numpy or wgpu at module level (Pyodide); numpy only in `logits()`.
"""

from __future__ import annotations

import asyncio
import numbers
import random
import struct
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from ..errors import (
    ContextLengthError,
    EngineBusyError,
    GPUError,
    InvalidArgumentError,
    NumericalError,
    shown,
)
from ..gpu.base import READBACK, STEP_UNIFORM, STORAGE, UNIFORM, Device
from ..kernels.autotune import MERGE_MOST, attention_ranking, attention_steps, chain_pays, choose_attention
from ..kernels.base import ceil_div
from ..kernels.sample import NONFINITE_TOKEN
from ..kernels.step import STEP_BYTES, pack_step
from ..kernels.step_advance import StepAdvanceKernel
from ..kernels.tree import row_words
from ..models.choices import Int8Choice, chain_key
from ..models.loader import GPUModel
from ..models.program import Program
from ..profile.profiler import DISABLED, Profiler
from ..tokenizer.tokenizer import check_text
from ..weights.forecast import MAX_FORECAST
from . import streams
from .options import EngineOptions
from .speculative import (
    MAX_TREE,
    TREE_BUCKETS,
    BackOff,
    DraftTree,
    ForecastDrafter,
    TreeVerifier,
    check_mode,
    greedy_walk,
    make_drafter,
    sampled_walk,
    with_forecast_rows,
)
from .streams import FIRST_TOKENS, MAX_STREAMS

# the prefill chunk where EngineOptions.prefill_chunk is None: on GPUs the largest of these whose
# activations fit one binding (H200, 2026-11-29, docs/BENCHMARKS.md session 29: 1024 rows against
# 256 prefilled a 1024-token prompt 3-60% faster, the GEMMs' tiles fill the GPU); software
# adapters run the GEMV kernels over exactly the prompt's rows, where a longer chunk gains nothing
PREFILL_CHUNKS = (1024, 512, 256)
SOFTWARE_PREFILL_CHUNK = 256


def auto_prefill_chunk(dev: Device, cfg) -> int:
    """The prefill chunk chosen for throughput: SOFTWARE_PREFILL_CHUNK on software adapters,
    else the largest of PREFILL_CHUNKS whose prefill activations fit the adapter's largest
    binding (the arena is one buffer), estimated from above as 4 bytes x rows x (2 dim + 2 ffn +
    q + 2 kv): measured arenas take 40% of that (SmolLM2's shapes)."""
    if dev.info.is_cpu:
        return SOFTWARE_PREFILL_CHUNK
    row_bytes = 4 * (2 * cfg.dim + 2 * cfg.ffn_dim + cfg.q_dim + 2 * cfg.kv_dim)
    return next((c for c in PREFILL_CHUNKS if c * row_bytes <= dev.max_binding_size), PREFILL_CHUNKS[-1])


RING = 4          # staging buffers for token read-back
IN_FLIGHT = 2     # submits queued ahead of the one being read (<= RING - 1)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    tokenize_s: float = 0.0
    prefill_s: float = 0.0        # until the first token is on the host
    decode_s: float = 0.0
    total_s: float = 0.0
    finish_reason: str = ""       # "eos", "length", "context", "stopped"
    # speculative decoding (runtime/speculative.py); all 0 without it
    spec_passes: int = 0          # tree-verification passes
    drafted_tokens: int = 0       # draft tokens verified (tree nodes below the roots)
    accepted_tokens: int = 0      # draft tokens accepted (each pass also emits one model token)
    plain_steps: int = 0          # plain decode steps taken while speculating (no draft, back-off)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        n = self.new_tokens - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else 0.0

    @property
    def drafted_per_pass(self) -> float:
        return self.drafted_tokens / self.spec_passes if self.spec_passes else 0.0

    @property
    def accepted_per_pass(self) -> float:
        """Draft tokens accepted per verification pass (tokens per pass = this + 1)."""
        return self.accepted_tokens / self.spec_passes if self.spec_passes else 0.0

    def as_dict(self) -> dict:
        d = {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
             "tokenize_s": round(self.tokenize_s, 6), "prefill_s": round(self.prefill_s, 6),
             "decode_s": round(self.decode_s, 6), "total_s": round(self.total_s, 6),
             "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
             "decode_tokens_per_s": round(self.decode_tokens_per_s, 2), "finish_reason": self.finish_reason}
        if self.spec_passes or self.plain_steps:
            d |= {"spec_passes": self.spec_passes, "drafted_tokens": self.drafted_tokens,
                  "accepted_tokens": self.accepted_tokens, "plain_steps": self.plain_steps,
                  "drafted_per_pass": round(self.drafted_per_pass, 3),
                  "accepted_per_pass": round(self.accepted_per_pass, 3)}
        return d


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]                  # new tokens only
    stats: GenerationStats = field(default_factory=GenerationStats)


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True
    n: int = 1                        # streams decoded together (runtime/streams.py)
    first_tokens: str = "distinct"    # how the streams' first tokens differ: "distinct" or "sampled"
    speculative: object = None        # None, "lookup", "forecast:PATH" or a runtime.speculative.Drafter
    lora: str | tuple | None = None   # the resident LoRA adapter applied (Engine.add_lora), or none;
                                      # a tuple: one per stream (n > 1; None: that stream has none)
    lora_scale: float = 1.0           # its strength (0: the base model)

    @classmethod
    def make(cls, max_new_tokens=64, temperature=0.0, top_k=None, top_p=None, seed=None, stop_at_eos=True,
             n=1, first_tokens="distinct", speculative=None, lora=None, lora_scale=1.0):
        """Checked parameters: every value is one the Step uniform holds (kernels/step.py: top_k a
        u32, temperature and top_p f32 that stay normal numbers), else an InvalidArgumentError
        naming the argument. speculative: a draft source (runtime/speculative.py)."""
        def bad(name, v, want):
            raise InvalidArgumentError(f"{name}={shown(v)}: {want}")

        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            bad("max_new_tokens", max_new_tokens, "must be an integer >= 0")
        t = _as_float(temperature)
        if t is None:
            bad("temperature", temperature, "must be a number: 0 (greedy) or a positive temperature")
        temperature = t
        if temperature != 0.0 and not F32_MIN_NORMAL <= temperature <= F32_MAX:
            bad("temperature", temperature, f"must be 0 (greedy) or in [{F32_MIN_NORMAL:.6g}, {F32_MAX:.6g}] "
                "(a normal 32-bit float)")
        if top_k is None:
            top_k = 0
        if not _is_int(top_k) or not 0 <= top_k <= U32_MAX:
            bad("top_k", top_k, f"must be None or an integer in [0, {U32_MAX}] (0 or None = no top-k)")
        if top_p is None:
            top_p = 1.0
        p = _as_float(top_p)
        if p is None:
            bad("top_p", top_p, "must be a number in (0, 1]")
        top_p = p
        if not F32_MIN_NORMAL <= top_p <= 1.0:
            bad("top_p", top_p, f"must be in (0, 1] (at least {F32_MIN_NORMAL:.6g}, a normal 32-bit float)")
        if seed is None:
            seed = random.getrandbits(32)
        if not _is_int(seed):
            bad("seed", seed, "must be None or an integer (used modulo 2**32)")
        if not isinstance(stop_at_eos, bool):
            bad("stop_at_eos", stop_at_eos, "must be True or False")
        if not _is_int(n) or not 1 <= n <= MAX_STREAMS:
            bad("n", n, f"must be an integer in [1, {MAX_STREAMS}] (streams decoded together)")
        if first_tokens not in FIRST_TOKENS:
            bad("first_tokens", first_tokens, f"must be one of {', '.join(FIRST_TOKENS)}")
        check_mode(speculative)
        if speculative is not None and n > 1:
            bad("speculative", speculative, "runs one stream: use it with n=1")
        if isinstance(lora, (list, tuple)):    # one adapter per stream (None: that stream has none)
            if len(lora) != n or not all(a is None or isinstance(a, str) for a in lora):
                bad("lora", lora, f"a list gives each of the n={n} streams its adapter: n names or None")
            lora = tuple(lora)
            if len(set(lora)) == 1:
                lora = lora[0]
        elif lora is not None and not isinstance(lora, str):
            bad("lora", lora, "must be None, the name of an adapter added with add_lora / loras=, or a list of n "
                "names (one per stream)")
        s = _as_float(lora_scale)
        if s is None or not abs(s) <= F32_MAX:
            bad("lora_scale", lora_scale, "must be a finite number (1.0: the adapter as trained, 0: the base model)")
        return cls(int(max_new_tokens), temperature, int(top_k), top_p, int(seed) & U32_MAX, stop_at_eos, int(n),
                   first_tokens, speculative, lora, s)


U32_MAX = 0xFFFFFFFF
F32_MAX = 3.4028234663852886e38          # the largest finite float32
F32_MIN_NORMAL = 1.1754943508222875e-38  # the smallest normal float32 (smaller ones may flush to 0)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _as_float(v) -> float | None:
    """v as a float if it is a real number (not a bool) that has one (10**400 has none), else None."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (OverflowError, TypeError, ValueError):
        return None


class Engine:
    """A model ready to generate. Create with `webdrift.load(...)`."""

    profiler: Profiler = DISABLED   # set `engine.profiler = Profiler(...)` to time phases / kernels

    def __init__(self, dev: Device, source, tokenizer, options=None, progress=None):
        """options: an EngineOptions (runtime/loading.py, where each option is checked; None: the
        defaults); progress(done, total, name) is called per weight tensor uploaded. Build engines
        through runtime/loading.py (`webdrift.load`, the browser API), which makes the tokenizer
        and the device."""
        if options is None:
            options = EngineOptions()
        elif not isinstance(options, EngineOptions):
            raise InvalidArgumentError(f"options must be an EngineOptions, got {type(options).__name__}")
        if not isinstance(dev, Device):
            raise InvalidArgumentError(f"device must be a webdrift.gpu device (e.g. gpu.native.get_device()), "
                                       f"got {type(dev).__name__}")
        if progress is not None and not callable(progress):
            raise InvalidArgumentError(f"progress must be None or a function (done, total, name), "
                                       f"got {type(progress).__name__}")
        cfg = source.config
        self.dev, self.config, self.tokenizer, self.path = dev, cfg, tokenizer, source.path
        self.options = options
        limit = cfg.max_position or 2048
        max_context = min(limit, 2048) if options.max_context is None else options.max_context
        if max_context > limit:       # the one check that needs the model
            raise InvalidArgumentError(f"max_context={max_context} exceeds the model's context length {limit}")
        # Prefill stage: tiled GEMM kernels (the papers' stage-aware split), except on software
        # adapters (lavapipe, SwiftShader), where the GEMV kernels over exactly the prompt's rows
        # are far faster (SwiftShader, 5-token SmolLM2 prompt: ~130 s with GEMM, ~6 s with GEMV).
        pk = options.prefill_kernels
        gemv = pk == "gemv" or (pk == "auto" and dev.info.is_cpu)
        self._prefill_stage = "decode" if gemv else "prefill"
        self.max_context = max_context
        self.prefill_chunk = min(options.prefill_chunk or auto_prefill_chunk(dev, cfg), max_context)
        t0 = time.perf_counter()
        self.model = GPUModel(dev, source, max_context, options.weight_format, progress, autotune=options.autotune,
                              int8_activations=options.int8_activations,
                              # the GEMMs' int8 rows: forced, refused, or chosen (not measured for GEMVs)
                              prefill_int8=False if gemv else {"gemm_int8": True, "gemm_float": False}.get(pk),
                              max_binding_bytes=options.max_binding_bytes, prefill_rows=self.prefill_chunk,
                              kv_cache=options.kv_cache)
        # shared per-engine buffers
        # decode steps per submit; several: each step's uniform copied on the GPU from
        # step_records (kernels/step_advance.py) by a dispatch ahead of the step's kernels
        self.steps_per_submit = options.steps_per_submit or dev.decode_steps_per_submit
        several = self.steps_per_submit > 1
        self.step_buf = dev.create_buffer(STEP_BYTES, STEP_UNIFORM if several else UNIFORM, "step")
        self.step_records = (dev.create_buffer(STEP_BYTES * (1 + self.steps_per_submit), STORAGE, "step_records")
                             if several else None)
        self._advance = (StepAdvanceKernel(dev).dispatch({"records": self.step_records, "dst": self.step_buf},
                                                         (1, 1, 1)) if several else None)
        self._batched: tuple = (None, {})      # (decode list, {n: its n-step list}) (_steps_list)
        self.ids_buf = dev.create_buffer(4 * max(self.prefill_chunk, 64), STORAGE, "ids")        # (T_cap) u32
        # (steps) u32 sampled tokens; the streams: (steps, n) within the cache's rows
        self.out_tokens = dev.create_buffer(4 * (self.model.cap_stride + MAX_STREAMS), STORAGE, "out_tokens")
        self.ring = [dev.create_buffer(4 * max(MAX_STREAMS, self.steps_per_submit), READBACK, f"token_ring{i}")
                     for i in range(RING)]
        self._layout, self._fuse = options.layout, options.fuse
        # LoRA slots (models/lora.py): the pool exists before the programs that bind it
        self.lora_pool = None
        if options.enable_lora:
            from ..models.lora import LoraPool
            self.lora_pool = LoraPool(dev, cfg, options.max_lora_rank,
                                      options.lora_pool_rank or 2 * options.max_lora_rank, max(self.prefill_chunk, 64),
                                      fused_shrink=options.lora_fused_shrink)
        self._choose_attention()
        self._choose_chain()
        self.decode = self._program("decode", 1, False)
        self.prefill = self._program(self._prefill_stage, self.prefill_chunk, False)
        # with LoRA slots, also the programs without them (built now, sharing the arena): a request
        # with no adapter (or lora_scale 0) runs those, at the speed of an engine without LoRA
        # (the slots' shrink dispatches cost an adapter-less request 0.81x, H100, 2026-11-24)
        self._plain = self._slotted = None
        if self.lora_pool is not None:
            self._slotted = (self.decode, self.prefill)
            self._plain = (self._program("decode", 1, False, lora=False),
                           self._program(self._prefill_stage, self.prefill_chunk, False, lora=False))
        self._score: Program | None = None
        self._streams: streams.StreamRunner | None = None   # built on the first n > 1
        self._verifier: TreeVerifier | None = None     # speculative decoding, built on first use
        self.tree_buf = None
        own = self._load_programs()
        self.arena = dev.create_buffer(max(p.arena_bytes for p in own), STORAGE, "arena")
        for p in own:
            p.bind(self.arena)
        self.load_s = time.perf_counter() - t0
        # one request at a time: every public entry point that touches the GPU state (generate,
        # stream, chat, agenerate, achat, logits) holds this lock while it runs, a stream() from its
        # first token until it is closed; a second caller gets EngineBusyError at once
        self._lock = threading.Lock()
        self._busy_with = ""          # what holds the lock, for the message
        self._stop_requested = False

    def _choose_attention(self) -> None:
        """Where the adapter timed the decode attention kernels (autotune.choose_attention) and the
        layers share one window: the fastest few of them timed again on whole decode steps at
        depths 1024 and 4096, as far as the cache reaches (autotune.attention_steps, cached), the
        fastest kept for every decode program (GPUModel.attn_steps). Each tiled kernel among them
        with at most MERGE_MOST partials a row is timed also with its partials merged in the kernel
        (no combine dispatch: AttnChoice.fused), which kernels timed alone cannot rank against a
        combine dispatch's cost in the step."""
        m, cfg = self.model, self.model.cfg
        windows = {cfg.sliding_window if cfg.layer_is_sliding(i) else 0 for i in range(cfg.n_layers)}
        if len(windows) != 1:
            return
        window, lw = windows.pop(), m.layers[0]
        choose_attention(m.dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, lw.k_cache, lw.v_cache,
                         window, enabled=m.autotune, kv_f16=m.kv_f16)       # (timed and cached, or a rule)
        cands = attention_ranking(m.dev, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, m.cap_stride, window, m.kv_f16)
        cands += [c._replace(fused=True) for c in cands if c.variant == "tiled" and c.adapt <= MERGE_MOST]
        if len(cands) < 2:
            return

        def build(c, step) -> Program:
            m.attn_steps = {window: c}
            return self._program("decode", 1, False, lora=False, step=step)
        positions = sorted({min(m.cap_stride, d) - 1 for d in (1024, 4096)})
        try:
            best = attention_steps(m.dev, f"{chain_key(m)}|{m.cap_stride}|{window}", build, cands, positions,
                                   enabled=m.autotune)
        finally:
            m.attn_steps = {}
        m.attn_steps = {window: best}

    def _choose_chain(self) -> None:
        """Where choose_int8 left the int8 chain open (a timed adapter: Int8Choice.unchained), a
        decode step of each kind timed whole (kernels/autotune.chain_pays, cached per adapter and
        model shape) and the faster kept as the model's choice, which every program built after
        follows."""
        m = self.model
        chained = m.int8_choice
        if chained.unchained is None:
            return
        plain = Int8Choice(chained.unchained, False)

        def build(chain: bool, step) -> Program:
            m.int8_choice = chained if chain else plain
            return self._program("decode", 1, False, lora=False, step=step)
        try:
            got = chain_pays(m.dev, chain_key(m), build, min(m.cap_stride, 1024) - 1, enabled=m.autotune)
        finally:
            m.int8_choice = chained
        m.int8_choice = chained if got["chain"] else plain

    def _program(self, stage: str, capacity: int, all_logits: bool, streams: bool = False,
                 lora: bool = True, step=None) -> Program:
        """lora=False: without the LoRA slots even where the engine has them; step: another Step
        uniform than the engine's (the load-time timings of whole steps)."""
        return Program(self.model, stage, capacity, all_logits, self._layout, step or self.step_buf, self.ids_buf,
                       self.out_tokens, fuse=self._fuse, streams=streams, lora=self.lora_pool if lora else None)

    def _load_programs(self) -> tuple:
        """The decode and prefill programs built at load (with LoRA slots: both pairs)."""
        return (*(self._slotted or (self.decode, self.prefill)), *(self._plain or ()))

    def _fit_arena(self, program: Program) -> None:
        """Bind a program built after load (scoring, the streams, tree verification) to the arena,
        first growing the arena (every program is bound to the new one) if it needs more."""
        if program.arena_bytes > self.arena.size:
            self.dev.release_buffer(self.arena)
            self.arena = self.dev.create_buffer(program.arena_bytes, STORAGE, "arena")
            for other in (*self._load_programs(), self._score, *(self._verifier.programs.values() if self._verifier else ()),
                          *(self._streams.programs.values() if self._streams else ())):
                if other is not None:
                    other.bind(self.arena)
        program.bind(self.arena)

    # -- LoRA adapters ----------------------------------------------------------------------
    @property
    def loras(self) -> list[str]:
        """The names of the resident LoRA adapters."""
        return sorted(self.lora_pool.resident) if self.lora_pool is not None else []

    def add_lora(self, name: str, source, *, label: str | None = None) -> None:
        """Make a LoRA adapter resident under `name`: a PEFT folder (adapter_config.json +
        adapter_model.safetensors), a llama.cpp GGUF LoRA path, or a GGUF file's bytes (`label`
        names them in messages). Refused with a WebdriftError naming the file and the mismatch
        (the engine unchanged) if it does not fit the model, its rank exceeds max_lora_rank or the
        pool is full. Writes the adapter's rows into the pool; rebuilds no program."""
        self._acquire("add_lora")
        try:
            self._add_lora(name, source, label)
        finally:
            self._release()

    def _add_lora(self, name, source, label=None) -> None:
        from ..weights.lora import read_checked
        if self.lora_pool is None:
            raise InvalidArgumentError("this engine has no LoRA slots: load it with enable_lora=True or loras={...}")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a LoRA adapter's name must be a non-empty str, got {shown(name)}")
        if name in self.lora_pool.resident:
            raise InvalidArgumentError(f"a LoRA adapter named {shown(name)} is already loaded (remove_lora it first)")
        ad = read_checked(source, self.config, self.lora_pool.max_rank, label)
        self.lora_pool.add(name, ad)

    def remove_lora(self, name: str) -> None:
        """Free a resident adapter's pool rows."""
        self._acquire("remove_lora")
        try:
            if self.lora_pool is None or name not in self.lora_pool.resident:
                raise InvalidArgumentError(f"no LoRA adapter named {shown(name)}; loaded: {self.loras}")
            self.lora_pool.remove(name)
        finally:
            self._release()

    def _apply_lora(self, sp: SamplingParams) -> None:
        """Point the LoRA slots at the request's adapter (16 bytes written when it changes); one
        adapter per stream (a tuple) is checked here and applied by the streams (runtime/streams.py)."""
        names = sp.lora if isinstance(sp.lora, tuple) else (sp.lora,)
        for name in names:
            if name is not None and (self.lora_pool is None or name not in self.lora_pool.resident):
                hint = "" if self.lora_pool is not None else " (load with enable_lora=True or loras={...})"
                raise InvalidArgumentError(f"lora={shown(name)}: no such adapter; loaded: {self.loras}{hint}")
        if self.lora_pool is not None and not isinstance(sp.lora, tuple):
            self.lora_pool.activate(sp.lora, sp.lora_scale)
        if self._plain is not None:   # no adapter: the programs without the slots
            plain = sp.lora is None or (not isinstance(sp.lora, tuple) and sp.lora_scale == 0)
            self.decode, self.prefill = self._plain if plain else self._slotted

    # -- public API ------------------------------------------------------------------------
    def generate(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_at_eos: bool = True, n: int = 1, first_tokens: str = "distinct",
                 speculative=None, lora: str | None = None,
                 lora_scale: float = 1.0) -> GenerationResult | list[GenerationResult]:
        """Generate a continuation of `prompt` (a string, tokenized like HF's encode, or ids).
        n > 1: n continuations decoded together from one prefill (runtime/streams.py), returned as
        a list; first_tokens: "distinct" (the n most likely first tokens) or "sampled".
        speculative="lookup": draft tokens by prompt lookup and verify them as a tree in one pass
        (the same tokens as without it; README "Speculative decoding"); "forecast:PATH": drafts
        from DS2D forecast vectors (docs/FORECAST.md).
        lora: a resident adapter's name (add_lora), applied at lora_scale (to every stream)."""
        sp = SamplingParams.make(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos, n, first_tokens,
                                 speculative, lora, lora_scale)
        return _run(self.agenerate(prompt, sp))

    def stream(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop_at_eos: bool = True, n: int = 1, first_tokens: str = "distinct", speculative=None,
               lora: str | None = None, lora_scale: float = 1.0):
        """Yield text pieces as tokens are produced (the pieces concatenate to the full text);
        n > 1: (stream index, piece) pairs, each stream's pieces concatenating to its text."""
        sp = SamplingParams.make(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos, n, first_tokens,
                                 speculative, lora, lora_scale)
        loop = asyncio.new_event_loop()
        agen = self.aevents(prompt, sp)
        try:
            while True:
                try:
                    kind, value = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    break
                if kind == "text":
                    yield value
        finally:
            loop.run_until_complete(agen.aclose())
            loop.close()

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The token ids of a conversation as the model's chat template writes it, the assistant's
        turn opened (add_generation_prompt), encoded without extra special tokens."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def chat(self, messages: list[dict], **kw) -> GenerationResult:
        """Generate the assistant's reply to a conversation, using the model's chat template."""
        return self.generate(self.chat_prompt(messages), **kw)

    async def achat(self, messages: list[dict], sp: SamplingParams, on_text=None) -> GenerationResult:
        """`chat` on the async core (the browser drives this): on_text(piece) per text piece."""
        return await self.agenerate(self.chat_prompt(messages), sp, on_text)

    def stop(self) -> None:
        """Ask a running generation to stop after the current token."""
        self._stop_requested = True

    def encode_prompt(self, prompt) -> list[int]:
        """A prompt's token ids: a str tokenized (InvalidTextError if it is not valid Unicode), or
        a list of ids checked against the vocabulary."""
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            v = self.config.vocab_size
            for k, i in enumerate(prompt):
                if not _is_int(i):
                    raise InvalidArgumentError(f"prompt token {k} is {shown(i)}: token ids must be integers")
                if not 0 <= i < v:
                    raise InvalidArgumentError(f"prompt token {k} is {shown(i)}; ids must be in [0, {v})")
            return [int(i) for i in prompt]
        raise InvalidArgumentError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")

    # -- the loop ---------------------------------------------------------------------------
    def _check_fits(self, n: int, room: int = 1) -> None:
        """n prompt tokens plus `room` new ones must fit the KV cache (teacher forcing needs none)."""
        if n == 0:
            raise InvalidArgumentError("the prompt is empty: give at least one token")
        if n + room > self.max_context:
            raise ContextLengthError(f"the prompt has {n} tokens; this engine's context is {self.max_context} "
                                     f"(load with a larger max_context, up to {self.config.max_position})")

    def _submit_prompt(self, ids: list[int], sp: SamplingParams, program=None, head_from: int | None = None,
                       draws: int = 1):
        """Prefill in chunks of the program's capacity; yields (pos, chunk, dispatches) after writing
        the chunk's ids and Step. Only the last chunk runs the head (LM head + sampling), and with
        head_from every chunk holding a row >= head_from (teacher-forced logits of those rows);
        draws: tokens sampled from the last row (the streams' first tokens, out_tokens[0 .. draws))."""
        program = program or self.prefill
        chunk = program.capacity
        pos = 0
        while pos < len(ids):
            part = ids[pos:pos + chunk]
            last = pos + len(part) == len(ids)
            head = last or (head_from is not None and pos + len(part) > head_from)
            self.dev.write_buffer(self.ids_buf, struct.pack(f"<{len(part)}I", *part))
            self.dev.write_buffer(self.step_buf, pack_step(len(part), pos, 0, sp.seed, sp.temperature,
                                                           sp.top_k, sp.top_p, n_out=draws))
            yield pos, part, program.dispatches(len(part), head=head, draws=draws)
            pos += len(part)

    async def agenerate(self, prompt, sp: SamplingParams, on_text=None) -> GenerationResult | list[GenerationResult]:
        """Generate to completion; on_text(piece) is called for each text piece (sp.n > 1: with
        (stream index, piece), and the result is a list, one per stream)."""
        result = None
        async for kind, value in self.aevents(prompt, sp):
            if kind == "text" and on_text:
                on_text(value)
            elif kind == "done":
                result = value
        return result

    async def aevents(self, prompt, sp: SamplingParams):
        """Async generator of ("text", piece) events, then one ("done", GenerationResult); with
        sp.n > 1, ("text", (stream index, piece)) and ("done", [GenerationResult per stream])."""
        self._acquire("generate")
        inner = self._aevents(prompt, sp)
        try:
            self._stop_requested = False
            async for ev in inner:
                yield ev
        finally:
            try:   # closed here, not by the garbage collector (whose aclose needs a loop that may be gone)
                await inner.aclose()
            finally:
                self._release()

    # -- the busy guard ---------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Whether a generation (or logits()) is running on this engine now."""
        return self._lock.locked()

    def _acquire(self, what: str) -> None:
        if not self._lock.acquire(blocking=False):
            raise EngineBusyError(f"{what}: this engine is busy ({self._busy_with}); one engine runs one "
                                  "request at a time: finish or close the open stream, or use another engine")
        self._busy_with = f"{what} running" if what != "generate" else "generating"

    def _release(self) -> None:
        self._busy_with = ""
        self._lock.release()

    async def _aevents(self, prompt, sp: SamplingParams):
        st = GenerationStats()
        prof = self.profiler
        t0 = time.perf_counter()
        with prof.phase("tokenize"):
            ids = self.encode_prompt(prompt)
        st.tokenize_s = time.perf_counter() - t0
        self._check_fits(len(ids))
        self._apply_lora(sp)
        st.prompt_tokens = len(ids)
        if sp.n > 1:
            async for ev in streams.events(self, ids, sp, st):
                yield ev
            return
        budget = min(sp.max_new_tokens, self.max_context - len(ids))
        eos = set(self.tokenizer.eos_token_ids) | set(self.config.eos_token_ids) if sp.stop_at_eos else set()
        dec = self.tokenizer.stream_decoder()
        out: list[int] = []
        pieces: list[str] = []
        if budget <= 0:
            st.finish_reason = "length" if sp.max_new_tokens == 0 else "context"
            st.total_s = time.perf_counter() - t0
            yield "done", GenerationResult("", [], st)
            return
        t_pf = time.perf_counter()
        source = (self._speculative_tokens(ids, sp, budget, st) if sp.speculative is not None
                  else self._plain_tokens(ids, sp, budget))
        read = 0
        t_dec = None
        finish = "length"
        try:
            async for tok in source:
                read += 1
                if read == 1:
                    st.prefill_s = time.perf_counter() - t_pf
                    t_dec = time.perf_counter()
                if tok in eos:
                    finish = "eos"
                    break
                out.append(tok)
                with prof.phase("detokenize"):
                    piece = dec.push(tok)
                if piece:
                    pieces.append(piece)
                    yield "text", piece
                if self._stop_requested:
                    finish = "stopped"
                    break
                if read == budget and budget < sp.max_new_tokens:
                    finish = "context"
        finally:
            await source.aclose()      # drains the steps still in flight (their tokens are discarded)
        if finish != "eos" and finish != "stopped" and read < budget:
            finish = "stopped"
        tail = dec.flush()
        if tail:
            pieces.append(tail)
            yield "text", tail
        st.new_tokens = len(out) + (1 if finish == "eos" else 0)
        if t_dec is not None:
            st.decode_s = time.perf_counter() - t_dec
        st.total_s = time.perf_counter() - t0
        st.finish_reason = finish
        yield "done", GenerationResult("".join(pieces), out, st)

    def _steps_list(self, decode_list: list, n: int) -> list:
        """n decode steps as one dispatch list: each step's kernels after a step_advance
        dispatch (built once per n and reused, so the browser converts each to JS once)."""
        if self._batched[0] is not decode_list:
            self._batched = (decode_list, {})
        lists = self._batched[1]
        if n not in lists:
            lists[n] = ([self._advance] + decode_list) * n
        return lists[n]

    def _submit_steps(self, flight: deque, decode_list: list, pos0: int, step0: int, n: int, sp: SamplingParams,
                      timestamps=None) -> None:
        """Submit n decode steps: step i reads its input token at cache slot pos0 + i and writes
        token step0 + i; their n tokens are copied to the next ring slot, and (step0, n, slot,
        ticket) joins `flight`, the submits not read yet. Several steps: one pass, each step's
        uniform loaded on the GPU (`_steps_list`)."""
        recs = [pack_step(1, pos0 + i, step0 + i, sp.seed, sp.temperature, sp.top_k, sp.top_p) for i in range(n)]
        if n == 1:
            self.dev.write_buffer(self.step_buf, recs[0])
            disp = decode_list
        else:
            self.dev.write_buffer(self.step_records, StepAdvanceKernel.records(recs))
            disp = self._steps_list(decode_list, n)
        slot = (flight[-1][2] + 1) % RING if flight else 0     # IN_FLIGHT < RING: never one in use
        ticket = self.dev.submit(disp, [(self.out_tokens, 4 * step0, self.ring[slot], 0, 4 * n)], timestamps=timestamps)
        flight.append((step0, n, slot, ticket))

    async def _read_submit(self, flight: deque) -> tuple[int, tuple]:
        """The oldest submit's first token index and its tokens, taken off `flight`."""
        first, n, slot, ticket = flight[0]
        with self.profiler.phase("readback", token=first + n - 1, tokens=n):
            raw = await self.dev.map_read(self.ring[slot], 4 * n, ticket)
        flight.popleft()
        return first, struct.unpack(f"<{n}I", raw)

    async def _drain(self, flight: deque) -> None:
        """Wait for the submits still in flight (a generation closed early): their tokens are dropped."""
        while flight:
            _, n, slot, ticket = flight.popleft()
            await self.dev.map_read(self.ring[slot], 4 * n, ticket)

    async def _plain_tokens(self, ids: list[int], sp: SamplingParams, budget: int):
        """The generated tokens, one decode step each, until `budget` or a stop request (the
        consumer stops reading at EOS; closing this drains the steps still queued).
        Steps go to the GPU in submits of up to `steps_per_submit` (1, 2, 4, ... as the tokens
        come, so the first ones are not held back): a submit of n steps is one compute pass with
        each step's kernels after a dispatch that loads its step uniform from `step_records`
        (written once per submit), and its n tokens come back in one read. IN_FLIGHT submits stay
        queued ahead of the one being read."""
        dev, prof = self.dev, self.profiler
        timed = getattr(prof, "kernels", False)    # GPU timestamps: one step per submit
        most = 1 if timed else self.steps_per_submit
        flight = deque()          # (first token, tokens, ring slot, ticket) per submit not read yet
        with prof.phase("prefill.submit", tokens=len(ids)):
            for pos, part, disp in self._submit_prompt(ids, sp):
                copies = [(self.out_tokens, 0, self.ring[0], 0, 4)] if pos + len(part) == len(ids) else None
                ticket = dev.submit(disp, copies, timestamps=prof.gpu_timer("prefill", len(disp), pos=pos))
        flight.append((0, 1, 0, ticket))
        pos = len(ids)
        decode_list = self.decode.dispatches(1)
        submitted = 1             # tokens whose step has been submitted
        try:
            while flight:
                while submitted < budget and not self._stop_requested and len(flight) < IN_FLIGHT:
                    n = min(most, budget - submitted, submitted)
                    with prof.phase("decode.submit", step=submitted, steps=n):
                        self._submit_steps(flight, decode_list, pos + submitted - 1, submitted, n, sp,
                                           prof.gpu_timer("decode", len(decode_list), step=submitted) if timed else None)
                    submitted += n
                first, toks = await self._read_submit(flight)
                for i, tok in enumerate(toks):
                    yield self._check_token(tok, first + i, len(ids))
        finally:
            await self._drain(flight)

    # -- speculative decoding (runtime/speculative.py) ---------------------------------------
    async def _speculative_tokens(self, ids: list[int], sp: SamplingParams, budget: int, st: GenerationStats):
        """The generated tokens with speculative decoding: after the prompt, each round either
        verifies a draft tree in one pass (greedy: the longest path the model agrees with, plus
        the model's own next token) or, when the drafter has nothing or backs off, runs plain
        decode steps (pipelined like `_plain_tokens`) until it has a draft again.
        Cache invariant between rounds: slots [0, pos) hold the prompt and every emitted token
        but the last, `last`, which is the next round's input (the tree's root)."""
        if sp.temperature != 0.0 and self._layout != "linear":
            raise InvalidArgumentError("speculative sampling (temperature > 0) reads logits rows in the linear "
                                       "activation layout only: load with layout='linear' or use temperature=0")
        dev, prof, verifier = self.dev, self.profiler, self._tree_verifier()
        drafter = make_drafter(sp.speculative, self.config)
        # DS2D: m forecast rows under every node of a pass (their vectors in the verifier's buffer)
        fc = drafter.forecast.m if isinstance(drafter, ForecastDrafter) else 0
        if fc:
            verifier.load_forecast(drafter.forecast)
        backoff = BackOff()
        # the prompt; its first token comes from the first burst of plain steps, whose steps are
        # queued behind the prefill at once, as plain decoding's (reading it before queueing any
        # step cost ~3% of a 50-token answer on SmolLM2 / H100, docs/BENCHMARKS.md session 18)
        with prof.phase("prefill.submit", tokens=len(ids)):
            for pos, part, disp in self._submit_prompt(ids, sp):
                copies = [(self.out_tokens, 0, self.ring[0], 0, 4)] if pos + len(part) == len(ids) else None
                ticket = dev.submit(disp, copies)
        prefill, last, emitted, pos = ticket, None, 0, len(ids)
        root = (0, 0.0)           # tokens and seconds of DS2D root passes not yet judged
        drafter.reset(list(ids))
        # (the first token is read even after a stop request, as plain decoding reads it)
        while prefill is not None or (emitted < budget and not self._stop_requested):
            tree = None
            if prefill is None and backoff.may_draft():
                # the pass's rows sit at slots pos .. pos + rows - 1: all inside the cache
                room = self._tree_room(pos) // (1 + fc)
                tree = drafter.propose(backoff.node_budget(room) if drafter.sized else room, budget - emitted)
                if tree is not None:
                    self._check_tree(tree, last, pos, 1 + fc)
            t0 = time.perf_counter()
            if tree is None:
                n_plain = 0
                # after the prompt, token 0 is the prefill's (in flight) and the steps count from 1
                burst = self._plain_burst(last, pos, max(emitted, 1), budget, sp, drafter, backoff, len(ids), fc,
                                          prefill)
                try:
                    async for tok in burst:
                        emitted, n_plain, last = emitted + 1, n_plain + 1, tok
                        drafter.append(tok)
                        yield tok
                finally:   # closed here (drains the steps in flight) when the caller stops at a token
                    await burst.aclose()
                steps = n_plain - (prefill is not None)    # the prefill's token took no decode step
                if prefill is None:   # (the first burst's steps were queued before its clock started)
                    backoff.plain_burst(steps, time.perf_counter() - t0)
                pos += steps
                st.plain_steps += steps
                prefill = None
                continue
            nodes = len(tree.tokens)
            with prof.phase("verify", nodes=nodes):
                argmax = await verifier.argmax_rows(with_forecast_rows(tree, fc) if fc else tree, pos, emitted, sp,
                                                    nodes)
            if sp.temperature == 0.0:
                for t in argmax:
                    self._check_token(t, emitted, len(ids))
                toks, path = greedy_walk(tree, argmax)
            else:   # the draws of a pass depend on (seed, index of its first token) only
                rng = random.Random(sp.seed * 1_000_003 + emitted)
                toks, path = await sampled_walk(tree, lambda row, at=pos: verifier.row_probs(row, sp, at), rng)
            verifier.compact_path(path, pos)
            st.spec_passes += 1
            st.drafted_tokens += nodes - 1
            st.accepted_tokens += len(path) - 1
            if nodes > 1:
                backoff.verified(len(path) - 1, len(toks) + root[0], time.perf_counter() - t0 + root[1])
                root = (0, 0.0)
            else:   # a DS2D pass of the root alone (after plain steps) drafts for the next one: its
                # time and token count with that pass's (H200, SmolLM2: counted apart, each pass
                # after it looked paying and DS2D fell from 0.8x to 0.6x once passes got cheaper)
                root = (root[0] + len(toks), root[1] + time.perf_counter() - t0)
            pos += len(path)
            for tok in toks[:budget - emitted]:
                emitted, last = emitted + 1, tok
                drafter.append(tok)
                yield tok
            if fc and emitted < budget:
                drafter.observe(verifier.forecasts(nodes, path[-1], drafter.forecast.branching))

    def _tree_room(self, pos: int) -> int:
        """Rows a verification pass may have with its root at cache slot pos."""
        return min(MAX_TREE, self.max_context - pos)

    async def _plain_burst(self, last: int | None, pos: int, emitted: int, budget: int, sp: SamplingParams,
                           drafter, backoff: BackOff, prompt_tokens: int, fc: int, prefill=None):
        """Plain decode steps from `last` at slot pos (pipelined like `_plain_tokens`: submits of
        1, 2, 4, ... steps, IN_FLIGHT ahead) until the budget, a stop request, or the drafter has a
        tree again (the steps in flight then are read and yielded: their tokens are valid).
        prefill: the ticket of the prompt's submit, whose sampler wrote token 0 to ring slot 0 and
        to the ids the first step reads (last None, emitted 1); token 0 is yielded first.
        Closing it early drains what is in flight."""
        flight = deque()          # (first token, tokens, ring slot, ticket) per submit not read yet
        if prefill is None:
            self.dev.write_buffer(self.ids_buf, struct.pack("<I", last))
        else:
            flight.append((0, 1, 0, prefill))
        decode_list = self.decode.dispatches(1)
        submitted = 0             # steps of this burst submitted
        want_tree = False
        try:
            while True:
                while (emitted + submitted < budget and len(flight) < IN_FLIGHT and not want_tree
                       and not self._stop_requested):
                    n = min(self.steps_per_submit, budget - emitted - submitted, max(1, submitted))
                    self._submit_steps(flight, decode_list, pos + submitted, emitted + submitted, n, sp)
                    submitted += n
                if not flight:
                    return
                first, toks = await self._read_submit(flight)
                for i, tok in enumerate(toks):
                    k = first + i             # the token's index; its step read cache slot pos + k - emitted
                    tok = self._check_token(tok, k, prompt_tokens)
                    backoff.plain_step()
                    yield tok
                    if not want_tree and backoff.may_draft():
                        left = budget - k - 1
                        # a tree of 2 nodes (the root alone with DS2D rows: its pass drafts) fits?
                        nodes = self._tree_room(pos + k - emitted + 1) // (1 + fc)
                        want_tree = left > 0 and drafter.propose(min(2, nodes), left) is not None
        finally:
            await self._drain(flight)

    def _check_token(self, tok: int, step: int, prompt_tokens: int) -> int:
        if tok >= self.config.vocab_size:
            raise self._bad_token(tok, step, prompt_tokens)
        return tok

    def _check_tree(self, tree: DraftTree, last: int, pos: int, rows_per_node: int = 1) -> None:
        """A drafter's tree must be rooted at the last token and fit the verification pass and the
        cache (InvalidArgumentError naming the limit); rows_per_node: with DS2D's forecast rows."""
        if not isinstance(tree, DraftTree) or tree.tokens[0] != last:
            raise InvalidArgumentError(f"the drafter proposed {shown(tree)}: a DraftTree rooted at the last token "
                                       f"({last}) is needed")
        room = self._tree_room(pos) // rows_per_node
        if len(tree.tokens) > room:
            raise InvalidArgumentError(f"the drafter proposed a tree of {len(tree.tokens)} nodes; at cache position "
                                       f"{pos} of {self.max_context} at most {room} fit (MAX_TREE = {MAX_TREE}"
                                       f"{f', {rows_per_node} rows per node' if rows_per_node > 1 else ''})")
        v = self.config.vocab_size
        bad = [t for t in tree.tokens if not (_is_int(t) and 0 <= t < v)]
        if bad:
            raise InvalidArgumentError(f"the drafter proposed token {shown(bad[0])}; ids must be in [0, {v})")

    def _tree_verifier(self) -> TreeVerifier:
        """The tree-verification programs (every row's logits, tree masks; one per TREE_BUCKETS
        capacity) and their buffers, built on first use (the arena grows to fit them)."""
        if self._verifier is None:
            self.tree_buf = self.dev.create_buffer(4 * MAX_TREE * row_words(MAX_TREE), STORAGE, "tree")
            forecast_buf = self.dev.create_buffer(4 * MAX_FORECAST * 4 * ceil_div(self.config.dim, 4), STORAGE,
                                                  "forecast")
            # the tree runs the decode kernels (each row's sums as a decode step's: the one-row
            # float GEMVs, the K-column integer-dot GEMVs, the int8 LM head on every row) and its
            # attention reads keys in path order (kernels/tree.py), so a node's logits are bit for
            # bit a decode step's: the prefill GEMMs round differently, and near-ties then resolve
            # differently (tokens != plain decoding). The largest first: the arena grows once.
            programs = {}
            for cap in sorted(TREE_BUCKETS, reverse=True):
                programs[cap] = Program(self.model, "decode", cap, True, self._layout, self.step_buf, self.ids_buf,
                                        self.out_tokens, fuse=self._fuse, tree_buf=self.tree_buf,
                                        lora=self.lora_pool, forecast_buf=forecast_buf)
                self._fit_arena(programs[cap])
            for p in programs.values():   # bound to the arena the last one left; compiled now, not at a
                p.bind(self.arena)        # bucket's first pass in the middle of a generation
                p.kernels()
            self._verifier = TreeVerifier(self, programs, forecast_buf)
        return self._verifier

    def _bad_token(self, tok: int, step: int, prompt_tokens: int) -> Exception:
        """The error for a sampled id outside the vocabulary: NumericalError for the sampler's
        non-finite-logits token, a GPUError (a kernel fault) for anything else."""
        where = (f"generation step {step} (the logits after the {prompt_tokens}-token prompt"
                 f"{'' if step == 0 else f' and {step} generated tokens'})")
        if tok == NONFINITE_TOKEN:
            return NumericalError(f"{where}: the model's logits hold NaN or infinite values; the weights "
                                  f"of {self.path} are damaged or a tensor's type is mislabelled")
        return GPUError(f"{where}: the sampler returned token id {tok}, outside the vocabulary of "
                        f"{self.config.vocab_size}")

    # -- teacher-forced logits ---------------------------------------------------------------
    def logits(self, ids: list[int], first: int = 0, lora: str | None = None, lora_scale: float = 1.0):
        """Teacher-forced logits (numpy float32, shape [len(ids) - first, vocab]): row i holds the
        logits after ids[first + i], i.e. the prediction of ids[first + i + 1]. Rows before
        `first` are computed through the layers but not through the LM head nor read back (the
        perplexity tool scores only the second half of each window). The ids may fill the whole
        context: nothing is generated after them. lora: a resident adapter applied at lora_scale."""
        import numpy as np
        sp = SamplingParams.make(lora=lora, lora_scale=lora_scale)
        self._acquire("logits")
        try:
            self._apply_lora(sp)
            return self._logits(ids, first, np)
        finally:
            self._release()

    def _logits(self, ids, first, np):
        if self._layout != "linear":
            raise InvalidArgumentError("logits() reads the linear activation layout only")
        ids = self.encode_prompt(list(ids))
        self._check_fits(len(ids), room=0)
        if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < len(ids):
            raise InvalidArgumentError(f"first={first!r}: must be an integer in [0, {len(ids)})")
        if self._score is None:
            self._score = self._program(self._prefill_stage, min(64, self.prefill_chunk), True)
            self._fit_arena(self._score)
        V = self.config.vocab_size
        out = np.empty((len(ids) - first, V), np.float32)
        sp = SamplingParams()
        lt = self._score.graph.tensors["logits"]
        for pos, part, disp in self._submit_prompt(ids, sp, program=self._score, head_from=first):
            self.dev.submit(disp)
            lo = max(pos, first)            # first row of this chunk that is wanted
            if lo >= pos + len(part):
                continue
            n = pos + len(part) - lo
            raw = _run(self.dev.read_buffer(self.arena, lt.offset + (lo - pos) * V * 4, n * V * 4))
            out[lo - first:lo - first + n] = np.frombuffer(raw, np.float32).reshape(n, V)
        return out


_loops = threading.local()      # this thread's private event loop (_run)
_all_loops = weakref.WeakSet()  # every thread's, closed at exit (a finished thread's goes with it)


def _close_loops() -> None:
    for loop in list(_all_loops):
        if not loop.is_closed() and not loop.is_running():
            loop.close()


def _run(coro):
    """Run a coroutine to completion on this thread's private event loop (desktop sync API). The
    loop is made once per thread and kept (closed at exit): with a loop made and closed per call,
    a Ctrl-C that landed inside BaseEventLoop.close() left its self-pipe half closed, and
    collecting it printed "Exception ignored ... Invalid file descriptor: -1"
    (tests/test_interrupt.py's sweep, on a loaded machine). A run that leaves tasks pending (an
    interrupt between two of their steps) closes its loop with them, as every call did before:
    they never resume in a later call, and the next call makes a new loop."""
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
        if not _all_loops:
            import atexit
            atexit.register(_close_loops)
        _all_loops.add(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        if any(not t.done() for t in asyncio.all_tasks(loop)):
            _loops.loop = None
            loop.close()
