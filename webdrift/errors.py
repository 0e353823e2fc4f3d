"""Every error webdrift raises on purpose is a WebdriftError subclass.

Messages name the file, argument or tensor at fault and what is wrong with it, and stay short:
values taken from a file or a caller are quoted through `shown()` (cut to a few dozen
characters), and a message longer than MAX_MESSAGE is cut in the middle when the error is made
(a damaged length field must not put megabytes on a terminal).
Must not: import anything beyond the standard library (it runs under Pyodide too).
"""

MAX_MESSAGE = 1000   # characters of an error message (longer ones are cut in the middle)


def shown(value, limit: int = 80) -> str:
    """repr(value) for a message, cut to about `limit` characters (the cut says how long it was).
    Anything read from a file or passed by a caller goes through this before it is quoted."""
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - a caller's object whose repr fails is still named
        r = f"<{type(value).__name__} object>"
    if len(r) <= limit:
        return r
    unit = {str: "characters", bytes: "bytes", bytearray: "bytes"}.get(type(value), "items")
    size = f" ({len(value)} {unit})" if isinstance(value, (str, bytes, bytearray, list, tuple, dict)) else ""
    return r[:limit - 3] + "..." + size


def _cut(msg: str) -> str:
    if len(msg) <= MAX_MESSAGE:
        return msg
    half = (MAX_MESSAGE - 40) // 2
    return f"{msg[:half]} [... {len(msg) - 2 * half} characters cut ...] {msg[-half:]}"


class WebdriftError(Exception):
    """Base class of all webdrift errors."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str):
            args = (_cut(args[0]),)
        super().__init__(*args)


class InvalidArgumentError(WebdriftError, ValueError):
    """A caller passed a bad argument (names the argument and the allowed values)."""


class ModelNotFoundError(WebdriftError):
    """A model name is not in the known-model table and is not an existing path."""


class ModelFileError(WebdriftError):
    """A model file is truncated, corrupted, or not in the format it claims."""


class UnsupportedModelError(WebdriftError):
    """A well-formed model uses an architecture, tensor type or option webdrift does not support."""


class TokenizerError(WebdriftError):
    """Tokenizer data is missing or malformed, or text cannot be tokenized."""


class InvalidTextError(TokenizerError, InvalidArgumentError):
    """Text passed to the tokenizer is not valid Unicode (a lone surrogate, e.g. from bytes that
    were not UTF-8): names the position and the code point."""


class ContextLengthError(WebdriftError):
    """A prompt (plus requested tokens) does not fit the engine's context."""


class EngineBusyError(WebdriftError):
    """An Engine was asked to do something while it is generating (an open stream(), another
    thread): one engine runs one request at a time."""


class NumericalError(WebdriftError):
    """The model produced non-finite values (NaN / inf logits): usually a damaged or mislabelled
    weight tensor. Names the generation step."""


class DownloadError(WebdriftError):
    """Obtaining a model package failed (pip, network, checksum)."""


class GPUError(WebdriftError):
    """No usable GPU adapter, a device loss, or a shader/pipeline failure."""


class GPULimitError(GPUError):
    """A model or buffer exceeds the adapter's limits or memory."""
