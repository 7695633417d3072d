"""OpenAI requests as the engine requests of their choices, and one choice assembled from the engine's
events: the generation logic every front-end shares.

Plain Python between the wire types (`protocol.chat`) and the engine: a chat or completions request
becomes one engine request per choice (n), with the grammar of its tools or JSON schema; `ChatChoice`
assembles a choice from the engine's events, for a whole answer or as streamed deltas. Tool calls come
either from constrained decoding (`required`, a named tool: the output is a call by construction) or
from parsing the model's own markup (`auto`). Not the chat family's module (that is `protocol.chat`,
`api.routes.chat`, `serving.chat`): chat and text completions, the Messages and Responses APIs and agent
runs all build on it, through `frontend.Generation`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec

from modelhost.errors import InvalidRequest
from modelhost.generation.contract import (
    GenerationEvent,
    GenerationRequest,
    GenerationStarted,
    Logprob,
    Sampling,
    Text,
    TokenLogprob,
)
from modelhost.generation.grammar import json_schema_grammar, split_tool_call, tool_call_grammar
from modelhost.generation.priority import numeric_priority
from modelhost.generation.reasoning import REASONING_PARSERS, ReasoningParser
from modelhost.generation.structured import structured_grammar
from modelhost.generation.tool_parsers import PARSERS, streamable_length
from modelhost.protocol.chat import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ImageURLPart,
    Message,
    NamedFunction,
    NamedToolChoice,
    RefusalPart,
    TextPart,
    TokenizeCompletionRequest,
    TokenizeRequest,
    Tool,
    ToolCallIn,
)

Event = dict[str, Any]
ToolChoice = str | NamedToolChoice


# ---------------------------------------------------------------- requests


def chat_requests(
    body: ChatCompletionRequest,
    max_string_length: int,
    effort_param: str = "reasoning_effort",
    format_param: str = "response_format",
    effort_optional: bool = False,
) -> tuple[list[GenerationRequest], str]:
    """The engine requests of a chat completion (one per choice) and its tool mode:
    `none` (plain text), `auto` (parse markup), `forced` (constrained call) or `json`. `effort_param`:
    the field a reasoning effort the model cannot honour is reported on (the replica knows the family);
    `format_param`: the field the JSON schema came in, which its errors name; `effort_optional`: a family
    without a reasoning switch ignores the effort rather than refusing it (the Messages API's
    `thinking`)."""
    tools, choice = effective_tools(body)
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true.", param="top_logprobs")
    messages, image_urls = _template_messages(body.messages)
    # the serving reads `image_urls` (into `images`) before the worker sees the request
    request = GenerationRequest(
        messages=messages,
        chat_template_kwargs=body.chat_template_kwargs or {},
        image_urls=image_urls,
        affinity=body.prompt_cache_key or body.user,
        priority=numeric_priority(body.service_tier, body.priority),
        low=body.service_tier == "flex",
    )
    if body.reasoning_effort is not None:
        request.reasoning_effort = body.reasoning_effort
        request.reasoning_effort_param = effort_param
        request.reasoning_effort_optional = effort_optional
    mode = "none"
    if tools and choice != "none":
        request.tools = [t.model_dump(exclude_none=True) for t in tools]
        mode = "auto"
        if choice == "required" or isinstance(choice, NamedToolChoice):
            wanted = choice.function.name if isinstance(choice, NamedToolChoice) else None
            allowed = [(t.function.name, t.function.parameters or {}) for t in tools]
            allowed = [a for a in allowed if wanted is None or a[0] == wanted]
            request.grammar = tool_call_grammar(allowed, max_string_length)
            request.grammar_param = "tools"
            mode = "forced"
    if mode != "forced" and body.response_format is not None and body.response_format.type != "text":
        spec = body.response_format.json_schema
        schema = (spec.schema_ if spec else None) or {"type": "object"}
        strict = bool(spec and spec.strict)
        request.grammar = json_schema_grammar(schema, max_string_length, strict, format_param)
        request.grammar_param = format_param
        mode = "json" if mode == "none" else mode
    structured = structured_grammar(body, max_string_length)
    if structured is not None and request.grammar is not None:
        raise InvalidRequest(
            f"{structured[1]} cannot be combined with a forced tool call or a JSON response_format "
            "(text.format): each constrains the whole output.",
            param=structured[1],
        )
    if structured is not None:
        request.grammar, request.grammar_param = structured
    params = sampling(body, body.max_completion_tokens or body.max_tokens)
    params.logprobs, params.top_logprobs = bool(body.logprobs), body.top_logprobs or 0
    return per_choice(request, params, body.n or 1, body.seed), mode


def completion_requests(body: CompletionRequest, max_string_length: int) -> list[GenerationRequest]:
    """One engine request per prompt and candidate (`best_of`, else `n`), in OpenAI's order
    (prompt-major), each with the grammar of its `structured_outputs`."""
    candidates = _candidates(body)
    prompts: list[str | list[int] | None]
    if body.prompt is None or isinstance(body.prompt, str) or isinstance(body.prompt[0], int):
        prompts = [body.prompt]
    else:
        prompts = list(body.prompt)
    if body.suffix and body.echo:
        raise InvalidRequest("echo cannot be used with suffix (insert mode).", param="suffix")
    params = sampling(body, body.max_tokens)
    wants = body.logprobs is not None
    params.logprobs = wants or candidates > (
        body.n or 1
    )  # best_of ranks candidates by their log probabilities
    params.top_logprobs = body.logprobs or 0
    params.prompt_logprobs = bool(body.echo and wants)
    grammar, grammar_param = structured_grammar(body, max_string_length) or (None, None)
    requests: list[GenerationRequest] = []
    for prompt in prompts:
        base = GenerationRequest(
            prompt=prompt,
            affinity=body.user,
            echo=bool(body.echo),
            suffix=body.suffix or None,
            grammar=grammar,
            grammar_param=grammar_param,
            priority=numeric_priority(body.service_tier, body.priority),
            low=body.service_tier == "flex",
        )
        requests += per_choice(base, params, candidates, body.seed)
    return requests


def _candidates(body: CompletionRequest) -> int:
    """Completions generated per prompt: `best_of`, which must not be below `n` nor be streamed."""
    n, best_of = body.n or 1, body.best_of or body.n or 1
    if best_of < n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({n}).", param="best_of")
    if best_of > n and body.stream:
        raise InvalidRequest(
            "best_of above n cannot be streamed (the best are known only at the end).", param="best_of"
        )
    return best_of


def tokenize_request(body: TokenizeRequest | DetokenizeRequest) -> GenerationRequest:
    """The engine request of `/tokenize` (the prompt, or the messages as a chat would render them) or
    `/detokenize`, which the replica answers with one event and no generation
    (`generation.requests.tokenized`)."""
    if isinstance(body, DetokenizeRequest):
        return GenerationRequest(detokenize=body.tokens)
    request = GenerationRequest(
        tokenize=True,
        add_special_tokens=body.add_special_tokens,
        return_token_strs=bool(body.return_token_strs),
    )
    if isinstance(body, TokenizeCompletionRequest):
        request.prompt = body.prompt
        return request
    messages, image_urls = _template_messages(body.messages)
    if image_urls:
        raise InvalidRequest("/tokenize takes text messages; image parts are not counted.", param="messages")
    request.messages = messages
    request.add_generation_prompt = body.add_generation_prompt
    request.continue_final_message = body.continue_final_message
    if body.tools:
        request.tools = [t.model_dump(exclude_none=True) for t in body.tools]
    request.chat_template_kwargs = body.chat_template_kwargs or {}
    return request


def effective_tools(body: ChatCompletionRequest) -> tuple[list[Tool], ToolChoice]:
    """The tools a chat request offers and how it wants them called (`none`, `auto`, `required` or a
    named tool), with the deprecated `functions` / `function_call` and an `allowed_tools` choice
    resolved. Rules across fields are 400s naming the field to fix."""
    tools, given, param = list(body.tools or []), body.tool_choice, "tool_choice"
    if body.functions is not None:
        if body.tools is not None:
            raise InvalidRequest("Send tools or the deprecated functions, not both.", param="functions")
        if body.tool_choice is not None:
            raise InvalidRequest("With functions, choose with function_call.", param="tool_choice")
        tools = [Tool(type="function", function=f) for f in body.functions]
        call = body.function_call
        given = NamedToolChoice(type="function", function=call) if isinstance(call, NamedFunction) else call
        param = "function_call"
    elif body.function_call is not None:
        raise InvalidRequest("function_call needs functions (tools take tool_choice).", param="function_call")
    if given is not None and not tools:
        raise InvalidRequest(f"{param} needs tools.", param=param)
    names = {t.function.name for t in tools}
    if isinstance(given, AllowedToolsChoice):
        allowed = [t.function.name for t in given.allowed_tools.tools]
        for name in allowed:
            if name not in names:
                raise InvalidRequest(f"allowed_tools names {name!r}, which is not in tools.", param=param)
        tools = [t for t in tools if t.function.name in allowed]
        given = given.allowed_tools.mode
    if isinstance(given, NamedToolChoice) and given.function.name not in names:
        listed = "functions" if body.functions is not None else "tools"
        name = given.function.name
        raise InvalidRequest(f"{param} names {name!r}, which is not in {listed}.", param=param)
    return tools, given or ("auto" if tools else "none")


def sampling(body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None) -> Sampling:
    """The request's sampling fields; None: the model's default, filled in by the replica
    (`generation.requests.sampling_params`)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    bias = [(int(token), float(value)) for token, value in (body.logit_bias or {}).items()]
    return Sampling(
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        stop=stop,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=bias or None,
        stop_token_ids=body.stop_token_ids,
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
    )


def per_choice(
    request: GenerationRequest, params: Sampling, n: int, seed: int | None
) -> list[GenerationRequest]:
    """n copies; a seed makes choice i use seed + i, so choices differ yet each is reproducible."""
    return [
        msgspec.structs.replace(
            request, params=msgspec.structs.replace(params, seed=None if seed is None else seed + i)
        )
        for i in range(n)
    ]


def _template_messages(messages: list[Message]) -> tuple[list[Event], list[tuple[str, str]]]:
    """OpenAI messages → what chat templates expect: text content, `developer` as `system`, tool call
    arguments as objects, tool results named after the call they answer, and the deprecated forms (an
    assistant's `function_call`, a `function` message) as a tool call and its result. A message with
    images keeps its parts, each image as `{"type": "image"}` (vision-language templates' form); their
    URLs come back in order, each with the field it came from."""
    names: dict[str, str] = {}
    rendered: list[Event] = []
    image_urls: list[tuple[str, str]] = []
    legacy_call = ""  # the ID given to the last assistant `function_call`, which a `function` answers
    for position, message in enumerate(messages):
        content: Any = message.content
        if isinstance(content, list) and any(isinstance(p, ImageURLPart) for p in content):
            parts: list[Event] = []
            for index, part in enumerate(content):
                if isinstance(part, ImageURLPart):
                    image_urls.append(
                        (part.image_url.url, f"messages[{position}].content[{index}].image_url.url")
                    )
                    parts.append({"type": "image"})
                else:
                    parts.append({"type": "text", "text": _text_of(part)})
            content = parts
        elif isinstance(content, list):
            content = "\n".join(_text_of(p) for p in content)
        role = {"developer": "system", "function": "tool"}.get(message.role, message.role)
        out: Event = {"role": role, "content": content or ""}
        reasoning = message.reasoning_content or message.reasoning
        if reasoning and message.role == "assistant":  # Qwen3's, GLM's templates; `thinking`: gpt-oss's
            out.update(reasoning_content=reasoning, thinking=reasoning)
        if message.name:
            out["name"] = message.name
        calls = list(message.tool_calls or [])
        if message.function_call is not None and not calls:
            legacy_call = f"call_{position}"
            calls = [ToolCallIn(id=legacy_call, function=message.function_call)]
        if message.role == "function":
            out["tool_call_id"] = legacy_call
        if calls:
            out["tool_calls"] = []
            for call in calls:
                names[call.id] = call.function.name
                arguments = _json_or_text(call.function.arguments)
                out["tool_calls"].append(
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": arguments},
                    }
                )
        if message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
            out.setdefault("name", names.get(message.tool_call_id or "", ""))
        rendered.append(out)
    return rendered, image_urls


def _text_of(part: TextPart | RefusalPart | ImageURLPart) -> str:
    if isinstance(part, TextPart):
        return part.text
    return part.refusal if isinstance(part, RefusalPart) else ""


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# ---------------------------------------------------------------- assembling a chat choice


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass
class ChatChoice:
    """One choice of a chat completion, fed the engine's events; answers OpenAI deltas as it goes.

    A reasoning model's text (`started` names its `reasoning_format`) is split first: its reasoning goes
    to `reasoning` (sent as `reasoning_content` and `reasoning`), and only the rest is `text`, the content
    where tool calls are parsed. Constrained answers (`forced`, `json`) are never split: the grammar
    writes them from their first token."""

    index: int
    mode: str
    tool_names: list[str]
    tool_format: str = "hermes"
    # each tool's `parameters` schema by name: formats whose argument values are text are typed by it
    tool_schemas: dict[str, Event] = field(default_factory=dict)
    text: str = ""
    sent: int = 0  # characters of `text` already released as content
    calls: list[Event] = field(default_factory=list)
    call_started: bool = False
    arguments_sent: int = 0
    logprobs: list[Event] = field(default_factory=list)
    finish: str | None = None
    completion_tokens: int = 0
    legacy: bool = False  # the request used `functions`: calls are answered as `function_call`
    one_call: bool = False  # `parallel_tool_calls: false` (or legacy): the first parsed call only
    reasoner: ReasoningParser | None = None  # the family's reasoning parser, from `started`
    reasoning: str = ""
    reasoning_tokens: int = 0  # tokens generated inside the reasoning, its markers included
    prompt_tokens: int = 0  # the prompt's tokens, and those of them the prefix cache held (`started`)
    cached_tokens: int = 0

    def feed(self, event: GenerationEvent) -> Event:
        """Apply one event; the delta (possibly empty) it produces for a stream."""
        if isinstance(event, GenerationStarted):
            self.prompt_tokens, self.cached_tokens = event.prompt_tokens, event.cached_tokens
            self.tool_format = event.tool_format or self.tool_format
            name = event.reasoning_format
            if name in REASONING_PARSERS and self.mode in ("none", "auto"):
                self.reasoner = REASONING_PARSERS[name](event.reasoning_open)
            return {}
        if isinstance(event, Logprob):
            entry = _chat_logprob(event.entry)
            self.logprobs.append(entry)
            return {"logprobs": [entry]}
        if not isinstance(event, Text):
            return {}
        if event.finish is not None:
            self.finish = event.finish
        thought = self._split(event)
        if self.mode == "forced":
            delta = self._forced_delta()
        elif self.mode == "auto":
            delta = self._auto_delta()
        else:
            delta = self._content(len(self.text))
        delta = _legacy_delta(delta) if self.legacy else delta
        return {"reasoning_content": thought, "reasoning": thought, **delta} if thought else delta

    def _split(self, event: Text) -> str:
        """Add the event's text (the rest of it, after a reasoning parser took the reasoning) and its
        tokens; the reasoning it adds. An event's tokens count as reasoning when the answer was inside
        its reasoning before or after them (exact where each event carries one token, as both
        engines send them)."""
        text, tokens = event.text, event.completion_tokens
        added, self.completion_tokens = tokens - self.completion_tokens, tokens
        if self.reasoner is None:
            self.text += text
            return ""
        before = self.reasoner.in_reasoning
        thought, rest = self.reasoner.feed(text)
        if before or self.reasoner.in_reasoning:
            self.reasoning_tokens += added
        if self.finish is not None:
            more_thought, more_rest = self.reasoner.finish()
            thought, rest = thought + more_thought, rest + more_rest
        self.reasoning += thought
        self.text += rest
        return thought

    @property
    def finish_reason(self) -> str:
        if self.calls and self.finish == "stop":
            return "function_call" if self.legacy else "tool_calls"
        return self.finish or "stop"

    def message(self) -> Event:
        content = self.text if self.mode in ("none", "json") else self._final_content
        message: Event = {"role": "assistant", "content": content, "refusal": None}
        if self.reasoner is not None:  # DeepSeek's and LiteLLM's name, and vLLM's (0.32) own
            message["content"] = content or None
            message["reasoning_content"] = message["reasoning"] = self.reasoning or None
        if self.calls and self.legacy:
            message["function_call"] = self.calls[0]["function"]
        elif self.calls:
            message["tool_calls"] = self.calls
        return message

    def _content(self, upto: int) -> Event:
        piece = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return {"content": piece} if piece else {}

    def _auto_delta(self) -> Event:
        parser = PARSERS.get(self.tool_format, PARSERS["hermes"])
        if self.finish is None:
            return self._content(self.sent + streamable_length(self.text[self.sent :], parser.start_markers))
        parsed = parser.parse(self.text, {name: self.tool_schemas.get(name, {}) for name in self.tool_names})
        if not parsed.tool_calls:
            self._final_content = self.text or None
            return self._content(len(self.text))
        calls = parsed.tool_calls[:1] if self.one_call else parsed.tool_calls
        self.calls = [_call(c.name, c.arguments, c.id) for c in calls]
        shown = self.text[: self.sent]
        rest = parsed.content or ""
        rest = rest[len(shown) :] if rest.startswith(shown) else ""
        self._final_content = (shown + rest) or None
        delta: Event = {"tool_calls": [{"index": i, **c} for i, c in enumerate(self.calls)]}
        if rest:
            delta["content"] = rest
        return delta

    def _forced_delta(self) -> Event:
        self._final_content = None
        split = split_tool_call(self.text, self.tool_names)
        if split is None:
            return {}
        name, arguments = split
        if self.finish == "stop" and arguments.endswith("}"):
            arguments = arguments[:-1]  # the closing brace of the wrapping {"name", "arguments"} object
        elif self.finish is None:
            arguments = arguments[:-1]  # it may be that brace: wait for the next event
        delta_call: Event = {"index": 0}
        if not self.call_started:
            self.call_started = True
            self.calls = [_call(name, "")]
            delta_call.update(id=self.calls[0]["id"], type="function")
            delta_call["function"] = {"name": name, "arguments": ""}
        piece = arguments[self.arguments_sent :]
        self.arguments_sent = len(arguments)
        self.calls[0]["function"]["arguments"] = arguments
        if piece:
            delta_call.setdefault("function", {})["arguments"] = piece
        return {"tool_calls": [delta_call]} if len(delta_call) > 1 else {}

    _final_content: str | None = None


def _legacy_delta(delta: Event) -> Event:
    """A streamed tool call's delta in the deprecated shape: `function_call` pieces (the first with the
    name), of the first call only."""
    calls = [c for c in delta.pop("tool_calls", []) if c.get("index") == 0]
    if calls and calls[0].get("function"):
        delta["function_call"] = dict(calls[0]["function"])
    return delta


def _call(name: str, arguments: str, call_id: str | None = None) -> Event:
    """A call as OpenAI's `tool_calls` item; its ID is the model's own where its family has one."""
    function = {"name": name, "arguments": arguments}
    return {"id": call_id or new_id("call"), "type": "function", "function": function}


def tool_schemas(tools: list[Tool]) -> dict[str, Event]:
    """Each tool's `parameters` schema by name, for `ChatChoice.tool_schemas`."""
    return {t.function.name: t.function.parameters or {} for t in tools}


def _chat_logprob(entry: TokenLogprob) -> Event:
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in entry.top or []],
    }
