"""A generation request made ready for an engine: the prompt's token IDs and its sampling parameters.

Built the same way whichever engine runs the model (modelhost's own, `engines.native.engine`, or vLLM's,
`engines.vllm`), so that a chat template, a fill-in-the-middle prompt, a context check or a bad
`logit_bias` gives the same prompt and the same 400 on both. Pure Python over a tokenizer: it imports
neither torch nor media libraries, so the vLLM environment (which has its own versions of both) runs it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from modelhost.errors import InvalidRequest, ModelhostError
from modelhost.generation import chat_templates
from modelhost.generation.contract import GenerationFailed, GenerationRequest, Sampling, Tokenized, failed
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.families import Family, detect_family
from modelhost.generation.reasoning import MARKERS, effort_kwargs, prompt_opens
from modelhost.generation.tool_parsers import PARSERS

# Fill-in-the-middle tokens (prefix, suffix, middle) of the families that have them, in the order
# prefix-suffix-middle they were trained on: Qwen2.5-Coder, StarCoder/SantaCoder, DeepSeek-Coder.
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)

log = logging.getLogger(__name__)

# The keys of `generation_config.json` that are a request's defaults, as our parameters' names, each with
# the values it may take (a value outside them is ignored, with a warning): vLLM's list
# (`ModelConfig.get_diff_sampling_param`). `do_sample` is not among them, as in vLLM: a config written
# for transformers' `generate` says `do_sample: false` by default, and OpenAI's clients expect sampling.
GENERATION_DEFAULTS: dict[str, tuple[str, type, float, float]] = {
    "temperature": ("temperature", float, 0.0, 2.0),
    "top_p": ("top_p", float, 0.0, 1.0),
    "top_k": ("top_k", int, -1, 1 << 31),
    "min_p": ("min_p", float, 0.0, 1.0),
    "repetition_penalty": ("repetition_penalty", float, 1e-6, 1e6),
    "max_new_tokens": ("max_tokens", int, 1, 1 << 31),
}


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1, as vLLM): every token
    min_p: float = 0.0  # tokens below min_p x the most likely one's probability are dropped
    repetition_penalty: float = 1.0  # above 1: tokens of the prompt and the output are less likely
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token ID, bias) added to the logits before sampling
    stop_token_ids: tuple[int, ...] = ()  # generation stops at any of these, as at the end of sequence
    ignore_eos: bool = False  # the end-of-sequence token does not stop generation
    include_stop_str_in_output: bool = False  # the stop string (or stop token) that ended it is in the text
    skip_special_tokens: bool = True  # special tokens are not in the text


class PromptModel(Protocol):
    """What building a request needs of a loaded model, whichever engine holds it."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def fim(self) -> tuple[int, int, int] | None: ...
    @property
    def generation_defaults(self) -> dict[str, Any]: ...
    @property
    def family(self) -> Family: ...
    @property
    def settings(self) -> GenerationSettings: ...


def chat_prompt(state: PromptModel, request: GenerationRequest) -> str:
    """A chat's text: the model's chat template (or the deployment's) rendered over its messages, in the
    budgeted sandbox (`generation.chat_templates`: a render past its time or size bounds is a 400 naming
    `chat_template`). Its own checks of the messages (roles, alternation) are a 400 naming `messages`."""
    tokenizer = state.tokenizer
    if not tokenizer.chat_template:
        raise InvalidRequest(
            "This model has no chat template (a base model): use /v1/completions with a prompt, or give "
            "the deployment one (`chat_template` on PATCH /v1/deployments/{id}, docs/generation.md "
            '"Per-deployment settings").',
            param="messages",
            code="no_chat_template",
        )
    kwargs = template_kwargs(state, request)  # outside the `try`: its 400 names its own field
    chat_templates.install()
    try:
        with chat_templates.limits(max_chars=chat_templates.output_cap(state.context_length, tokenizer)):
            text = tokenizer.apply_chat_template(
                request.messages,
                tools=request.tools,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                tokenize=False,
                **kwargs,
            )
    except ModelhostError:  # a bound of the render, or its caller gone
        raise
    except Exception as exc:  # the template's own checks (roles, alternation) raise here
        message = f"The model's chat template refused the messages: {exc}"
        raise InvalidRequest(message, param="messages") from None
    return str(text)


async def chat_prompt_off_loop(state: PromptModel, request: GenerationRequest) -> str | None:
    """`chat_prompt` for an engine that runs requests on an event loop (vLLM, llama.cpp): rendered in a
    thread (`chat_templates.in_thread`), so that a slow template holds no other request and stops when
    its caller leaves; None for a request without messages."""
    if request.messages is None or request.detokenize is not None:
        return None
    return await chat_templates.in_thread(chat_prompt, state, request)


def prompt_ids(
    state: PromptModel, request: GenerationRequest, chat: str | None = None
) -> tuple[list[int], str]:
    """The prompt's token IDs (the chat template for `messages`: `chat`, where rendered already, else
    `chat_prompt`; the prompt or its IDs for completions, OpenAI's insert mode for `suffix`) and the
    parameter a client error names."""
    tokenizer = state.tokenizer
    if request.messages is not None:
        text = chat_prompt(state, request) if chat is None else chat
        special = bool(request.add_special_tokens)  # the template writes the special tokens
        ids: list[int] = tokenizer(text, add_special_tokens=special)["input_ids"]
        return ids, "messages"
    prompt = request.prompt
    if prompt is None:  # OpenAI's default: the start of a new document
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start is None:
            raise InvalidRequest("This model has no start-of-document token: send a prompt.", param="prompt")
        ids = [int(start)]
    elif isinstance(prompt, str):
        special = request.add_special_tokens is not False
        ids = list(tokenizer(prompt, add_special_tokens=special)["input_ids"])
    elif any(token >= state.vocab_size for token in prompt):
        raise InvalidRequest(f"Token IDs must be below {state.vocab_size}.", param="prompt")
    else:
        ids = list(prompt)
    suffix = request.suffix
    if suffix is None:
        return ids, "prompt"
    if state.fim is None:
        raise InvalidRequest(
            "suffix needs a model trained for fill-in-the-middle (a tokenizer with FIM tokens such as "
            "<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>); this one has none.",
            param="suffix",
        )
    return fill_in_the_middle(tokenizer, state.fim, ids, suffix), "prompt"


def template_kwargs(state: PromptModel, request: GenerationRequest) -> dict[str, Any]:
    """The chat template's extra variables: the deployment's defaults (`chat_template_kwargs`), under the
    request's reasoning effort as the family's switch takes it (`generation.reasoning.effort_kwargs`: a
    400 for a family without one, unless the effort is `reasoning_effort_optional`: the Messages API's
    `thinking`, which such a family ignores), under the request's own `chat_template_kwargs`, which win."""
    kwargs = dict(request.chat_template_kwargs)
    effort = request.reasoning_effort
    if effort:
        try:
            kwargs = {**effort_kwargs(state.family, effort, request.reasoning_effort_param), **kwargs}
        except InvalidRequest:
            if not request.reasoning_effort_optional:
                raise
    return {**state.settings.chat_template_kwargs, **kwargs}


def reasoning_open(state: PromptModel, request: GenerationRequest, prompt: list[int]) -> bool:
    """Whether a chat's rendered prompt leaves the answer inside its reasoning (its last tokens open a
    thought: `generation.reasoning.prompt_opens`), said on the request's `started` event."""
    name = state.family.reasoning_parser
    if name is None or request.messages is None:
        return False
    tail = state.tokenizer.decode([t for t in prompt[-16:] if t >= 0], skip_special_tokens=False)
    return prompt_opens(name, str(tail))


@dataclass(frozen=True)
class SpecialTokens:
    """How a chat's answer is decoded when the family's markers are special tokens of its tokenizer
    (gpt-oss's harmony tokens; DeepSeek's, Kimi's tool-call tokens; a `<think>` a tokenizer marks
    special): the parsers must read them, so the answer is decoded keeping special tokens (`keeps`), and
    those that are not the family's markup (`hidden`) are taken out of the text here when the client
    asked to skip them (`skip_special_tokens`, true by default)."""

    keeps: bool = False
    hidden: re.Pattern[str] | None = None

    def decoding(self, request: GenerationRequest, skip: bool) -> tuple[bool, Callable[[str], str] | None]:
        """How to decode this request: the engine's `skip_special_tokens`, and what takes the hidden
        special tokens out of each piece of text after (None: nothing to take out)."""
        if not self.keeps or request.messages is None:
            return skip, None
        hidden = self.hidden
        if not skip or hidden is None:
            return False, None
        return False, lambda text: hidden.sub("", text)


def chat_markup(tokenizer: Any, settings: GenerationSettings) -> tuple[Family, SpecialTokens]:
    """What both engines work out of a tokenizer when the model loads (the deployment's template already
    on it): its family, with the deployment's own parsers over the detected ones, and how its chats
    decode that family's markup."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    family = settings.family(detect_family(template, tokenizer.get_added_vocab()))
    return family, special_tokens(tokenizer, family, template)


def special_tokens(tokenizer: Any, family: Family, template: str | None) -> SpecialTokens:
    """What `SpecialTokens` needs of a tokenizer, worked out once when the model loads. The family's
    markup is its parsers' markers and the special tokens its chat template writes (the closing tags and
    separators of a call as well as its start), but not the tokenizer's own start, end, padding and
    unknown tokens, which the client's `skip_special_tokens` governs as for any answer."""
    special = set(tokenizer.all_special_tokens)
    special |= {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    parser = PARSERS.get(family.tool_parser)
    markers = set(MARKERS.get(family.reasoning_parser or "", ())) | set(
        parser.start_markers if parser else ()
    )
    if not markers & special:
        return SpecialTokens()
    own = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token}
    markup = {t for t in special if t in (template or "")} - own | markers
    hidden = sorted(special - markup, key=len, reverse=True)  # the longest first: no partial matches
    return SpecialTokens(True, re.compile("|".join(map(re.escape, hidden))) if hidden else None)


def error_event(exc: ModelhostError) -> GenerationFailed:
    """A client error as a generation's `GenerationFailed` event (the caller's 400 with its param and
    code): how every replica answers a request it refuses."""
    return failed(exc.message, exc.param, exc.code)


async def tokenized_event(state: PromptModel, request: GenerationRequest) -> Tokenized | GenerationFailed:
    """`tokenized`'s answer, or the error event of a request it refuses, for an engine on an event loop
    (its chat rendered off the loop: `chat_prompt_off_loop`)."""
    try:
        return tokenized(state, request, await chat_prompt_off_loop(state, request))
    except ModelhostError as exc:
        return error_event(exc)


def tokenized(state: PromptModel, request: GenerationRequest, chat: str | None = None) -> Tokenized:
    """The one event that answers `/tokenize` (`"tokenize": true`: the prompt's IDs, as a generation
    would see them; `chat`: its chat rendered already) or `/detokenize` (`"detokenize"`: the text of
    token IDs), without generating."""
    if request.tokenizer_info:
        return Tokenized(tokenizer_info=tokenizer_info(state.tokenizer))
    if request.detokenize is not None:
        tokens = request.detokenize
        if any(token >= state.vocab_size for token in tokens):
            raise InvalidRequest(f"Token IDs must be below {state.vocab_size}.", param="tokens")
        return Tokenized(prompt=state.tokenizer.decode(tokens))
    ids, _ = prompt_ids(state, request, chat)
    answer = Tokenized(tokens=ids, max_model_len=state.context_length)
    if request.return_token_strs:
        answer.token_strs = state.tokenizer.convert_ids_to_tokens(ids)
    return answer


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """vLLM's `/tokenizer_info`: the tokenizer's configuration (its `tokenizer_config.json` as loaded),
    its class and the chat template it renders with (the deployment's, where it sets one), so a client
    (lm-eval's remote tokenizer) tokenizes and renders as the server does. Less the file paths (the
    replica's folders), and with the special tokens always named: lm-eval needs `eos_token`."""
    config = {
        key: _plain(value)
        for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
        if not key.endswith("_file") and key != "name_or_path"
    }
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        config[name] = _plain(getattr(tokenizer, name, None))
    config["tokenizer_class"] = type(tokenizer).__name__
    if getattr(tokenizer, "chat_template", None):
        config["chat_template"] = tokenizer.chat_template
    return config


def _plain(value: Any) -> Any:
    """A configuration value as JSON: an added token as its text (as vLLM writes it)."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def fim_tokens(tokenizer: Any) -> tuple[int, int, int] | None:
    """The IDs of the tokenizer's fill-in-the-middle tokens (`FIM_TOKENS`), or None."""
    vocabulary = tokenizer.get_vocab()
    for names in FIM_TOKENS:
        if all(name in vocabulary for name in names):
            prefix, suffix, middle = (int(vocabulary[name]) for name in names)
            return prefix, suffix, middle
    return None


def fill_in_the_middle(
    tokenizer: Any, fim: tuple[int, int, int], prompt: list[int], suffix: str
) -> list[int]:
    """OpenAI's insert mode: `<prefix> prompt <suffix> suffix <middle>`, after which the model writes
    what goes between the two (the answer is that text alone). A leading start-of-sequence token stays
    first, as the families' own examples have it."""
    prefix_token, suffix_token, middle_token = fim
    start = [prompt[0]] if prompt and prompt[0] == tokenizer.bos_token_id else []
    after = list(tokenizer(suffix, add_special_tokens=False)["input_ids"])
    return [*start, prefix_token, *prompt[len(start) :], suffix_token, *after, middle_token]


def generation_defaults(model_dir: Path) -> dict[str, Any]:
    """The sampling defaults the artifact's `generation_config.json` sets (`GENERATION_DEFAULTS`), as our
    parameters: what a request that leaves a field unset gets (docs/generation.md, "The model's
    defaults"). Read once, when a replica loads the model; no file (or an unreadable one): none."""
    try:
        config = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    defaults: dict[str, Any] = {}
    for key, (name, kind, low, high) in GENERATION_DEFAULTS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            log.warning("generation_config.json: %s %r is not a default we can use; ignored", key, value)
        elif kind is int and value != int(value):
            log.warning("generation_config.json: %s %r is not a whole number; ignored", key, value)
        else:
            defaults[name] = kind(value)
    return defaults


def sampling_params(
    state: PromptModel,
    given: Sampling,
    prompt_tokens: int,
    prompt_param: str,
    deployment: dict[str, Any] | None = None,
) -> SamplingParams:
    """The gateway's validated fields as the engine's parameters, the token budget checked against the
    model's context (`context_length_exceeded`, in our words, before any engine sees the prompt).

    A field the request left unset (None) takes the deployment's default (`deployment`: its
    `generation_defaults`), else the model's (`generation_defaults`), else the engine's
    (`SamplingParams`'). A default `max_tokens` is cut to the room the context leaves; the request's own
    that does not fit is a 400."""
    context = state.context_length
    if prompt_tokens == 0:
        raise InvalidRequest("The prompt is empty.", param=prompt_param)
    room = context - prompt_tokens
    max_tokens = given.max_tokens
    defaults = {**state.generation_defaults, **(deployment or {})}
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        wanted = f" + max_tokens {max_tokens}" if max_tokens is not None else ""
        limit = "the model's context"
        if state.settings.max_model_len == context:
            limit = "the deployment's context (max_model_len)"
        raise InvalidRequest(
            f"The prompt ({prompt_tokens} tokens){wanted} does not fit {limit} of {context} tokens.",
            param="max_tokens" if max_tokens is not None and room > 0 else prompt_param,
            code="context_length_exceeded",
        )
    fields = {k: v for k, v in defaults.items() if k != "max_tokens"}
    fields.update((k, v) for k, v in given.given().items() if k != "max_tokens")
    if max_tokens is None:
        max_tokens = min(defaults.get("max_tokens", room), room)
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    if "logit_bias" in fields:
        fields["logit_bias"] = _logit_bias(fields["logit_bias"], state.vocab_size)
    if "stop_token_ids" in fields:
        fields["stop_token_ids"] = _stop_token_ids(fields["stop_token_ids"], state.vocab_size)
    return SamplingParams(max_tokens=max_tokens, **fields)


def _logit_bias(pairs: list[list[float]], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """`[[token, bias], ...]` from the gateway; every token must be in the model's vocabulary."""
    for token, _ in pairs:
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"logit_bias: token ID {int(token)} is not in this model's vocabulary "
                f"(IDs 0 to {vocab_size - 1}).",
                param="logit_bias",
            )
    return tuple((int(token), float(bias)) for token, bias in pairs)


def _stop_token_ids(tokens: list[int], vocab_size: int) -> tuple[int, ...]:
    """The stop tokens, each in the model's vocabulary (else a 400 naming the field)."""
    for token in tokens:
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"stop_token_ids: token ID {token} is not in this model's vocabulary "
                f"(IDs 0 to {vocab_size - 1}).",
                param="stop_token_ids",
            )
    return tuple(dict.fromkeys(tokens))
