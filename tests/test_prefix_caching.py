"""Prefix caching in simulate_llm (vLLM V1's automatic prefix caching): exact cases by hand, conservation, a
differential test against a plain reference, and bad input named before anything runs.

The reference below is the engine written the obvious way, as in tests/test_simulate_llm.py, with the cache as
plainly as it can be kept: a dict from a block's whole token prefix to the blocks holding it (oldest first), a
free list (head first), a reference count per block, and every sequence's blocks listed, decode blocks included.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from infergraph_lite import simulate_llm
from infergraph_lite.simulation.llm_blocks import block_keys
from infergraph_lite.simulation.llm_scheduler import LLMEngine
from infergraph_lite.simulation.prefix_workloads import multi_turn, shared_prefix_prompts

# --- exact cases by hand ------------------------------------------------------------------------------------


def alone(prompts, block_size=16, kv_cache_tokens=None, output=2, **kw):
    # Each request arrives after the one before it has finished: only the cache links them.
    n = len(prompts)
    return simulate_llm(n_requests=n, prompts=prompts, output_tokens=output, step_time=0.01, max_num_seqs=4,
                        arrivals=[float(i) for i in range(n)], block_size=block_size,
                        kv_cache_tokens=kv_cache_tokens, prefix_caching=True, **kw)


def test_an_identical_prompt_reuses_every_full_block_but_the_one_holding_its_last_token():
    prompt = list(range(64))                      # 4 full blocks: the cap, (64 - 1) // 16 = 3, leaves one to compute
    r = alone([prompt] * 3)
    assert r.cached_tokens.tolist() == [0, 48, 48]
    assert r.steps_prefill_tokens.tolist() == [64, 0, 16, 0, 16, 0]
    assert r.prefix_hit_rate == pytest.approx(96 / 192)
    np.testing.assert_allclose(r.ttft, 0.01)      # a constant step: the hit saves compute, not a step


def test_a_request_admitted_in_the_same_step_already_reuses_the_blocks_scheduled_before_it():
    # vLLM's allocate_slots caches a full block when a step is scheduled to compute it.
    prompt = list(range(64))
    r = simulate_llm(n_requests=2, prompts=[prompt, prompt], output_tokens=2, step_time=0.01, max_num_seqs=2,
                     prefix_caching=True)
    assert r.cached_tokens.tolist() == [0, 48]
    assert r.steps_prefill_tokens.tolist() == [64 + 16, 0]


def test_a_shared_system_prompt_is_reused_up_to_its_last_full_block():
    prompts = shared_prefix_prompts(4, system_tokens=40, question_tokens=10)   # 2 full blocks of system prompt
    r = alone(prompts)
    assert r.cached_tokens.tolist() == [0, 32, 32, 32]
    assert r.prefix_hit_rate == pytest.approx(96 / 200)
    calls = []
    simulate_llm(n_requests=4, prompts=prompts, output_tokens=2, max_num_seqs=4, arrivals=[0.0, 1.0, 2.0, 3.0],
                 prefix_caching=True, step_time=lambda p, d, kv: calls.append((p, d, kv)) or 0.01)
    # step_time gets the prompt tokens each step computes (cached excluded); kv_tokens counts the reused ones.
    assert calls[1:] == [(50, 0, 50), (0, 1, 51), (18, 0, 50), (0, 1, 51), (18, 0, 50), (0, 1, 51),
                         (18, 0, 50), (0, 1, 51)]


@pytest.mark.parametrize("blocks, cached", [
    (5, [0, 0, 0, 0, 0, 0]),          # one prompt's 5 blocks: each request evicts all of the other's
    (10, [0, 0, 64, 64, 64, 64]),     # both: every full block the cap allows (4 of 4.5)
    # One block more than one prompt: B takes the never-used block and then the queue's head, A's blocks from
    # its last; A's first block, queued last, survives, and so it goes on: one block (16 tokens) each time.
    (6, [0, 0, 16, 16, 16, 16]),
])
def test_two_system_prompts_taking_turns_keep_what_the_eviction_order_leaves(blocks, cached):
    prompts = shared_prefix_prompts(6, system_tokens=64, question_tokens=8, n_systems=2)    # 72 tokens: 5 blocks
    r = alone(prompts, kv_cache_tokens=16 * blocks, output=1)
    assert r.cached_tokens.tolist() == cached
    assert r.steps_kv_slots.max() <= 16 * blocks


def test_a_multi_turn_chat_reuses_the_previous_turns_full_prompt_blocks():
    w = multi_turn(1, 4, system_tokens=30, user_tokens=7, answer_tokens=5)
    r = alone(w.prompts, output=w.output_tokens)
    lengths = [len(p) for p in w.prompts]
    # Blocks of generated tokens are not cached (the simulator has no ids for them): a lower bound on vLLM's.
    assert r.cached_tokens.tolist() == [0] + [16 * (p // 16) for p in lengths[:-1]]


def test_off_by_default_and_prompts_alone_give_the_same_results_as_their_lengths():
    prompts = shared_prefix_prompts(30, system_tokens=40, question_tokens=9, n_systems=3)
    kw = dict(n_requests=30, output_tokens=5, step_time=lambda p, d, kv: 0.01 + 1e-4 * p, max_num_seqs=4,
              arrival_rate=50.0, kv_cache_tokens=256)
    plain = simulate_llm(prompt_tokens=[len(p) for p in prompts], **kw)
    for r in (simulate_llm(prompts=prompts, **kw), simulate_llm(prompts=prompts, prefix_caching=False, **kw)):
        np.testing.assert_array_equal(r.finish, plain.finish)
        np.testing.assert_array_equal(r.steps_prefill_tokens, plain.steps_prefill_tokens)
        assert r.cached_tokens.tolist() == [0] * 30 and r.prefix_hit_rate == 0.0
    cached = simulate_llm(prompts=prompts, prefix_caching=True, **kw)
    assert cached.prefix_hit_rate > 0.5 and cached.mean("ttft") < plain.mean("ttft")


# --- conservation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_every_prompt_token_is_computed_or_reused_and_every_block_comes_back(seed):
    rng = np.random.default_rng(seed)
    n = 200
    prompts = [p[: rng.integers(1, len(p) + 1)]
               for p in shared_prefix_prompts(n, system_tokens=48, question_tokens=40, n_systems=4, seed=seed)]
    output = rng.integers(1, 30, n).tolist()
    arrivals = np.cumsum(rng.exponential(0.01, n)).tolist()
    # Unlimited cache: no preemption, each prompt prefilled once.
    r = simulate_llm(n_requests=n, prompts=prompts, output_tokens=output, arrivals=arrivals, step_time=0.01,
                     max_num_seqs=16, max_num_batched_tokens=64, prefix_caching=True)
    assert r.preemptions == 0
    assert r.steps_prefill_tokens.sum() + r.cached_tokens.sum() == sum(len(p) for p in prompts)
    assert r.output_tokens.tolist() == output
    # A small cache: preemptions re-prefill; still every token comes, and every block is free at the end.
    keys = block_keys(prompts, 8)
    engine = LLMEngine([len(p) for p in prompts], output, arrivals, max_num_seqs=16, max_num_batched_tokens=64,
                       num_blocks=40, block_size=8, prefix_keys=keys)
    engine.run(lambda p, d, kv: 0.01)
    blocks = engine.blocks
    assert engine.preemptions > 0 and engine.generated == output
    assert blocks.num_used == 0 and blocks.num_free == 40 and not any(blocks.ref.values())
    assert len(blocks.queue) == blocks.never_used and not blocks.decode_pool
    assert all(blocks.key_of[b] == k for k, copies in blocks.block_of.items() for b in copies)


# --- the reference: one object per sequence, every block listed, the cache a dict and a free list -------------


class Seq:
    def __init__(self, i, ids, output):
        self.i, self.ids, self.prompt, self.output = i, ids, len(ids), output
        self.num_tokens, self.computed, self.generated = len(ids), 0, 0
        self.blocks: list[int] = []
        self.decoding, self.cached, self.registered = False, None, 0
        self.times: list[float] = []


def reference(prompts, output, arrival, *, max_num_seqs, budget=math.inf, num_blocks=math.inf, block_size=16,
              chunked=True, prefill_first=False, static=False, step_time=lambda p, d, kv: 1.0):
    seqs = [Seq(i, p, o) for i, (p, o) in enumerate(zip(prompts, output))]
    n, bs = len(seqs), block_size
    waiting: deque[Seq] = deque()
    running: list[Seq] = []
    cache: dict[tuple, list[int]] = {}    # a full block's whole token prefix -> the blocks holding it
    prefix_of: dict[int, tuple] = {}
    free: list[int] = []                  # free blocks that were used, head first
    ref: dict[int, int] = {}
    state = {"new": 0, "preemptions": 0}
    now, nxt, done, steps = 0.0, 0, 0, []

    def n_free():
        return num_blocks - state["new"] + len(free)

    def take():
        if state["new"] < num_blocks:
            b = state["new"]
            state["new"] += 1
        else:
            b = free.pop(0)
            if b in prefix_of:
                prefix = prefix_of.pop(b)
                cache[prefix].remove(b)
                if not cache[prefix]:
                    del cache[prefix]
        ref[b] = 1
        return b

    def lookup(s):
        hits = []
        for j in range((s.prompt - 1) // bs):
            copies = cache.get(tuple(s.ids[: (j + 1) * bs]))
            if not copies:
                break
            hits.append(copies[0])
        return hits

    def alloc(s, ntok, hits=()):
        start = len(hits) * bs if hits else s.computed
        need = -(-(start + ntok) // bs) - len(hits) - len(s.blocks)
        if need + sum(1 for b in hits if ref[b] == 0) > n_free():
            return False
        for b in hits:
            if ref[b] == 0:
                free.remove(b)
            ref[b] += 1
            s.blocks.append(b)
        if hits:
            s.computed, s.registered = start, len(hits)
        for _ in range(need):
            s.blocks.append(take())
        while s.registered < min((start + ntok) // bs, s.prompt // bs):     # each full prompt block once
            j = s.registered
            prefix = tuple(s.ids[: (j + 1) * bs])
            cache.setdefault(prefix, []).append(s.blocks[j])
            prefix_of[s.blocks[j]] = prefix
            s.registered += 1
        return True

    def release(s):
        for b in reversed(s.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free.append(b)
        s.blocks = []

    def preempt(s, sched):
        running.remove(s)
        sched[:] = [(x, k) for x, k in sched if x is not s]
        release(s)
        s.computed, s.decoding, s.registered = 0, False, 0
        waiting.appendleft(s)
        state["preemptions"] += 1

    def join(s, hits):
        if s.cached is None:
            s.cached = len(hits) * bs
        running.append(waiting.popleft())

    def admit(sched, left, whole):
        while waiting and len(running) < max_num_seqs and left > 0:
            s = waiting[0]
            hits = lookup(s)
            ntok = s.num_tokens - len(hits) * bs
            if not whole:
                ntok = min(ntok, left)
            if ntok > left or not alloc(s, ntok, hits):
                break
            join(s, hits)
            sched.append((s, ntok))
            left -= ntok

    while done < n:
        if not running and not waiting:
            now = max(now, arrival[nxt])
        while nxt < n and arrival[nxt] <= now:
            waiting.append(seqs[nxt])
            nxt += 1
        sched: list[tuple[Seq, int]] = []
        left, preempted, prefill_step = budget, False, False
        if static:
            if not running:
                while waiting and len(running) < max_num_seqs:
                    s, hits = waiting[0], lookup(waiting[0])
                    if not alloc(s, s.num_tokens - len(hits) * bs, hits):
                        break
                    join(s, hits)
        elif prefill_first:
            admit(sched, left, whole=True)
            prefill_step = bool(sched)
        if not prefill_step:
            for phase in (True, False):       # decodes first, then prefills, each in admission order
                k = 0
                while k < len(running):
                    s = running[k]
                    if s.decoding != phase or (not phase and left <= 0):
                        k += 1
                        continue
                    if not phase and not chunked and s.num_tokens - s.computed > left:
                        break
                    ntok = 1 if phase else min(s.num_tokens - s.computed, left)
                    ok = True
                    while not alloc(s, ntok):
                        victim = running[-1]
                        preempt(victim, sched)
                        preempted = True
                        if victim is s:
                            ok = False
                            break
                    if not ok:
                        continue
                    sched.append((s, ntok))
                    left -= ntok
                    k += 1
            if not (static or prefill_first or preempted):
                admit(sched, left, whole=not chunked)
        decode = sum(1 for s, _ in sched if s.decoding)
        prefill = sum(k for s, k in sched if not s.decoding)
        used = sum(1 for c in ref.values() if c > 0)
        for s, k in sched:
            s.computed += k
        kv = sum(s.computed for s in running)
        now += step_time(prefill, decode, kv)
        steps.append((now, prefill, decode, kv, used))
        for s, _ in sched:
            if s.computed == s.num_tokens:
                s.generated += 1
                s.num_tokens += 1
                s.times.append(now)
                s.decoding = True
                if s.generated == s.output:
                    running.remove(s)
                    release(s)
                    done += 1
    return seqs, steps, state["preemptions"]


@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([2, 4, 8]))
    n = draw(st.integers(1, 25))
    # A few shared stems, so that prompts share blocks (and half-blocks) often.
    stems = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=20)) for _ in range(draw(st.integers(1, 3)))]
    prompts = []
    for _ in range(n):
        stem = stems[draw(st.integers(0, len(stems) - 1))]
        stem = stem[: draw(st.integers(0, len(stem)))]
        prompts.append(stem + draw(st.lists(st.integers(0, 3), min_size=0 if stem else 1, max_size=8)))
    output = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0]), min_size=n, max_size=n))
    mode = draw(st.sampled_from(["v1", "v1", "unchunked", "prefill_first", "static"]))
    kw = dict(max_num_seqs=draw(st.integers(1, 6)), block_size=bs, prefill_first=mode == "prefill_first",
              chunked_prefill=mode not in ("unchunked", "prefill_first"),
              scheduling="static" if mode == "static" else "continuous")
    footprint = max(-(-(len(p) + o - 1) // bs) for p, o in zip(prompts, output))
    if draw(st.booleans()):
        kw["kv_cache_tokens"] = bs * (footprint + draw(st.integers(0, 4)))
    if draw(st.booleans()):
        whole = mode in ("unchunked", "prefill_first")
        longest = max((len(p) + o - 1) if "kv_cache_tokens" in kw else len(p) for p, o in zip(prompts, output))
        low = max(kw["max_num_seqs"], longest if whole else 1)
        kw["max_num_batched_tokens"] = draw(st.integers(low, low + 20))
    linear = draw(st.booleans())
    kw["step_time"] = (lambda p, d, kv: 0.25 + 0.01 * p + 0.05 * d + 0.001 * kv) if linear else 1.0
    return prompts, output, np.cumsum(gaps).tolist(), kw


def run_both(prompts, output, arrivals, **kw):
    r = simulate_llm(n_requests=len(prompts), prompts=prompts, output_tokens=output, arrivals=arrivals,
                     prefix_caching=True, **kw)
    step_time, kv, budget = kw["step_time"], kw.get("kv_cache_tokens"), kw.get("max_num_batched_tokens")
    seqs, steps, preemptions = reference(
        prompts, output, arrivals, max_num_seqs=kw["max_num_seqs"], block_size=kw["block_size"],
        budget=math.inf if budget is None else budget,
        num_blocks=math.inf if kv is None else kv // kw["block_size"], chunked=kw["chunked_prefill"],
        prefill_first=kw["prefill_first"], static=kw["scheduling"] == "static",
        step_time=step_time if callable(step_time) else (lambda p, d, k: step_time))
    return r, seqs, steps, preemptions


def assert_agree(r, seqs, steps, preemptions, block_size):
    assert r.preemptions == preemptions
    assert r.cached_tokens.tolist() == [s.cached for s in seqs]
    assert r.steps_prefill_tokens.tolist() == [s[1] for s in steps]
    assert r.steps_decode_seqs.tolist() == [s[2] for s in steps]
    assert r.steps_kv_tokens.tolist() == [s[3] for s in steps]
    assert r.steps_kv_slots.tolist() == [block_size * s[4] for s in steps]
    np.testing.assert_allclose(r.steps_end, [s[0] for s in steps], rtol=1e-12)
    for k, s in enumerate(seqs):
        np.testing.assert_allclose(r.token_times(k), s.times, rtol=1e-12)


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_agrees_with_the_plain_reference_on_random_workloads(case):
    prompts, output, arrivals, kw = case
    r, seqs, steps, preemptions = run_both(prompts, output, arrivals, **kw)
    event(f"cache hits: {bool(r.cached_tokens.sum())}, preempted: {bool(preemptions)}")
    assert_agree(r, seqs, steps, preemptions, block_size=kw["block_size"])


def test_agrees_with_the_reference_under_heavy_preemption_and_eviction():
    rng = np.random.default_rng(11)
    n = 300
    prompts = [p[: rng.integers(1, len(p) + 1)]
               for p in shared_prefix_prompts(n, system_tokens=24, question_tokens=30, n_systems=5, seed=3)]
    output = rng.integers(1, 60, n).tolist()
    arrivals = np.cumsum(rng.exponential(0.3, n)).tolist()
    for kw in [dict(kv_cache_tokens=160, block_size=8, max_num_seqs=8, max_num_batched_tokens=48),
               dict(kv_cache_tokens=160, block_size=4, max_num_seqs=6, prefill_first=True, chunked_prefill=False,
                    max_num_batched_tokens=160),
               dict(kv_cache_tokens=200, block_size=4, max_num_seqs=6, scheduling="static")]:
        kw = {"prefill_first": False, "chunked_prefill": True, "scheduling": "continuous", "step_time": 1.0, **kw}
        r, seqs, steps, preemptions = run_both(prompts, output, arrivals, **kw)
        assert preemptions > 10 and r.prefix_hit_rate > 0.1
        assert_agree(r, seqs, steps, preemptions, block_size=kw["block_size"])


# --- bad input, named before anything runs --------------------------------------------------------------------


def never(p, d, kv):
    raise AssertionError("step_time called: the check came too late")


@pytest.mark.parametrize("kw, message", [
    (dict(prompts=[[1, 2, 3], [1, 2.5, 3]]), r"prompts\[1\] must be a sequence of integer token ids"),
    (dict(prompts=[[1, 2, 3], "abc"]), r"prompts\[1\] must be a sequence of integer token ids"),
    (dict(prompts=[[1, True, 3], [1, 2]]), r"prompts\[0\] must be a sequence of integer token ids"),
    (dict(prompts=[[1, 2, 3], []]), r"prompts\[1\] is empty"),
    (dict(prompts=[[1, 2, 3]]), r"prompts must hold one sequence of token ids per request \(2\)"),
    (dict(prompts=[[1, 2, 3], [4, 5]], prompt_tokens=3), r"prompts and prompt_tokens disagree: prompts\[1\] has 2"),
    (dict(prompt_tokens=3, prefix_caching=True), "prefix_caching needs prompts="),
    (dict(prompt_tokens=3, prefix_caching="yes"), "prefix_caching must be True or False"),
    (dict(prompts=[[1, 2], [1, 2]], prefix_caching=True, kv_allocation="reserve_max"),
     "prefix_caching needs kv_allocation='paged'"),
    (dict(prompts=[[1, 2], [1, 2]], prefix_caching=True, slot_placement="lru"), "prefix_caching and slot_placement"),
    (dict(), r"prompt_tokens \(or prompts\) is required"),
])
def test_bad_prefix_caching_input_is_named_before_anything_runs(kw, message):
    with pytest.raises(ValueError, match=message):
        simulate_llm(n_requests=2, output_tokens=2, step_time=never, max_num_seqs=2, **kw)


def test_numpy_token_ids_are_taken():
    ids = np.arange(40)
    r = alone([ids, ids.tolist()])
    assert r.cached_tokens.tolist() == [0, 32]
