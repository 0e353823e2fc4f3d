"""Chat templates: render a model's Jinja chat template the way `transformers` does.

Same environment as `transformers.apply_chat_template`: an ImmutableSandboxedEnvironment with
trim_blocks / lstrip_blocks, the loopcontrols extension, a `{% generation %}` block that renders its
body, `raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape, and the special-token
strings (`bos_token`, `eos_token`, ...) as variables. Templates come from model files and are untrusted:
they only ever run inside the sandbox. Needs jinja2 (available in Pyodide); nothing else.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar

from webdrift.errors import InvalidArgumentError, TokenizerError


class _TemplateRaised(Exception):
    """raise_exception(...) inside a template: the caller's messages are not acceptable to it."""


def _make_environment():
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        # transformers tracks assistant spans with {% generation %}...{% endgeneration %}; we only render.
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message: str):
        raise _TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_ENV = None


class ChatTemplate:
    """A compiled chat template for one model."""

    def __init__(self, source: str, model_name: str, special_tokens: dict[str, str | None]) -> None:
        global _ENV
        import jinja2

        if _ENV is None:
            _ENV = _make_environment()
        self.source = source
        self.model_name = model_name
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        try:
            self._template = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TokenizerError(
                f"chat template of {model_name} does not parse: {exc.message} (line {exc.lineno})"
            ) from exc

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        import jinja2

        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise InvalidArgumentError(
                f"messages must be a list of dicts like {{'role': 'user', 'content': '...'}}, got {messages!r:.200}"
            )
        variables = {**self.special_tokens, "tools": None, "documents": None, **kwargs}
        try:
            return self._template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
            )
        except _TemplateRaised as exc:
            raise InvalidArgumentError(
                f"chat template of {self.model_name} rejected the messages: {exc}"
            ) from exc
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # the messages were checked (tokenizer.check_messages): a failure here is the template's
            raise TokenizerError(f"chat template of {self.model_name} failed: {type(exc).__name__}: {exc}") from exc
