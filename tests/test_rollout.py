"""Tests for agentrl.rollout (Chapter 13). Expected values come from closed forms (pipeline timings worked
out by hand, the mean of a truncated geometric, log-normal moments), from per-token formulas written out
with Python's math, and from train_rl / rl_update themselves where the chapter claims to reproduce them."""
import copy
import inspect
import math
import random

import pytest
import torch

import agentrl as arl
import agentrl.rollout as m
from agentrl.gym import make_tasks
from agentrl.grpo import RLConfig, rl_update, sample_groups, train_rl
from agentrl.policies import TinyAgent, sequence_log_probs
from agentrl.trajectories import collate

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(120)          # every test here takes seconds; a hang fails fast
INDEX = ('agent_episode_durations', 'simulate_pipeline', 'tis_weights', 'mis_weights', 'offpolicy_update',
         'train_offpolicy')


def test_index_names_reachable_with_their_signatures():
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    sig = lambda f: str(inspect.signature(f))
    assert sig(m.agent_episode_durations) == ("(n, generator, mean_turns=8, max_turns=40, tokens_per_turn=(100, 600), "
                                              "decode_rate=40.0, tool_median=2.0, tool_sigma=1.0)")
    assert sig(m.simulate_pipeline) == ("(durations, n_slots, batch_size, train_time, sync_time, max_staleness=0, "
                                        "interrupt=True, steps=10)")
    assert sig(m.tis_weights) == '(logp_trainer, logp_sampler, mask, cap=2.0)'
    assert sig(m.mis_weights) == '(logp_trainer, logp_sampler, mask, low=0.5, high=5.0)'
    assert sig(m.offpolicy_update) == ("(model, optimizer, batch, advantages, cfg, correction='none', cap=2.0, "
                                       "generator=None)")
    assert sig(m.train_offpolicy) == "(model, tasks, tok, cfg, steps, lag=0, correction='none', cap=2.0, sampler=None)"


# ---------------------------------------------------------------- agent_episode_durations
def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_durations_shape_dtype_and_determinism():
    a = m.agent_episode_durations(50, gen(0))
    assert a.shape == (50,) and a.dtype == torch.float64 and bool((a > 0).all())
    assert torch.equal(a, m.agent_episode_durations(50, gen(0)))
    assert not torch.equal(a, m.agent_episode_durations(50, gen(1)))


def test_one_turn_without_spread_is_exact():
    # one call (mean_turns=1: the first uniform is always < 1), 300 tokens at 40 tok/s, tools take the median
    d = m.agent_episode_durations(7, gen(0), mean_turns=1, tokens_per_turn=(300, 300), tool_sigma=0.0)
    assert torch.equal(d, torch.full((7,), 300 / 40 + 2.0))


def test_turn_count_is_a_truncated_geometric():
    # fixed tokens and tool time: duration = turns * (per-turn time), so turns can be read back
    per_turn = 100 / 40.0 + 1.0
    n, mean_turns, cap = 20000, 5, 12
    d = m.agent_episode_durations(n, gen(3), mean_turns=mean_turns, max_turns=cap, tokens_per_turn=(100, 100),
                                  tool_median=1.0, tool_sigma=0.0)
    turns = d / per_turn
    assert torch.allclose(turns, turns.round(), atol=1e-9)
    turns = turns.round()
    p = 1 / mean_turns
    want = (1 - (1 - p) ** cap) / p                                   # E[min(K, cap)], K ~ Geometric(p)
    sd = float(turns.std())
    assert abs(float(turns.mean()) - want) < 4 * sd / math.sqrt(n)
    assert float(turns.max()) == cap and float(turns.min()) == 1
    assert abs(float((turns == cap).double().mean()) - (1 - p) ** (cap - 1)) < 0.01


def test_tool_latency_is_log_normal_and_tokens_uniform():
    n = 20000
    tool = m.agent_episode_durations(n, gen(5), mean_turns=1, tokens_per_turn=(40, 40), decode_rate=40.0,
                                     tool_median=3.0, tool_sigma=0.5) - 1.0
    logs = tool.log()
    assert abs(float(logs.mean()) - math.log(3.0)) < 4 * 0.5 / math.sqrt(n)
    assert abs(float(logs.std()) - 0.5) < 0.02
    tokens = m.agent_episode_durations(n, gen(6), mean_turns=1, tokens_per_turn=(100, 109), decode_rate=1.0,
                                       tool_median=1.0, tool_sigma=0.0) - 1.0
    values = tokens.round()
    assert torch.equal(values, tokens) and set(values.tolist()) == set(range(100, 110))
    assert abs(float(values.mean()) - 104.5) < 4 * math.sqrt(99 / 12) / math.sqrt(n)


def test_durations_reject_bad_arguments():
    for kw, match in ((dict(n=0), 'n'), (dict(mean_turns=0.5), 'mean_turns'), (dict(max_turns=0), 'max_turns'),
                      (dict(tokens_per_turn=(5, 2)), 'tokens_per_turn'), (dict(tokens_per_turn=(0, 2)), 'tokens_per_turn'),
                      (dict(decode_rate=0.0), 'decode_rate'), (dict(tool_median=-1.0), 'tool_median'),
                      (dict(tool_sigma=float('nan')), 'tool_sigma')):
        args = dict(n=3, generator=gen(0))
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            m.agent_episode_durations(**args)
    with pytest.raises(TypeError, match='generator'):
        m.agent_episode_durations(3, 0)


# ---------------------------------------------------------------- simulate_pipeline
def sim(d, *args, **kw):
    return m.simulate_pipeline(torch.tensor(d, dtype=torch.float64), *args, **kw)


def test_one_slot_fixed_durations_closed_form():
    d, T, S, B, steps = 3.0, 5.0, 1.0, 4, 6
    r = sim([d], 1, B, T, S, steps=steps)
    assert r['time'] == pytest.approx(steps * (B * d + T + S), abs=1e-9)
    assert r['throughput'] == pytest.approx(steps * B / r['time'], abs=1e-12)
    assert r['trainer_idle'] == pytest.approx(B * d / (B * d + T + S), abs=1e-12)
    assert r['slot_idle'] == pytest.approx((T + S) / (B * d + T + S), abs=1e-12)
    assert r['staleness'].tolist() == [0] * (steps * B) and r['mixed'] == 0.0 and r['dropped'] == 0


def test_many_slots_synchronous_closed_forms():
    d, T, S, B, steps = 3.0, 5.0, 1.0, 4, 5
    assert sim([d], B, B, T, S, steps=steps)['time'] == pytest.approx(steps * (d + T + S))
    assert sim([d], 3 * B, B, T, S, steps=steps)['time'] == pytest.approx(steps * (d + T + S))   # extra slots idle
    assert sim([d], 2, B, T, S, steps=steps)['time'] == pytest.approx(steps * (2 * d + T + S))


def test_synchronous_step_waits_for_its_longest_episode():
    # with at least B slots and max_staleness 0, step k uses episodes kB .. kB+B-1, all started at once
    rng = random.Random(0)
    d = [rng.uniform(1.0, 50.0) for _ in range(40)]
    B, steps, T, S = 8, 5, 7.0, 2.0
    for interrupt in (True, False):
        r = sim(d, 10, B, T, S, interrupt=interrupt, steps=steps)
        want = sum(max(d[k * B:(k + 1) * B]) for k in range(steps)) + steps * (T + S)
        assert r['time'] == pytest.approx(want, abs=1e-9)
        assert sorted(r['used'].tolist()) == list(range(steps * B))
    # one slot: every episode one after the other
    r = sim(d, 1, B, T, S, steps=steps)
    assert r['time'] == pytest.approx(sum(d[:steps * B]) + steps * (T + S), abs=1e-9)


@pytest.mark.parametrize('d', [3.0, 7.0])
def test_one_step_stale_closed_forms(d):
    # B slots, fixed d, max_staleness 1, train T = 5: worked out by hand in Section 13.2
    T, S, B, steps = 5.0, 1.0, 4, 6
    r = sim([d], B, B, T, S, max_staleness=1, interrupt=True, steps=steps)
    assert r['time'] == pytest.approx(d + (steps - 1) * (max(d, T) + S) + T + S)
    assert r['staleness'].tolist() == [0] * B + [1] * ((steps - 1) * B)
    assert r['mixed'] == pytest.approx(0.0 if d <= T else (steps - 1) / steps)
    drain = sim([d], B, B, T, S, max_staleness=1, interrupt=False, steps=steps)
    assert drain['time'] == pytest.approx(d + steps * (T + S) if d <= T else (steps + 1) * d + steps * S)
    assert drain['mixed'] == 0.0


def test_a_dropped_episode_and_its_wasted_seconds_by_hand():
    # 2 slots, B = 1, max_staleness 1, T = 5, S = 1, episodes alternate 1 s and 100 s (i % 2). Worked by hand:
    # t=0 ep0 (1 s) and ep1 (100 s) start (admission: fewer than (0+1+1)*1 = 2 started); t=1 step 0 trains
    # on ep0; sync 6-7 pauses ep1 after 6 s; at 7 (v=1) ep1 resumes and ep2 (1 s) starts; t=8 step 1 trains
    # on ep2; sync 13-14 pauses ep1 after 6 more s; at 14 (v=2) ep1 is 2 versions old: dropped after 12 s.
    # ep3 (100 s) and ep4 (1 s) start; t=15 step 2 trains on ep4; sync 20-21 pauses ep3 after 6 s.
    r = sim([1.0, 100.0], 2, 1, 5.0, 1.0, max_staleness=1, interrupt=True, steps=3)
    assert r['time'] == pytest.approx(21.0) and r['step_end'] == pytest.approx([7.0, 14.0, 21.0])
    assert r['used'].tolist() == [0, 2, 4] and r['staleness'].tolist() == [0, 0, 0]
    assert r['started'] == 5 and r['dropped'] == 1
    generated = 1 + 12 + 1 + 1 + 6                                  # ep0, ep1, ep2, ep4, ep3 (seconds)
    assert r['wasted'] == pytest.approx(12 / generated, abs=1e-12)
    assert r['slot_idle'] == pytest.approx(1 - generated / (2 * 21.0), abs=1e-12)


def test_staleness_bound_and_bookkeeping_on_random_durations():
    durations = m.agent_episode_durations(300, gen(2))
    for n_slots, B, s, interrupt in ((8, 8, 0, True), (16, 8, 1, True), (16, 8, 2, False), (5, 8, 3, True),
                                     (32, 8, 1, True), (12, 4, 4, False)):
        r = m.simulate_pipeline(durations, n_slots, B, 40.0, 5.0, max_staleness=s, interrupt=interrupt, steps=12)
        st = r['staleness']
        assert st.shape == (12 * B,) and st.dtype == torch.long
        assert int(st.min()) >= 0 and int(st.max()) <= s
        assert len(set(r['used'].tolist())) == 12 * B and int(r['used'].max()) < r['started']
        assert 0 <= r['trainer_idle'] <= 1 and 0 <= r['slot_idle'] <= 1 and 0 <= r['wasted'] <= 1
        assert r['step_end'][-1] == r['time'] and r['step_end'] == sorted(r['step_end'])
        assert r['throughput'] == pytest.approx(12 * B / r['time'])
        if not interrupt:
            assert r['mixed'] == 0.0
        lanes = {}
        for e in r['events']:
            assert 0 <= e['start'] <= e['end'] <= r['time'] + 1e-9
            lanes.setdefault(e['lane'], []).append((e['start'], e['end']))
        for spans in lanes.values():                                  # one thing at a time per lane
            spans.sort()
            assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
        train = sum(e['end'] - e['start'] for e in r['events'] if e['lane'] == 'trainer')
        assert train == pytest.approx(12 * (40.0 + 5.0))
        gen_time = sum(e['end'] - e['start'] for e in r['events'] if e['kind'] == 'generate')
        assert r['slot_idle'] == pytest.approx(1 - gen_time / (n_slots * r['time']))
        assert len(lanes) == 1 + min(n_slots, len(lanes) - 1)
        # admission, read from the events: episodes started under versions <= v number at most
        # (v + max_staleness + 1) * B, plus the dropped ones (a drop frees its place)
        version = {}
        for e in r['events']:
            if e['kind'] == 'generate':
                assert version.setdefault(e['episode'], e['version']) == e['version']
        assert len(version) == r['started']
        for v in range(12):
            assert sum(x <= v for x in version.values()) <= (v + s + 1) * B + r['dropped']


def test_pipeline_rejects_bad_arguments():
    d = torch.tensor([1.0, 2.0])
    for args, kw, match in (((torch.tensor([1, 2]), 1, 1, 1.0, 1.0), {}, 'durations'),
                            ((torch.tensor([1.0, -2.0]), 1, 1, 1.0, 1.0), {}, 'durations'),
                            ((d, 0, 1, 1.0, 1.0), {}, 'n_slots'), ((d, 1, 0, 1.0, 1.0), {}, 'batch_size'),
                            ((d, 1, 1, -1.0, 1.0), {}, 'train_time'), ((d, 1, 1, 1.0, math.inf), {}, 'sync_time'),
                            ((d, 1, 1, 1.0, 1.0), dict(max_staleness=-1), 'max_staleness'),
                            ((d, 1, 1, 1.0, 1.0), dict(interrupt=1), 'interrupt'),
                            ((d, 1, 1, 1.0, 1.0), dict(steps=0), 'steps')):
        with pytest.raises(ValueError, match=match):
            m.simulate_pipeline(*args, **kw)


# ---------------------------------------------------------------- tis_weights, mis_weights
def test_tis_and_mis_match_the_per_token_formulas():
    pi = torch.tensor([[-0.1, -2.0, -0.5, -3.0], [-1.0, -0.2, -4.0, -0.7]])
    mu = torch.tensor([[-0.1, -0.3, -2.5, -0.2], [-2.0, -0.2, -1.0, -0.7]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    tis, mis = m.tis_weights(pi, mu, mask, cap=2.0), m.mis_weights(pi, mu, mask)
    for b in range(2):
        for t in range(4):
            r = math.exp(pi[b, t] - mu[b, t])
            want_t = min(r, 2.0) if mask[b, t] else 0.0
            want_m = r if mask[b, t] and 0.5 <= r <= 5.0 else 0.0
            assert float(tis[b, t]) == pytest.approx(want_t, rel=1e-12, abs=1e-300)
            assert float(mis[b, t]) == pytest.approx(want_m, rel=1e-12, abs=1e-300)
    assert float(m.tis_weights(pi, mu, mask, cap=1.0).max()) == 1.0


def test_weights_are_finite_for_huge_log_ratios_and_ignore_the_padding():
    pi = torch.tensor([[1000.0, -1000.0, 0.0, float('nan'), float('inf')]])
    mu = torch.tensor([[0.0, 0.0, 0.0, 0.0, float('inf')]])
    mask = torch.tensor([[1.0, 1, 1, 0, 0]])                        # NaN and inf only off the mask
    tis = m.tis_weights(pi, mu, mask, cap=3.0)
    mis = m.mis_weights(pi, mu, mask)
    assert tis.tolist() == [[3.0, 0.0, 1.0, 0.0, 0.0]]
    assert mis.tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]
    x = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    for w in (m.tis_weights(x, torch.zeros(1, 2), torch.ones(1, 2)), m.mis_weights(x, torch.zeros(1, 2), torch.ones(1, 2))):
        assert not w.requires_grad


def test_weights_reject_bad_input():
    z, one = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match='logp_sampler'):
        m.tis_weights(z, torch.zeros(2, 4), one)
    with pytest.raises(ValueError, match='mask'):
        m.tis_weights(z, z, torch.full((2, 3), 2.0))
    with pytest.raises(ValueError, match=r'\[B, T\]'):
        m.mis_weights(torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match='NaN'):
        m.tis_weights(torch.full((2, 3), -math.inf), torch.full((2, 3), -math.inf), one)
    with pytest.raises(TypeError, match='logp_trainer'):
        m.tis_weights([[0.0]], z, one)
    with pytest.raises(ValueError, match='cap'):
        m.tis_weights(z, z, one, cap=0.0)
    with pytest.raises(ValueError, match='low'):
        m.mis_weights(z, z, one, low=1.5)
    with pytest.raises(ValueError, match='high'):
        m.mis_weights(z, z, one, high=0.9)


# ---------------------------------------------------------------- offpolicy_update
TRAIN = make_tasks('train')


def small(seed=0, vocab=None):
    torch.manual_seed(seed)
    return TinyAgent(vocab_size=vocab, d_model=16, n_layers=1, n_heads=2)


def sampled_batch(model, tok, cfg, seed=0, tasks=4):
    trajs = sample_groups(model, None, TRAIN[:tasks], tok, cfg, torch.Generator().manual_seed(seed))
    return collate(trajs, tok.pad_id)


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_correction_none_is_rl_update(tok):
    cfg = RLConfig(group_size=4, minibatches=2, weight_grid=None)
    model = small(0, len(tok))
    batch = sampled_batch(model, tok, cfg)
    adv = torch.randn(len(batch['ids']), generator=torch.Generator().manual_seed(1))
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_a, opt_b = (torch.optim.AdamW(x.parameters(), lr=1e-2, weight_decay=0.0) for x in (a, b))
    got = m.offpolicy_update(a, opt_a, batch, adv, cfg, generator=torch.Generator().manual_seed(2))
    want = rl_update(b, opt_b, batch, adv, cfg, generator=torch.Generator().manual_seed(2))
    assert same_weights(a, b)
    assert {k: got[k] for k in want} == want
    # sampled by the model itself: every ratio is 1 up to rounding, nothing truncated or masked
    assert abs(got['is_ratio_max'] - 1) < 1e-9 and abs(got['is_ratio_min'] - 1) < 1e-9 and got['is_kl'] < 1e-12
    assert got['is_truncated'] == 0.0 and got['is_masked'] == 0.0 and got['is_weight_mean'] == 1.0


@pytest.mark.parametrize('correction', ['tis', 'mis'])
def test_weighted_update_matches_a_hand_written_gradient_step(tok, correction):
    # one minibatch, one epoch: the ratio to pi_prox is 1 at the step, so the loss is -mean_t(w_t A_b log pi_t)
    cfg = RLConfig(group_size=4, minibatches=1, epochs=1, weight_grid=None, max_grad_norm=1e6)
    model = small(0, len(tok))
    batch = sampled_batch(model, tok, cfg, seed=3)
    mask = batch['action_mask']
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4))
    batch['sample_logp'] = batch['sample_logp'] + 0.8 * noise * mask        # a sampler that disagrees
    adv = torch.randn(len(mask), generator=torch.Generator().manual_seed(5))
    ref = copy.deepcopy(model)
    logp = sequence_log_probs(ref, batch['ids'])                                # [B, T-1], another code path
    w = torch.zeros_like(mask)
    for b, t in mask.nonzero().tolist():
        r = math.exp(float(logp[b, t].detach()) - float(batch['sample_logp'][b, t]))
        w[b, t] = min(r, 1.5) if correction == 'tis' else (r if 0.5 <= r <= 5.0 else 0.0)
    loss = -(w * adv[:, None] * logp * mask).sum() / mask.sum()
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    want = [p.detach() - 0.1 * g for p, g in zip(ref.parameters(), grads)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = m.offpolicy_update(model, opt, batch, adv, cfg, correction=correction, cap=1.5)
    for p, q in zip(model.parameters(), want):
        assert torch.allclose(p, q, atol=1e-12, rtol=0)
    keep = mask.bool()
    d = (logp.detach() - batch['sample_logp'])[keep]
    assert stats['is_ratio_mean'] == pytest.approx(float(d.exp().mean()), rel=1e-9)
    assert stats['is_truncated'] == pytest.approx(float((d.exp() > 1.5).double().mean()), abs=1e-12)
    assert stats['is_masked'] == pytest.approx(float(((d.exp() < 0.5) | (d.exp() > 5)).double().mean()), abs=1e-12)
    assert stats['is_weight_mean'] == pytest.approx(float(w[keep].mean()), rel=1e-9)
    assert stats['is_kl'] == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-9)   # k3, from sequence_log_probs
    assert 0.0 < stats['is_truncated'] < 1.0


def test_offpolicy_update_rejects_bad_arguments(tok):
    cfg = RLConfig(group_size=4)
    model = small(0, len(tok))
    batch = sampled_batch(model, tok, cfg)
    adv = torch.zeros(len(batch['ids']))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = {k: v for k, v in batch.items() if k != 'sample_logp'}
    for args, kw, err, match in (((bad, adv, cfg), {}, ValueError, 'sample_logp'),
                                 ((batch, adv, cfg), dict(correction='is'), ValueError, 'correction'),
                                 ((batch, adv, cfg), dict(cap=-1.0), ValueError, 'cap'),
                                 ((batch, adv, RLConfig(group_size=4, kl_coef=0.1)), {}, ValueError, 'kl_coef'),
                                 ((batch, adv, RLConfig(group_size=4, level='sequence')), dict(correction='tis'),
                                  ValueError, 'level'),
                                 ((batch, adv[:-1], cfg), dict(correction='mis'), ValueError, 'advantages'),
                                 ((batch, adv, 'cfg'), {}, TypeError, 'cfg')):
        with pytest.raises(err, match=match):
            m.offpolicy_update(model, opt, *args, **kw)


# ---------------------------------------------------------------- train_offpolicy
def strip(history):
    "The keys train_rl writes (train_offpolicy adds is_* statistics and staleness)."
    return [{k: v for k, v in r.items() if not k.startswith('is_') and k != 'staleness'} for r in history]


def test_lag_zero_without_correction_or_sampler_is_train_rl(tok):
    cfg = RLConfig(group_size=4, tasks_per_step=3, eval_samples=1, seed=5)
    heldout = make_tasks('heldout')[:3]
    a, b, c = small(0, len(tok)), small(0, len(tok)), small(0, len(tok))
    want = train_rl(a, TRAIN, tok, cfg, 3, eval_tasks=heldout, eval_every=2)
    got = m._train_offpolicy(b, TRAIN, tok, cfg, 3, eval_tasks=heldout, eval_every=2)
    assert same_weights(a, b) and strip(got) == want
    assert all(r['staleness'] == 0 for r in got)
    # a sampler that returns an exact copy changes nothing either
    got = m._train_offpolicy(c, TRAIN, tok, cfg, 3, sampler=lambda net: copy.deepcopy(net),
                             eval_tasks=heldout, eval_every=2)
    assert same_weights(a, c) and strip(got) == want
    assert m.train_offpolicy(small(0, len(tok)), TRAIN, tok, cfg, 0) == []


def test_behavior_policy_is_lag_updates_old(tok, monkeypatch):
    cfg = RLConfig(group_size=4, tasks_per_step=4, drop_equal_groups=False, seed=1)
    model = small(0, len(tok))
    seen, trainer = [], []

    def sampler(net):
        seen.append(copy.deepcopy(net.state_dict()))
        trainer.append(copy.deepcopy(model.state_dict()))
        assert net is not model
        return net

    g = torch.Generator().manual_seed(0)                # an untrained policy earns equal rewards: random advantages
    monkeypatch.setattr(m, 'compute_advantages', lambda batch, cfg: torch.randn(len(batch['rewards']), generator=g))
    history = m.train_offpolicy(model, TRAIN, tok, cfg, 6, lag=2, sampler=sampler)
    assert all(r['updated'] for r in history)                       # every step updates: version = step
    assert [r['staleness'] for r in history] == [0, 1, 2, 2, 2, 2]
    for step in range(6):
        ref = trainer[max(0, step - 2)]
        assert all(torch.equal(seen[step][k], ref[k]) for k in ref)
    off = lambda r: max(r['is_ratio_max'] - 1, 1 - r['is_ratio_min'])
    assert off(history[0]) < 1e-9 and all(off(r) > 1e-6 for r in history[1:])   # stale data: r moves off 1


def test_held_out_evaluations_measure_the_trainer_not_the_actor(tok, monkeypatch):
    # with a lag the actor samples old weights, but train_rl's evaluation points (steps 0, 2 and after the
    # last) must see the trainer: the weights the same run has after 0, 2 and 3 steps without evaluation
    cfg = RLConfig(group_size=4, tasks_per_step=3, drop_equal_groups=False, seed=4)
    seeded = lambda batch, cfg: torch.randn(len(batch['rewards']),              # every step updates
                                            generator=torch.Generator().manual_seed(int(batch['ids'].sum())))
    monkeypatch.setattr(m, 'compute_advantages', seeded)
    seen = []

    def judge(model, tasks, tok, **kw):
        seen.append(copy.deepcopy(model.state_dict()))
        return {'pass_rate': float(len(seen)), 'reward': 0.0}

    monkeypatch.setattr(m, 'evaluate', judge)
    history = m._train_offpolicy(small(0, len(tok)), TRAIN, tok, cfg, 3, lag=1, correction='tis',
                                 eval_tasks=TRAIN[:2], eval_every=2)
    assert [history[0]['eval_pass_rate'], history[2]['eval_pass_rate'], history[2]['final_eval_pass_rate']] \
        == [1.0, 2.0, 3.0] and 'eval_pass_rate' not in history[1]
    assert [r['staleness'] for r in history] == [0, 1, 1]
    after = {}
    for steps in (0, 1, 2, 3):
        model = small(0, len(tok))
        m.train_offpolicy(model, TRAIN, tok, cfg, steps, lag=1, correction='tis')
        after[steps] = model.state_dict()
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)
    assert all(same(state, after[k]) for state, k in zip(seen, (0, 2, 3)))
    assert not same(seen[1], after[1])                  # the actor of step 2 held version 1, not the trainer's


def test_a_mismatched_sampler_is_what_the_ratio_sees(tok):
    cfg = RLConfig(group_size=4, tasks_per_step=3, seed=2)
    hot = lambda net: m._tempered(net, 2.0)
    model = small(0, len(tok))
    before = copy.deepcopy(model)
    history = m.train_offpolicy(model, TRAIN, tok, cfg, 2, correction='tis', sampler=hot)
    assert all(r['is_kl'] > 1e-4 for r in history if r['updated'])
    torch.manual_seed(0)
    probe = small(3, len(tok))
    copy_ = hot(probe)
    assert same_weights(probe, small(3, len(tok)))                   # the sampler leaves its argument alone
    assert torch.equal(copy_.head.weight, probe.head.weight / 2.0)
    assert not same_weights(model, before)


def test_round_mantissa_keeps_the_leading_bits():
    model = small(0, 40)
    with torch.no_grad():
        model.head.weight[0, :3] = torch.tensor([0.1234567891234, -3.3333333, 1e-5])
    r = m._round_mantissa(model, 8).head.weight[0, :3].tolist()
    assert r == [253 / 2048, -213 / 64, round(1e-5 * 2 ** 24) / 2 ** 24]
    assert same_weights(m._round_mantissa(model, 53), model)


def test_train_offpolicy_rejects_bad_arguments(tok):
    cfg = RLConfig(group_size=4)
    model = small(0, len(tok))
    for kw, err, match in ((dict(lag=-1), ValueError, 'lag'), (dict(correction='x'), ValueError, 'correction'),
                           (dict(cap=0.0), ValueError, 'cap'), (dict(sampler=3), TypeError, 'sampler')):
        with pytest.raises(err, match=match):
            m.train_offpolicy(model, TRAIN, tok, cfg, 1, **kw)
    with pytest.raises(ValueError, match='kl_coef'):
        m.train_offpolicy(model, TRAIN, tok, RLConfig(group_size=4, kl_coef=0.1), 1)
    with pytest.raises(TypeError, match='TinyAgent'):
        m.train_offpolicy(model, TRAIN, tok, cfg, 1, sampler=lambda net: 'engine')


# ---------------------------------------------------------------- the cached runs
from conftest import small_base  # noqa: E402


def test_make_offpolicy_agent_is_the_run_and_caches_it(tok, monkeypatch, tmp_path):
    import agentrl.grpo as grpo
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    # lag 0, no correction, no sampler: Chapter 9's run, weights and history
    model, history, seconds = m.make_offpolicy_agent(tok, seed=1, steps=2)
    book, book_history = grpo.make_grpo_agent(tok, base_seed=0, seed=1, steps=2)
    assert same_weights(model, book) and seconds > 0 and strip(history) == book_history
    # a lagged, corrected run with a named sampler: the same as calling _train_offpolicy directly
    ref = small_base(tok, 0)
    want = m._train_offpolicy(ref, TRAIN, tok, RLConfig(seed=1), 2, lag=1, correction='tis',
                              sampler=m.SAMPLERS['tempered'], eval_tasks=make_tasks('heldout'), eval_every=25)
    got, got_history, _ = m.make_offpolicy_agent(tok, seed=1, steps=2, lag=1, correction='tis', sampler='tempered')
    assert same_weights(got, ref) and got_history == want
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 3
    monkeypatch.setattr(m, '_train_offpolicy', lambda *a, **k: pytest.fail('trained instead of loading the cache'))
    again, again_history, _ = m.make_offpolicy_agent(tok, seed=1, steps=2, lag=1, correction='tis', sampler='tempered')
    assert again_history == want and same_weights(again, ref)


def test_make_offpolicy_agent_rejects_bad_arguments(tok):
    for kw, match in ((dict(seed=-1), 'seed'), (dict(base_seed=0.5), 'base_seed'), (dict(steps=0), 'steps'),
                      (dict(lag=-2), 'lag'), (dict(sampler='bf16'), 'sampler'), (dict(correction='v-trace'), 'correction'),
                      (dict(cap=float('inf')), 'cap')):
        with pytest.raises(ValueError, match=match):
            m.make_offpolicy_agent(tok, **kw)
    for name, kw in m.OFFPOLICY_RUNS.items():
        assert set(kw) <= {'lag', 'correction', 'sampler', 'cap'} and kw.get('sampler') in (None, *m.SAMPLERS)
