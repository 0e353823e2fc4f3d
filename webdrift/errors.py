"""Every error webdrift raises on purpose is a WebdriftError subclass.

Messages name the file, argument or tensor at fault and what is wrong with it. Nothing here
imports anything beyond the standard library (it runs under Pyodide too).
"""


class WebdriftError(Exception):
    """Base class of all webdrift errors."""


class InvalidArgumentError(WebdriftError, ValueError):
    """A caller passed a bad argument (names the argument and the allowed values)."""


class ModelNotFoundError(WebdriftError):
    """A model name is not in the known-model table and is not an existing path."""


class ModelFileError(WebdriftError):
    """A model file is truncated, corrupted, or not in the format it claims."""


class UnsupportedModelError(WebdriftError):
    """A well-formed model uses an architecture, tensor type or option webdrift does not support."""


class TokenizerError(WebdriftError):
    """Tokenizer data is missing or malformed."""


class ContextLengthError(WebdriftError):
    """A prompt (plus requested tokens) does not fit the engine's context."""


class DownloadError(WebdriftError):
    """Obtaining a model package failed (pip, network, checksum)."""


class GPUError(WebdriftError):
    """No usable GPU adapter, a device loss, or a shader/pipeline failure."""


class GPULimitError(GPUError):
    """A model or buffer exceeds the adapter's limits or memory."""
