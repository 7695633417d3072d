"""Virtual token counters (`generation.fairness`, issue 72): whose turn it is on a generating engine."""

from __future__ import annotations

import pytest

from modelhost.generation.fairness import (
    LINGER_SECONDS,
    HeldTenants,
    Lingering,
    StepCosts,
    TokenWeights,
    VirtualTokenCounters,
    decoding_share,
    engine_number,
    levels,
)


def test_a_tenant_is_an_account_and_a_key_inside_it() -> None:
    assert levels("acct_1/key_9") == ("acct_1", "key_9")
    assert levels("key_9") == ("", "key_9")
    assert levels("") == ("", "")


def test_the_least_served_tenant_goes_next_and_equal_ones_in_the_order_given() -> None:
    counters = VirtualTokenCounters()
    counters.charge("a/1", prompt=10, output=5)  # 10 + 2 x 5 = 20
    counters.charge("b/1", prompt=30)
    assert counters.counters("a/1") == (20.0, 20.0)
    assert counters.least(["b/1", "a/1", "c/1"]) == "c/1"
    assert counters.least(["b/1", "a/1"]) == "a/1"
    assert counters.least(["d/1", "c/1"]) == "d/1"


def test_three_tenants_served_by_turns_receive_equal_service() -> None:
    """Admitting by the least counter and charging what each admission costs keeps three backlogged
    tenants within one request's cost of each other, however unequal their requests."""
    counters = VirtualTokenCounters()
    cost = {"a/1": 10, "b/1": 40, "c/1": 25}  # output tokens per request
    served = dict.fromkeys(cost, 0)
    for _ in range(300):
        turn = counters.least(cost)
        counters.charge(turn, output=cost[turn])
        served[turn] += cost[turn]
    assert max(served.values()) - min(served.values()) <= max(cost.values())


def test_accounts_share_first_and_an_accounts_keys_share_what_it_gets() -> None:
    """Account a's two keys together get what account b's one key gets; inside a, its keys take turns."""
    counters = VirtualTokenCounters()
    served = dict.fromkeys(["a/1", "a/2", "b/1"], 0)
    for _ in range(600):
        turn = counters.least(served)
        counters.charge(turn, output=1)
        served[turn] += 1
    assert served == {"a/1": 150, "a/2": 150, "b/1": 300}


def test_accounts_and_keys_are_served_in_the_ratio_of_their_weights() -> None:
    """Account a of weight 2 gets twice account b's tokens; inside a, key 1 of weight 3 three times key
    2's (the weights a request carries, read at its arrival)."""
    counters = VirtualTokenCounters()
    weights = {"a/1": (2.0, 3.0), "a/2": (2.0, 1.0), "b/1": (1.0, 1.0)}
    held: list[str] = []
    for tenant, shares in weights.items():
        counters.arrive(tenant, held, shares)
        held.append(tenant)
    served = dict.fromkeys(weights, 0)
    for _ in range(1200):
        turn = counters.least(served)
        counters.charge(turn, output=1)
        served[turn] += 1
    assert served == {"a/1": 600, "a/2": 200, "b/1": 400}


def test_a_returning_tenant_is_lifted_to_the_least_held_and_banks_no_idle_time() -> None:
    counters = VirtualTokenCounters()
    counters.charge("a/1", output=100)
    counters.charge("b/1", output=40)
    counters.arrive("c/1", held=["a/1", "b/1"])  # a new account starts level with the least served one
    assert counters.counters("c/1") == (80.0, 0.0)  # (its key has no other key of its account to match)
    counters.arrive("a/1", held=["b/1", "c/1"])  # never lowered
    assert counters.counters("a/1") == (200.0, 200.0)
    counters.arrive("a/2", held=["a/1", "b/1"])  # its account is held: lifted among its account's keys
    assert counters.counters("a/2") == (200.0, 200.0)


def test_an_engine_that_holds_nothing_starts_every_counter_again() -> None:
    counters = VirtualTokenCounters()
    counters.charge("a/1", output=100)
    counters.arrive("b/1", held=[])
    assert counters.counters("a/1") == (0.0, 0.0)


def test_prompt_and_output_tokens_cost_their_weights() -> None:
    counters = VirtualTokenCounters(TokenWeights(prompt=0.5, output=3))
    counters.charge("a/1", prompt=10, output=2)
    assert counters.counters("a/1") == (11.0, 11.0)


def test_keys_are_compared_only_with_their_own_accounts_keys() -> None:
    counters = VirtualTokenCounters()
    counters.charge("a/1", output=6)
    counters.arrive("b/1", held=["a/1"])  # account b starts level with a; its key, alone in b, at 0
    assert counters.counters("b/1") == (12.0, 0.0)
    assert counters.least(["a/1", "b/1"]) == "a/1"  # equal accounts: the first given, whatever the keys
    assert counters.order(["a/1", "b/1", "a/2"]) == ["a/2", "a/1", "b/1"]  # a's keys together, by theirs


def test_step_costs_say_how_large_a_batch_keeps_a_step_within_the_slowdown() -> None:
    costs = StepCosts()
    assert costs.cap() is None  # nothing seen yet
    for size in (1, 8, 16, 32):
        costs.record(size, 0.010 + 0.00125 * (size - 1))  # a step of 33 takes 5 x a step of one
    assert costs.cap(slowdown=2.5) == 13  # 10 ms + 12 x 1.25 ms = 25 ms
    flat = StepCosts()
    for size in (1, 32):
        flat.record(size, 0.010)  # a GPU: no batch slows a step
    assert flat.cap() is None
    unknown = StepCosts()
    for size in (30, 32):
        unknown.record(size, 0.05 + size * 0.001)
    assert unknown.cap() is None  # no small batch seen: a step of one is not known


def test_a_light_tenant_decodes_in_a_small_batch_and_the_heavy_ones_take_turns() -> None:
    counters = VirtualTokenCounters()
    decoding = [("a", i) for i in range(12)] + [("b", 0)]
    waited = {s: 0 for s in decoding}

    def step() -> list[tuple[str, int]]:
        chosen = decoding_share(decoding, 5, lambda s: s[0], counters, lambda s: waited[s])
        for s in decoding:
            waited[s] = 0 if s in chosen else waited[s] + 1
        return chosen

    first = step()
    assert len(first) == 5 and ("b", 0) in first  # b always, four of a's
    seen = set(first)
    for _ in range(2):
        seen |= set(step())
    assert seen == set(decoding)  # within three steps every one of a's has decoded: none starved


def test_tenants_that_are_all_heavy_share_the_full_batch() -> None:
    counters = VirtualTokenCounters()
    decoding = [("a", i) for i in range(8)] + [("b", i) for i in range(8)]
    assert decoding_share(decoding, 5, lambda s: s[0], counters, lambda s: 0) == decoding
    assert (
        decoding_share(decoding[:8], 5, lambda s: s[0], counters, lambda s: 0) == decoding[:8]
    )  # one tenant
    assert decoding_share(decoding, None, lambda s: s[0], counters, lambda s: 0) == decoding  # cap unknown


def test_an_engines_number_puts_low_work_last_then_the_least_served_then_a_requests_own_number() -> None:
    counters = VirtualTokenCounters()
    counters.charge("a/1", output=50)
    held = ["a/1", "b/1"]
    assert counters.rank("a/1", held) == (100.0, 0.0) and counters.rank("b/1", held) == (0.0, 0.0)

    def number(tenant: str, priority: int = 0, low: bool = False) -> int:
        return engine_number(counters.rank(tenant, held), priority, low, 1000)

    assert number("b/1") < number("a/1")  # the least served first, whatever a's own number says
    assert number("b/1") < number("a/1", priority=-1000)
    assert number("a/1", priority=-1) < number("a/1") < number("a/1", priority=1000)  # its own order
    assert number("a/1", priority=1000) < number("b/1", low=True)  # low work after all interactive
    counters.charge("a/1", output=10**9)
    assert number("a/1") < number("b/1", low=True)  # ranks saturate below the low bit


def test_held_tenants_are_those_with_a_request_in_the_engine_until_its_last_ends() -> None:
    held = HeldTenants()
    with held.holding("a/1"), held.holding("a/1"):
        assert list(held) == ["a/1"]
    with pytest.raises(RuntimeError), held.holding("b/1"):
        raise RuntimeError("the request failed")
    assert list(held) == []


def test_a_keys_weights_travel_with_its_request_to_the_engine() -> None:
    """The gateway's request carries its key's principal's weights in `Generate`, and the replica hands
    them with its tenant to the engine (`runtime.worker.host.with_priority`)."""
    import contextvars

    from modelhost.auth.principal import (
        Principal,
        PrincipalKind,
        acting_for,
        current_tenant,
        current_weights,
    )
    from modelhost.generation.contract import GenerationRequest
    from modelhost.runtime.replica_protocol import Generate, decode_to_replica, encode
    from modelhost.runtime.worker.host import with_priority

    principal = Principal(kind=PrincipalKind.ACCOUNT, account_id="acct", key_id="key", weights=(2.0, 0.5))

    def sent() -> Generate:
        acting_for(principal)
        return Generate(1, GenerationRequest(prompt="hi"), False, "", current_tenant(), current_weights())

    message = decode_to_replica(encode(contextvars.copy_context().run(sent))[4:])  # past its length
    assert isinstance(message, Generate)
    request = with_priority(message)
    assert isinstance(request, GenerationRequest)
    assert (request.tenant, request.weights) == ("acct/key", (2.0, 0.5))


def test_a_tenant_whose_request_has_just_ended_keeps_the_batch_small_for_its_next_one() -> None:
    now = [0.0]
    lingering = Lingering(lambda: now[0])
    counters = VirtualTokenCounters()
    heavy = [("a", i) for i in range(12)]
    assert decoding_share(heavy, 5, lambda s: s[0], counters, lambda s: 0, lingering.tenants(["a"])) == heavy
    lingering.ended("b")  # b's one request has ended: its next comes as soon as its client reads the end
    now[0] = LINGER_SECONDS / 2
    assert len(decoding_share(heavy, 5, lambda s: s[0], counters, lambda s: 0, lingering.tenants(["a"]))) == 5
    assert lingering.tenants(["a", "b"]) == []  # b is back: it counts by its requests again
    lingering.ended("b")
    now[0] = LINGER_SECONDS * 2
    assert lingering.tenants(["a"]) == []  # b has not come back: the batch is a's whole again
