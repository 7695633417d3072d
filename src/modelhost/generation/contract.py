"""What a generation request can contain, from the gateway to the engine: one typed contract.

Every front-end (chat completions, completions, the Messages and Responses APIs, agent runs, batch lines;
`modelhost.frontend`) builds `GenerationRequest`s, the replica protocol carries them (`Generate`), and
every engine (ours, vLLM, llama.cpp) reads them: a field's name is checked by mypy at each end and its
type by msgspec when a replica decodes it, where a dict key's typo went unseen. A video job's request is
`VideoRequest`. Both are msgspec structs (they cross processes) and import nothing of ours, so the vLLM
environment, which has its own torch and transformers, reads them too.

What comes back is a stream of `GenerationEvent`s: `GenerationStarted` first (the prompt's tokens, how
the family's output is parsed), then `Text` per generated token (its `finish` set on the last) with
`Logprob`s where asked, or one `GenerationFailed`; a tokenizer question is answered by one `Tokenized`,
a video job by `Progress` events and one `VideoDone`. A `GenerationFailed` is made in one place
(`failed`).

`Sampling`'s fields are the client's; None is "not set": the replica fills it with the deployment's
default (`defaults`), then the model's (`generation_config.json`), then the engine's
(`generation.requests.sampling_params`).
"""

from __future__ import annotations

from typing import Any

import msgspec


class Sampling(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The sampling fields a client set (None: not set), as OpenAI's and vLLM's requests name them."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: list[tuple[int, float]] | None = None  # (token ID, bias)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prompt_logprobs: bool | None = None

    def given(self) -> dict[str, Any]:
        """The fields the client set, by name."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not None}


class Adapter(msgspec.Struct, frozen=True):
    """A LoRA adapter the request runs with on its shared base: its deployment ID and its files."""

    name: str
    path: str


class GenerationRequest(msgspec.Struct, tag="generation", kw_only=True, omit_defaults=True):
    """One sequence to generate (one choice of a request), or a tokenizer question (`tokenize`,
    `detokenize`) the replica answers with one event and no generation.

    Its prompt is `messages` (a chat, rendered by the model's chat template), else `prompt` (text or
    token IDs; None: the start of a new document)."""

    # ---- the prompt
    messages: list[dict[str, Any]] | None = None  # as chat templates take them (`generation.choices`)
    prompt: str | list[int] | None = None
    suffix: str | None = None  # OpenAI's insert mode (fill-in-the-middle)
    echo: bool = False  # the answer starts with the prompt's text (completions)
    tools: list[dict[str, Any]] | None = None  # offered to the chat template
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None  # None: a chat's template writes them; a prompt gets them
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    # the reasoning switch: the effort, the field a family without one names in its 400, and whether such
    # a family ignores it instead (the Messages API's `thinking`)
    reasoning_effort: str | None = None
    reasoning_effort_param: str = "reasoning_effort"
    reasoning_effort_optional: bool = False
    # ---- images: URLs and the fields they came from (the gateway reads them), then their bytes
    image_urls: list[tuple[str, str]] = msgspec.field(default_factory=list)
    images: list[bytes] = msgspec.field(default_factory=list)
    image_params: list[str] = msgspec.field(default_factory=list)  # the field each image came from
    # ---- what is generated
    params: Sampling = msgspec.field(default_factory=Sampling)
    defaults: dict[str, int | float] | None = None  # the deployment's `generation_defaults`
    grammar: str | None = None  # the Lark grammar the output must match
    grammar_param: str | None = None  # the field it came from, named by its errors
    adapter: Adapter | None = None
    # ---- how it is run
    # what the client says places it on a replica (`prompt_cache_key`, `user`, the Messages API's
    # `metadata.user_id`): requests with the same one go to the same replica (runtime.gateway.routing)
    affinity: str | None = None
    # its service tier (`generation.priority`): `low` (flex, a batch line) is held back behind interactive
    # requests; `priority`, vLLM's number (lower first), orders the waiting requests of its `tenant` (key)
    low: bool = False
    priority: int = 0
    tenant: str = ""
    weights: tuple[float, float] = (1.0, 1.0)  # its tenant's (account's, key's): `generation.fairness`
    # the prefix cache this request may read and fill (`frontend.cache_salt`: its key's salt and its own
    # `cache_salt`): an engine reuses a cached prefix only for a request of the same salt; None: the
    # deployment's shared cache
    cache_salt: str | None = None
    whole: bool = False  # the caller waits for the whole answer: the dispatcher may run it again
    # a continuation (issue 73, `runtime.gateway.dispatch`): the tokens the replica that died had
    # generated and sent. The engine takes them as its own output so far (after the prompt, in the
    # limits, the stop strings' and the grammar's state) and generates what comes next
    continued: list[int] | None = None
    # ---- a tokenizer question instead of a generation
    tokenize: bool = False
    detokenize: list[int] | None = None
    return_token_strs: bool = False
    tokenizer_info: bool = False  # with `tokenize`: vLLM's `/tokenizer_info` (the tokenizer's configuration)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def asks_tokenizer(self) -> bool:
        """`/tokenize` or `/detokenize`: answered without generating."""
        return self.tokenize or self.detokenize is not None


class VideoLimits(msgspec.Struct, frozen=True):
    max_pixels: int
    max_seconds: float


class VideoRequest(msgspec.Struct, tag="video", kw_only=True, omit_defaults=True):
    """A video job's generation (`jobs.runner`): progress events, then the MP4."""

    prompt: str
    width: int
    height: int
    fps: int
    frames: int
    limits: VideoLimits
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    reference: bytes | None = None  # the image a video starts from
    low: bool = False
    whole: bool = False


StreamRequest = GenerationRequest | VideoRequest


# ---------------------------------------------------------------- what comes back


class TokenLogprob(msgspec.Struct, omit_defaults=True):
    """One token's log probability (None: the prompt's first token has none) and the `top` most likely
    alternatives at its position, as (text, log probability)."""

    token: str
    id: int
    logprob: float | None = None
    top: list[tuple[str, float]] | None = None


class GenerationStarted(msgspec.Struct, tag="started", kw_only=True, omit_defaults=True):
    """The prompt went in: its tokens (and those the prefix cache held), how the family's output is
    parsed (its tool-call and reasoning formats, whether the prompt opened the reasoning), and what
    completions' `echo` and prompt log probabilities need."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    tool_format: str | None = None
    reasoning_format: str | None = None
    reasoning_open: bool = False
    prompt_text: str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


class Text(msgspec.Struct, tag="text", kw_only=True, omit_defaults=True):
    """One generated token's text (empty while a character is incomplete) and the tokens generated so
    far; `finish` (`stop`, `length`) on the last. `token_ids`: the tokens this event adds to the output,
    from an engine that can continue a generation another replica began (None: one that cannot)."""

    text: str = ""
    completion_tokens: int = 0
    finish: str | None = None
    token_ids: list[int] | None = None


class Logprob(msgspec.Struct, tag="logprob"):
    """A generated token's log probability (before its `Text`)."""

    entry: TokenLogprob


class Tokenized(msgspec.Struct, tag="tokenized", kw_only=True, omit_defaults=True):
    """The answer to a tokenizer question: a prompt's `tokens` (`/tokenize`) or their text (`prompt`,
    `/detokenize`)."""

    tokens: list[int] | None = None
    max_model_len: int | None = None
    token_strs: list[str] | None = None
    prompt: str | None = None
    tokenizer_info: dict[str, Any] | None = None  # `/tokenizer_info`: the tokenizer's configuration


class GenerationFailed(msgspec.Struct, tag="failed", kw_only=True, omit_defaults=True):
    """The request failed: its caller's 400 (`param`, `code`), or, `internal`, the replica's fault (a
    503; `crashed`: the engine died under it, a 502 never retried)."""

    message: str
    param: str | None = None
    code: str | None = None
    internal: bool = False
    crashed: bool = False


class Progress(msgspec.Struct, tag="progress"):
    """A video job's progress, in percent."""

    percent: int


class VideoDone(msgspec.Struct, tag="video", kw_only=True):
    """A video job's MP4 and its previews."""

    video: bytes
    thumbnail: bytes
    spritesheet: bytes
    frames: int


class Moved(msgspec.Struct, tag="moved"):
    """The replica handed the generation off (a drain, issue 73): the gateway continues it on another
    replica from the tokens it has sent (`runtime.gateway.dispatch`). No client ever sees it."""


GenerationEvent = (
    GenerationStarted | Text | Logprob | Tokenized | GenerationFailed | Progress | VideoDone | Moved
)


def is_last(event: GenerationEvent) -> bool:
    """Whether the stream ends with this event."""
    return isinstance(event, GenerationFailed | Tokenized | VideoDone | Moved) or (
        isinstance(event, Text) and event.finish is not None
    )


def failed(
    message: str,
    param: str | None = None,
    code: str | None = None,
    *,
    internal: bool = False,
    crashed: bool = False,
) -> GenerationFailed:
    """The one way a replica reports a failed request."""
    return GenerationFailed(message=message, param=param, code=code, internal=internal, crashed=crashed)
