"""Tenants' grammars and chat templates compiled where a crash costs only the request: child processes
under limits.

Every grammar a generation request carries (a `response_format` or tool schema made into Lark, a
`structured_outputs` regex, choice, schema or grammar) passes `GrammarChecker.check` before the request
is dispatched: first the cheap bounded pass (`grammar_bounds`), then llguidance itself (GBNF → Lark
conversion, `LLMatcher.validate_grammar`), both in a compile process. llguidance is Rust: a grammar that
overflows its stack or its memory kills the process it runs in, and its GBNF converter is quadratic
Python. So it runs in a child process, never on an event loop and never in a process others depend on,
and whatever happens there is this request's 400 (`grammar_too_complex`, naming its field and the
bound): a bound exceeded, a crash (SIGSEGV), more CPU time than `cpu_seconds` (RLIMIT_CPU: SIGXCPU),
more memory than `memory_mb` (RLIMIT_AS: llguidance aborts), or no answer within `timeout_seconds`
(killed). The dead process is replaced; nobody else's compile shared it. The bounded pass runs there too,
not in the gateway: it is linear, but a 10 MB schema is still most of a second of reading that would
hold the gateway's interpreter (C's JSON reader keeps the GIL); the gateway only hashes the text.

The processes (`processes` of them per gateway process, and per supervisor for agent runs) start on
first use, not with the gateway, and live on; each takes one compile at a time, from a thread of this
pool's own (the event loop only awaits), so a compile waits for a free process, never for the loop.
They die with their parent (`PR_SET_PDEATHSIG`, and the end of their stdin), and `close` kills them.

The compile runs on a thread of `COMPILE_STACK` (4 MiB): not a large stack but half the 8 MiB a
replica's engine compiles on, so that the compile process is a stricter judge than any replica: a
grammar it passes has twice the stack it needed when a replica compiles it (a replica's compile against
its tokenizer needs the same stack as this validation, within 1 %: `grammar_bounds`), and one that needs
more crashes here, as a 400, instead of there. Under the default bounds a grammar needs under 1 MiB.

Answers are cached (`CACHE_ENTRIES`, by a hash of the field and the text, failures included but for
timeouts): agents send the same tool schemas with every request, which then cost one lookup.

A deployment's `chat_template` (PATCH, POST) is compiled there too (`check_chat_template`), in the
budgeted sandbox every replica renders it in (`generation.chat_templates`): Jinja's parser and Python's
compiler, never on an event loop nor in a gateway's own interpreter. So are a tenant's JSON values
against a tenant's JSON schema (`check_values`: an eval run's items against its eval's `item_schema`,
`generation.value_schemas`), whose regexes backtrack and whose branches multiply: never cached (the
values are a run's own), the first value that does not conform a 400 naming it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import hashlib
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from modelhost.errors import InvalidRequest
from modelhost.generation.contract import GenerationRequest
from modelhost.generation.grammar_bounds import CODE, GrammarBounds, check_grammar_text, check_lark, is_lark

if TYPE_CHECKING:
    from modelhost.config import Settings

COMPILE_STACK = 4 << 20
CACHE_ENTRIES = 1024
START_SECONDS = 60.0  # a process starting on a loaded machine (it imports llguidance)
Event = dict[str, Any]
Outcome = tuple[str | None, str | None, str | None]


@dataclass(frozen=True)
class CompileLimits:
    """The operator's limits on compile processes (`MODELHOST_GRAMMAR_COMPILE_*`)."""

    processes: int = 2
    cpu_seconds: int = 5
    memory_mb: int = 1024
    timeout_seconds: float = 10.0


class CompileFailed(Exception):
    """The compile process did not answer: what happened to it, and whether it would happen again."""

    def __init__(self, reason: str, lasting: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.lasting = reason, lasting


class GrammarChecker:
    """How this process constrains generation: the longest string a schema leaves unbounded gets
    (`max_string_length`), and the check every grammar passes before its request is dispatched."""

    def __init__(self, max_string_length: int, bounds: GrammarBounds, limits: CompileLimits) -> None:
        self.max_string_length = max_string_length
        self.bounds = bounds
        self.pool = CompilePool(limits)
        self._cache: OrderedDict[bytes, Outcome] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: Settings) -> GrammarChecker:
        limits = CompileLimits(
            settings.grammar_compile_processes,
            settings.grammar_compile_cpu_seconds,
            settings.grammar_compile_memory_mb,
            settings.grammar_compile_timeout_seconds,
        )
        return cls(settings.constrained_max_string_length, GrammarBounds.from_settings(settings), limits)

    async def check(self, requests: list[GenerationRequest]) -> None:
        """Every request's grammar checked and compiled (the choices of one request share theirs); a GBNF
        grammar is replaced by the Lark llguidance made of it. A 400 naming the grammar's field if not."""
        done: dict[str, str] = {}
        for request in requests:
            if grammar := request.grammar:
                if grammar not in done:
                    done[grammar] = await self.compiled(grammar, request.grammar_param or "grammar")
                request.grammar = done[grammar]

    async def check_chat_template(self, text: str) -> None:
        """A deployment's chat template compiled (never rendered) as replicas will; a 400 naming
        `chat_template` if it does not compile, or its compile crashes or overruns."""
        await self.compiled(text, "chat_template", kind="chat_template")

    async def check_values(
        self, schema: dict[str, Any], values: list[Any], names: list[str], param: str, what: str
    ) -> None:
        """Each of `values` conforms to `schema` (a vetted one: `value_schemas.check_value_schema`),
        checked in a compile process; a 400 naming `param` and the first that does not (by its entry of
        `names`), or saying which limit the check overran."""
        job = {"kind": "json_values", "schema": schema, "values": values, "names": names, "what": what}
        try:
            answer = await self.pool.run(job)
        except CompileFailed as exc:
            raise InvalidRequest(
                f"{param}: checking it against {what} {exc.reason}.", param=param, code=CODE
            ) from None
        if answer.get("error"):
            raise InvalidRequest(answer["error"], param=param, code=answer.get("code"))

    async def compiled(self, text: str, param: str, kind: str = "grammar") -> str:
        """`text` as llguidance's Lark, checked and validated; InvalidRequest naming `param` if not."""
        key = hashlib.sha256(f"{kind}\0{param}\0{text}".encode()).digest()
        if (outcome := self._cache.get(key)) is None:
            outcome = await self._compile(text, param, kind)
            self._cache[key] = outcome
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        lark, code, message = outcome
        if message is not None:
            raise InvalidRequest(message, param=param, code=code)
        return lark or text

    async def _compile(self, text: str, param: str, kind: str) -> Outcome:
        """(Lark if converted, error code, error message): what the cache keeps."""
        job = {"kind": kind, "text": text, "param": param, "bounds": asdict(self.bounds)}
        try:
            answer = await self.pool.run(job)
        except CompileFailed as exc:
            message = f"{param}: compiling it {exc.reason}."
            if not exc.lasting:  # not the grammar's doing, maybe: not remembered
                raise InvalidRequest(message, param=param, code=CODE) from None
            return None, CODE, message
        if answer.get("error"):
            return None, answer.get("code"), answer["error"]
        return answer.get("lark"), None, None

    def close(self) -> None:
        self.pool.close()


class CompilePool:
    """Compile processes, started when a compile finds none free (up to `limits.processes`)."""

    def __init__(self, limits: CompileLimits) -> None:
        self.limits = limits
        self._idle: list[_Child] = []
        self._all: list[_Child] = []  # every live one, for `close` (and the finalizer, without self)
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        weakref.finalize(self, _kill_all, self._all)

    async def run(self, job: Event) -> Event:
        """The compile process's answer to `job`; CompileFailed if it died, overran or timed out."""
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.limits.processes, thread_name_prefix="grammar-compile"
                )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, {**job, "cpu": self.limits.cpu_seconds})

    def _run(self, job: Event) -> Event:
        payload = json.dumps(job).encode() + b"\n"
        for _attempt in (1, 2):  # a process that died while idle (killed, its parent thread gone): replaced
            child = self._take()
            try:
                answer = child.ask(payload, self.limits)
            except CompileFailed:
                self._drop(child)
                raise
            except BrokenPipeError:
                self._drop(child)
                continue
            self._give_back(child)
            return answer
        raise CompileFailed("could not reach a compile process", lasting=False)

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.process.poll() is None:
                    return child
                self._all.remove(child)
        child = _Child(self.limits.memory_mb)
        with self._lock:
            self._all.append(child)
        return child

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(child)
                return
        self._drop(child)

    def _drop(self, child: _Child) -> None:
        child.kill()
        with self._lock, contextlib.suppress(ValueError):
            self._all.remove(child)

    def processes(self) -> list[int]:
        """The pids of the live compile processes (for tests and operators)."""
        with self._lock:
            return [c.process.pid for c in self._all if c.process.poll() is None]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._idle.clear()
            executor, self._executor = self._executor, None
        _kill_all(self._all)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _kill_all(children: list[_Child]) -> None:
    for child in list(children):
        child.kill()


class _Child:
    """One compile process and its pipes; a line of JSON each way per compile."""

    def __init__(self, memory_mb: int) -> None:
        command = [sys.executable, "-m", __name__, str(os.getpid()), str(memory_mb)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buffer = b""
        if self._line(time.monotonic() + START_SECONDS) != b"ready":
            self.kill()
            raise CompileFailed("could not start a compile process", lasting=False)

    def ask(self, payload: bytes, limits: CompileLimits) -> Event:
        deadline = time.monotonic() + limits.timeout_seconds
        if not self._send(payload, deadline) or (line := self._line(deadline)) is None:
            self.kill()
            raise CompileFailed(f"took longer than {limits.timeout_seconds:g} s", lasting=False)
        if line == b"":
            raise CompileFailed(*self._death(limits))
        answer: Event = json.loads(line)
        return answer

    def _send(self, payload: bytes, deadline: float) -> bool:
        """Write the whole of `payload` by `deadline` (a stopped process reads nothing: no blocking)."""
        assert self.process.stdin is not None
        fd = self.process.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(payload)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                return False
            view = view[os.write(fd, view) :]
        return True

    def _line(self, deadline: float) -> bytes | None:
        """The next line the process writes; b"" at its end, None past `deadline`."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _death(self, limits: CompileLimits) -> tuple[str, bool]:
        """What ended the process, and whether the grammar would end it again (a crash, its CPU time),
        or maybe not (killed from outside: the kernel's out-of-memory killer, an operator)."""
        try:
            code = self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            return "lost its compile process", False
        if code == -signal.SIGXCPU:
            return f"took more than {limits.cpu_seconds} s of CPU time", True
        if code in (-signal.SIGSEGV, -signal.SIGBUS):
            stack, name = COMPILE_STACK >> 20, signal.Signals(-code).name
            return f"overflowed the compile process's {stack} MiB stack (llguidance: {name})", True
        if code == -signal.SIGABRT:
            return f"needed more than the compile process's {limits.memory_mb} MB of memory", True
        if code < 0:
            return f"lost its compile process (signal {signal.Signals(-code).name})", False
        return f"lost its compile process (exit status {code})", False

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe and pipe.close()


# ---------------------------------------------------------------- the compile process


def _serve(parent: int, memory_mb: int) -> None:
    """A compile process: one compile per line of stdin, each on a fresh thread of `COMPILE_STACK`."""
    with contextlib.suppress(OSError, AttributeError):  # Linux: die with the parent
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        return
    import llguidance.gbnf_to_lark  # noqa: F401 (before the limits: what every compile needs, loaded once)

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    threading.stack_size(COMPILE_STACK)
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        job = json.loads(line)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + int(job["cpu"])
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))
        answer: Event = {}
        thread = threading.Thread(target=_compile, args=(job, answer))
        thread.start()
        thread.join()
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


def _compile(job: Event, answer: Event) -> None:
    answer.update(_compiled(job))


def _compiled(job: Event) -> Event:
    if job.get("kind") == "chat_template":
        return _template_compiled(job["text"])
    if job.get("kind") == "json_values":
        return _values_checked(job)
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    text, param, bounds = job["text"], job["param"], GrammarBounds(**job["bounds"])
    converted = not is_lark(text)
    try:
        check_grammar_text(text, param, bounds)
        if converted:
            text = any_to_lark(text)
            check_lark(text, param, bounds)
        error = llguidance.LLMatcher.validate_grammar(text)
    except InvalidRequest as exc:
        return {"error": exc.message, "code": exc.code}
    except MemoryError:
        return {"error": f"{param}: compiling it needs more memory than it may.", "code": CODE}
    except Exception as exc:  # the converter raises bare exceptions of several kinds (RecursionError too)
        message = f"{param}: neither Lark nor GBNF that can be read: {str(exc)[:500]}"
        return {"error": message, "code": "invalid_request"}
    if error:
        return {"error": f"{param} cannot be enforced: {error.strip()[:2000]}", "code": "invalid_request"}
    return {"lark": text if converted else None}


def _template_compiled(text: str) -> Event:
    from modelhost.generation.deployment_settings import check_chat_template

    try:
        check_chat_template(text)
    except InvalidRequest as exc:
        return {"error": exc.message, "code": exc.code}
    except MemoryError:
        return {"error": "chat_template: compiling it needs more memory than it may.", "code": CODE}
    return {}


def _values_checked(job: Event) -> Event:
    from modelhost.generation.value_schemas import first_mismatch

    what = job["what"]
    try:
        mismatch = first_mismatch(job["schema"], job["values"], job["names"], what)
    except InvalidRequest as exc:
        return {"error": exc.message, "code": exc.code}
    except MemoryError:
        return {"error": f"Checking values against {what} needs more memory than it may.", "code": CODE}
    except Exception as exc:  # a schema that passed the meta-schema yet cannot be applied
        return {"error": f"{what} cannot be applied: {type(exc).__name__}: {str(exc)[:300]}"}
    return {} if mismatch is None else {"error": mismatch, "code": "invalid_request"}


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
