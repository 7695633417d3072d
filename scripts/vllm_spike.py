"""Spike (issue 29): vLLM's async engine in-process, on a tiny random-weight Llama, feature by feature.

Not part of the product: it proves the calls a vLLM replica worker would make (docs/engines-vllm-notes.md).
Three steps, each under the Python that has what it needs:

    # 1. the model folder (project venv: transformers + the benchmark's offline-trained BPE tokenizer)
    HF_HUB_OFFLINE=1 /work/main/.venv/bin/python scripts/vllm_spike.py build /tmp/vllm-spike/llama
    # 2. the spike itself (vLLM's venv); writes what it saw to --out as JSON
    HF_HUB_OFFLINE=1 .venv-vllm/bin/python scripts/vllm_spike.py run /tmp/vllm-spike/llama \
        --out /tmp/vllm-spike/result.json [--eager] [--kv-cache-mb 64]
    # 3. the greedy tokens vLLM gave, checked against transformers' generate (project venv)
    HF_HUB_OFFLINE=1 /work/main/.venv/bin/python scripts/vllm_spike.py compare /tmp/vllm-spike/llama \
        /tmp/vllm-spike/result.json

The top of the file imports only the standard library: each step imports its own libraries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Tell me a short story about a lighthouse keeper and a storm."
# A long shared prefix for the prefix-caching check: > 2 KV blocks (vLLM's CPU default block is 128 tokens).
SYSTEM = " ".join(["The gateway parses, authenticates and routes; the replica runs the model."] * 10)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# A raw Lark grammar (llguidance's dialect): a tiny arithmetic language, with a regex terminal.
LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""


# ---------------------------------------------------------------- build (project venv)


def build(folder: Path) -> None:
    """A 4-layer Llama of width 256 (head size 64, which vLLM's CPU attention supports), float32, with the
    benchmark's byte-level BPE (8000 tokens, trained offline) and ChatML template."""
    sys.path.insert(0, str(ROOT))
    import torch
    from bench.generation import Shape, build_model

    shape = Shape("spike", 256, 4, 4, 688, 8000, torch.float32, (1,), 32, 0, 0)
    started = time.perf_counter()
    parameters = build_model(folder, shape)
    print(f"built {folder}: {parameters:,} parameters in {time.perf_counter() - started:.1f} s")


# ---------------------------------------------------------------- compare (project venv)


def compare(folder: Path, result_path: Path) -> None:
    """transformers' greedy `generate` on the prompt IDs vLLM used; how many leading tokens agree."""
    import torch
    from transformers import AutoModelForCausalLM

    result = json.loads(result_path.read_text())
    prompt_ids, vllm_ids = result["greedy"]["prompt_ids"], result["greedy"]["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=len(vllm_ids),
            min_new_tokens=len(vllm_ids),
            do_sample=False,
        )
    hf_ids = out[0, len(prompt_ids) :].tolist()
    agree = next((i for i, (a, b) in enumerate(zip(hf_ids, vllm_ids, strict=False)) if a != b), len(vllm_ids))
    print(f"vLLM         : {vllm_ids}")
    print(f"transformers : {hf_ids}")
    print(f"first {agree} of {len(vllm_ids)} tokens agree" + (" (all)" if agree == len(vllm_ids) else ""))
    # vLLM's first-step top logprobs (raw logits' log-softmax, its default logprobs_mode) against ours
    with torch.inference_mode():
        first = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0, -1].float(), -1)
    for token, entry in result["logprobs"][0].items():
        print(
            f"token {token}: vLLM logprob {entry['logprob']:.4f}, transformers {first[int(token)].item():.4f}"
        )
    if agree < len(vllm_ids):
        # Where they part, how close the two candidates were: random weights give near-ties.
        with torch.inference_mode():
            logits = model(torch.tensor([prompt_ids + vllm_ids[:agree]])).logits[0, -1]
        top = torch.topk(logits, 3)
        print(
            f"at the first difference, transformers' top-3 logits {top.values.tolist()}"
            f" of tokens {top.indices.tolist()}"
        )


# ---------------------------------------------------------------- run (vLLM venv)


class Stats:
    """What the engine's stat loggers report each step (scheduler: running requests, KV-cache use)."""

    samples: list[tuple[float, int, float]] = []  # (time, running requests, KV-cache usage)


def make_stat_logger() -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class Recorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                Stats.samples.append(
                    (time.perf_counter(), scheduler_stats.num_running_reqs, scheduler_stats.kv_cache_usage)
                )

        def log_engine_initialized(self) -> None:
            pass

    return Recorder


def registry_check() -> dict[str, Any]:
    """Which architectures vLLM has a model class for, asked of its registry without loading a model."""
    started = time.perf_counter()
    from vllm import ModelRegistry

    imported = time.perf_counter() - started
    archs = ModelRegistry.get_supported_archs()
    answers = {arch: arch in archs for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MadeUpForCausalLM")}
    # _try_inspect_model_cls: the model's capabilities (text generation? pooling? multimodal?); vLLM inspects
    # the class in a subprocess the first time and caches the answer by the module's hash.
    started_inspect = time.perf_counter()
    info = ModelRegistry._try_inspect_model_cls("LlamaForCausalLM")
    inspect_s = time.perf_counter() - started_inspect
    return {
        "import_vllm_s": round(imported, 2),
        "supported_arch_count": len(archs),
        "supported": answers,
        "llama_is_text_generation": bool(info and info.is_text_generation_model),
        "inspect_s": round(inspect_s, 2),
    }


async def first_sample(since: float, running: int, timeout: float = 10.0) -> float:
    """When the engine first reported `running` requests after `since` (nan if not within `timeout`)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        hit = next((t for t, r, _ in Stats.samples if t > since and r == running), None)
        if hit is not None:
            return hit
        await asyncio.sleep(0.005)
    return float("nan")


async def collect(engine: Any, prompt: Any, params: Any, request_id: str) -> Any:
    """The last RequestOutput, its `outputs` made whole: with n > 1 and a streaming output kind
    (CUMULATIVE, DELTA) each RequestOutput carries only the children that moved in that step, so they
    are gathered by `CompletionOutput.index` (FINAL_ONLY aggregates them itself)."""
    final, children = None, {}
    async for output in engine.generate(prompt, params, request_id):
        final = output
        for child in output.outputs:
            children[child.index] = child
    assert final is not None
    final.outputs = [children[i] for i in sorted(children)]
    return final


async def spike(folder: Path, eager: bool, kv_cache_mb: int, report: dict[str, Any]) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import tokens_input
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM

    sys.path.insert(0, str(ROOT / "src"))
    from modelhost.generation.grammar import json_schema_grammar, tool_call_grammar  # pure Python

    report["registry"] = registry_check()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    args = AsyncEngineArgs(
        model=str(folder),
        dtype="float32",
        max_model_len=1024,
        seed=0,
        enforce_eager=eager,
        enable_prefix_caching=True,
        # The KV-cache size in bytes (MB * 2**20): the engine argument behind --kv-cache-memory-bytes. The
        # legacy VLLM_CPU_KVCACHE_SPACE takes whole GiB and, when set, overrides this.
        kv_cache_memory_bytes=kv_cache_mb * 2**20,
        structured_outputs_config=StructuredOutputsConfig(backend="guidance"),
        max_logprobs=5,
        disable_log_stats=False,  # the stat logger below sees each step's scheduler stats
    )
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[make_stat_logger()])
    report["startup_s"] = round(time.perf_counter() - started, 2)
    cache = engine.vllm_config.cache_config
    report["kv_cache"] = {
        "requested_mb": kv_cache_mb,
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "block_size": cache.block_size,
        "num_blocks": cache.num_gpu_blocks,
        "tokens": (cache.num_gpu_blocks or 0) * cache.block_size,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
    }
    print(f"engine up in {report['startup_s']} s; KV cache {report['kv_cache']}", flush=True)

    def ids(text: str) -> Any:
        # tokens_input(): an EngineInput ({"type": "token", ...}). Our gateway tokenizes (chat templates are
        # ours), so the worker hands vLLM token IDs; a plain TokensPrompt dict works too but logs that raw
        # prompts are deprecated.
        return tokens_input(tokenizer(text)["input_ids"])

    try:
        # -- streamed greedy generation: DELTA outputs, one per engine step
        prompt = ids(PROMPT)
        params = SamplingParams(
            temperature=0.0, max_tokens=24, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        stream, tokens, t0 = [], [], time.perf_counter()
        async for out in engine.generate(prompt, params, "greedy"):
            delta = out.outputs[0]
            stream.append(
                {
                    "t_ms": round(1000 * (time.perf_counter() - t0), 1),
                    "ids": list(delta.token_ids),
                    "text": delta.text,
                }
            )
            tokens.extend(delta.token_ids)
            print(
                f"  stream +{stream[-1]['t_ms']:7.1f} ms {list(delta.token_ids)} {delta.text!r}", flush=True
            )
        report["greedy"] = {
            "prompt_ids": prompt["prompt_token_ids"],
            "token_ids": tokens,
            "text": tokenizer.decode(tokens),
            "chunks": len(stream),
            "finish_reason": out.outputs[0].finish_reason,
            "first_chunk_ms": stream[0]["t_ms"],
            "total_ms": stream[-1]["t_ms"],
        }

        # -- n and seed: three samples per request; the same seed gives the same three
        sampled = SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=8)
        a = await collect(engine, prompt, sampled, "n-a")
        b = await collect(engine, prompt, sampled, "n-b")
        c = await collect(engine, prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8), "n-c")
        one = await collect(engine, prompt, SamplingParams(temperature=1.0, seed=43, max_tokens=8), "n-one")
        report["n_seed"] = {
            "n": len(a.outputs),
            # child i of a seeded request is sampled with seed + i: the second child of seed 42 is seed 43's
            "child_1_is_seed_43": list(a.outputs[1].token_ids) == list(one.outputs[0].token_ids),
            "samples": [list(o.token_ids) for o in a.outputs],
            "same_seed_same_samples": [list(o.token_ids) for o in a.outputs]
            == [list(o.token_ids) for o in b.outputs],
            "other_seed_differs": [list(o.token_ids) for o in a.outputs]
            != [list(o.token_ids) for o in c.outputs],
        }

        # -- stop strings: stop at a piece of the greedy text
        greedy_text = report["greedy"]["text"]
        stop_word = greedy_text[len(greedy_text) // 2 :][:6].strip() or greedy_text[-4:]
        out = await collect(
            engine, prompt, SamplingParams(temperature=0, max_tokens=24, stop=[stop_word]), "stop"
        )
        report["stop"] = {
            "stop": stop_word,
            "text": out.outputs[0].text,
            "finish_reason": out.outputs[0].finish_reason,
            "stop_reason": out.outputs[0].stop_reason,
        }

        # -- logprobs / top logprobs: per token a dict {token_id: Logprob(logprob, rank, decoded_token)}
        out = await collect(
            engine,
            prompt,
            SamplingParams(temperature=0, max_tokens=3, logprobs=3, prompt_logprobs=1),
            "logprobs",
        )
        report["logprobs"] = [
            {
                str(tid): {"logprob": round(lp.logprob, 4), "rank": lp.rank, "token": lp.decoded_token}
                for tid, lp in step.items()
            }
            for step in out.outputs[0].logprobs
        ]
        report["logprobs_cumulative"] = out.outputs[0].cumulative_logprob
        report["prompt_logprobs_len"] = len(out.prompt_logprobs or [])

        # -- penalties: repetition / presence / frequency change the greedy continuation
        pen = {}
        for name, extra in {
            "repetition_penalty": {"repetition_penalty": 1.8},
            "presence_penalty": {"presence_penalty": 2.0},
            "frequency_penalty": {"frequency_penalty": 2.0},
        }.items():
            out = await collect(
                engine, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **extra), name
            )
            pen[name] = {
                "differs_from_greedy": list(out.outputs[0].token_ids) != tokens,
                "distinct": len(set(out.outputs[0].token_ids)),
            }
        pen["greedy_distinct"] = len(set(tokens))
        report["penalties"] = pen

        # -- logit_bias: a +100 bias on one token makes greedy pick it every step
        forced = tokenizer.convert_tokens_to_ids("<|endoftext|>") + 5  # some ordinary token
        out = await collect(
            engine, prompt, SamplingParams(temperature=0, max_tokens=4, logit_bias={forced: 100.0}), "bias"
        )
        report["logit_bias"] = {"token": forced, "output": list(out.outputs[0].token_ids)}
        # allowed_token_ids: the other way to restrict sampling
        out = await collect(
            engine,
            prompt,
            SamplingParams(temperature=0, max_tokens=4, allowed_token_ids=[forced, forced + 1]),
            "allowed",
        )
        report["allowed_token_ids"] = list(out.outputs[0].token_ids)

        # -- min_tokens: a stop token (greedy's first) is ignored until min_tokens are out
        first = tokens[0]
        plain = await collect(
            engine, prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[first]), "min0"
        )
        held = await collect(
            engine,
            prompt,
            SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[first], min_tokens=5),
            "min5",
        )
        report["min_tokens"] = {
            "stop_token": first,
            "without": {
                "ids": list(plain.outputs[0].token_ids),
                "finish": plain.outputs[0].finish_reason,
                "stop_reason": plain.outputs[0].stop_reason,
            },
            "min_tokens_5": {"ids": list(held.outputs[0].token_ids), "finish": held.outputs[0].finish_reason},
        }

        # -- structured output (guidance backend, chosen engine-wide)
        structured: dict[str, Any] = {}
        cases = {
            "json_schema": StructuredOutputsParams(json=SCHEMA),
            "lark": StructuredOutputsParams(grammar=LARK),
            # our own grammar strings (modelhost.generation.grammar): Lark with %json, passed as they are
            "ours_json_schema_grammar": StructuredOutputsParams(
                grammar=json_schema_grammar(SCHEMA, 12, strict=True)
            ),
            "ours_tool_call_grammar": StructuredOutputsParams(
                grammar=tool_call_grammar(
                    [
                        (
                            "get_weather",
                            {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                                "required": ["city"],
                            },
                        )
                    ],
                    12,
                )
            ),
            "regex": StructuredOutputsParams(regex=r"(yes|no), [a-z]{2,5}"),
            "choice": StructuredOutputsParams(choice=["red", "green", "blue"]),
        }
        for name, so in cases.items():
            t = time.perf_counter()
            try:
                out = await collect(
                    engine,
                    prompt,
                    SamplingParams(temperature=0.8, seed=1, max_tokens=64, structured_outputs=so),
                    f"so-{name}",
                )
                text = out.outputs[0].text
                entry: dict[str, Any] = {
                    "text": text,
                    "finish": out.outputs[0].finish_reason,
                    "ms": round(1000 * (time.perf_counter() - t)),
                }
                if name in ("json_schema", "ours_json_schema_grammar", "ours_tool_call_grammar"):
                    try:
                        entry["parsed"] = json.loads(text)
                    except ValueError as error:
                        entry["parse_error"] = str(error)
            except Exception as error:  # a refused grammar: what the error looks like
                entry = {"error": f"{type(error).__name__}: {error}"}
            structured[name] = entry
            print(f"  structured {name}: {entry}", flush=True)
        # a malformed grammar: refused when the request is added (VLLMValidationError), before any step?
        try:
            await collect(
                engine,
                prompt,
                SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(grammar="start: (")),
                "so-bad",
            )
            structured["malformed"] = "accepted?!"
        except Exception as error:
            structured["malformed"] = f"{type(error).__name__}: {str(error)[:300]}"
        report["structured"] = structured

        # -- abort: a long request beside another; count steps until the engine runs one request again
        Stats.samples.clear()
        long_params = SamplingParams(
            temperature=0, max_tokens=900, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )

        async def drain(rid: str) -> Any:
            last = None
            async for o in engine.generate(prompt, long_params, rid):
                last = o
            return last

        other = asyncio.create_task(drain("beside"))
        seen, aborted_at, end_state = 0, 0.0, {}
        async for o in engine.generate(prompt, long_params, "victim"):
            seen += len(o.outputs[0].token_ids)
            if seen >= 20 and not aborted_at:
                aborted_at = time.perf_counter()
                await engine.abort("victim")
            if o.finished:
                end_state = {"finish_reason": o.outputs[0].finish_reason, "tokens_seen": seen}
        generator_ended_ms = 1000 * (time.perf_counter() - aborted_at)
        freed = await first_sample(aborted_at, running=1)
        usage_before = max((u for t, r, u in Stats.samples if t <= aborted_at), default=None)
        usage_after = next((u for t, r, u in Stats.samples if t > aborted_at and r == 1), None)
        # cancelling the consuming task is the other way: generate()'s CancelledError handler aborts
        cancel_task = asyncio.create_task(drain("cancelled"))
        await asyncio.sleep(0.5)
        cancel_task.cancel()
        cancelled_at = time.perf_counter()
        cancel_freed = await first_sample(cancelled_at, running=1)
        await engine.abort("beside")
        with contextlib.suppress(Exception):
            await other
        report["abort"] = {
            "end_state": end_state,
            "generator_ended_ms_after_abort": round(generator_ended_ms, 1),
            "engine_running_1_ms_after_abort": round(1000 * (freed - aborted_at), 1),
            "kv_usage_before_after": [usage_before, usage_after],
            "engine_running_1_ms_after_task_cancel": round(1000 * (cancel_freed - cancelled_at), 1),
            "unfinished_after": engine.get_num_unfinished_requests(),
        }
        print(f"  abort {report['abort']}", flush=True)

        # -- prefix caching: the second request with the same long prefix reuses whole blocks
        shared = tokenizer(SYSTEM)["input_ids"]
        first_q = await collect(
            engine,
            tokens_input(shared + tokenizer(" Question one?")["input_ids"]),
            SamplingParams(max_tokens=2),
            "prefix-1",
        )
        second_q = await collect(
            engine,
            tokens_input(shared + tokenizer(" Another question?")["input_ids"]),
            SamplingParams(max_tokens=2),
            "prefix-2",
        )
        no_read = await collect(
            engine,
            tokens_input(shared + tokenizer(" Third one?")["input_ids"]),
            SamplingParams(max_tokens=2, skip_reading_prefix_cache=True),
            "prefix-3",
        )
        report["prefix_caching"] = {
            "shared_prefix_tokens": len(shared),
            "first_num_cached_tokens": first_q.num_cached_tokens,
            "second_num_cached_tokens": second_q.num_cached_tokens,
            "skip_reading_prefix_cache_num_cached_tokens": no_read.num_cached_tokens,
            "prompt_tokens": [len(first_q.prompt_token_ids), len(second_q.prompt_token_ids)],
        }
        reset = await engine.reset_prefix_cache()
        after_reset = await collect(
            engine,
            tokens_input(shared + tokenizer(" Question one?")["input_ids"]),
            SamplingParams(max_tokens=2),
            "prefix-4",
        )
        report["prefix_caching"]["reset_returned"] = reset
        report["prefix_caching"]["after_reset_num_cached_tokens"] = after_reset.num_cached_tokens
        print(f"  prefix {report['prefix_caching']}", flush=True)
    finally:
        t = time.perf_counter()
        engine.shutdown()
        report["shutdown_s"] = round(time.perf_counter() - t, 2)


def run(folder: Path, out: Path, eager: bool, kv_cache_mb: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report: dict[str, Any] = {"eager": eager}
    try:
        asyncio.run(spike(folder, eager, kv_cache_mb, report))
    finally:  # what was seen so far, also when a step failed
        out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("build").add_argument("folder", type=Path)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, default=Path("/tmp/vllm-spike/result.json"))
    r.add_argument("--eager", action="store_true", help="enforce_eager: no torch.compile (faster start)")
    r.add_argument("--kv-cache-mb", type=int, default=64)
    c = sub.add_parser("compare")
    c.add_argument("folder", type=Path)
    c.add_argument("result", type=Path)
    args = parser.parse_args()
    if args.step == "build":
        build(args.folder)
    elif args.step == "run":
        run(args.folder, args.out, args.eager, args.kv_cache_mb)
    else:
        compare(args.folder, args.result)


if __name__ == "__main__":
    main()
