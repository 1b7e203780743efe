"""Render a conversation with a model's Jinja chat template (as Hugging Face and llama.cpp do)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from localspec.backends.base import ChatMessage
from localspec.errors import GenerationError

# Used when a model ships no template: ChatML, the most common format among chat models.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def render_chat(
    template: str | None,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template or FALLBACK_TEMPLATE).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError as e:
        raise GenerationError(f"the model's chat template failed: {e}", "try without --system, or use --raw") from None


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)
