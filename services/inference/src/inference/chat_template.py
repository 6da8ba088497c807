"""The ChatML chat template with Hermes-style tools, shipped with every checkpoint we create.

Role: one Jinja template (rendered by ``transformers``' ``apply_chat_template``) that turns OpenAI-shaped messages
into ChatML. Tools follow the Hermes convention used by Qwen: the schemas go into the system turn inside
``<tools></tools>``, the model answers with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and tool
results come back as a user turn wrapping ``<tool_response>`` blocks. Assistant reasoning is rendered as
``<think>...</think>``.

``SMOLLM2_CHAT_TEMPLATE`` is the same template for SmolLM2-Instruct (``inference.models``), keeping SmolLM2's own
behaviour of inserting its default system prompt when the conversation has no system message (also in front of the
tool section). SmolLM2 has no ``<tool_call>`` token: the tags are plain text to it, which both engines' Hermes parsers
accept (vLLM's parses text; see ``parsing.py`` for ours).

Limits: content parts other than ``text`` (images, audio) are dropped; ``developer`` is treated as ``system``.
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "SMOLLM2_CHAT_TEMPLATE", "SMOLLM2_DEFAULT_SYSTEM", "chatml_hermes_template"]

# Written as one string so that the checkpoint directory is self-contained (tokenizer_config / chat_template.jinja).
CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{ content }}
{%- else -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0].role in ['system', 'developer'] -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if first_is_system -%}{{- render_content(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
{{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and first_is_system -%}
{%- elif message.role in ['system', 'developer'] -%}
{{- '<|im_start|>system\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- elif message.role == 'user' -%}
{{- '<|im_start|>user\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- set reasoning = message.reasoning_content or message.reasoning -%}
{%- if reasoning -%}{{- '<think>\n' + reasoning + '\n</think>\n\n' -}}{%- endif -%}
{{- render_content(message.content) -}}
{%- if message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if (loop.first and message.content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


# What SmolLM2-Instruct's own template says when the conversation has no system message.
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml_hermes_template(default_system: str | None = None) -> str:
    """``CHAT_TEMPLATE``, or with ``default_system`` the same template with that system prompt when none is given."""
    if default_system is None:
        return CHAT_TEMPLATE
    # Derived by editing the two system-turn branches, so the dev template stays byte-identical (its checkpoints
    # and tests) and the two variants cannot drift apart anywhere else.
    literal = "'" + default_system.replace("\\", "\\\\").replace("'", "\\'") + "'"
    tools_prefix = "{%- if first_is_system -%}{{- render_content(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    plain_system = (
        "{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' -}}\n{%- endif -%}"
    )
    assert tools_prefix in CHAT_TEMPLATE and plain_system in CHAT_TEMPLATE, (
        "CHAT_TEMPLATE changed: update this function"
    )
    return CHAT_TEMPLATE.replace(
        tools_prefix,
        "{%- if first_is_system -%}{{- render_content(messages[0].content) + '\\n\\n' -}}"
        "{%- else -%}{{- " + literal + " + '\\n\\n' -}}{%- endif -%}",
    ).replace(
        plain_system,
        plain_system.removesuffix("{%- endif -%}")
        + "{%- else -%}\n{{- '<|im_start|>system\\n' + "
        + literal
        + " + '<|im_end|>\\n' -}}\n{%- endif -%}",
    )


SMOLLM2_CHAT_TEMPLATE = chatml_hermes_template(SMOLLM2_DEFAULT_SYSTEM)
