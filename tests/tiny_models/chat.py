"""The chat model (t11): a tiny Qwen2ForCausalLM with a byte-level BPE tokenizer and a ChatML template
that renders `tools`, tool calls and tool results, as Qwen2.5's does (simplified).

The same tokenizer, template and greedy generation config serve the Llava model in `multimodal`, whose
language half is a Qwen2 too. The template teaches hermes-style ``<tool_call>`` markup (the server picks
its tool-call parser from the template's text), and the vocabulary has no fill-in-the-middle tokens: the
tests expect a `suffix` to be refused for this model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tests.tiny_models.common import reseed, save
from tests.tiny_models.vocab import train_byte_level_bpe

VOCAB_SIZE = 400
CONTEXT = 512
END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
IMAGE_TOKEN = "<image>"
# Special tokens, in ID order: padding is 0, the end of a turn (the end of generation) is 2.
SPECIAL_TOKENS: tuple[str, ...] = (
    END_OF_TEXT,
    TURN_START,
    TURN_END,
    IMAGE_TOKEN,
    "<tool_call>",
    "</tool_call>",
)

# ChatML: every turn is "<|im_start|>ROLE\n...<|im_end|>\n". Given tools, the system turn (the caller's
# or a default one) lists them, one JSON object a line inside <tools>, and says how to call them; an
# assistant's calls follow its content as JSON inside <tool_call> tags; a tool's result comes back as a
# user turn inside <tool_response> tags. In a content list, text parts are written out and image parts
# become the <image> placeholder Llava expands. A tool result or a system prompt (without tools) that is
# not a string is refused ("+" joins strings only): the server answers such messages with a 400.
CHAT_TEMPLATE = """\
{%- macro turn(role, body) -%}
    {{- '<|im_start|>' + role + '\\n' + body + '<|im_end|>\\n' -}}
{%- endmacro -%}

{%- macro content_text(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}
            {%- if part['type'] == 'image' -%}
                {{- '<image>' -}}
            {%- elif part['type'] == 'text' -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}

{%- macro tool_calls_text(calls) -%}
    {%- for call in calls -%}
        {%- set function = call['function'] if call['function'] is defined else call -%}
        {{- '\\n<tool_call>\\n{"name": "' + function['name'] + '", "arguments": ' -}}
        {%- if function['arguments'] is string -%}
            {{- function['arguments'] -}}
        {%- else -%}
            {{- function['arguments'] | tojson -}}
        {%- endif -%}
        {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
{%- endmacro -%}

{%- set opens_with_system = messages[0]['role'] == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {{- messages[0]['content'] if opens_with_system else 'You are a helpful assistant.' -}}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
        '\\n\\n<tools>\\n' -}}
    {{- tools | map('tojson') | join('\\n') -}}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments'
        ' within <tool_call></tool_call> XML tags.<|im_end|>\\n' -}}
{%- elif opens_with_system -%}
    {{- turn('system', messages[0]['content']) -}}
{%- endif -%}

{%- for message in messages -%}
    {%- if message['role'] == 'tool' -%}
        {{- turn('user', '<tool_response>\\n' + message['content'] + '\\n</tool_response>') -}}
    {%- elif message['role'] != 'system' -%}
        {{- '<|im_start|>' + message['role'] + '\\n' -}}
        {{- content_text(message['content']) -}}
        {%- if message['tool_calls'] is defined and message['tool_calls'] -%}
            {{- tool_calls_text(message['tool_calls']) -}}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """The BPE wrapped as a transformers tokenizer: no BOS or UNK (byte-level needs none), turns end
    with <|im_end|>, <|endoftext|> pads, and the ChatML template is attached."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_byte_level_bpe(VOCAB_SIZE, SPECIAL_TOKENS),
        eos_token=TURN_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        bos_token=None,
        model_max_length=CONTEXT,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def qwen2_config(tokenizer: PreTrainedTokenizerFast, **extra: Any) -> Qwen2Config:
    """Two layers of width 32 with grouped-query attention (4 query heads over 2 key/value heads), so the
    engine's KV-cache paths see a GQA model."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **extra,
    )


def greedy_generation(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Greedy decoding of at most 16 tokens, stopping at the end of the turn."""
    return GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=16,
    )


def build_chat(folder: Path) -> None:
    """t11: the Qwen2 chat model, its input and output embeddings tied."""
    reseed()
    tokenizer = chat_tokenizer()
    model = Qwen2ForCausalLM(qwen2_config(tokenizer, tie_word_embeddings=True))
    model.generation_config = greedy_generation(tokenizer)
    save(folder, model, tokenizer)


def build_chat_for_vllm(folder: Path) -> None:
    """The chat model at the smallest shape vLLM's CPU attention runs (heads of 64: it has no kernel for
    t11's heads of 8), with t11's tokenizer and template and a 2048-token context, for tests/test_vllm.py."""
    reseed()
    tokenizer = chat_tokenizer()
    config = qwen2_config(tokenizer, tie_word_embeddings=True)
    config.hidden_size, config.intermediate_size = 128, 256
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 64
    config.max_position_embeddings = 2048
    model = Qwen2ForCausalLM(config)
    model.generation_config = greedy_generation(tokenizer)
    save(folder, model, tokenizer)
