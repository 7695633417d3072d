"""Which replica a generation goes to (runtime.gateway.routing, docs/runtime.md "Routing"): the one its
prompt's prefix belongs to, the same from every process, unless that one is past the bound. The choice
across real gateway processes and replicas is tests/test_gateway_processes.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from modelhost.generation.choices import chat_requests, completion_requests
from modelhost.generation.contract import GenerationRequest
from modelhost.protocol.chat import ChatCompletionRequest, CompletionRequest
from modelhost.runtime.gateway.routing import PREFIX_BYTES, affinity_of, choose

SYSTEM = "You answer questions about the 1997 tide tables of the port of Bergen. " * 40


@dataclass
class Replica:
    route: str
    in_flight: int = 0


REPLICAS = [Replica(f"/run/modelhost/replicas/dep_1-{i}.sock") for i in range(4)]


def chat(question: str, system: str = SYSTEM, **fields: object) -> GenerationRequest:
    body = ChatCompletionRequest.model_validate(
        {
            "model": "chat",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            **fields,
        }
    )
    return chat_requests(body, 64)[0][0]


def test_chats_that_share_a_long_system_prompt_share_an_affinity_whatever_the_question() -> None:
    assert len(SYSTEM) > PREFIX_BYTES
    assert affinity_of(chat("when is high tide?")) == affinity_of(chat("and low tide?"))
    assert affinity_of(chat("when is high tide?")) != affinity_of(
        chat("when is high tide?", system="Be brief.")
    )


def test_a_conversation_keeps_its_affinity_as_it_grows() -> None:
    """Its system prompt and first message stay as turns are added: every turn goes where the earlier
    ones are cached, however short the system prompt."""
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    later = [*first, {"role": "assistant", "content": "hi!"}, {"role": "user", "content": "the tides?"}]
    assert affinity_of(GenerationRequest(messages=first)) == affinity_of(GenerationRequest(messages=later))
    other = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "good morning"}]
    assert affinity_of(GenerationRequest(messages=first)) != affinity_of(GenerationRequest(messages=other))


def test_what_the_client_says_places_the_request_before_its_prompt() -> None:
    """`prompt_cache_key`, else `user` (the Messages API's `metadata.user_id` arrives as `user`)."""
    assert affinity_of(chat("a", system="one", prompt_cache_key="team-7")) == affinity_of(
        chat("b", system="two", prompt_cache_key="team-7")
    )
    assert affinity_of(chat("a", system="one", user="ana")) == affinity_of(
        chat("b", system="two", user="ana")
    )
    assert affinity_of(chat("a", prompt_cache_key="k", user="ana")) == "key:k"
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "once upon a time", "user": "ana"})
    assert affinity_of(completion_requests(completion, 64)[0]) == "key:ana"


def test_a_tokenizer_question_has_no_affinity() -> None:
    assert affinity_of(GenerationRequest(tokenize=True, prompt="x")) == ""


def test_the_choice_is_a_function_of_the_affinity_and_the_replicas_alone() -> None:
    """Another Python process (another gateway process) makes the same choice: nothing per-process
    (a salted `hash()`, an order) takes part."""
    affinities = [affinity_of(chat(f"q{i}", system=f"system prompt {i}")) for i in range(32)]
    here = [choose(REPLICAS, a, 2).route for a in affinities]
    script = (
        "import sys, json\n"
        "from modelhost.runtime.gateway.routing import choose\n"
        "from tests.test_replica_routing import REPLICAS\n"
        "print(json.dumps([choose(REPLICAS, a, 2).route for a in json.loads(sys.stdin.read())]))\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(affinities),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(there) == here
    assert choose(list(reversed(REPLICAS)), affinities[0], 2).route == here[0]  # order plays no part
    assert len(set(here)) == len(REPLICAS)  # 32 prefixes spread over the 4 replicas


def test_a_replica_past_the_bound_is_skipped_for_the_least_busy() -> None:
    affinity = affinity_of(chat("when is high tide?"))
    own = choose(REPLICAS, affinity, 2)
    busy = [Replica(r.route, 1 if r is own else 0) for r in REPLICAS]
    assert choose(busy, affinity, 2).route == own.route  # one more than the others: still its own
    busier = [Replica(r.route, 2 if r is own else 0) for r in REPLICAS]
    chosen = choose(busier, affinity, 2)
    assert chosen.route != own.route and chosen.in_flight == 0


def test_a_replica_going_away_moves_only_the_prefixes_it_held() -> None:
    affinities = [affinity_of(chat(f"q{i}", system=f"system prompt {i}")) for i in range(64)]
    before = {a: choose(REPLICAS, a, 2).route for a in affinities}
    gone = REPLICAS[1].route
    after = {a: choose([r for r in REPLICAS if r.route != gone], a, 2).route for a in affinities}
    assert [a for a in affinities if before[a] != after[a]] == [a for a in affinities if before[a] == gone]


def test_without_an_affinity_the_least_busy_replica_takes_the_request() -> None:
    replicas = [Replica("a", 3), Replica("b", 1), Replica("c", 2)]
    assert choose(replicas, "", 2).route == "b"
