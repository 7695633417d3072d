"""The trained family models (t24): for each model family of `modelhost.generation.families`, a tiny model
of the family's architecture, with its special tokens and a chat template in its published format
(`family_templates`), *trained* to answer a few fixed conversations in the family's format: reasoning then
an answer, a tool call, or both.

Random weights never show a family's format; these do, so the whole path (template → engine → tokens →
parsers → OpenAI JSON and stream) runs on real model output. Each model learns its `Conversation`s by
heart: Adam on the rendered prompts (tens of steps to a few hundred, a second or two), the loss on the
answer tokens only, until the greedy answer of every prompt is its target with a margin (so that
vLLM's kernels, whose sums differ from torch's in the last bits, answer the same). The build fails
rather than save a model that answers otherwise, and fails if `detect_family` does not recognise the
template as its family.

Tokenizers are byte-level BPEs learnt from the family's own rendered conversations (short prompts make
training fast); the tokens of the markup are added tokens, special (skipped when decoding) or not as in
the family's real tokenizer. Contexts are 2048 tokens, heads 64 wide (vLLM's CPU attention has kernels
for that width).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import AddedToken
from transformers import GenerationConfig, PreTrainedTokenizerFast

from modelhost.generation.families import detect_family
from tests.tiny_models import family_templates as templates
from tests.tiny_models.common import reseed, save
from tests.tiny_models.vocab import SENTENCES, train_byte_level_bpe

CONTEXT = 2048
VOCAB_SIZE = 700
MAX_STEPS = 600
CHECK_EVERY = 10
MARGIN = 2.0  # the least gap between a target token's logit and any other's, in teacher forcing
OUTPUTS = "outputs.json"

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
# `get_weather(city: str)`, documented "Get the current weather for a city.", as two agent frameworks
# declare it (each makes a strict JSON schema of the function's signature, in its own words) and as the
# gateway gives it to the template (`Tool.model_dump(exclude_none=True)`, `strict` included): the models
# learn these prompts too, so that the frameworks' own tool loops run unchanged (tests/test_families.py).
AGENTS_SDK_WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "properties": {"city": {"title": "City", "type": "string"}},
            "required": ["city"],
            "title": "get_weather_args",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}
PYDANTIC_AI_WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "additionalProperties": False,
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "type": "object",
        },
        "strict": True,
    },
}
WEATHER_QUESTION = "What's the weather in Paris?"
WEATHER_CALL = ("get_weather", {"city": "Paris"})
WEATHER_REASONING = "The user wants the weather in Paris."
WEATHER_RESULT = "sunny"
WEATHER_ANSWER = "It is sunny in Paris."
WEATHER_RESULT_REASONING = "The tool says sunny."
CALL_ID = "functions.get_weather:0"  # Kimi K2's form of a call's ID; the other templates take any
GREETING = "Say hi"
GREETING_ANSWER = "Hello!"
GREETING_REASONING = "The user greets me."


@dataclass(frozen=True)
class Conversation:
    """One conversation the model learns: `messages` (and `tools`, `kwargs` for the template) rendered
    with the generation prompt, and `target`, the exact text the model writes after it (its end token
    included). `call`, `reasoning` and `content` say what a client should receive from it."""

    name: str
    messages: list[dict[str, Any]]
    target: str
    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    call: tuple[str, dict[str, Any]] | None = None
    reasoning: str | None = None
    content: str | None = None


def weather(
    target: str,
    reasoning: str | None = None,
    name: str = "weather",
    tool: dict[str, Any] = WEATHER_TOOL,
    **kwargs: Any,
) -> Conversation:
    """The tool conversation: a question that the `get_weather` tool (`tool`, as a client declares it)
    answers."""
    messages = [{"role": "user", "content": WEATHER_QUESTION}]
    return Conversation(name, messages, target, [tool], kwargs, call=WEATHER_CALL, reasoning=reasoning)


def tool_result(
    target: str,
    reasoning: str | None = None,
    name: str = "tool_result",
    tool: dict[str, Any] = WEATHER_TOOL,
    call_reasoning: str | None = None,
    **kwargs: Any,
) -> Conversation:
    """The tool loop's second turn: the call and its result in the conversation, the answer from it. The
    messages as the server gives them to a template (arguments as an object, the result named after its
    tool; `call_reasoning`: the call's reasoning, where the client sends it back, under both names the
    server gives it)."""
    call = {"name": WEATHER_CALL[0], "arguments": WEATHER_CALL[1]}
    assistant: dict[str, Any] = {"role": "assistant", "content": ""}
    if call_reasoning is not None:
        assistant.update(reasoning_content=call_reasoning, thinking=call_reasoning)
    assistant["tool_calls"] = [{"id": CALL_ID, "type": "function", "function": call}]
    messages = [
        {"role": "user", "content": WEATHER_QUESTION},
        assistant,
        {"role": "tool", "content": WEATHER_RESULT, "tool_call_id": CALL_ID, "name": WEATHER_CALL[0]},
    ]
    return Conversation(name, messages, target, [tool], kwargs, reasoning=reasoning, content=WEATHER_ANSWER)


def greeting(
    target: str, reasoning: str | None = None, name: str = "greeting", **kwargs: Any
) -> Conversation:
    """The plain conversation: no tools, a one-word answer."""
    messages = [{"role": "user", "content": GREETING}]
    return Conversation(name, messages, target, None, kwargs, reasoning=reasoning, content=GREETING_ANSWER)


@dataclass(frozen=True)
class FamilyModel:
    """One family's model: its architecture (the transformers model class's name, and its config class),
    the template, the tokens (`specials`: skipped in decoded text; `markup`: kept), the turn's end tokens
    (`eos`: the first is the tokenizer's) and the conversations it learns."""

    family: str
    architecture: str
    config: Callable[..., Any]
    template: str
    specials: tuple[str, ...]
    markup: tuple[str, ...]
    eos: tuple[str, ...]
    conversations: tuple[Conversation, ...]
    bos: str | None = None
    pad: str | None = None
    config_args: dict[str, Any] = field(default_factory=dict)
    detected: str = ""  # the family `detect_family` finds in the template, where not `family`


_WEATHER_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
_QWEN_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_DEEPSEEK_MARKUP = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
_DEEPSEEK_SPECIALS = ("<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
_DEEPSEEK_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
)
_DEEPSEEK_V3_SHAPE = {
    # latent attention, keys and values as wide as each other (the engine's KV cache holds both at one
    # width); vLLM's MLA takes only DeepSeek's own latent widths (320, 512, 576), and even at 576 its CPU
    # path answers otherwise than transformers: not served on vLLM here
    "head_dim": 32,  # the rotary part
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_routed_experts": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 64,
    "first_k_dense_replace": 1,
    "num_experts_per_tok": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",  # as DeepSeek-V3's config says: vLLM then loads the router's bias
    "scoring_func": "sigmoid",
}
_GPT_OSS_CALL = (
    "<|channel|>analysis<|message|>" + WEATHER_REASONING + "<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
)
_GPT_OSS_TOOL_ANSWER = (
    f"<|channel|>analysis<|message|>{WEATHER_RESULT_REASONING}<|end|>"
    f"<|start|>assistant<|channel|>final<|message|>{WEATHER_ANSWER}<|return|>"
)
_QWEN3_CALL = (
    f"<think>\n{WEATHER_REASONING}\n</think>\n\n<tool_call>\n{_WEATHER_JSON}\n</tool_call><|im_end|>"
)
_QWEN3_ANSWER = f"<think>\n{WEATHER_RESULT_REASONING}\n</think>\n\n{WEATHER_ANSWER}<|im_end|>"
_GPT_OSS_ANSWER = (
    "<|channel|>analysis<|message|>" + GREETING_REASONING + "<|end|><|start|>assistant<|channel|>final"
    "<|message|>" + GREETING_ANSWER + "<|return|>"
)

MODELS: tuple[FamilyModel, ...] = (
    FamilyModel(
        "qwen3",
        "Qwen3ForCausalLM",
        transformers.Qwen3Config,
        templates.QWEN3,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        _QWEN_TOKENS,
        ("<|im_end|>", "<|endoftext|>"),
        (
            weather(_QWEN3_CALL, WEATHER_REASONING),
            tool_result(_QWEN3_ANSWER, WEATHER_RESULT_REASONING),
            weather(_QWEN3_CALL, WEATHER_REASONING, "agents_sdk_weather", AGENTS_SDK_WEATHER_TOOL),
            tool_result(
                _QWEN3_ANSWER, WEATHER_RESULT_REASONING, "agents_sdk_tool_result", AGENTS_SDK_WEATHER_TOOL
            ),
            weather(_QWEN3_CALL, WEATHER_REASONING, "pydantic_ai_weather", PYDANTIC_AI_WEATHER_TOOL),
            tool_result(  # pydantic-ai sends the call's reasoning back
                _QWEN3_ANSWER,
                WEATHER_RESULT_REASONING,
                "pydantic_ai_tool_result",
                PYDANTIC_AI_WEATHER_TOOL,
                call_reasoning=WEATHER_REASONING,
            ),
            greeting(f"<think>\n{GREETING_REASONING}\n</think>\n\nHello!<|im_end|>", GREETING_REASONING),
            greeting("Hello!<|im_end|>", name="greeting_no_thinking", enable_thinking=False),
        ),
    ),
    FamilyModel(
        "qwen3_coder",
        "Qwen3ForCausalLM",
        transformers.Qwen3Config,
        templates.QWEN3_CODER,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        _QWEN_TOKENS,
        ("<|im_end|>", "<|endoftext|>"),
        (
            weather(
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                "</tool_call><|im_end|>"
            ),
            tool_result(f"{WEATHER_ANSWER}<|im_end|>"),
            greeting("Hello!<|im_end|>"),
        ),
    ),
    FamilyModel(
        "qwq",
        "Qwen2ForCausalLM",
        transformers.Qwen2Config,
        templates.QWQ,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        _QWEN_TOKENS,
        ("<|im_end|>", "<|endoftext|>"),
        (
            weather(
                f"{WEATHER_REASONING}\n</think>\n\n<tool_call>\n{_WEATHER_JSON}\n</tool_call><|im_end|>",
                WEATHER_REASONING,
            ),
            tool_result(
                f"{WEATHER_RESULT_REASONING}\n</think>\n\n{WEATHER_ANSWER}<|im_end|>",
                WEATHER_RESULT_REASONING,
            ),
            greeting(f"{GREETING_REASONING}\n</think>\n\nHello!<|im_end|>", GREETING_REASONING),
        ),
        detected="qwen_think",  # QwQ's template has no switch: it always thinks
    ),
    FamilyModel(
        "deepseek_r1",
        "Qwen2ForCausalLM",  # DeepSeek-R1-Distill-Qwen: Qwen2.5's architecture, R1's template and tokens
        transformers.Qwen2Config,
        templates.DEEPSEEK_R1,
        _DEEPSEEK_SPECIALS,
        ("<think>", "</think>", *_DEEPSEEK_MARKUP),
        ("<｜end▁of▁sentence｜>",),
        (
            weather(f"{WEATHER_REASONING}\n</think>\n\n{_DEEPSEEK_CALL}", WEATHER_REASONING),
            tool_result(
                f"{WEATHER_RESULT_REASONING}\n</think>\n\n{WEATHER_ANSWER}<｜end▁of▁sentence｜>",
                WEATHER_RESULT_REASONING,
            ),
            greeting(f"{GREETING_REASONING}\n</think>\n\nHello!<｜end▁of▁sentence｜>", GREETING_REASONING),
        ),
        bos="<｜begin▁of▁sentence｜>",
    ),
    FamilyModel(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        transformers.DeepseekV3Config,
        templates.DEEPSEEK_V3,
        _DEEPSEEK_SPECIALS,
        _DEEPSEEK_MARKUP,
        ("<｜end▁of▁sentence｜>",),
        (
            weather(_DEEPSEEK_CALL),
            tool_result(f"{WEATHER_ANSWER}<｜end▁of▁sentence｜>"),
            greeting("Hello!<｜end▁of▁sentence｜>"),
        ),
        bos="<｜begin▁of▁sentence｜>",
        config_args=_DEEPSEEK_V3_SHAPE,
    ),
    FamilyModel(
        "deepseek_v31",
        "DeepseekV3ForCausalLM",
        transformers.DeepseekV3Config,
        templates.DEEPSEEK_V31,
        _DEEPSEEK_SPECIALS,
        ("<think>", "</think>", *_DEEPSEEK_MARKUP),
        ("<｜end▁of▁sentence｜>",),
        (
            weather(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
            ),
            tool_result(f"{WEATHER_ANSWER}<｜end▁of▁sentence｜>"),
            greeting("Hello!<｜end▁of▁sentence｜>"),
            greeting(
                f"{GREETING_REASONING}</think>Hello!<｜end▁of▁sentence｜>",
                GREETING_REASONING,
                name="greeting_thinking",
                thinking=True,
            ),
        ),
        bos="<｜begin▁of▁sentence｜>",
        config_args=_DEEPSEEK_V3_SHAPE,
    ),
    FamilyModel(
        "kimi_k2",
        "DeepseekV3ForCausalLM",  # Kimi K2 is DeepSeek V3's architecture
        transformers.DeepseekV3Config,
        templates.KIMI_K2,
        ("[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"),
        (
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ),
        ("<|im_end|>", "[EOS]"),
        (
            weather(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
                "<|im_end|>"
            ),
            tool_result(f"{WEATHER_ANSWER}<|im_end|>"),
            greeting("Hello!<|im_end|>"),
        ),
        config_args=_DEEPSEEK_V3_SHAPE,
    ),
    FamilyModel(
        "gpt_oss",
        "GptOssForCausalLM",
        transformers.GptOssConfig,
        templates.GPT_OSS,
        # harmony's tokens are special in o200k_harmony: text decoded without them loses the channels
        (
            "<|endoftext|>",
            "<|return|>",
            "<|call|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
        ),
        (),
        ("<|return|>", "<|call|>", "<|endoftext|>"),
        (
            weather(_GPT_OSS_CALL, WEATHER_REASONING),
            tool_result(_GPT_OSS_TOOL_ANSWER, WEATHER_RESULT_REASONING),
            weather(_GPT_OSS_CALL, WEATHER_REASONING, "agents_sdk_weather", AGENTS_SDK_WEATHER_TOOL),
            tool_result(
                _GPT_OSS_TOOL_ANSWER,
                WEATHER_RESULT_REASONING,
                "agents_sdk_tool_result",
                AGENTS_SDK_WEATHER_TOOL,
            ),
            greeting(_GPT_OSS_ANSWER, GREETING_REASONING),
            greeting(
                _GPT_OSS_ANSWER.replace(GREETING_REASONING, "Greet."),
                "Greet.",
                name="greeting_low_effort",
                reasoning_effort="low",
            ),
        ),
        config_args={
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "sliding_window": CONTEXT,
            # gpt-oss's YaRN, its factor over a 64-token original context (vLLM's gpt-oss reads it)
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
                "rope_theta": 150000.0,
            },
        },
    ),
    FamilyModel(
        "llama3",
        "LlamaForCausalLM",
        transformers.LlamaConfig,
        templates.LLAMA3,
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        (),
        ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        (
            weather('{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'),
            tool_result(f"{WEATHER_ANSWER}<|eot_id|>"),
            greeting("Hello!<|eot_id|>"),
        ),
        bos="<|begin_of_text|>",
        pad="<|end_of_text|>",
    ),
    FamilyModel(
        "llama4",
        "Llama4ForCausalLM",
        transformers.Llama4TextConfig,
        templates.LLAMA4,
        ("<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>"),
        (),
        ("<|eot|>", "<|eom|>", "<|end_of_text|>"),
        (
            weather('[get_weather(city="Paris")]<|eot|>'),
            tool_result(f"{WEATHER_ANSWER}<|eot|>"),
            greeting("Hello!<|eot|>"),
        ),
        bos="<|begin_of_text|>",
        pad="<|end_of_text|>",
        config_args={
            "num_local_experts": 1,
            "intermediate_size_mlp": 128,
            "interleave_moe_layer_step": 1,
            "attention_chunk_size": CONTEXT,
        },
        # its template is vLLM's pythonic one for Llama 4 (Meta's published one asks for JSON calls)
        detected="pythonic",
    ),
    FamilyModel(
        "mistral",
        "MistralForCausalLM",
        transformers.MistralConfig,
        templates.MISTRAL,
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
        # [TOOL_CALLS] is a control token of Mistral's tokenizer; kept in the text here, as our parser
        # reads text (vLLM's turns `skip_special_tokens` off for it)
        ("[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        ("</s>",),
        (
            weather(f"[TOOL_CALLS] [{_WEATHER_JSON}]</s>"),
            tool_result(f"{WEATHER_ANSWER}</s>"),
            greeting("Hello!</s>"),
        ),
        bos="<s>",
        pad="<unk>",
    ),
    FamilyModel(
        "mistral_v11",
        "MistralForCausalLM",
        transformers.MistralConfig,
        templates.MISTRAL_V11,
        (
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
        ),
        ("[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        ("</s>",),
        (
            weather('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'),
            tool_result(f"{WEATHER_ANSWER}</s>"),
            greeting("Hello!</s>"),
        ),
        bos="<s>",
        pad="<unk>",
        detected="mistral",  # one family, one parser for both tokenizer generations
    ),
    FamilyModel(
        "glm45",
        "Glm4MoeForCausalLM",
        transformers.Glm4MoeConfig,
        templates.GLM45,
        ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        (*_QWEN_TOKENS, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        ("<|endoftext|>", "<|user|>", "<|observation|>"),
        (
            weather(
                f"\n<think>{WEATHER_REASONING}</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                "<arg_value>Paris</arg_value>\n</tool_call><|observation|>",
                WEATHER_REASONING,
            ),
            tool_result(
                f"\n<think>{WEATHER_RESULT_REASONING}</think>\n{WEATHER_ANSWER}<|user|>",
                WEATHER_RESULT_REASONING,
            ),
            greeting(f"\n<think>{GREETING_REASONING}</think>\nHello!<|user|>", GREETING_REASONING),
            greeting("\nHello!<|user|>", name="greeting_no_thinking", enable_thinking=False),
        ),
        config_args={
            "n_routed_experts": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 64,
            "first_k_dense_replace": 1,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    FamilyModel(
        "granite",
        "GraniteForCausalLM",
        transformers.GraniteConfig,
        templates.GRANITE,
        ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"),
        ("<|tool_call|>",),
        ("<|end_of_text|>",),
        (
            weather(f"<|tool_call|>[{_WEATHER_JSON}]<|end_of_text|>"),
            tool_result(f"{WEATHER_ANSWER}<|end_of_text|>"),
            greeting("Hello!<|end_of_text|>"),
            greeting(
                f"Here is my thought process:\n{GREETING_REASONING}\n\n"
                "Here is my response:\nHello!<|end_of_text|>",
                GREETING_REASONING,
                name="greeting_thinking",
                thinking=True,
            ),
        ),
    ),
    FamilyModel(
        "phi4_mini",
        "Phi3ForCausalLM",
        transformers.Phi3Config,
        templates.PHI4_MINI,
        ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>"),
        (),
        ("<|end|>", "<|endoftext|>"),
        (
            weather(f"functools[{_WEATHER_JSON}]<|end|>"),
            tool_result(f"{WEATHER_ANSWER}<|end|>"),
            greeting("Hello!<|end|>"),
        ),
    ),
    FamilyModel(
        "gemma3",
        "Gemma3ForCausalLM",
        transformers.Gemma3TextConfig,
        templates.GEMMA3,
        ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        ("<end_of_turn>", "<eos>"),
        (
            weather(f"<tool_call>\n{_WEATHER_JSON}\n</tool_call><end_of_turn>"),
            tool_result(f"{WEATHER_ANSWER}<end_of_turn>"),
            greeting("Hello!<end_of_turn>"),
        ),
        bos="<bos>",
        config_args={"sliding_window": CONTEXT, "query_pre_attn_scalar": 64},
        detected="hermes",  # Gemma 3's own template teaches no tool format: this one teaches hermes's
    ),
)

MODEL_NAMES: tuple[str, ...] = tuple(model.family for model in MODELS)


def model_named(family: str) -> FamilyModel:
    return next(model for model in MODELS if model.family == family)


# ---------------------------------------------------------------- tokenizer


def family_tokenizer(spec: FamilyModel) -> PreTrainedTokenizerFast:
    """The family's tokenizer: a byte-level BPE (the specials first, so the first is ID 0), learnt from
    `SENTENCES` and the family's own rendered conversations, with the markup as added tokens."""
    bootstrap = _wrap(spec, train_byte_level_bpe(VOCAB_SIZE, spec.specials))
    texts = [*SENTENCES]
    for conversation in spec.conversations:
        texts += [render(bootstrap, conversation), conversation.target]
    return _wrap(spec, train_byte_level_bpe(VOCAB_SIZE, spec.specials, texts))


def _wrap(spec: FamilyModel, bpe: Any) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=spec.eos[0],
        pad_token=spec.pad or spec.specials[0],
        bos_token=spec.bos,
        unk_token=None,
        model_max_length=CONTEXT,
    )
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in spec.markup])
    tokenizer.chat_template = spec.template
    return tokenizer


def render(tokenizer: PreTrainedTokenizerFast, conversation: Conversation) -> str:
    """The prompt of `conversation` as a server renders it (the generation prompt added)."""
    text: str = tokenizer.apply_chat_template(
        conversation.messages,
        tools=conversation.tools,
        add_generation_prompt=True,
        tokenize=False,
        **conversation.kwargs,
    )
    return text


# ---------------------------------------------------------------- model and training


def family_config(spec: FamilyModel, tokenizer: PreTrainedTokenizerFast) -> Any:
    """Two layers of width 64 with one head of 64: a head as wide as the model, since vLLM's Qwen2 takes
    the head's width from them (hidden / heads), not from `head_dim`."""
    eos = [tokenizer.convert_tokens_to_ids(token) for token in spec.eos]
    shape = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": True,
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    return spec.config(**{**shape, **spec.config_args})


def _examples(tokenizer: PreTrainedTokenizerFast, spec: FamilyModel) -> list[tuple[list[int], list[int]]]:
    """Each conversation as (prompt IDs, target IDs), tokenized as the server tokenizes a prompt."""
    examples = []
    for conversation in spec.conversations:
        prompt = tokenizer(render(tokenizer, conversation), add_special_tokens=False)["input_ids"]
        target = tokenizer(conversation.target, add_special_tokens=False)["input_ids"]
        examples.append((prompt, target))
    return examples


def _batch(examples: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, ...]:
    """Right-padded inputs, their attention mask and labels (-100 but on the target tokens)."""
    length = max(len(p) + len(t) for p, t in examples)
    ids = torch.full((len(examples), length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, (prompt, target) in enumerate(examples):
        whole = prompt + target
        ids[row, : len(whole)] = torch.tensor(whole)
        mask[row, : len(whole)] = 1
        labels[row, len(prompt) : len(whole)] = torch.tensor(target)
    return ids, mask, labels


def _least_margin(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Over every target token: its logit less the largest other logit (positive: greedy picks it)."""
    scores, wanted = logits[:, :-1], labels[:, 1:]
    keep = wanted != -100
    scores, wanted = scores[keep], wanted[keep]
    right = scores.gather(1, wanted[:, None])[:, 0]
    others = scores.scatter(1, wanted[:, None], float("-inf")).max(dim=1).values
    return float((right - others).min())


def train(model: Any, examples: list[tuple[list[int], list[int]]], pad: int) -> int:
    """Adam on the target tokens until every one wins by `MARGIN`; the steps it took."""
    ids, mask, labels = _batch(examples, pad)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(1, MAX_STEPS + 1):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        if step % CHECK_EVERY == 0 and _least_margin(out.logits.detach(), labels) > MARGIN:
            model.eval()
            return step
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    raise RuntimeError(f"{type(model).__name__} did not learn its conversations in {MAX_STEPS} steps")


def greedy_answer(model: Any, tokenizer: PreTrainedTokenizerFast, conversation: Conversation) -> list[int]:
    """The token IDs the model writes greedily after the conversation's prompt."""
    prompt = tokenizer(render(tokenizer, conversation), add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=128, do_sample=False)
    answer: list[int] = out[0, prompt["input_ids"].shape[1] :].tolist()
    return answer


def build_family(spec: FamilyModel, folder: Path) -> dict[str, Any]:
    """Train, check and save one family's model into `folder`; what it answers (`family_outputs`)."""
    reseed()
    tokenizer = family_tokenizer(spec)
    recognised = detect_family(spec.template, tokenizer.get_added_vocab()).name
    if recognised != (spec.detected or spec.family):
        raise RuntimeError(f"the {spec.family} template is recognised as {recognised}")
    model = getattr(transformers, spec.architecture)(family_config(spec, tokenizer))
    train(model, _examples(tokenizer, spec), int(tokenizer.pad_token_id))
    answers = {c.name: greedy_answer(model, tokenizer, c) for c in spec.conversations}
    for conversation in spec.conversations:
        answer = tokenizer.decode(answers[conversation.name], skip_special_tokens=False)
        if answer != conversation.target:
            raise RuntimeError(f"{spec.family} answers {conversation.name} with {answer!r}")
    eos = [tokenizer.convert_tokens_to_ids(token) for token in spec.eos]
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    )
    save(folder, model, tokenizer)
    return family_outputs(spec, tokenizer, answers)


def build_families(folder: Path) -> None:
    """t24: every family's model in `folder/<family>`, and what each answers in `folder/outputs.json`
    (tests/data/family_outputs.json is a copy, for the parsers' unit tests)."""
    outputs = {spec.family: build_family(spec, folder / spec.family) for spec in MODELS}
    (folder / OUTPUTS).write_text(json.dumps(outputs, indent=2, ensure_ascii=False) + "\n")


def family_outputs(
    spec: FamilyModel, tokenizer: PreTrainedTokenizerFast, answers: dict[str, list[int]]
) -> dict[str, Any]:
    """What the model answers to each conversation: the rendered prompt, the answer's text with and
    without special tokens (a parser sees the latter by default), and what a client should get from it."""
    found = detect_family(spec.template, tokenizer.get_added_vocab())
    conversations: dict[str, Any] = {}
    for conversation in spec.conversations:
        ids = answers[conversation.name]
        conversations[conversation.name] = {
            "messages": conversation.messages,
            "tools": conversation.tools,
            "chat_template_kwargs": conversation.kwargs,
            "prompt": render(tokenizer, conversation),
            "text": tokenizer.decode(ids, skip_special_tokens=False),
            "text_without_special_tokens": tokenizer.decode(ids, skip_special_tokens=True),
            "tool_call": {"name": conversation.call[0], "arguments": conversation.call[1]}
            if conversation.call
            else None,
            "reasoning": conversation.reasoning,
            "content": conversation.content,
        }
    return {
        "architecture": spec.architecture,
        "detected_family": found.name,
        "tool_parser": found.tool_parser,
        "reasoning_parser": found.reasoning_parser,
        "end_tokens": list(spec.eos),
        "conversations": conversations,
    }
