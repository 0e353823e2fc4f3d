"""Engine: a loaded model + tokenizer, and generation (the host loop).

The host loop does almost nothing per token: a decode step is one 48-byte uniform write and a
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
from dataclasses import dataclass, field

from ..errors import (
    ContextLengthError,
    EngineBusyError,
    GPUError,
    InvalidArgumentError,
    NumericalError,
    shown,
)
from ..gpu.base import READBACK, STORAGE, UNIFORM, Device
from ..kernels.sample import NONFINITE_TOKEN
from ..kernels.step import STEP_BYTES, pack_step
from ..models.loader import GPUModel
from ..models.program import Program
from ..profile.profiler import DISABLED, Profiler
from ..tokenizer.tokenizer import check_text
from .options import EngineOptions

RING = 4          # staging buffers for token read-back
IN_FLIGHT = 2     # decode steps queued ahead of the token being read (<= RING - 1)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    tokenize_s: float = 0.0
    prefill_s: float = 0.0        # until the first token is on the host
    decode_s: float = 0.0
    total_s: float = 0.0
    finish_reason: str = ""       # "eos", "length", "context", "stopped"

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        n = self.new_tokens - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "tokenize_s": round(self.tokenize_s, 6), "prefill_s": round(self.prefill_s, 6),
                "decode_s": round(self.decode_s, 6), "total_s": round(self.total_s, 6),
                "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
                "decode_tokens_per_s": round(self.decode_tokens_per_s, 2), "finish_reason": self.finish_reason}


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

    @classmethod
    def make(cls, max_new_tokens=64, temperature=0.0, top_k=None, top_p=None, seed=None, stop_at_eos=True):
        """Checked parameters: every value is one the Step uniform holds (kernels/step.py: top_k a
        u32, temperature and top_p f32 that stay normal numbers), else an InvalidArgumentError
        naming the argument."""
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
        return cls(int(max_new_tokens), temperature, int(top_k), top_p, int(seed) & U32_MAX, stop_at_eos)


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
        self.prefill_chunk = min(options.prefill_chunk, max_context)
        t0 = time.perf_counter()
        self.model = GPUModel(dev, source, max_context, options.weight_format, progress, autotune=options.autotune,
                              int8_activations=options.int8_activations,
                              max_binding_bytes=options.max_binding_bytes)
        # shared per-engine buffers
        self.step_buf = dev.create_buffer(STEP_BYTES, UNIFORM, "step")
        self.ids_buf = dev.create_buffer(4 * max(self.prefill_chunk, 64), STORAGE, "ids")        # (T_cap) u32
        self.out_tokens = dev.create_buffer(4 * (max_context + 1), STORAGE, "out_tokens")      # (steps) u32
        self.ring = [dev.create_buffer(16, READBACK, f"token_ring{i}") for i in range(RING)]
        self._layout, self._fuse = options.layout, options.fuse
        self.decode = self._program("decode", 1, False)
        self.prefill = self._program(self._prefill_stage, self.prefill_chunk, False)
        self._score: Program | None = None
        self.arena = dev.create_buffer(max(self.decode.arena_bytes, self.prefill.arena_bytes), STORAGE, "arena")
        self.decode.bind(self.arena)
        self.prefill.bind(self.arena)
        self.load_s = time.perf_counter() - t0
        # one request at a time: every public entry point that touches the GPU state (generate,
        # stream, chat, agenerate, achat, logits) holds this lock while it runs, a stream() from its
        # first token until it is closed; a second caller gets EngineBusyError at once
        self._lock = threading.Lock()
        self._busy_with = ""          # what holds the lock, for the message
        self._stop_requested = False

    def _program(self, stage: str, capacity: int, all_logits: bool) -> Program:
        return Program(self.model, stage, capacity, all_logits, self._layout, self.step_buf, self.ids_buf,
                       self.out_tokens, fuse=self._fuse)

    # -- public API ------------------------------------------------------------------------
    def generate(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_at_eos: bool = True) -> GenerationResult:
        """Generate a continuation of `prompt` (a string, tokenized like HF's encode, or ids)."""
        sp = SamplingParams.make(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos)
        return _run(self.agenerate(prompt, sp))

    def stream(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop_at_eos: bool = True):
        """Yield text pieces as tokens are produced (the pieces concatenate to the full text)."""
        sp = SamplingParams.make(max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos)
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

    def _submit_prompt(self, ids: list[int], sp: SamplingParams, program=None, head_from: int | None = None):
        """Prefill in chunks of the program's capacity; yields (pos, chunk, dispatches) after writing
        the chunk's ids and Step. Only the last chunk runs the head (LM head + sampling), and with
        head_from every chunk holding a row >= head_from (teacher-forced logits of those rows)."""
        program = program or self.prefill
        chunk = program.capacity
        pos = 0
        while pos < len(ids):
            part = ids[pos:pos + chunk]
            last = pos + len(part) == len(ids)
            head = last or (head_from is not None and pos + len(part) > head_from)
            self.dev.write_buffer(self.ids_buf, struct.pack(f"<{len(part)}I", *part))
            self.dev.write_buffer(self.step_buf, pack_step(len(part), pos, 0, sp.seed, sp.temperature,
                                                           sp.top_k, sp.top_p))
            yield pos, part, program.dispatches(len(part), head=head)
            pos += len(part)

    async def agenerate(self, prompt, sp: SamplingParams, on_text=None) -> GenerationResult:
        """Generate to completion; on_text(piece) is called for each text piece."""
        result = None
        async for kind, value in self.aevents(prompt, sp):
            if kind == "text" and on_text:
                on_text(value)
            elif kind == "done":
                result = value
        return result

    async def aevents(self, prompt, sp: SamplingParams):
        """Async generator of ("text", piece) events, then one ("done", GenerationResult)."""
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
        st.prompt_tokens = len(ids)
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
        dev = self.dev
        t_pf = time.perf_counter()
        tickets = [None] * RING   # submission of the step that fills each ring slot
        with prof.phase("prefill.submit", tokens=len(ids)):
            for pos, part, disp in self._submit_prompt(ids, sp):
                copies = [(self.out_tokens, 0, self.ring[0], 0, 4)] if pos + len(part) == len(ids) else None
                tickets[0] = dev.submit(disp, copies, timestamps=prof.gpu_timer("prefill", len(disp), pos=pos))
        pos = len(ids)
        decode_list = self.decode.dispatches(1)
        submitted = 1             # tokens whose step has been submitted
        read = 0
        t_dec = None
        finish = "length"
        while read < submitted:
            # keep IN_FLIGHT steps queued: submit steps up to `read + IN_FLIGHT` before reading
            # token `read`, so the GPU has the next step while the host waits, reads and encodes
            # (each step's uniform is written in queue order, between the submits)
            while submitted < budget and not self._stop_requested and submitted < read + IN_FLIGHT:
                with prof.phase("decode.submit", step=submitted):
                    dev.write_buffer(self.step_buf, pack_step(1, pos + submitted - 1, submitted, sp.seed,
                                                              sp.temperature, sp.top_k, sp.top_p))
                    tickets[submitted % RING] = dev.submit(
                        decode_list, [(self.out_tokens, 4 * submitted, self.ring[submitted % RING], 0, 4)],
                        timestamps=prof.gpu_timer("decode", len(decode_list), step=submitted))
                submitted += 1
            with prof.phase("readback", token=read):
                raw = await dev.map_read(self.ring[read % RING], 4, tickets[read % RING])
            tok = struct.unpack("<I", raw)[0]
            if tok >= self.config.vocab_size:
                raise self._bad_token(tok, read, len(ids))
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
        if finish != "eos" and finish != "stopped" and read < budget:
            finish = "stopped"
        # drain the steps still in flight (their tokens are discarded)
        while read < submitted:
            await dev.map_read(self.ring[read % RING], 4, tickets[read % RING])
            read += 1
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
    def logits(self, ids: list[int], first: int = 0):
        """Teacher-forced logits (numpy float32, shape [len(ids) - first, vocab]): row i holds the
        logits after ids[first + i], i.e. the prediction of ids[first + i + 1]. Rows before
        `first` are computed through the layers but not through the LM head nor read back (the
        perplexity tool scores only the second half of each window). The ids may fill the whole
        context: nothing is generated after them."""
        import numpy as np
        self._acquire("logits")
        try:
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
            if self._score.arena_bytes > self.arena.size:   # rebind everything to a larger arena
                self.dev.release_buffer(self.arena)
                self.arena = self.dev.create_buffer(self._score.arena_bytes, STORAGE, "arena")
                self.decode = self._program("decode", 1, False)
                self.prefill = self._program(self._prefill_stage, self.prefill_chunk, False)
                self.decode.bind(self.arena)
                self.prefill.bind(self.arena)
            self._score.bind(self.arena)
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


def _run(coro):
    """Run a coroutine to completion on a private loop (desktop sync API)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
