"""The chat templates of the trained family models (`families`), each written in its family's published
format, shortened: the same special tokens, role headers, tool listing and tool-call markup as the
family's own template (or, where that lists no tools, as vLLM's example template for it), so that
`detect_family` recognises it as the real one and the model learns to write what the real one does.

Dates are fixed (the real templates take today's date): a prompt renders the same every day, so the
trained answers stay the greedy ones. Lines are as long as the families' own: a template's text is its
output, and splitting a string literal across lines would change what the model sees.
"""

# ruff: noqa: E501

from __future__ import annotations

# Qwen3: ChatML; tools listed as JSON lines inside <tools>, calls as JSON inside <tool_call>; the model
# thinks inside <think> unless `enable_thinking` is false, which writes an empty thought into the prompt.
# An assistant turn after the last user turn keeps its reasoning (a tool-calling loop), earlier ones not.
QWEN3 = r"""
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content or '' -%}
        {%- set reasoning = message.reasoning_content or '' -%}
        {%- if '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > ns.last_user and reasoning -%}
            {{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- content -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' -}}
            {{- call.function.arguments if call.function.arguments is string else call.function.arguments | tojson -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""

# Qwen3-Coder: ChatML; tools listed in XML, each call an XML <function=...> with <parameter=...> blocks.
QWEN3_CODER = r"""
{%- macro render_calls(calls) -%}
    {%- for call in calls -%}
        {{- '<tool_call>\n<function=' + call.function.name + '>\n' -}}
        {%- for name, value in call.function.arguments.items() -%}
            {{- '<parameter=' + name + '>\n' + (value if value is string else value | tojson) + '\n</parameter>\n' -}}
        {%- endfor -%}
        {{- '</function>\n</tool_call>' -}}
    {%- endfor -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
    {%- for tool in tools -%}
        {%- set function = tool.function -%}
        {{- '\n<function>\n<name>' + function.name + '</name>' -}}
        {%- if function.description -%}{{- '\n<description>' + function.description + '</description>' -}}{%- endif -%}
        {{- '\n<parameters>' -}}
        {%- for name, schema in (function.parameters.properties or {}).items() -%}
            {{- '\n<parameter>\n<name>' + name + '</name>' -}}
            {%- if schema.type -%}{{- '\n<type>' + schema.type + '</type>' -}}{%- endif -%}
            {%- if schema.enum -%}{{- '\n<enum>' + (schema.enum | tojson) + '</enum>' -}}{%- endif -%}
            {{- '\n</parameter>' -}}
        {%- endfor -%}
        {%- if function.parameters.required -%}{{- '\n<required>' + (function.parameters.required | tojson) + '</required>' -}}{%- endif -%}
        {{- '\n</parameters>\n</function>' -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + (message.content or '') -}}
        {%- if message.tool_calls -%}{{- ('\n' if message.content else '') + render_calls(message.tool_calls) -}}{%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# DeepSeek-R1 (and its Qwen / Llama distills): <｜User｜> / <｜Assistant｜> turns after the system text;
# the generation prompt opens the thought (`<think>\n`), which the model closes itself. Calls in DeepSeek
# V3's markup; the tool listing follows vLLM's example template for R1 (R1's own lists none). Earlier
# assistant turns lose their reasoning, as R1's template does.
_DEEPSEEK_TOOLS = r"""
{%- if tools -%}
    {{- '\n\n## Tools\n\n### Function\n\nYou have the following functions available:\n' -}}
    {%- for tool in tools -%}
        {{- '\n- `' + tool.function.name + '`:\n```json\n' + (tool.function | tojson) + '\n```' -}}
    {%- endfor -%}
    {{- '\n\nCall a function as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>' -}}
{%- endif -%}
"""
_DEEPSEEK_TURNS = r"""
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<｜User｜>' + message.content -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = (message.content or '').split('</think>')[-1].lstrip('\n') -%}
        {{- '<｜Assistant｜>' + content -}}
        {%- if message.tool_calls -%}
            {{- '<｜tool▁calls▁begin｜>' -}}
            {%- for call in message.tool_calls -%}
                {{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + call.function.name + '\n```json\n' + (call.function.arguments | tojson) + '\n```<｜tool▁call▁end｜>' -}}
            {%- endfor -%}
            {{- '<｜tool▁calls▁end｜>' -}}
        {%- endif -%}
        {{- '<｜end▁of▁sentence｜>' -}}
    {%- elif message.role == 'tool' -%}
        {%- if messages[loop.index0 - 1].role != 'tool' -%}{{- '<｜tool▁outputs▁begin｜>' -}}{%- endif -%}
        {{- '<｜tool▁output▁begin｜>' + message.content + '<｜tool▁output▁end｜>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
"""
_DEEPSEEK_SYSTEM = r"""
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}{%- if message.role == 'system' -%}{%- set ns.system = message.content -%}{%- endif -%}{%- endfor -%}
{{- bos_token + ns.system -}}
"""
DEEPSEEK_R1 = (
    _DEEPSEEK_SYSTEM
    + _DEEPSEEK_TOOLS
    + _DEEPSEEK_TURNS
    + r"""
{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\n' -}}{%- endif -%}
"""
)
# DeepSeek-V3: the same turns and calls, no thought.
DEEPSEEK_V3 = (
    _DEEPSEEK_SYSTEM
    + _DEEPSEEK_TOOLS
    + _DEEPSEEK_TURNS
    + r"""
{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}
"""
)

# Kimi K2: tools declared as one JSON list in a `tool_declare` system turn; each call is
# `functions.NAME:INDEX` then its JSON arguments, inside the tool-calls section.
KIMI_K2 = r"""
{%- if tools -%}{{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson) + '<|im_end|>' -}}{%- endif -%}
{%- if messages[0].role != 'system' -%}
    {{- '<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {{- '<|im_system|>system<|im_middle|>' + message.content + '<|im_end|>' -}}
    {%- elif message.role == 'user' -%}
        {{- '<|im_user|>user<|im_middle|>' + message.content + '<|im_end|>' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_assistant|>assistant<|im_middle|>' + (message.content or '') -}}
        {%- if message.tool_calls -%}
            {{- '<|tool_calls_section_begin|>' -}}
            {%- for call in message.tool_calls -%}
                {{- '<|tool_call_begin|>' + call.id + '<|tool_call_argument_begin|>' + (call.function.arguments | tojson) + '<|tool_call_end|>' -}}
            {%- endfor -%}
            {{- '<|tool_calls_section_end|>' -}}
        {%- endif -%}
        {{- '<|im_end|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_system|>tool<|im_middle|>## Return of ' + message.tool_call_id + '\n' + message.content + '<|im_end|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}
"""

# gpt-oss: OpenAI's harmony format. A system message with the reasoning effort, a developer message with
# the instructions and the tools as a TypeScript namespace; the model writes its reasoning on the
# `analysis` channel, calls on `commentary` addressed `to=functions.NAME`, and its answer on `final`.
GPT_OSS = r"""
{%- macro ts_type(schema) -%}
    {%- if schema.enum -%}{{- schema.enum | map('tojson') | join(' | ') -}}
    {%- elif schema.type == 'string' -%}{{- 'string' -}}
    {%- elif schema.type in ['integer', 'number'] -%}{{- 'number' -}}
    {%- elif schema.type == 'boolean' -%}{{- 'boolean' -}}
    {%- else -%}{{- 'any' -}}{%- endif -%}
{%- endmacro -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: ' + (reasoning_effort | default('medium')) + '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- '<|end|>' -}}
{%- set developer = messages[0].content if messages[0].role in ['system', 'developer'] else '' -%}
{%- if developer or tools -%}
    {{- '<|start|>developer<|message|>' -}}
    {%- if developer -%}{{- '# Instructions\n\n' + developer + '\n\n' -}}{%- endif -%}
    {%- if tools -%}
        {{- '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
        {%- for tool in tools -%}
            {%- set function = tool.function -%}
            {%- if function.description -%}{{- '// ' + function.description + '\n' -}}{%- endif -%}
            {{- 'type ' + function.name + ' = (_: {\n' -}}
            {%- for name, schema in (function.parameters.properties or {}).items() -%}
                {{- name + ('' if name in (function.parameters.required or []) else '?') + ': ' + ts_type(schema) + ',\n' -}}
            {%- endfor -%}
            {{- '}) => any;\n\n' -}}
        {%- endfor -%}
        {{- '} // namespace functions' -}}
    {%- endif -%}
    {{- '<|end|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<|start|>user<|message|>' + message.content + '<|end|>' -}}
    {%- elif message.role == 'assistant' -%}
        {%- if message.thinking or message.reasoning_content -%}
            {{- '<|start|>assistant<|channel|>analysis<|message|>' + (message.thinking or message.reasoning_content) + '<|end|>' -}}
        {%- endif -%}
        {%- for call in message.tool_calls or [] -%}
            {{- '<|start|>assistant<|channel|>commentary to=functions.' + call.function.name + ' <|constrain|>json<|message|>' + (call.function.arguments | tojson) + '<|call|>' -}}
        {%- endfor -%}
        {%- if message.content -%}
            {{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' -}}
        {%- endif -%}
    {%- elif message.role == 'tool' -%}
        {{- '<|start|>functions.' + message.name + ' to=assistant<|channel|>commentary<|message|>' + message.content + '<|end|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
"""

# Llama 3.1: the date header, `Environment: ipython` with tools, the tools (indented JSON) in the first
# user turn with the instruction to answer a call as {"name", "parameters"}; tool results as `ipython`.
LLAMA3 = r"""
{{- bos_token -}}
{%- if messages[0].role == 'system' -%}
    {%- set system_message = messages[0].content -%}{%- set messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = '' -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' + system_message + '<|eot_id|>' -}}
{%- if tools and messages -%}
    {{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' -}}
    {%- for tool in tools -%}{{- (tool | tojson(indent=4)) + '\n\n' -}}{%- endfor -%}
    {{- messages[0].content + '<|eot_id|>' -}}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'assistant' and message.tool_calls -%}
        {%- set call = message.tool_calls[0].function -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + call.name + '", "parameters": ' + (call.arguments | tojson) + '}<|eot_id|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' -}}
    {%- else -%}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content or '') + '<|eot_id|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""

# Llama 4 with pythonic calls (vLLM's llama4_pythonic example template, shortened): the tools listed as
# JSON in the system turn, calls written as a Python list of calls.
LLAMA4 = r"""
{{- bos_token -}}
{%- set system_message = messages[0].content if messages[0].role == 'system' else '' -%}
{%- if system_message or tools -%}
    {{- '<|header_start|>system<|header_end|>\n\n' + system_message -}}
    {%- if tools -%}
        {{- ('\n\n' if system_message else '') + 'You can invoke functions. If you decide to invoke any of the function(s), put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. Here is a list of functions in JSON format that you can invoke.\n\n' -}}
        {%- for tool in tools -%}{{- (tool.function | tojson) + '\n' -}}{%- endfor -%}
    {%- endif -%}
    {{- '<|eot|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<|header_start|>user<|header_end|>\n\n' + message.content + '<|eot|>' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|header_start|>assistant<|header_end|>\n\n' + (message.content or '') -}}
        {%- if message.tool_calls -%}
            {{- '[' -}}
            {%- for call in message.tool_calls -%}
                {{- call.function.name + '(' -}}
                {%- for name, value in call.function.arguments.items() -%}
                    {{- name + '=' + (value | tojson) + (', ' if not loop.last else '') -}}
                {%- endfor -%}
                {{- ')' + (', ' if not loop.last else '') -}}
            {%- endfor -%}
            {{- ']' -}}
        {%- endif -%}
        {{- '<|eot|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|header_start|>ipython<|header_end|>\n\n' + message.content + '<|eot|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|header_start|>assistant<|header_end|>\n\n' -}}{%- endif -%}
"""

# Mistral (v0.3 tokenizer): the tools as a JSON list in [AVAILABLE_TOOLS] before the last user turn, the
# system text before that turn's text, calls as [TOOL_CALLS] and a JSON list of calls.
MISTRAL = r"""
{{- bos_token -}}
{%- set system_message = messages[0].content if messages[0].role == 'system' else '' -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {%- if tools and loop.index0 == ns.last_user -%}
            {{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}
        {%- endif -%}
        {%- if system_message and loop.index0 == ns.last_user -%}
            {{- '[INST] ' + system_message + '\n\n' + message.content + '[/INST]' -}}
        {%- else -%}
            {{- '[INST] ' + message.content + '[/INST]' -}}
        {%- endif -%}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- '[TOOL_CALLS] [' -}}
        {%- for call in message.tool_calls -%}
            {{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + ', "id": "' + call.id + '"}' + (', ' if not loop.last else '') -}}
        {%- endfor -%}
        {{- ']' + eos_token -}}
    {%- elif message.role == 'assistant' -%}
        {{- ' ' + message.content + eos_token -}}
    {%- elif message.role == 'tool' -%}
        {{- '[TOOL_RESULTS] {"content": ' + (message.content | tojson) + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' -}}
    {%- endif -%}
{%- endfor -%}
"""

# GLM-4.5: [gMASK]<sop>, role tokens without turn ends, the tools as JSON lines inside <tools>, calls as
# <tool_call>NAME then <arg_key>/<arg_value> pairs; reasoning inside <think>, which `enable_thinking`
# false leaves empty in the prompt. A call ends the turn with <|observation|>, an answer with <|user|>.
GLM45 = r"""
{{- '[gMASK]<sop>' -}}
{%- if tools -%}
    {{- '<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' -}}
    {%- for tool in tools -%}{{- (tool | tojson) + '\n' -}}{%- endfor -%}
    {{- '</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {{- '<|system|>\n' + message.content -}}
    {%- elif message.role == 'user' -%}
        {{- '<|user|>\n' + message.content -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = message.content or '' -%}
        {%- set reasoning = message.reasoning_content or '' -%}
        {%- if '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1] -%}
        {%- endif -%}
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > ns.last_user and reasoning -%}
            {{- '\n<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '\n<think></think>' -}}
        {%- endif -%}
        {%- if content.strip() -%}{{- '\n' + content.strip() -}}{%- endif -%}
        {%- for call in message.tool_calls or [] -%}
            {{- '\n<tool_call>' + call.function.name + '\n' -}}
            {%- for name, value in call.function.arguments.items() -%}
                {{- '<arg_key>' + name + '</arg_key>\n<arg_value>' + (value if value is string else value | tojson) + '</arg_value>\n' -}}
            {%- endfor -%}
            {{- '</tool_call>' -}}
        {%- endfor -%}
    {%- elif message.role == 'tool' -%}
        {%- if messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
"""

# Granite 3.2: <|start_of_role|>ROLE<|end_of_role|>...<|end_of_text|> turns, the default system text
# naming the tools and the thinking mode (`thinking`: "Here is my thought process:" then "Here is my
# response:"), the tools as indented JSON in an `available_tools` turn, calls as <|tool_call|> and a
# JSON list.
GRANITE = r"""
{%- if messages[0].role == 'system' -%}
    {%- set system_message = messages[0].content -%}{%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\nToday's Date: April 1, 2025.\nYou are Granite, developed by IBM." -%}
    {%- if tools -%}
        {%- set system_message = system_message + " You are a helpful AI assistant with access to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed by a JSON list of tools used." -%}
    {%- endif -%}
    {%- if thinking is defined and thinking -%}
        {%- set system_message = system_message + " Respond to every user query in a comprehensive and detailed way. You can write down your thoughts and reasoning process before responding. Write your thoughts after 'Here is my thought process:' and write your response after 'Here is my response:' for each user query." -%}
    {%- endif -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' -}}
{%- if tools -%}
    {{- '<|start_of_role|>available_tools<|end_of_role|>' -}}
    {%- for tool in tools -%}{{- (tool | tojson(indent=4)) + ('\n\n' if not loop.last else '') -}}{%- endfor -%}
    {{- '<|end_of_text|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message.role == 'assistant' and message.tool_calls -%}
        {{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>[' -}}
        {%- for call in message.tool_calls -%}
            {{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}' + (', ' if not loop.last else '') -}}
        {%- endfor -%}
        {{- ']<|end_of_text|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|start_of_role|>tool_response<|end_of_role|>' + message.content + '<|end_of_text|>\n' -}}
    {%- else -%}
        {{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + (message.content or '') + '<|end_of_text|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}{%- endif -%}
"""

# Phi-4-mini: <|role|>...<|end|> turns, the tools as JSON between <|tool|> and <|/tool|> in the system
# turn, calls written as `functools` and a JSON list.
PHI4_MINI = r"""
{%- set system_message = messages[0].content if messages[0].role == 'system' else ('You are a helpful assistant with some tools.' if tools else '') -%}
{%- if system_message -%}
    {{- '<|system|>' + system_message -}}
    {%- if tools -%}{{- ' To call them, answer functools[{"name": ..., "arguments": {...}}].<|tool|>' + (tools | tojson) + '<|/tool|>' -}}{%- endif -%}
    {{- '<|end|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<|user|>' + message.content + '<|end|>' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|assistant|>' + (message.content or '') -}}
        {%- if message.tool_calls -%}
            {{- 'functools[' -}}
            {%- for call in message.tool_calls -%}
                {{- '{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}' + (', ' if not loop.last else '') -}}
            {%- endfor -%}
            {{- ']' -}}
        {%- endif -%}
        {{- '<|end|>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|tool|>' + message.content + '<|end|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}
"""

# Gemma 3: <start_of_turn>user / model turns, the system text folded into the first user turn. Its own
# template teaches no tool format; this one adds the hermes listing and <tool_call> blocks there, as the
# community's tool-calling Gemma 3 templates do (no other family's markers: served with the hermes parser).
GEMMA3 = r"""
{{- bos_token -}}
{%- if messages[0].role == 'system' -%}
    {%- set prefix = messages[0].content + '\n\n' -%}{%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set prefix = '' -%}{%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
    {%- set listing = namespace(text='# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>') -%}
    {%- for tool in tools -%}{%- set listing.text = listing.text + '\n' + (tool | tojson) -%}{%- endfor -%}
    {%- set prefix = prefix + listing.text + '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.\n\n' -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message.role == 'user' -%}
        {{- '<start_of_turn>user\n' + (prefix if loop.first else '') + message.content + '<end_of_turn>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<start_of_turn>model\n' + (message.content or '') -}}
        {%- for call in message.tool_calls or [] -%}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<end_of_turn>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<start_of_turn>user\n<tool_response>\n' + message.content + '\n</tool_response><end_of_turn>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""

# QwQ (and Hermes 4's thinking templates): Qwen2.5's ChatML and hermes calls; the generation prompt opens
# the thought (`<think>\n`), which cannot be switched off. Earlier answers lose their reasoning.
QWQ = r"""
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set content = (message.content or '').split('</think>')[-1].lstrip('\n') -%}
        {{- '<|im_start|>assistant\n' + content -}}
        {%- for call in message.tool_calls or [] -%}
            {{- ('\n' if content or not loop.first else '') + '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}{%- endif -%}
"""

# DeepSeek-V3.1: R1's turns, tools listed by name with their parameters' schema, calls as NAME<｜tool▁sep｜>
# JSON (no `function` type, no code fence); `thinking` opens the thought in the prompt, else it is closed.
DEEPSEEK_V31 = (
    _DEEPSEEK_SYSTEM
    + r"""
{%- if tools -%}
    {{- '\n\n## Tools\nYou have access to the following tools:\n' -}}
    {%- for tool in tools -%}
        {{- '\n### ' + tool.function.name + '\nDescription: ' + (tool.function.description or '') + '\n\nParameters: ' + (tool.function.parameters | tojson) + '\n' -}}
    {%- endfor -%}
    {{- '\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<｜User｜>' + message.content -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<｜Assistant｜></think>' + (message.content or '').split('</think>')[-1] -}}
        {%- if message.tool_calls -%}
            {{- '<｜tool▁calls▁begin｜>' -}}
            {%- for call in message.tool_calls -%}
                {{- '<｜tool▁call▁begin｜>' + call.function.name + '<｜tool▁sep｜>' + (call.function.arguments | tojson) + '<｜tool▁call▁end｜>' -}}
            {%- endfor -%}
            {{- '<｜tool▁calls▁end｜>' -}}
        {%- endif -%}
        {{- '<｜end▁of▁sentence｜>' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<｜tool▁output▁begin｜>' + message.content + '<｜tool▁output▁end｜>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<｜Assistant｜>' + ('<think>' if thinking is defined and thinking else '</think>') -}}
{%- endif -%}
"""
)

# Mistral with the newer (v11+) tokenizer (Mistral Small 3.2, Magistral, Devstral): a [SYSTEM_PROMPT]
# turn, and each call written as [TOOL_CALLS]NAME[ARGS]JSON.
MISTRAL_V11 = r"""
{{- bos_token -}}
{%- if messages[0].role == 'system' -%}{{- '[SYSTEM_PROMPT]' + messages[0].content + '[/SYSTEM_PROMPT]' -}}{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {%- if tools and loop.index0 == ns.last_user -%}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}
        {{- '[INST]' + message.content + '[/INST]' -}}
    {%- elif message.role == 'assistant' -%}
        {{- message.content or '' -}}
        {%- for call in message.tool_calls or [] -%}
            {{- '[TOOL_CALLS]' + call.function.name + '[ARGS]' + (call.function.arguments | tojson) -}}
        {%- endfor -%}
        {{- eos_token -}}
    {%- elif message.role == 'tool' -%}
        {{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' -}}
    {%- endif -%}
{%- endfor -%}
"""
