"""Text generation (chat and completions) inside a replica worker: prompts in, token events out.

Unlike the batch handlers, this one streams: the worker feeds requests into the continuous-batching
engine between decoding steps and sends every step's events back (see `runtime.worker.sync_worker`). A request
arrives with the gateway's already validated fields; here it becomes a prompt (the artifact's own chat
template for chat, or the deployment's: `generation.deployment_settings`), a token budget checked
against the model's context (or the deployment's `max_model_len`), and an optional grammar.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhost.config import get_settings
from modelhost.engines import loader
from modelhost.engines.chat_images import chat_with_images
from modelhost.engines.interface import Engine, Event
from modelhost.engines.native.engine import GenerationEngine, Sequence
from modelhost.errors import InvalidRequest
from modelhost.generation.chat_templates import output_cap
from modelhost.generation.contract import GenerationRequest, GenerationStarted, Sampling, StreamRequest
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.families import Family
from modelhost.generation.grammar_bounds import check_engine_grammar
from modelhost.generation.requests import (
    SpecialTokens,
    chat_markup,
    fim_tokens,
    generation_defaults,
    prompt_ids,
    reasoning_open,
    sampling_params,
    template_kwargs,
    tokenized,
)
from modelhost.generation.text import IncrementalDecoder

MAX_RUNNING_SEQUENCES = 64


@dataclass
class ChatModel:
    engine: Engine[Sequence]  # stepped by the replica's loop through this handler (`engines.interface`)
    tokenizer: Any
    family: Family
    model_config: Any = None  # the model's (`transformers` config): a vision model's image token
    _guidance: Any = None  # llguidance's tokenizer, built on the first constrained request (~1 s)
    echo: dict[int, list[int]] = field(default_factory=dict)  # prompts to send back (completions' echo)
    fim: tuple[int, int, int] | None = None  # the tokenizer's fill-in-the-middle tokens, if any
    processor: Any = None  # a vision-language model's processor (`image-text-to-text`); None: text only
    # the artifact's generation_config.json sampling defaults (`generation.requests.generation_defaults`)
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # answers that need no decoding step (`/tokenize`, `/detokenize`), sent with the next step's events
    ready: list[tuple[int, Event]] = field(default_factory=list)
    special: SpecialTokens = field(default_factory=SpecialTokens)  # how chats decode the family's markers
    opened: set[int] = field(default_factory=set)  # requests whose prompt opened the answer's reasoning
    # the deployment's own settings it was loaded with (context, template, template arguments, parsers)
    settings: GenerationSettings = field(default_factory=GenerationSettings)

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    def guidance_tokenizer(self) -> Any:
        if self._guidance is None:
            import llguidance.hf

            self._guidance = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.engine.vocab_size)
        return self._guidance


class TextGeneration:
    streaming = True

    def load(self, model_dir: Path, device: str) -> ChatModel:
        model = loader.load_auto(model_dir, device, "AutoModelForCausalLM")
        return chat_model(model, loader.load_tokenizer(model_dir), device, generation_defaults(model_dir))

    def warmup(self, state: ChatModel) -> None:
        warm_up = GenerationRequest(prompt="modelhost warm-up", params=Sampling(max_tokens=2, temperature=0))
        self.start(state, 0, warm_up)
        while not state.engine.idle:
            state.engine.step()
        state.engine.warm_up()

    def start(self, state: ChatModel, request_id: int, request: StreamRequest) -> None:
        """Queue a request in the engine; InvalidRequest (a 400 for its caller) if it cannot run."""
        if not isinstance(request, GenerationRequest):
            raise InvalidRequest("A text-generation deployment makes no videos.", param="model")
        if request.adapter is not None:  # a base that fell back from vLLM after its adapters were attached
            raise InvalidRequest(
                "The adapter's base runs on the transformers engine, which does not serve adapters; "
                "patch the base to engine: vllm (docs/adapters.md).",
                param="model",
                code="adapter_base_unsupported",
            )
        if request.asks_tokenizer:
            state.ready.append((request_id, tokenized(state, request)))
            return
        images: dict[str, Any] | None = None
        if request.images:  # the processor's prompt, not the tokenizer's: built once, here
            prompt, images = _vision_prompt(state, request)
            prompt_param = "messages"
        else:
            prompt, prompt_param = prompt_ids(state, request)
        params = sampling_params(state, request.params, len(prompt), prompt_param, request.defaults)
        constraint = None
        if request.grammar:
            from modelhost.engines.native.guidance import GrammarConstraint

            check_engine_grammar(request)  # as the gateway did: never compile what it would refuse
            constraint = GrammarConstraint(
                state.guidance_tokenizer(), request.grammar, param=request.grammar_param
            )
        skip, strip = state.special.decoding(request, params.skip_special_tokens)
        decode = functools.partial(state.tokenizer.decode, skip_special_tokens=skip)
        if strip is not None:
            decode = functools.partial(_stripped, decode, strip)
        opened = reasoning_open(state, request, prompt)
        if request.continued:  # after the prompt, as output so far (`Sequence.carried`)
            prompt = [*prompt, *request.continued]
        sequence = Sequence(request_id, prompt, params, IncrementalDecoder(decode), constraint)
        sequence.carried = len(request.continued or ())
        sequence.priority, sequence.tenant = request.priority, request.tenant
        sequence.weights = request.weights
        sequence.salt = request.cache_salt
        if images is not None:
            sequence.images, sequence.image_token = images, _image_token(state)
        state.engine.add(sequence, low=request.low)
        if request.echo:
            state.echo[request_id] = prompt
        if opened:
            state.opened.add(request_id)

    def cancel(self, state: ChatModel, request_id: int) -> None:
        state.echo.pop(request_id, None)
        state.opened.discard(request_id)
        state.ready = [(key, event) for key, event in state.ready if key != request_id]
        state.engine.cancel(request_id)

    def step(self, state: ChatModel) -> list[tuple[int, Event]]:
        events, state.ready = state.ready, []
        if not state.engine.idle:
            events += state.engine.step()
        for request_id, event in events:
            if isinstance(event, GenerationStarted):
                event.tool_format = state.family.tool_parser
                event.reasoning_format = state.family.reasoning_parser
                if request_id in state.opened:
                    state.opened.discard(request_id)
                    event.reasoning_open = True
                prompt = state.echo.pop(request_id, None)
                if prompt is not None:
                    event.prompt_text = state.tokenizer.decode(prompt)
        return events

    def abort(self, state: ChatModel) -> list[int]:
        state.echo.clear()
        state.opened.clear()
        ready, state.ready = state.ready, []
        return [request_id for request_id, _ in ready] + state.engine.abort()

    def handoff(self, state: ChatModel) -> list[int] | None:
        """Every generation continues elsewhere: each token's event says its ID (`Text.token_ids`), and
        this engine takes a continuation (`GenerationRequest.continued`)."""
        return self.abort(state)

    def idle(self, state: ChatModel) -> bool:
        return state.engine.idle and not state.ready

    def running(self, state: ChatModel) -> int:
        return state.engine.held

    def cache_usage(self, state: ChatModel) -> float:
        return state.engine.cache_usage


def chat_model(model: Any, tokenizer: Any, device: str, defaults: dict[str, Any]) -> ChatModel:
    """The engine over a loaded model, with what the handler needs of its tokenizer, the model's
    sampling defaults, and the deployment's settings (its context, template and parsers)."""
    text = functools.lru_cache(maxsize=65536)(lambda token: tokenizer.decode([token]))
    settings = get_settings()  # the replica's environment: the server's
    own = GenerationSettings.from_environment()
    own.use_template(tokenizer)
    engine = GenerationEngine(
        model,
        tokenizer,
        device,
        MAX_RUNNING_SEQUENCES,
        own.context(_context_length(model, tokenizer)),
        text,
        cache_bytes=settings.kv_cache_mb << 20 if settings.kv_cache_mb else None,
        prefill_chunk=settings.prefill_chunk_tokens,
        cuda_graphs=settings.cuda_graphs,
        token_weights=own.token_weights(),
    )
    family, special = chat_markup(tokenizer, own)
    return ChatModel(
        engine,
        tokenizer,
        family,
        model_config=model.config,
        fim=fim_tokens(tokenizer),
        generation_defaults=defaults,
        special=special,
        settings=own,
    )


def _stripped(decode: Any, strip: Any, tokens: list[int]) -> str:
    """A decoding that keeps special tokens, less those `strip` takes out (`SpecialTokens`)."""
    return str(strip(decode(tokens)))


def _image_token(state: ChatModel) -> int:
    config = state.model_config
    token = getattr(config, "image_token_id", None)
    return int(token if token is not None else config.image_token_index)


def _vision_prompt(state: ChatModel, request: GenerationRequest) -> tuple[list[int], dict[str, Any]]:
    """A chat with images: the processor's prompt (each image expanded into its image tokens) and its
    image tensors. The image tokens become negative IDs derived from the image's bytes and position, so
    the prefix cache never gives one image's keys and values to another."""
    cap = output_cap(state.context_length, state.tokenizer)
    text, pictures = chat_with_images(state.processor, request, template_kwargs(state, request), cap)
    try:
        encoded = state.processor(text=text, images=pictures, return_tensors="pt")
    except (ValueError, TypeError) as exc:  # the processor's own checks (image and placeholder counts)
        raise InvalidRequest(f"The model's processor refused the messages: {exc}", param="messages") from None
    ids: list[int] = encoded["input_ids"][0].tolist()
    images = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask", "token_type_ids")}
    salt = int.from_bytes(
        hashlib.sha256(b"".join(hashlib.sha256(d).digest() for d in request.images)).digest()[:7]
    )
    token = _image_token(state)
    return [-(1 + salt + i) if t == token else t for i, t in enumerate(ids)], images


def _context_length(model: Any, tokenizer: Any) -> int:
    """The model's context: its position embeddings, or the tokenizer's limit when that is sane."""
    for value in (getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length):
        if isinstance(value, int) and 0 < value < 10_000_000:
            return value
    return 2048
