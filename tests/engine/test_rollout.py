"""The rollout engine: greedy equivalence (alone, batched, preempted, migrated), sampling, stop
strings, tool pauses, weight swaps, and clear errors for bad input."""

from __future__ import annotations

import os
import pickle

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from jigsawrl.engine.models import build_model  # noqa: E402
from jigsawrl.engine.rollout import (  # noqa: E402
    GenerationRequest,
    RequestOutput,
    RolloutEngine,
    SamplingParams,
)
from jigsawrl.engine.sampling import new_generator, sample_tokens  # noqa: E402
from jigsawrl.errors import InputError  # noqa: E402

PROMPTS = ["hello", "1+2=", "The quick brown fox", "x", "abcdefghijklmnopqrstuvwxyz0123456789"]


def lively(preset: str = "qwen2-1m", seed: int = 0):
    """A random model with large weights, so greedy text varies instead of repeating one token."""
    model, tok = build_model(preset, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15, generator=gen)
    return model, tok


@pytest.fixture(scope="module")
def mt():
    return lively()


def req(tok, rid: str, text: str, n: int = 24, **kw) -> GenerationRequest:
    kw.setdefault("temperature", 0.0)
    return GenerationRequest(rid, tok.encode(text), SamplingParams(n, **kw))


def alone(mt, text: str, n: int = 24, **kw) -> RequestOutput:
    model, tok = mt
    return RolloutEngine(model, tok, eos_token_id=-1).generate([req(tok, "solo", text, n, **kw)])[0]


def test_greedy_matches_transformers_generate(mt) -> None:
    model, tok = mt
    ids = tok.encode("hello")
    out = RolloutEngine(model, tok, eos_token_id=-1).generate([req(tok, "a", "hello", 20)])[0]
    ref = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert out.state.output_ids == ref[0, len(ids):].tolist()
    assert out.finish_reason == "length" and out.state.num_generated == 20
    assert out.state.output_mask == [1] * 20


def test_logprobs_are_log_softmax_of_the_scaled_logits(mt) -> None:
    model, tok = mt
    for temp in (0.0, 0.7):
        out = alone(mt, "1+2=", 12, temperature=temp, seed=3)
        ids = torch.tensor([out.state.prompt_ids + out.state.output_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(out.state.prompt_ids) - 1: -1]
        logp = torch.log_softmax(logits / (temp or 1.0), dim=-1)
        want = logp.gather(1, torch.tensor(out.state.output_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out.state.output_logprobs), want, atol=1e-4,
                                   rtol=0)


def test_batched_continuous_greedy_equals_alone(mt) -> None:
    model, tok = mt
    lengths = [30, 7, 19, 3, 25]
    # Two sequences at a time: requests join as others finish, at different lengths.
    eng = RolloutEngine(model, tok, max_num_seqs=2, eos_token_id=-1)
    outs = eng.generate([req(tok, f"r{i}", p, n) for i, (p, n) in
                         enumerate(zip(PROMPTS, lengths, strict=True))])
    for p, n, out in zip(PROMPTS, lengths, outs, strict=True):
        assert out.state.output_ids == alone(mt, p, n).state.output_ids
    assert eng.stats.iterations > max(lengths)
    wide = RolloutEngine(model, tok, eos_token_id=-1).generate(
        [req(tok, f"w{i}", p, 24) for i, p in enumerate(PROMPTS)])
    for p, out in zip(PROMPTS, wide, strict=True):
        assert out.state.output_ids == alone(mt, p, 24).state.output_ids


def test_preemption_under_a_small_kv_budget_keeps_greedy_results(mt) -> None:
    model, tok = mt
    eng = RolloutEngine(model, tok, max_batch_tokens=70, eos_token_id=-1)
    outs = eng.generate([req(tok, f"r{i}", p, 30) for i, p in enumerate(PROMPTS)])
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.state.output_ids == alone(mt, p, 30).state.output_ids
    assert eng.stats.preemptions > 0


def test_stats_count_prefill_and_decode_tokens(mt) -> None:
    model, tok = mt
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    for i, p in enumerate(PROMPTS[:3]):
        eng.add_request(req(tok, f"r{i}", p, 5))
    assert eng.stats.waiting == 3 and eng.has_unfinished()
    eng.step()
    st = eng.stats
    assert st.prefill_tokens == st.last_iter_tokens == sum(len(p) for p in PROMPTS[:3])
    assert (st.running, st.waiting, st.kv_tokens) == (3, 0, st.prefill_tokens)
    assert st.kv_cache_bytes > 0
    eng.step()
    assert eng.stats.last_iter_tokens == 3 and eng.stats.decode_tokens == 3
    while eng.has_unfinished():
        eng.step()
    assert eng.stats.running == 0 and eng.stats.kv_tokens == 0
    assert eng.stats.kv_cache_bytes == 0  # memory goes back when no request holds a cache


def test_max_new_tokens_and_eos(mt) -> None:
    model, tok = mt
    base = alone(mt, "hello", 24).state.output_ids
    eos = base[5]
    first = base.index(eos)
    out = RolloutEngine(model, tok, eos_token_id=eos).generate([req(tok, "e", "hello", 24)])[0]
    assert out.finish_reason == "eos"
    assert out.state.output_ids == base[: first + 1]
    short = alone(mt, "hello", 3)
    assert short.finish_reason == "length" and short.state.output_ids == base[:3]


def test_stop_string_ends_the_request_and_is_kept(mt) -> None:
    model, tok = mt
    full = tok.decode(alone(mt, "The quick brown fox", 40).state.output_ids)
    stop = full[12:14]
    out = alone(mt, "The quick brown fox", 40, stop=("zzzz", stop))
    text = tok.decode(out.state.output_ids)
    assert out.finish_reason == "stop" and out.matched_stop == stop
    assert text.endswith(stop) and full.startswith(text) and stop not in text[:-1]


def test_top_p_seed_and_batch_independence(mt) -> None:
    model, tok = mt
    sampled = dict(n=30, temperature=1.0, top_p=0.9, seed=7)
    one = alone(mt, "hello", **sampled).state.output_ids
    assert alone(mt, "hello", **sampled).state.output_ids == one
    assert alone(mt, "hello", **{**sampled, "seed": 8}).state.output_ids != one
    assert one != alone(mt, "hello", 30).state.output_ids
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    outs = eng.generate([req(tok, "x", "abc", 30, temperature=1.0, seed=1),
                         req(tok, "h", "hello", **sampled)])
    assert outs[1].state.output_ids == one
    tiny = alone(mt, "hello", 30, temperature=1.0, top_p=1e-6, seed=7).state.output_ids
    assert tiny == alone(mt, "hello", 30).state.output_ids


def test_nucleus_sampling_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(400, 1)
    gens = [new_generator(i) for i in range(400)]
    for top_p, allowed in ((0.4, {0}), (0.7, {0, 1}), (0.9, {0, 1, 2})):
        toks, _ = sample_tokens(logits, [1.0] * 400, [top_p] * 400, gens)
        assert set(toks) == allowed
    toks, lps = sample_tokens(logits, [1.0] * 400, [1.0] * 400, gens)
    assert set(toks) == {0, 1, 2, 3}
    assert abs(toks.count(0) / 400 - 0.5) < 0.1
    assert lps[toks.index(3)] == pytest.approx(torch.log(torch.tensor(0.05)).item(), abs=1e-5)


def _tool_flow(mt):
    """Greedy text until a stop string; returns (engine, stop string, first output)."""
    model, tok = mt
    full = tok.decode(alone(mt, "1+2=", 40).state.output_ids)
    stop = full[8:10]
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    first = eng.generate([req(tok, "t", "1+2=", 40, stop=(stop,))])[0]
    assert first.finish_reason == "stop"
    return eng, stop, first


def test_continue_request_appends_tool_tokens_and_goes_on(mt) -> None:
    model, tok = mt
    eng, stop, first = _tool_flow(mt)
    assert eng.stats.paused == 1 and not eng.has_unfinished()
    tool = tok.encode("<result>3</result>")
    eng.continue_request("t", tool)
    assert eng.stats.paused == 0
    done = [o for _ in range(60) for o in eng.step()]
    assert len(done) == 1
    st = done[0].state
    n0, n_gen = len(first.state.output_ids), first.state.num_generated
    assert st.output_ids[:n0] == first.state.output_ids
    assert st.output_ids[n0: n0 + len(tool)] == tool
    n_after = len(st.output_ids) - n0 - len(tool)
    assert st.output_mask == [1] * n0 + [0] * len(tool) + [1] * n_after
    assert st.output_logprobs[n0: n0 + len(tool)] == [0.0] * len(tool)
    assert st.num_generated == sum(st.output_mask) <= 40
    # The continuation is what greedy decoding of the whole context produces (the tool text,
    # which is not model text, is not searched for the stop string).
    ctx = tok.decode(first.state.prompt_ids + first.state.output_ids + tool)
    rest = alone(mt, ctx, 40 - n_gen, stop=(stop,))
    assert st.output_ids[n0 + len(tool):] == rest.state.output_ids
    assert done[0].finish_reason == rest.finish_reason


def test_export_after_tool_call_and_resume_elsewhere(mt) -> None:
    model, tok = mt
    eng, _, first = _tool_flow(mt)
    tool = tok.encode("<r>3</r>")
    ref_eng, _, _ = _tool_flow(mt)
    ref_eng.continue_request("t", tool)
    want = [o for _ in range(60) for o in ref_eng.step()][0].state.output_ids
    state = pickle.loads(pickle.dumps(eng.abort("t")))
    assert state.finish_reason is None and eng.stats.paused == 0
    other = RolloutEngine(model, tok, eos_token_id=-1)
    other.resume(state, tool)
    got = [o for _ in range(60) for o in other.step()]
    assert got[0].state.output_ids == want
    # The stop snapshot itself resumes too.
    third = RolloutEngine(model, tok, eos_token_id=-1)
    third.resume(first.state, tool)
    assert [o for _ in range(60) for o in third.step()][0].state.output_ids == want


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, seed=5)])
def test_abort_and_resume_on_a_new_engine_is_token_for_token(mt, sampling) -> None:
    model, tok = mt
    want = [alone(mt, p, 30, **sampling).state.output_ids for p in PROMPTS[:3]]
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    for i, p in enumerate(PROMPTS[:3]):
        r = req(tok, f"r{i}", p, 30, **sampling)
        r.user_data["turn"] = i
        eng.add_request(r)
    for _ in range(11):
        assert eng.step() == []
    states = [pickle.loads(pickle.dumps(eng.abort(f"r{i}"))) for i in range(3)]
    assert not eng.has_unfinished() and eng.stats.kv_tokens == 0
    assert [s.num_generated for s in states] == [11, 11, 11]
    new = RolloutEngine(model, tok, eos_token_id=-1)
    for s in reversed(states):
        new.resume(s)
    outs = {o.request_id: o for _ in range(40) for o in new.step()}
    assert [outs[f"r{i}"].state.output_ids for i in range(3)] == want
    assert [outs[f"r{i}"].state.user_data for i in range(3)] == [{"turn": i} for i in range(3)]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, seed=5)])
def test_peek_is_a_checkpoint_that_leaves_the_request_running(mt, sampling) -> None:
    """``peek`` returns what ``abort`` would (RNG state included) without disturbing the
    request: the original finishes as if never peeked, and the peeked state resumed on another
    engine finishes with the same tokens; a waiting request (no slot yet) peeks too."""
    model, tok = mt
    want = [alone(mt, p, 30, **sampling).state.output_ids for p in PROMPTS[:3]]
    eng = RolloutEngine(model, tok, eos_token_id=-1, max_num_seqs=2)
    for i, p in enumerate(PROMPTS[:3]):
        eng.add_request(req(tok, f"r{i}", p, 30, **sampling))
    for _ in range(7):
        assert eng.step() == []
    before = eng.stats
    states = [pickle.loads(pickle.dumps(eng.peek(f"r{i}"))) for i in range(3)]
    assert eng.stats == before and eng.stats.running == 2 and eng.stats.waiting == 1
    assert [s.num_generated for s in states] == [7, 7, 0]
    assert all(s.finish_reason is None and s.rng_state for s in states)
    outs = {o.request_id: o for _ in range(80) for o in eng.step()}
    assert [outs[f"r{i}"].state.output_ids for i in range(3)] == want
    assert states[0].output_ids == want[0][:7]  # later steps did not touch the checkpoint
    new = RolloutEngine(model, tok, eos_token_id=-1)
    for s in states:
        new.resume(s)
    resumed = {o.request_id: o for _ in range(40) for o in new.step()}
    assert [resumed[f"r{i}"].state.output_ids for i in range(3)] == want
    with pytest.raises(InputError, match="no such request"):
        eng.peek("r0")  # finished: gone from the engine


def test_abort_waiting_request_and_release(mt) -> None:
    model, tok = mt
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    eng.add_request(req(tok, "w", "hello", 5))
    state = eng.abort("w")
    assert state.output_ids == [] and not eng.has_unfinished()
    eng.resume(state)
    assert eng.stats.waiting == 1 and eng.has_unfinished()
    eng.release("w")
    eng.release("never-there")
    assert not eng.has_unfinished()


def test_load_weights_changes_outputs_and_drops_stale_caches(mt) -> None:
    model, tok = mt
    other, _ = lively(seed=1)
    eng = RolloutEngine(lively()[0], tok, eos_token_id=-1)
    eng.add_request(req(tok, "a", "hello", 20))
    for _ in range(5):
        eng.step()
    eng.load_weights(other.state_dict())
    out = [o for _ in range(30) for o in eng.step()][0].state.output_ids
    prefix = alone(mt, "hello", 5).state.output_ids
    ctx = tok.decode(tok.encode("hello") + prefix)
    expect = RolloutEngine(other, tok, eos_token_id=-1).generate([req(tok, "b", ctx, 15)])[0]
    assert out[:5] == prefix and out[5:] == expect.state.output_ids
    assert out != alone(mt, "hello", 20).state.output_ids
    sd = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}
    eng.load_weights(sd)  # tied output embedding may be left out
    with pytest.raises(InputError, match="missing"):
        eng.load_weights({"model.norm.weight": sd["model.norm.weight"]})
    with pytest.raises(InputError, match="wrong shape"):
        eng.load_weights({**sd, "model.norm.weight": torch.ones(3)})


def test_max_positions_finish_with_length() -> None:
    model, tok = lively()
    model.config.max_position_embeddings = 16
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    out = eng.generate([req(tok, "a", "0123456789", 50, stop=("@@",))])[0]
    assert out.finish_reason == "length" and out.state.context_len == 16
    with pytest.raises(InputError, match="does not fit"):
        eng.add_request(req(tok, "b", "x" * 16))


def test_continue_past_max_positions_finishes_with_length() -> None:
    model, tok = lively()
    full = tok.decode(alone((model, tok), "1+2=", 30).state.output_ids)
    model.config.max_position_embeddings = 20
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    first = eng.generate([req(tok, "t", "1+2=", 30, stop=(full[3:5],))])[0]
    assert first.finish_reason == "stop"
    eng.continue_request("t", tok.encode("a long tool result"))
    out = eng.step()
    assert out[0].finish_reason == "length" and out[0].state.output_ids == first.state.output_ids


@pytest.mark.parametrize("preset", ["llama-1m", "qwen3-1m"])
def test_other_architectures_match_transformers_generate(preset) -> None:
    model, tok = lively(preset)
    ids = tok.encode("hello")
    outs = RolloutEngine(model, tok, eos_token_id=-1).generate(
        [req(tok, "a", "hello", 15), req(tok, "b", "The quick brown fox", 15)])
    ref = model.generate(torch.tensor([ids]), max_new_tokens=15, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert outs[0].state.output_ids == ref[0, len(ids):].tolist()


def test_eager_attention_gives_the_same_tokens() -> None:
    model, tok = lively()
    want = RolloutEngine(model, tok, eos_token_id=-1).generate(
        [req(tok, f"r{i}", p, 20) for i, p in enumerate(PROMPTS)])
    model.set_attn_implementation("eager")
    got = RolloutEngine(model, tok, eos_token_id=-1).generate(
        [req(tok, f"r{i}", p, 20) for i, p in enumerate(PROMPTS)])
    assert [o.state.output_ids for o in got] == [o.state.output_ids for o in want]


def test_bad_input_is_an_input_error(mt) -> None:
    model, tok = mt
    eng = RolloutEngine(model, tok, max_batch_tokens=64)
    bad = [
        (GenerationRequest("e", [], SamplingParams(4)), "empty prompt"),
        (GenerationRequest("l", [5] * 65, SamplingParams(4)), "does not fit"),
        (GenerationRequest("v", [5, 100], SamplingParams(4)), "outside"),
        (GenerationRequest("n", [5, -1], SamplingParams(4)), "outside"),
        (GenerationRequest("t", [5], SamplingParams(4, temperature=-1)), "temperature"),
        (GenerationRequest("p", [5], SamplingParams(4, top_p=0)), "top_p"),
        (GenerationRequest("m", [5], SamplingParams(0)), "max_new_tokens"),
        (GenerationRequest("s", [5], SamplingParams(4, stop="</a>")), "not a tuple"),
        (GenerationRequest("z", [5], SamplingParams(4, stop=("",))), "empty stop"),
    ]
    for request, message in bad:
        with pytest.raises(InputError, match=message):
            eng.add_request(request)
    eng.add_request(req(tok, "ok", "hi", 2))
    with pytest.raises(InputError, match="already"):
        eng.add_request(req(tok, "ok", "hi", 2))
    with pytest.raises(InputError, match="no paused request"):
        eng.continue_request("ok", [5])
    with pytest.raises(InputError, match="no such request"):
        eng.abort("ghost")
    out = eng.generate([])
    assert out == [] and eng.has_unfinished()
    small, _ = build_model("qwen2-1m", vocab_size=100)
    small.resize_token_embeddings(64)
    with pytest.raises(InputError, match="embedding has 64 rows"):
        RolloutEngine(small, tok)


def test_random_arrivals_migrations_and_budget_keep_greedy_results(mt) -> None:
    """A long-tail migration scenario: requests arrive over time on a small engine, some are
    aborted mid-flight and resumed on a second engine; every result equals its solo run and the
    first engine never holds more KV than its budget unless one request runs alone."""
    import random

    model, tok = mt
    rng = random.Random(0)
    jobs = [(f"j{i}", PROMPTS[i % len(PROMPTS)], rng.randint(4, 22)) for i in range(9)]
    src = RolloutEngine(model, tok, max_batch_tokens=64, max_num_seqs=3, eos_token_id=-1)
    dst = RolloutEngine(model, tok, eos_token_id=-1)
    done: dict[str, list[int]] = {}
    arrivals = list(jobs)
    on_src: set[str] = set()
    migrated = 0
    for _ in range(400):
        if arrivals and rng.random() < 0.4:
            rid, text, n = arrivals.pop(0)
            src.add_request(req(tok, rid, text, n))
            on_src.add(rid)
        if on_src and rng.random() < 0.15:
            rid = rng.choice(sorted(on_src))
            on_src.discard(rid)
            dst.resume(pickle.loads(pickle.dumps(src.abort(rid))))
            migrated += 1
        for out in (*src.step(), *dst.step()):
            done[out.request_id] = out.state.output_ids
            on_src.discard(out.request_id)
        st = src.stats
        assert st.kv_tokens <= 64 or st.running <= 1
        if not arrivals and not src.has_unfinished() and not dst.has_unfinished():
            break
    assert sorted(done) == sorted(rid for rid, _, _ in jobs)
    assert migrated >= 2 and src.stats.preemptions >= 1
    for rid, text, n in jobs:
        assert done[rid] == alone(mt, text, n).state.output_ids, rid


def test_prefill_groups_bound_the_padding() -> None:
    from jigsawrl.engine.kvcache import group_by_length

    lengths = [900, 10, 12, 30, 850, 200, 5]
    groups = group_by_length(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert [3, 0] not in groups and all(g == sorted(g) for g in groups)
    for g in groups:
        real = sum(lengths[i] for i in g)
        assert max(lengths[i] for i in g) * len(g) <= 2 * real + 64
    assert group_by_length([3, 3, 3]) == [[0, 1, 2]]


def test_context_tokens_counts_the_queued_requests_asked_for(mt) -> None:
    model, tok = mt
    eng = RolloutEngine(model, tok, eos_token_id=-1)
    eng.add_request(req(tok, "a", "hello", 8))
    eng.add_request(req(tok, "b", "x", 8))
    n_a, n_b = len(tok.encode("hello")), len(tok.encode("x"))
    assert eng.context_tokens({"a", "b"}) == n_a + n_b  # waiting
    eng.step()
    assert eng.context_tokens({"a"}) == n_a + 1  # running, one token sampled
    assert eng.context_tokens({"nobody"}) == 0


def test_a_shared_prompt_is_prefilled_once_and_samples_as_alone(mt, monkeypatch) -> None:
    """A GRPO group (one prompt, several seeds) beside other prompts: each distinct prompt runs
    through the model once, and every request samples exactly what it samples alone."""
    import jigsawrl.engine.batch as batch

    model, tok = mt
    rows: list[int] = []
    forward = batch.BatchRunner._forward_rows

    def counted(self, group):  # noqa: ANN001, ANN202
        rows.append(len(group))
        return forward(self, group)

    monkeypatch.setattr(batch.BatchRunner, "_forward_rows", counted)
    sampled = dict(temperature=1.0, top_p=0.9)
    reqs = [req(tok, f"g{i}", "The quick brown fox", 20, seed=i, **sampled) for i in range(4)]
    reqs += [req(tok, "o", "1+2=", 20, seed=9, **sampled),
             req(tok, "g-greedy", "The quick brown fox", 20)]
    outs = RolloutEngine(model, tok, eos_token_id=-1).generate(reqs)
    assert rows[0] == 2  # the first pass prefilled "The quick brown fox" once, and "1+2=" once
    assert len({tuple(o.state.output_ids) for o in outs[:4]}) > 1  # the seeds differ
    rows.clear()
    for r, out in zip(reqs, outs, strict=True):
        solo = RolloutEngine(model, tok, eos_token_id=-1).generate([r])[0]
        assert solo.state.output_ids == out.state.output_ids
        assert solo.state.output_logprobs == pytest.approx(out.state.output_logprobs, abs=1e-4)
