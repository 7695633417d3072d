"""llama.cpp's server as a modelhost engine: GGUF text generation on the `llamacpp` engine.

Loaded and driven by the llama.cpp replica worker (`runtime.worker.llamacpp_worker`). The server is
llama.cpp's own C++ server, the `xllamacpp` wheel's or a `llama-server` program (MODELHOST_LLAMA_SERVER),
run as the worker's child (`engines.llamacpp_server`): continuous batching over its slots, each slot a
sequence with its own part of the KV cache. We set what llama.cpp would otherwise default: the slots
(`slots`: the most requests decoded together), the context of each (`context`: `kv_unified` off, so
`n_ctx` is `slots × context` and every slot gets its whole context), the threads (the replica's), its
prompt cache and warm-up on, its memory fitting off (we size the replica: `runtime.footprint`).

**Requests go over HTTP**, to the server's loopback address (a random port, a random API key only the
worker knows), on llama.cpp's native `/completion`, streamed. Not through the wheel's in-process
`handle_completions(request, callback)`: that call blocks a thread per request (its callback runs on
it), so each waiting or running request would hold a thread of ours, and stopping one means waiting for
its next token to return True from the callback. Over HTTP the requests are plain asyncio streams in the
worker's loop, and closing one stops its slot at once (llama.cpp checks the connection before each
token); the same code drives both builds.

**Weights are read into memory, not mapped** (`--no-mmap`: load mode `none`). We bill and admit replicas
by measured memory (`runtime.memory`): a mapped file's pages are the page cache's, which the kernel may
drop under pressure and read back at every token; and on a CPU llama.cpp repacks quantized weights into
its own interleaved layout (`REPACK`), copying them into anonymous memory anyway, so a mapped file would
be counted twice (the mapping, whole, and the copy). Read in, the weights are the replica's own pages,
counted once, never dropped.

What stays ours, so that every engine answers alike (as on vLLM, `engines.vllm`): the prompt (the GGUF's
own chat template through its tokenizer, loaded by transformers from the file; tools, reasoning switch,
fill-in-the-middle, the context check: `generation.requests`), sent as token IDs; the text (our
tokenizer decodes the tokens llama.cpp samples, with our stop strings and stop tokens: llama.cpp's own
detokenizer drops control tokens a family's markup may need); the grammars (the gateway's llguidance
Lark strings, which llama.cpp runs through the same llguidance: `%llguidance {}` before them); `n`
(the gateway sends one request per choice); the priority of interactive requests over batch lines (a
gate in front of the slots: `SlotGate`). What is llama.cpp's: scheduling, the KV cache and its prompt
cache, sampling.

**Cache salts** (a request's `cache_salt`: docs/access.md, "Cache salts"). llama.cpp has no salt of its
own: a request reuses whatever prefix the slot it gets holds, and the slot is llama.cpp's choice (the
one whose last prompt shares most with this one). From the first salted request a replica sees, the gate
chooses each request's slot itself (`id_slot`): a free slot whose last request had the same salt and
shares most of the prompt, else the least recently used free slot; on a slot last used by another salt
the request is sent with `cache_prompt: false`, so it computes its whole prompt (reporting 0 cached
tokens) and its keys and values replace the other salt's. Requests that llama.cpp placed itself finish
first. Its host-memory prompt cache (`--cache-ram`, which would restore one salt's saved prompt for
another's request on any slot, and takes memory outside the replica's footprint) is off: a prefix is
reused from the slots' own KV cache only.

Refused with a 400-style `error` event (llama.cpp has no such option): `min_tokens`, prompt
log-probabilities, images, adapters.

An embedding GGUF's server is started the same way (`start` with `Embedding`), and driven by
`engines.llamacpp_embeddings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from modelhost.artifacts.gguf_check import gguf_set
from modelhost.engines.interface import Emit, StreamingEngine
from modelhost.engines.llamacpp_server import Answered, LlamaCppServer, start
from modelhost.engines.loader import load_tokenizer
from modelhost.engines.native.kv_cache import common_prefix
from modelhost.errors import InvalidRequest, ModelhostError
from modelhost.generation.contract import (
    GenerationRequest,
    GenerationStarted,
    Logprob,
    Text,
    TokenLogprob,
    failed,
)
from modelhost.generation.deployment_settings import GenerationSettings
from modelhost.generation.fairness import HeldTenants, TokenWeights, VirtualTokenCounters
from modelhost.generation.families import Family
from modelhost.generation.grammar_bounds import check_engine_grammar
from modelhost.generation.priority import BUSY_SECONDS, enqueue, low_cap
from modelhost.generation.requests import (
    SamplingParams,
    SpecialTokens,
    chat_markup,
    chat_prompt_off_loop,
    error_event,
    fim_tokens,
    prompt_ids,
    reasoning_open,
    sampling_params,
    tokenized_event,
)
from modelhost.generation.text import IncrementalDecoder, StopStrings

GRAMMAR_PREFIX = "%llguidance {}\n"  # llama.cpp's marker for a Lark grammar run by llguidance
# llama.cpp's own threshold for a slot's last prompt to count as sharing a new one's prefix
# (`slot_prompt_similarity`: the common prefix over the new prompt's length)
SIMILAR = 0.1


@dataclass(eq=False, slots=True)
class _Turn:
    """A request waiting at the gate: its place's terms (`generation.priority.Queued`) and its wake-up."""

    tenant: str
    priority: int
    low: bool
    ready: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class Placed:
    """The llama.cpp slot the gate chose for a request (`id_slot`), and whether it may reuse what the
    slot holds (`cache_prompt`: its last request had the same salt)."""

    index: int
    reuse: bool


@dataclass(slots=True)
class _Slot:
    """What the gate knows of one llama.cpp slot once it places requests: the salt and prompt of its
    last request (whose keys and values it holds), when that came, whether one runs there now."""

    salt: str | None = None
    prompt: list[int] = field(default_factory=list)
    used: int = 0
    busy: bool = False


class SlotGate:
    """At most `slots` requests inside llama.cpp at once, the others waiting here in the order of
    `generation.priority` (interactive requests first, each key's ordered by its numbers; flex requests
    and batch lines after every one of them, and let in only into the room `low_cap` leaves them), the
    next one let in being the first of the tenant served least (`generation.fairness`: `served` is
    charged with the tokens llama.cpp computes for each tenant).
    llama.cpp's own queue is first come, first served; in front of it, a flex flood or a batch cannot
    delay a chat. From the first salted request on, it also chooses each request's slot (`Placed`; the
    module docstring, "Cache salts")."""

    def __init__(
        self, slots: int, clock: Callable[[], float] = time.monotonic, weights: TokenWeights | None = None
    ) -> None:
        self.slots = slots
        self.free = slots
        self._running_low = 0
        self._waiting: list[_Turn] = []
        self._clock = clock
        self._interactive_at = -BUSY_SECONDS  # when the last interactive request arrived
        self._timer: asyncio.TimerHandle | None = None
        self.placing = False  # a salted request came: the gate places every request from then on
        self._unplaced = 0  # requests inside whose slot llama.cpp chose
        self._drained: asyncio.Event | None = None  # set once none is left (when placing began)
        self._slots = [_Slot() for _ in range(slots)]
        self._uses = 0
        self.served = VirtualTokenCounters(weights)  # what a token costs: the deployment's `TokenWeights`
        self._inside = HeldTenants()  # the tenants of the requests inside

    @contextlib.asynccontextmanager
    async def slot(
        self,
        low: bool,
        priority: int = 0,
        tenant: str = "",
        salt: str | None = None,
        prompt: list[int] | None = None,
        weights: tuple[float, float] = (1.0, 1.0),
    ) -> AsyncIterator[Placed | None]:
        """A turn inside llama.cpp for `tenant` of `weights`: None where llama.cpp chooses the slot (no
        salt seen yet), else the slot chosen for `prompt` of `salt`."""
        await self._acquire(low, priority, tenant, weights)
        try:
            with self._inside.holding(tenant):
                if salt is not None and not self.placing:
                    self.placing, self._drained = True, asyncio.Event()
                    if not self._unplaced:
                        self._drained.set()
                if not self.placing:
                    self._unplaced += 1
                    try:
                        yield None
                    finally:
                        self._unplaced -= 1
                        if not self._unplaced and self._drained is not None:
                            self._drained.set()
                    return
                if self._drained is not None and not self._drained.is_set():
                    await self._drained.wait()  # a slot llama.cpp chose may hold another salt's prefix
                placed = self._place(salt, prompt or [])
                try:
                    yield placed
                finally:
                    self._slots[placed.index].busy = False
        finally:
            self._release(low)

    def _place(self, salt: str | None, prompt: list[int]) -> Placed:
        """A free slot for `prompt` of `salt`: the one of that salt whose last prompt shares most of it
        (as llama.cpp chooses: more than `SIMILAR` of the prompt), else the least recently used."""
        free = [i for i, s in enumerate(self._slots) if not s.busy]
        same = [i for i in free if self._slots[i].salt == salt]
        shared = {i: common_prefix(self._slots[i].prompt, prompt, len(prompt)) for i in same}
        best = max(same, key=lambda i: shared[i], default=None)
        if best is None or shared[best] <= SIMILAR * len(prompt):
            best = min(free, key=lambda i: self._slots[i].used)
        chosen = self._slots[best]
        placed = Placed(best, reuse=chosen.salt == salt)
        self._uses += 1
        chosen.salt, chosen.prompt, chosen.used, chosen.busy = salt, prompt, self._uses, True
        return placed

    async def _acquire(self, low: bool, priority: int, tenant: str, weights: tuple[float, float]) -> None:
        if not low:
            self._interactive_at = self._clock()
        self.served.arrive(tenant, [*self._inside, *(t.tenant for t in self._waiting)], weights)
        if not self._waiting and self._may_start(low):
            self._take(low)
            return
        turn = _Turn(tenant, priority, low, asyncio.get_running_loop().create_future())
        enqueue(self._waiting, turn)
        self._wake()  # an interactive request may pass held-back low ones into a free slot
        try:
            await turn.ready
        except asyncio.CancelledError:
            if turn.ready.done() and not turn.ready.cancelled():  # given the slot as it was cancelled
                self._release(low)
            elif turn in self._waiting:
                self._waiting.remove(turn)
            raise

    def _may_start(self, low: bool) -> bool:
        """A free slot, and for a low request room beside the interactive traffic (`low_cap`)."""
        if self.free <= 0:
            return False
        if not low:
            return True
        interactive = self.slots - self.free > self._running_low or any(not t.low for t in self._waiting)
        recent = self._clock() - self._interactive_at < BUSY_SECONDS
        return self._running_low < low_cap(self.slots, interactive, recent)

    def _next(self) -> int:
        """The place of the turn to let in next: among the interactive ones (all ahead of the low ones),
        or the low ones when none is, the first of the least served tenant."""
        low = self._waiting[0].low
        tenants = dict.fromkeys(t.tenant for t in self._waiting if t.low == low and not t.ready.done())
        if len(tenants) <= 1:
            return 0
        turn = self.served.least(tenants)
        return next(i for i, t in enumerate(self._waiting) if t.low == low and t.tenant == turn)

    def _take(self, low: bool) -> None:
        self.free -= 1
        self._running_low += low

    def _release(self, low: bool) -> None:
        self.free += 1
        self._running_low -= low
        self._wake()

    def _wake(self) -> None:
        """Let in whoever may start, in order (the next: `_next`); a low request held back only by the
        interactive traffic's recent arrival is looked at again when that window ends."""
        while self._waiting and self._may_start(self._waiting[0].low):
            turn = self._waiting.pop(self._next())
            if turn.ready.done():  # cancelled meanwhile
                continue
            self._take(turn.low)
            turn.ready.set_result(None)
        if self._waiting and self.free > 0 and self._timer is None:
            remaining = self._interactive_at + BUSY_SECONDS - self._clock()
            if remaining > 0:
                self._timer = asyncio.get_running_loop().call_later(remaining, self._window_ended)

    def _window_ended(self) -> None:
        self._timer = None
        self._wake()


@dataclass
class LlamaCppModel(LlamaCppServer, StreamingEngine):
    """The server generating, as a `StreamingEngine` (`engines.interface`), and what building a request
    needs of the model (`generation.requests.PromptModel`)."""

    tokenizer: Any
    vocab_size: int
    context_length: int  # each slot's
    slots: int
    family: Family
    fim: tuple[int, int, int] | None = None
    special: SpecialTokens = field(default_factory=SpecialTokens)
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    gate: SlotGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = SlotGate(self.slots, weights=self.settings.token_weights())

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """A GGUF carries no `generation_config.json`: the deployment's defaults, else ours."""
        return {}

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """The tokenizer's special tokens: where an end-of-generation token may be (see `_chunk`)."""
        tokenizer = self.tokenizer
        added = (i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
        return frozenset({*tokenizer.all_special_ids, *added})

    @functools.cached_property
    def token_text(self) -> Callable[[int], str]:
        """One token's text in log-probabilities, as our engine writes it."""
        return functools.lru_cache(maxsize=65536)(lambda token: str(self.tokenizer.decode([token])))

    def cache_usage(self) -> float:
        """Busy slots over slots, as the transformers engine counts its own: each of llama.cpp's slots is
        one context, and at 1 the next request waits at the gate."""
        return (self.slots - self.gate.free) / self.slots

    async def generate(self, request_id: str, request: GenerationRequest, emit: Emit) -> None:
        """Run one request to its end, emitting our events (`_generate`)."""
        await _generate(self, request_id, request, emit)

    def continues(self, request: GenerationRequest) -> bool:
        """Every generation but a grammar's (llama.cpp's grammar cannot start from a part of its answer):
        the decoding and stop strings are ours, and replayed (`_Answer.replay`)."""
        return not request.grammar

    async def abort(self, request_id: str) -> None:
        """Nothing to do: a cancelled request's stream is closed as its task unwinds, which stops its
        slot."""

    async def warm_up(self) -> None:
        """One short generation before `Ready`, through the same path as every request: a model
        llama.cpp loads but cannot run fails its load with llama.cpp's reason, rather than every request
        later."""
        body = llama_body(SamplingParams(max_tokens=2, temperature=0.0), [_start_token(self)], None)
        response = await self.client.post("/completion", json={**body, "stream": False})
        if response.status_code != 200:
            raise RuntimeError(error_message(response.text))


def gguf_file(model_dir: Path) -> Path:
    """The GGUF file llama.cpp loads in an artifact's folder (the first part of a split set: it finds
    the others by their names). A vision projector beside it is not loaded: text only."""
    found = gguf_set(model_dir)
    if found is None:
        raise FileNotFoundError(f"no .gguf file in {model_dir}")
    return found.model


def load(
    model_dir: Path, slots: int, context: int, threads: int | None, binary: str | None = None
) -> LlamaCppModel:
    """llama.cpp's server over the artifact's GGUF, with `slots` slots of `context` tokens each, and the
    tokenizer and chat template transformers reads from the same file. The deployment's settings
    (`generation.deployment_settings`) give its template and parsers; its context is `context`. The
    server is the `xllamacpp` wheel's, in this process, or with `binary` (MODELHOST_LLAMA_SERVER) that
    `llama-server` program, as this process's child: the same requests drive either."""
    path = gguf_file(model_dir)
    own = GenerationSettings.from_environment()
    tokenizer = load_tokenizer(path.parent, gguf_file=path.name)
    own.use_template(tokenizer)
    server, client = start(path, slots, context, threads, binary)
    family, special = chat_markup(tokenizer, own)
    return LlamaCppModel(
        server,
        client,
        tokenizer,
        vocab_size=len(tokenizer),
        context_length=context,
        slots=slots,
        family=family,
        fim=fim_tokens(tokenizer),
        special=special,
        settings=own,
    )


def _start_token(model: LlamaCppModel) -> int:
    tokenizer = model.tokenizer
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return int(start or 0)


def llama_body(params: SamplingParams, prompt: list[int], grammar: str | None) -> dict[str, Any]:
    """Our parameters as llama.cpp's `/completion` request. Every sampler it has that we do not name is
    left off by its default (DRY, XTC, typical, mirostat); those whose defaults are on (top-k 40, top-p
    0.95, min-p 0.05) are set to ours. Stop strings and stop tokens are ours (`generate`)."""
    greedy = params.top_p <= 0 or params.temperature <= 0  # OpenAI's top_p 0: the most likely token
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": params.max_tokens,
        "stream": True,
        "return_tokens": True,
        "timings_per_token": True,  # the first token's chunk says how much of the prompt was cached
        "cache_prompt": True,
        "temperature": 0.0 if greedy else params.temperature,
        "top_k": max(0, params.top_k),  # 0: every token
        "top_p": 1.0 if greedy else params.top_p,
        "min_p": params.min_p,
        "repeat_penalty": params.repetition_penalty,
        "repeat_last_n": len(prompt) + params.max_tokens,  # every token, as vLLM's penalties see them
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "ignore_eos": params.ignore_eos,
        "n_probs": max(1, params.top_logprobs) if params.logprobs else 0,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.logit_bias:
        body["logit_bias"] = [[token, bias] for token, bias in params.logit_bias]
    if grammar:
        body["grammar"] = GRAMMAR_PREFIX + grammar
    return body


def _refuse_unsupported(params: SamplingParams) -> None:
    """A 400 for what llama.cpp cannot do (rather than doing something else)."""
    if params.min_tokens:
        raise InvalidRequest(
            "min_tokens is not supported by the llamacpp engine (llama.cpp has no such option).",
            param="min_tokens",
            code="unsupported_parameter",
        )
    if params.prompt_logprobs:
        raise InvalidRequest(
            "prompt_logprobs is not supported by the llamacpp engine.",
            param="prompt_logprobs",
            code="unsupported_parameter",
        )


# ---------------------------------------------------------------- one generation


@dataclass
class _Answer:
    """One request's answer as its tokens arrive: our decoding, stop strings and stop tokens."""

    params: SamplingParams
    strip: Callable[[str], str] | None
    decoder: IncrementalDecoder
    stops: StopStrings
    generated: int = 0
    finish: str | None = None
    held: list[tuple[int, dict[str, Any] | None]] = field(default_factory=list)  # see `_chunk`
    says_tokens: bool = False  # its events say their tokens (`Text.token_ids`: it can move, issue 73)
    received: int = 0  # the token IDs llama.cpp has sent (see `_chunk`)
    counted: list[int] = field(default_factory=list)  # the tokens counted since the last event

    def replay(self, tokens: list[int]) -> None:
        """A continuation's carried tokens through the decoder and the stop strings, their text dropped
        (the replica that died sent it), as the transformers engine replays them."""
        for token in tokens:
            self.token(token)
        self.counted = []

    def token(self, token: int) -> str:
        """The text a sampled token releases; sets `finish` where it ends the answer."""
        params = self.params
        if token in params.stop_token_ids:
            self.finish = "stop"
            if not params.include_stop_str_in_output:
                return ""  # as the end of sequence: neither in the text nor counted
        self.generated += 1
        self.counted.append(token)
        text = self.stops.feed(self.decoder.push(token))
        if self.stops.stopped:
            self.finish = "stop"
        elif self.finish is None and self.generated >= params.max_tokens:
            self.finish = "length"
        return text

    def end(self) -> str:
        return self.stops.feed(self.decoder.flush()) + self.stops.flush()

    def event(self, text: str) -> Text:
        if self.finish is not None:
            text += self.end()
        text = self.strip(text) if self.strip else text
        ids, self.counted = self.counted, []
        return Text(
            text=text,
            completion_tokens=self.generated,
            finish=self.finish,
            token_ids=ids if self.says_tokens else None,
        )


def _logprob_entry(model: LlamaCppModel, entry: dict[str, Any], top: int) -> TokenLogprob:
    """One token's log-probability as our engine writes it, from llama.cpp's `completion_probabilities`
    item (the sampled token's, and the most likely before sampling)."""
    token = int(entry["id"])
    out = TokenLogprob(model.token_text(token), token, float(entry["logprob"]))
    if top:
        ranked = entry.get("top_logprobs", [])[:top]
        out.top = [(model.token_text(int(t["id"])), float(t["logprob"])) for t in ranked]
    return out


def error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error", {})
        return str(error.get("message") or body)
    except (ValueError, AttributeError):
        return body


async def _generate(model: LlamaCppModel, request_id: str, request: GenerationRequest, emit: Emit) -> None:
    """Run one request to its end, emitting our events. Bad input becomes an `error` event (the
    caller's 400). Cancelled (its caller is gone), the stream to llama.cpp closes, which frees the slot."""
    if request.adapter is not None:
        emit(failed("The llamacpp engine serves no adapters.", "model"))
        return
    if request.images:
        message = "This deployment's llamacpp engine reads text only: send no images."
        emit(failed(message, "messages"))
        return
    if request.asks_tokenizer:
        emit(await tokenized_event(model, request))
        return
    try:
        prompt, prompt_param = prompt_ids(model, request, await chat_prompt_off_loop(model, request))
        params = sampling_params(model, request.params, len(prompt), prompt_param, request.defaults)
        _refuse_unsupported(params)
        check_engine_grammar(request)  # as the gateway did: llama.cpp never compiles what it would refuse
    except ModelhostError as exc:
        emit(error_event(exc))
        return
    skip, strip = model.special.decoding(request, params.skip_special_tokens)
    params = replace(params, skip_special_tokens=skip)
    decode = functools.partial(model.tokenizer.decode, skip_special_tokens=skip)
    answer = _Answer(
        params,
        strip,
        IncrementalDecoder(decode),
        StopStrings(params.stop, params.include_stop_str_in_output),
    )
    answer.says_tokens = model.continues(request)
    engine_prompt = prompt
    if request.continued:  # its output so far follows the prompt; the rest is what is left to generate
        if not answer.says_tokens:  # never sent by a gateway
            emit(failed("this generation cannot continue on llama.cpp", internal=True))
            return
        answer.replay(request.continued)
        engine_prompt = [*prompt, *request.continued]
        params = replace(params, max_tokens=params.max_tokens - len(request.continued))
    body = llama_body(params, engine_prompt, request.grammar)
    started = False

    def on_line(line: bytes) -> bool:
        """One line of llama.cpp's stream, as it arrives; True when the answer ended."""
        nonlocal started
        if line.startswith(b"error:"):
            emit(failed(error_message(line[6:].decode()), internal=True))
            return True
        if not line.startswith(b"data: "):
            return False
        chunk = orjson.loads(line[6:])  # one per token: orjson parses it in a third of json's time
        if "error" in chunk:  # llama.cpp failed the request after it started
            emit(failed(error_message(line[6:].decode()), internal=True))
            return True
        if not started:
            begun = _started(model, request, prompt, chunk)
            model.gate.served.charge(request.tenant, prompt=begun.prompt_tokens - begun.cached_tokens)
            emit(begun)
            started = True
        generated = answer.generated
        ended = _chunk(model, answer, chunk, emit)
        model.gate.served.charge(request.tenant, output=answer.generated - generated)
        return ended

    async with model.gate.slot(
        request.low, request.priority, request.tenant, request.cache_salt, engine_prompt, request.weights
    ) as placed:
        if placed is not None:
            body |= {"id_slot": placed.index, "cache_prompt": placed.reuse}
        answered = await model.post_lines("/completion", orjson.dumps(body), on_line)
    if answered.status != 200:
        _refused(request, answered, emit)
    elif not answered.finished:
        emit(failed("llama.cpp ended the stream before the answer's end", internal=True))


def _refused(request: GenerationRequest, answered: Answered, emit: Emit) -> None:
    """llama.cpp answered a request with an error: a 400 of its own checks is the caller's (a grammar
    it cannot run...), anything else internal."""
    message = error_message(answered.body.decode(errors="replace"))
    if answered.status == 400:
        param = request.grammar_param if request.grammar else None
        emit(failed(f"The engine refused the request: {message}", param))
    else:
        emit(failed(f"llama.cpp answered {answered.status}: {message}", internal=True))


def _started(
    model: LlamaCppModel, request: GenerationRequest, prompt: list[int], chunk: dict[str, Any]
) -> GenerationStarted:
    timings = chunk.get("timings") or {}
    return GenerationStarted(
        prompt_tokens=len(prompt),
        cached_tokens=int(timings.get("cache_n") or 0),
        tool_format=model.family.tool_parser,
        reasoning_format=model.family.reasoning_parser,
        reasoning_open=reasoning_open(model, request, prompt),
        prompt_text=model.tokenizer.decode(prompt) if request.echo else None,
    )


def _chunk(model: LlamaCppModel, answer: _Answer, chunk: dict[str, Any], emit: Emit) -> bool:
    """One streamed chunk of llama.cpp's: its tokens (usually one) through our decoding, their
    log-probabilities, and the end where llama.cpp or we end the answer. True when it ended.

    llama.cpp streams the end-of-generation token it sampled, then says `eos` in a chunk of its own: a
    special token is held back one chunk, and dropped from the text and the count (its log-probability
    is sent, as vLLM's is) where that chunk follows."""
    params = answer.params
    probabilities = chunk.get("completion_probabilities") or []  # none where no log-probabilities are asked
    tokens = [*answer.held]
    answer.received += len(chunk.get("tokens") or ())
    if int((chunk.get("timings") or {}).get("predicted_n") or 0) > answer.received:
        # llama.cpp sampled tokens it never sent (a character's first bytes, issue 59): a continuation
        # would lack them, so from here the answer says no tokens and cannot move (issue 73)
        answer.says_tokens = False
    for index, token in enumerate(chunk.get("tokens") or []):
        tokens.append((int(token), probabilities[index] if index < len(probabilities) else None))
    answer.held = []
    eos = chunk.get("stop") and chunk.get("stop_type") == "eos" and not params.ignore_eos
    if eos and tokens and tokens[-1][0] in model.special_ids:
        token, probability = tokens.pop()
        if params.logprobs and probability is not None:
            tokens.append((-1, probability))  # its log-probability alone
    elif not chunk.get("stop") and tokens and tokens[-1][0] in model.special_ids:
        answer.held = [tokens.pop()]
    text, counted = "", answer.generated
    for token, probability in tokens:
        if params.logprobs and probability is not None:
            emit(Logprob(_logprob_entry(model, probability, params.top_logprobs)))
        if token < 0:
            continue
        text += answer.token(int(token))
        if answer.finish is not None:
            break
    if answer.finish is None and chunk.get("stop"):
        # the end of sequence, or llama.cpp's limit (`n_predict`, or the slot's context)
        answer.finish = "length" if chunk.get("stop_type") == "limit" else "stop"
    if text or answer.finish is not None or answer.generated > counted:  # a token, even without text
        emit(answer.event(text))
    return answer.finish is not None
