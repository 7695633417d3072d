"""Tool-call parsers: turn the tool-call markup in a model's own text into OpenAI ``tool_calls``.

With ``tool_choice: "auto"`` the model decides itself whether to call a tool, in the markup its chat
template taught it, which differs per model family (`generation.families` names each family's parser).
Parsing is forgiving: a block that does not parse, names a tool the request did not offer, or has
non-object arguments stays in the content as the model wrote it, so nothing is lost and no input makes a
parser raise. Standard library only, so the gateway parses without torch, and one implementation serves
every engine alike (why not vLLM's parsers or ``openai-harmony``: docs/generation.md "Tools").
"""

from __future__ import annotations

from modelhost.generation.tool_parsers.base import (
    ParsedOutput,
    ToolCall,
    ToolCallParser,
    Tools,
    streamable_length,
)
from modelhost.generation.tool_parsers.harmony import HARMONY
from modelhost.generation.tool_parsers.json_blocks import GRANITE, HERMES, PHI4_MINI
from modelhost.generation.tool_parsers.llama import LLAMA3_JSON, PYTHONIC
from modelhost.generation.tool_parsers.mistral import MISTRAL
from modelhost.generation.tool_parsers.sections import DEEPSEEK_V3, DEEPSEEK_V31, KIMI_K2
from modelhost.generation.tool_parsers.xml import GLM45, QWEN3_XML

PARSERS: dict[str, ToolCallParser] = {
    parser.name: parser
    for parser in (
        HERMES,
        QWEN3_XML,
        LLAMA3_JSON,
        PYTHONIC,
        MISTRAL,
        DEEPSEEK_V3,
        DEEPSEEK_V31,
        GLM45,
        KIMI_K2,
        GRANITE,
        PHI4_MINI,
        HARMONY,
    )
}

__all__ = ["PARSERS", "ParsedOutput", "ToolCall", "ToolCallParser", "Tools", "streamable_length"]
