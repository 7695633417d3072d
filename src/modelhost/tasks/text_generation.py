"""Text generation (chat and completions) inside a replica worker: prompts in, token events out.

Unlike the batch handlers, this one streams: the worker feeds requests into the continuous-batching
engine between decoding steps and sends every step's events back (see `runtime.worker`). A request
arrives with the gateway's already validated fields; here it becomes a prompt (the artifact's own chat
template for chat), a token budget checked against the model's context, and an optional grammar.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhost.config import get_settings
from modelhost.errors import InvalidRequest
from modelhost.generation.engine import Event, GenerationEngine, SamplingParams, Sequence
from modelhost.generation.text import IncrementalDecoder
from modelhost.generation.tool_parsers import parser_for_template
from modelhost.media.decode import decode_image
from modelhost.tasks import loader

MAX_RUNNING_SEQUENCES = 64
# Fill-in-the-middle tokens (prefix, suffix, middle) of the families that have them, in the order
# prefix-suffix-middle they were trained on: Qwen2.5-Coder, StarCoder/SantaCoder, DeepSeek-Coder.
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


@dataclass
class ChatModel:
    engine: GenerationEngine
    tokenizer: Any
    tool_format: str
    _guidance: Any = None  # llguidance's tokenizer, built on the first constrained request (~1 s)
    echo: dict[int, list[int]] = field(default_factory=dict)  # prompts to send back (completions' echo)
    fim: tuple[int, int, int] | None = None  # the tokenizer's fill-in-the-middle tokens, if any
    processor: Any = None  # a vision-language model's processor (`image-text-to-text`); None: text only

    def guidance_tokenizer(self) -> Any:
        if self._guidance is None:
            import llguidance.hf

            self._guidance = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.engine.vocab_size)
        return self._guidance


class TextGeneration:
    streaming = True

    def load(self, model_dir: Path, device: str) -> ChatModel:
        model = loader.load_auto(model_dir, device, "AutoModelForCausalLM")
        return chat_model(model, loader.load_tokenizer(model_dir), device)

    def warmup(self, state: ChatModel) -> None:
        self.start(state, 0, {"prompt": "modelhost warm-up", "params": {"max_tokens": 2, "temperature": 0}})
        while not state.engine.idle:
            state.engine.step()
        state.engine.warm_up()

    def start(self, state: ChatModel, request_id: int, request: dict[str, Any]) -> None:
        """Queue a request in the engine; InvalidRequest (a 400 for its caller) if it cannot run."""
        images: dict[str, Any] | None = None
        if request.get("images"):  # the processor's prompt, not the tokenizer's: built once, here
            prompt, images = _vision_prompt(state, request)
            prompt_param = "messages"
        else:
            prompt, prompt_param = _prompt(state, request)
        params = _params(state, request.get("params", {}), len(prompt), prompt_param)
        constraint = None
        if request.get("grammar"):
            from modelhost.generation.guidance import GrammarConstraint

            constraint = GrammarConstraint(
                state.guidance_tokenizer(), request["grammar"], param=request.get("grammar_param")
            )
        decode = functools.partial(state.tokenizer.decode, skip_special_tokens=True)
        sequence = Sequence(request_id, prompt, params, IncrementalDecoder(decode), constraint)
        if images is not None:
            sequence.images, sequence.image_token = images, _image_token(state)
        state.engine.add(sequence)
        if request.get("echo"):
            state.echo[request_id] = prompt

    def cancel(self, state: ChatModel, request_id: int) -> None:
        state.echo.pop(request_id, None)
        state.engine.cancel(request_id)

    def step(self, state: ChatModel) -> list[tuple[int, Event]]:
        events = state.engine.step()
        for request_id, event in events:
            if event.get("started"):
                event["tool_format"] = state.tool_format
                prompt = state.echo.pop(request_id, None)
                if prompt is not None:
                    event["prompt_text"] = state.tokenizer.decode(prompt)
        return events

    def abort(self, state: ChatModel) -> list[int]:
        state.echo.clear()
        return state.engine.abort()

    def idle(self, state: ChatModel) -> bool:
        return state.engine.idle

    def running(self, state: ChatModel) -> int:
        return state.engine.held


def chat_model(model: Any, tokenizer: Any, device: str) -> ChatModel:
    """The engine over a loaded model, with what the handler needs of its tokenizer."""
    text = functools.lru_cache(maxsize=65536)(lambda token: tokenizer.decode([token]))
    settings = get_settings()  # the replica's environment: the server's
    engine = GenerationEngine(
        model,
        tokenizer,
        device,
        MAX_RUNNING_SEQUENCES,
        _context_length(model, tokenizer),
        text,
        cache_bytes=settings.kv_cache_mb << 20 if settings.kv_cache_mb else None,
        prefill_chunk=settings.prefill_chunk_tokens,
        cuda_graphs=settings.cuda_graphs,
    )
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return ChatModel(engine, tokenizer, parser_for_template(template).name, fim=fim_tokens(tokenizer))


def _image_token(state: ChatModel) -> int:
    config = state.engine.model.config
    token = getattr(config, "image_token_id", None)
    return int(token if token is not None else config.image_token_index)


def _vision_prompt(state: ChatModel, request: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """A chat with images: the processor's prompt (each image expanded into its image tokens) and its
    image tensors. The image tokens become negative IDs derived from the image's bytes and position, so
    the prefix cache never gives one image's keys and values to another."""
    if state.processor is None:
        raise InvalidRequest(
            "This model reads text only: image_url parts need a deployment of an image-text-to-text "
            "(vision-language) model.",
            param="messages",
        )
    max_pixels = get_settings().media_max_pixels
    params = request.get("image_params") or ["messages"] * len(request["images"])
    pictures = [
        decode_image(data, max_pixels=max_pixels, param=param)
        for data, param in zip(request["images"], params, strict=True)
    ]
    try:
        text = state.processor.apply_chat_template(
            request["messages"], tools=request.get("tools"), add_generation_prompt=True, tokenize=False
        )
        encoded = state.processor(text=text, images=pictures, return_tensors="pt")
    except (ValueError, TypeError) as exc:  # the template's or the processor's own checks
        raise InvalidRequest(f"The model's processor refused the messages: {exc}", param="messages") from None
    ids: list[int] = encoded["input_ids"][0].tolist()
    images = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
    salt = int.from_bytes(
        hashlib.sha256(b"".join(hashlib.sha256(d).digest() for d in request["images"])).digest()[:7]
    )
    token = _image_token(state)
    return [-(1 + salt + i) if t == token else t for i, t in enumerate(ids)], images


def _prompt(state: ChatModel, request: dict[str, Any]) -> tuple[list[int], str]:
    tokenizer = state.tokenizer
    if "messages" in request:
        if not tokenizer.chat_template:
            raise InvalidRequest(
                "This model has no chat template; use /v1/completions with a prompt.", param="messages"
            )
        try:
            text = tokenizer.apply_chat_template(
                request["messages"], tools=request.get("tools"), add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # the template's own checks (roles, alternation) raise here
            message = f"The model's chat template refused the messages: {exc}"
            raise InvalidRequest(message, param="messages") from None
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, "messages"
    prompt = request["prompt"]
    if prompt is None:  # OpenAI's default: the start of a new document
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start is None:
            raise InvalidRequest("This model has no start-of-document token: send a prompt.", param="prompt")
        ids = [int(start)]
    elif isinstance(prompt, str):
        ids = list(tokenizer(prompt)["input_ids"])
    elif any(token >= state.engine.vocab_size for token in prompt):
        raise InvalidRequest(f"Token IDs must be below {state.engine.vocab_size}.", param="prompt")
    else:
        ids = list(prompt)
    suffix = request.get("suffix")
    if suffix is None:
        return ids, "prompt"
    if state.fim is None:
        raise InvalidRequest(
            "suffix needs a model trained for fill-in-the-middle (a tokenizer with FIM tokens such as "
            "<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>); this one has none.",
            param="suffix",
        )
    return fill_in_the_middle(tokenizer, state.fim, ids, suffix), "prompt"


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


def _params(state: ChatModel, given: dict[str, Any], prompt_tokens: int, prompt_param: str) -> SamplingParams:
    context = state.engine.context_length
    if prompt_tokens == 0:
        raise InvalidRequest("The prompt is empty.", param=prompt_param)
    room = context - prompt_tokens
    max_tokens = given.get("max_tokens")
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        wanted = f" + max_tokens {max_tokens}" if max_tokens is not None else ""
        raise InvalidRequest(
            f"The prompt ({prompt_tokens} tokens){wanted} does not fit the model's context "
            f"of {context} tokens.",
            param="max_tokens" if max_tokens is not None and room > 0 else prompt_param,
            code="context_length_exceeded",
        )
    fields = {k: v for k, v in given.items() if k != "max_tokens" and v is not None}
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    if "logit_bias" in fields:
        fields["logit_bias"] = _logit_bias(fields["logit_bias"], state.engine.vocab_size)
    return SamplingParams(max_tokens=max_tokens or room, **fields)


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


def _context_length(model: Any, tokenizer: Any) -> int:
    """The model's context: its position embeddings, or the tokenizer's limit when that is sane."""
    for value in (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length):
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return 2048
