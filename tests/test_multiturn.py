"""Tests for agentrl.multiturn (Chapter 12). Expected values come from hand computations, plain loops
over tokens, autograd, and the Chapter 5 and 9 functions the new ones must agree with."""
import inspect
import math

import pytest
import torch

import agentrl as arl
import agentrl.multiturn as m
from agentrl.grpo import EditBudgetEnv, RLConfig, evaluate, make_env, randomize_names
from agentrl.gym import BugFixEnv, compact_source, make_tasks, scripted_policy
from agentrl.policies import sequence_log_probs
from agentrl.trajectories import (OWNER_ENV, OWNER_POLICY, OWNER_PROMPT, Trajectory, collate, rollout_batch,
                                  scripted_rollout)
import random

torch.set_num_threads(1)
TEST = make_tasks('test')
TRAIN = make_tasks('train')
INDEX = ('per_call_rewards', 'masked_whiten', 'context_view', 'call_sample', 'context_rollout_batch',
         'evaluate_context', 'EarlyStopEnv', 'single_turn', 'MixedTurnEnv')


def oracle_trajs(tok, n=4, max_turns=6):
    "Scripted oracle episodes (read, edit, test, submit) on the first n train tasks."
    return [scripted_rollout(scripted_policy('oracle'), EditBudgetEnv(max_turns=max_turns), t, tok,
                             max_turns=max_turns) for t in TRAIN[:n]]


def test_index_names_reachable_with_their_signatures():
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    sig = lambda f: str(inspect.signature(f))
    assert sig(m.per_call_rewards) == '(trajs, mask, step_penalty=0.0)'
    assert sig(m.masked_whiten) == '(x, mask, eps=1e-06)'
    assert sig(m.context_view) == '(ids, owner, turn, k, keep_obs=None)'
    assert sig(m.call_sample) == '(traj, view, call_ids, call_logp)'
    assert sig(m.context_rollout_batch) == ('(model, envs, tasks, tok, keep_obs=None, max_turns=6, temperature=1.0, '
                                            'generator=None)')
    assert sig(m.evaluate_context) == '(model, tasks, tok, keep_obs=None, n_samples=16, seed=7, cfg=None)'
    assert sig(m.single_turn) == '(task)'
    assert issubclass(m.EarlyStopEnv, EditBudgetEnv) and issubclass(m.MixedTurnEnv, EditBudgetEnv)


# ---------------------------------------------------------------- per_call_rewards
def test_per_call_rewards_by_loop(tok):
    trajs = oracle_trajs(tok)
    batch = collate(trajs, tok.pad_id)
    r = m.per_call_rewards(trajs, batch['action_mask'], step_penalty=0.1)
    assert r.shape == batch['action_mask'].shape and r.dtype == torch.float64
    for b, t in enumerate(trajs):
        want = torch.zeros(r.shape[1])
        pos = [i for i in range(len(t) - 1) if t.owner[i + 1] == OWNER_POLICY]
        for j, i in enumerate(pos):          # last token of a call: the next policy token has another turn
            if j == len(pos) - 1 or t.turn[pos[j + 1] + 1] != t.turn[i + 1]:
                want[i] -= 0.1
        verdict = float(t.info['submitted'] and t.info['hidden_pass'])
        want[pos[-1]] += verdict
        assert torch.equal(r[b], want)
        assert float(r[b].sum()) == pytest.approx(verdict - 0.1 * t.info['turns'], abs=1e-12)
        assert not bool(r[b][batch['action_mask'][b] == 0].any())   # rewards only on policy tokens


def test_per_call_rewards_verdict_ignores_env_reward(tok):
    "A public-reward hacker gets reward 1 from its env but verdict 0 here (hidden tests)."
    from agentrl.gym import public_reward
    t = scripted_rollout(scripted_policy('hacker'), BugFixEnv(reward_fn=public_reward), TRAIN[0], tok)
    assert t.reward == 1.0 and not t.info['hidden_pass']
    r = m.per_call_rewards([t], collate([t], tok.pad_id)['action_mask'])
    assert float(r.sum()) == 0.0


def test_per_call_rewards_no_policy_token_and_padding(tok):
    trajs = oracle_trajs(tok, 2)
    mask = torch.cat([collate(trajs, tok.pad_id)['action_mask'], torch.zeros(2, 5)], 1)   # extra padding
    r = m.per_call_rewards(trajs, mask)
    assert r.shape == mask.shape and torch.isfinite(r).all() and not bool(r[:, -5:].any())
    empty = Trajectory(ids=torch.tensor([2]), action_mask=torch.zeros(0), sample_logp=torch.zeros(0),
                       owner=torch.tensor([0]), turn=torch.tensor([0]), reward=0.0,
                       info={'submitted': False, 'hidden_pass': False})
    assert torch.equal(m.per_call_rewards([empty], torch.zeros(1, 3)), torch.zeros(1, 3))


def test_per_call_rewards_bad_input(tok):
    trajs = oracle_trajs(tok, 2)
    mask = collate(trajs, tok.pad_id)['action_mask']
    with pytest.raises(TypeError, match='trajs'):
        m.per_call_rewards(trajs[0], mask)
    with pytest.raises(ValueError, match='trajs'):
        m.per_call_rewards([], mask)
    with pytest.raises(TypeError, match='mask'):
        m.per_call_rewards(trajs, mask.long())
    with pytest.raises(ValueError, match=r'mask must have shape \[B=2'):
        m.per_call_rewards(trajs, mask[:1])
    moved = mask.clone()
    moved[1, 0] = 1.0                                   # a prompt position marked as the policy's
    with pytest.raises(ValueError, match='mask row 1'):
        m.per_call_rewards(trajs, moved)
    with pytest.raises(ValueError, match='step_penalty'):
        m.per_call_rewards(trajs, mask, step_penalty=-0.1)
    with pytest.raises(ValueError, match='step_penalty'):
        m.per_call_rewards(trajs, mask, step_penalty=float('nan'))


# ---------------------------------------------------------------- masked_whiten
def whiten_loop(x, mask, eps=1e-6):
    vals = [float(x[b, t]) for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t]]
    out = torch.zeros_like(x)
    if not vals or all(v == vals[0] for v in vals):
        return out
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mask[b, t]:
                out[b, t] = (float(x[b, t]) - mean) / (std + eps)
    return out


def test_masked_whiten_against_loop():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(4, 7, generator=gen) * 3 + 1
        mask = (torch.rand(4, 7, generator=gen) < 0.6).double()
        got = m.masked_whiten(x, mask)
        assert torch.allclose(got, whiten_loop(x, mask), atol=1e-12, rtol=0)
        keep = mask.bool()
        assert abs(float(got[keep].mean())) < 1e-12
        assert float(got[keep].pow(2).mean().sqrt()) == pytest.approx(1.0, abs=1e-5)   # eps shrinks it a little


def test_masked_whiten_degenerate_masks_are_finite_with_finite_gradients():
    x = torch.tensor([[0.3, float('nan'), float('inf')], [2.0, -1.0, 5.0]], requires_grad=True)
    for mask in (torch.zeros(2, 3), torch.tensor([[1.0, 0, 0], [0, 0, 0]]),
                 torch.tensor([[0.0, 0, 0], [1, 1, 1]]), torch.tensor([[1.0, 0, 0], [0, 1, 0]])):
        y = m.masked_whiten(x, mask)
        assert torch.isfinite(y).all()
        assert not bool(y[mask == 0].any())
        (g,) = torch.autograd.grad((y * torch.arange(1.0, 7.0).reshape(2, 3)).sum(), x)
        assert torch.isfinite(g).all()
    one = m.masked_whiten(x, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))
    assert torch.equal(one.detach(), torch.zeros(2, 3))                       # one token: exactly 0
    same = m.masked_whiten(torch.full((2, 3), 0.1), torch.ones(2, 3))         # equal values: exactly 0
    assert torch.equal(same, torch.zeros(2, 3))


def test_masked_whiten_gradient_matches_autograd_of_formula():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=gen).requires_grad_(True)
    mask = (torch.rand(3, 5, generator=gen) < 0.7).double()
    w = torch.randn(3, 5, generator=gen)
    (g,) = torch.autograd.grad((m.masked_whiten(x, mask) * w).sum(), x)
    xs = x[mask.bool()]
    ref = (xs - xs.mean()) / (xs.var(unbiased=False).sqrt() + 1e-6)
    (g_ref,) = torch.autograd.grad((ref * w[mask.bool()]).sum(), x)
    assert torch.allclose(g, g_ref, atol=1e-12, rtol=0)


def test_masked_whiten_bad_input():
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match='x must be a floating tensor'):
        m.masked_whiten(x.long(), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r'x must have shape \[B, T\]'):
        m.masked_whiten(x[0], torch.ones(3))
    with pytest.raises(TypeError, match='mask'):
        m.masked_whiten(x, [[1, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match='mask must have'):
        m.masked_whiten(x, torch.ones(3, 2))
    with pytest.raises(ValueError, match='0 and 1'):
        m.masked_whiten(x, torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match='finite where mask'):
        m.masked_whiten(torch.tensor([[float('nan'), 1.0]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match='eps'):
        m.masked_whiten(x, torch.ones(2, 3), eps=-1.0)


# ---------------------------------------------------------------- context_view / call_sample
def test_context_view_by_hand():
    ids = torch.arange(10, 23)
    owner = torch.tensor([0, 0, 1, 1, 2, 2, 1, 2, 2, 2, 1, 1, 2])
    turn = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    assert m.context_view(ids, owner, turn, 1).tolist() == [10, 11]
    assert m.context_view(ids, owner, turn, 3).tolist() == list(range(10, 20))
    assert m.context_view(ids, owner, turn, 4, keep_obs=None).tolist() == list(range(10, 23))
    assert m.context_view(ids, owner, turn, 4, keep_obs=0).tolist() == [10, 11, 12, 13, 16, 20, 21]
    assert m.context_view(ids, owner, turn, 4, keep_obs=1).tolist() == [10, 11, 12, 13, 16, 20, 21, 22]
    assert m.context_view(ids, owner, turn, 4, keep_obs=2).tolist() == [10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 22]
    assert m.context_view(ids, owner, turn, 4, keep_obs=3).tolist() == list(range(10, 23))
    assert m.context_view(ids.tolist(), owner.tolist(), turn.tolist(), 2, 0).tolist() == [10, 11, 12, 13]


def test_context_view_loop_on_episodes(tok):
    for t in oracle_trajs(tok, 3):
        for k in range(1, int(t.turn.max()) + 2):
            for keep in (None, 0, 1, 2, 5):
                want = [int(t.ids[i]) for i in range(len(t)) if t.turn[i] < k and not (
                    keep is not None and t.owner[i] == OWNER_ENV and t.turn[i] < k - keep)]
                assert m.context_view(t.ids, t.owner, t.turn, k, keep).tolist() == want


def test_context_view_bad_input():
    ids, owner, turn = torch.arange(4), torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 2])
    with pytest.raises(ValueError, match='one length'):
        m.context_view(ids[:3], owner, turn, 1)
    with pytest.raises(ValueError, match='owner'):
        m.context_view(ids, torch.tensor([0, 1, 3, 1]), turn, 1)
    with pytest.raises(ValueError, match=r'k must be an int in \[1, 3\]'):
        m.context_view(ids, owner, turn, 4)
    with pytest.raises(ValueError, match='k must'):
        m.context_view(ids, owner, turn, 0)
    with pytest.raises(TypeError, match='keep_obs'):
        m.context_view(ids, owner, turn, 1, keep_obs=1.5)
    with pytest.raises(ValueError, match='keep_obs'):
        m.context_view(ids, owner, turn, 1, keep_obs=-1)
    with pytest.raises(ValueError, match='ids must be a 1-D integer tensor'):
        m.context_view(ids.double(), owner, turn, 1)
    with pytest.raises(TypeError, match='ids'):
        m.context_view('abc', owner, turn, 1)
    with pytest.raises(TypeError, match='k must be an int'):
        m.context_view(ids, owner, turn, 1.0)
    with pytest.raises(TypeError, match='k must be an int'):
        m.context_view(ids, owner, turn, True)
    with pytest.raises(ValueError, match='turn must hold'):
        m.context_view(ids, owner, torch.tensor([0, -1, 1, 2]), 1)


def test_call_sample_fields_and_scoring(tok, tiny):
    t = oracle_trajs(tok, 1)[0]
    view = m.context_view(t.ids, t.owner, t.turn, 2, keep_obs=0)
    call = t.ids[(t.owner == OWNER_POLICY) & (t.turn == 2)]
    logp = [-0.5] * len(call)
    s = m.call_sample(t, view, call.tolist(), logp)
    n = len(view)
    assert torch.equal(s.ids, torch.cat([view, call]))
    assert s.action_mask.tolist() == [0.0] * (n - 1) + [1.0] * len(call)
    assert s.sample_logp.tolist() == [0.0] * (n - 1) + logp
    assert s.owner.tolist() == [OWNER_PROMPT] * n + [OWNER_POLICY] * len(call)
    assert s.turn.tolist() == [0] * n + [1] * len(call)
    assert s.reward == t.reward and s.info == t.info and s.info is not t.info
    # with the full prefix as view, the call's scored log-probs are the episode's at those positions
    full = m.call_sample(t, m.context_view(t.ids, t.owner, t.turn, 2), call, torch.tensor(logp))
    lp_full = sequence_log_probs(tiny, full.ids[None])[0]
    lp_ep = sequence_log_probs(tiny, t.ids[None])[0]
    on = full.action_mask.bool()
    assert torch.allclose(lp_full[on], lp_ep[:len(on)][on], atol=1e-12, rtol=0)


def test_call_sample_bad_input(tok):
    t = oracle_trajs(tok, 1)[0]
    with pytest.raises(TypeError, match='traj'):
        m.call_sample('x', [2], [4], [-1.0])
    with pytest.raises(ValueError, match='view'):
        m.call_sample(t, [], [4], [-1.0])
    with pytest.raises(ValueError, match='call_logp'):
        m.call_sample(t, [2], [4, 5], [-1.0])
    with pytest.raises(ValueError, match='sample_logp'):
        m.call_sample(t, [2], [4], [0.5])
    with pytest.raises(TypeError, match='call_ids'):
        m.call_sample(t, [2], [4.0], [-1.0])
    for bad in (['x'], [None], [True]):
        with pytest.raises(TypeError, match='call_logp'):
            m.call_sample(t, [2], [4], bad)


# ---------------------------------------------------------------- context_rollout_batch / evaluate_context
def test_context_rollout_none_equals_rollout_batch_bit_for_bit(tok, tiny):
    cfg = RLConfig()
    tasks = TRAIN[:6]
    a = rollout_batch(tiny, [make_env(cfg) for _ in tasks], tasks, tok, generator=torch.Generator().manual_seed(5))
    b, calls = m.context_rollout_batch(tiny, [make_env(cfg) for _ in tasks], tasks, tok,
                                       generator=torch.Generator().manual_seed(5))
    for x, y in zip(a, b):
        for f in ('ids', 'action_mask', 'sample_logp', 'owner', 'turn'):
            assert torch.equal(getattr(x, f), getattr(y, f))
        assert x.reward == y.reward and x.info == y.info
    assert [i for i, _ in calls] == sorted(i for i, _ in calls)
    for i, t in enumerate(b):            # the calls of episode i rebuild its log and its log-probs
        mine = [c for j, c in calls if j == i]
        assert len(mine) == len(set(t.turn[t.owner == OWNER_POLICY].tolist()))
        last = mine[-1]
        n = len(last)
        assert torch.equal(last.ids, t.ids[:n])
        assert float(sum(c.sample_logp.sum() for c in mine)) == pytest.approx(float(t.sample_logp.sum()), abs=1e-12)


def test_context_rollout_keeping_everything_matches_none(tok, tiny):
    "An int keep_obs that drops nothing runs the other engine (fresh cache per turn): same tokens."
    cfg = RLConfig()
    tasks = TRAIN[:6]
    a, ca = m.context_rollout_batch(tiny, [make_env(cfg) for _ in tasks], tasks, tok,
                                    generator=torch.Generator().manual_seed(5))
    b, cb = m.context_rollout_batch(tiny, [make_env(cfg) for _ in tasks], tasks, tok, keep_obs=cfg.max_turns,
                                    generator=torch.Generator().manual_seed(5))
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.owner, y.owner) and x.info == y.info
        assert torch.allclose(x.sample_logp, y.sample_logp, atol=1e-12, rtol=0)
    assert [i for i, _ in ca] == [i for i, _ in cb]
    assert all(torch.equal(x.ids, y.ids) for (_, x), (_, y) in zip(ca, cb))


def test_context_rollout_views_and_logps_are_what_the_model_read(tok, tiny):
    "With keep_obs=0 every call sample is its view + call, and the model rescores it to 1e-12."
    cfg = RLConfig()
    tasks = TRAIN[:5]
    trajs, calls = m.context_rollout_batch(tiny, [make_env(cfg) for _ in tasks], tasks, tok, keep_obs=0,
                                           generator=torch.Generator().manual_seed(2))
    k_of = {}
    for i, c in calls:
        k_of[i] = k_of.get(i, 0) + 1
        t = trajs[i]
        view = m.context_view(t.ids, t.owner, t.turn, k_of[i], keep_obs=0)
        n = len(view)
        assert torch.equal(c.ids[:n], view)
        assert torch.equal(c.ids[n:], t.ids[(t.owner == OWNER_POLICY) & (t.turn == k_of[i])])
        lp = sequence_log_probs(tiny, c.ids[None])[0]
        on = c.action_mask.bool()
        assert torch.allclose(lp[on], c.sample_logp[on], atol=1e-12, rtol=0)
        assert not bool((c.ids[:n][1:] == -1).any())
    for t in trajs:
        assert 'hidden_pass' in t.info


def test_context_rollout_context_limit_on_the_view(tok):
    "A tiny context: views stay within max_len; the episode ends with overflow, never an error."
    torch.manual_seed(0)
    small = arl.TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, max_len=40)
    cfg = RLConfig()
    tasks = TRAIN[:6]
    trajs, calls = m.context_rollout_batch(small, [make_env(cfg) for _ in tasks], tasks, tok, keep_obs=1,
                                           generator=torch.Generator().manual_seed(0))
    assert all(len(c) <= 40 for _, c in calls)
    assert all('overflow' in t.info for t in trajs)


def test_context_rollout_bad_input(tok, tiny):
    cfg = RLConfig()
    with pytest.raises(TypeError, match='keep_obs'):
        m.context_rollout_batch(tiny, [make_env(cfg)], TRAIN[:1], tok, keep_obs='all')
    with pytest.raises(ValueError, match='keep_obs'):
        m.context_rollout_batch(tiny, [make_env(cfg)], TRAIN[:1], tok, keep_obs=-2)
    env = make_env(cfg)
    with pytest.raises(ValueError, match='distinct'):
        m.context_rollout_batch(tiny, [env, env], TRAIN[:2], tok, keep_obs=1)
    with pytest.raises(ValueError, match='equal length'):
        m.context_rollout_batch(tiny, [make_env(cfg)], TRAIN[:2], tok, keep_obs=1)


def test_evaluate_context_none_equals_evaluate(tok, tiny):
    got = m.evaluate_context(tiny, TEST[:4], tok, n_samples=3, seed=11)
    want = evaluate(tiny, TEST[:4], tok, n_samples=3, generator=torch.Generator().manual_seed(11))
    for key, value in want.items():
        assert got[key] == value
    assert got['read_tokens'] >= got['peak_context'] and got['log_tokens'] == got['peak_context']
    low = m.evaluate_context(tiny, TEST[:4], tok, keep_obs=0, n_samples=3, seed=11)
    assert low['peak_context'] <= low['log_tokens']
    with pytest.raises(ValueError, match='n_samples'):
        m.evaluate_context(tiny, TEST[:4], tok, n_samples=0)
    with pytest.raises(ValueError, match='tasks'):
        m.evaluate_context(tiny, [], tok)


# ---------------------------------------------------------------- EarlyStopEnv
def test_early_stop_env_ends_after_max_invalid():
    env = m.EarlyStopEnv(max_invalid=2)
    env.reset(TRAIN[0])
    obs, r, done, info = env.step('<call> read </call>')
    assert not done
    obs, r, done, info = env.step('oops')
    assert not done and info['event'] == 'invalid'
    obs, r, done, info = env.step('<call> fly </call>')                # unknown tool: the second invalid
    assert done and r == 0.0 and info['early_stop'] and not info['truncated'] and not info['submitted']
    assert info['invalid'] == 2 and info['turns'] == 3 and obs.endswith('out of turns')
    env.reset(TRAIN[0])                                                # a new episode starts afresh
    _, _, done, info = env.step('<call> submit </call>')
    assert done and info['early_stop'] is False


def test_early_stop_env_matches_edit_budget_env_without_invalid_calls(tok):
    for task in TRAIN[:5]:
        a = scripted_rollout(scripted_policy('oracle'), EditBudgetEnv(), task, tok)
        b = scripted_rollout(scripted_policy('oracle'), m.EarlyStopEnv(max_invalid=1), task, tok)
        assert torch.equal(a.ids, b.ids) and a.reward == b.reward
        assert {k: v for k, v in b.info.items() if k != 'early_stop'} == a.info


def test_early_stop_env_last_turn_is_a_truncation():
    env = m.EarlyStopEnv(max_turns=2, max_invalid=2)
    env.reset(TRAIN[0])
    env.step('<call> read </call>')
    _, _, done, info = env.step('bad')          # the turn budget ends it first: a truncation
    assert done and info['truncated'] and not info['early_stop']


def test_early_stop_env_bad_input():
    for bad in (0, 1.5, True, None):
        with pytest.raises(ValueError, match='max_invalid'):
            m.EarlyStopEnv(max_invalid=bad)


# ---------------------------------------------------------------- single_turn / MixedTurnEnv
def test_single_turn_task_and_env(tok):
    task = TRAIN[0]
    s = m.single_turn(task)
    assert s.prompt == task.prompt + '\n' + compact_source(task.buggy)
    assert m.single_turn(s) is s and tok.unknown_words(s.prompt) == []
    env = m.MixedTurnEnv()
    env.reset(s)
    obs, r, done, info = env.step(f'<call> edit {task.op} </call>')
    assert done and r == 1.0 and info['submitted'] and info['single_turn'] and info['turns'] == 1
    env.reset(s)
    _, r, done, info = env.step('<call> read </call>')                 # graded after one call anyway
    assert done and r == 0.0 and info['submitted']
    env.reset(task)                                                    # a multi-turn task runs as before
    _, _, done, info = env.step(f'<call> edit {task.op} </call>')
    assert not done
    _, r, done, info = env.step('<call> submit </call>')
    assert done and r == 1.0 and not info['single_turn']


def test_mixed_turn_env_refuses_renamed_single_turn_task():
    s = randomize_names(m.single_turn(TRAIN[0]), random.Random(0))
    with pytest.raises(ValueError, match='after randomize_names'):
        m.MixedTurnEnv().reset(s)
    with pytest.raises(TypeError, match='task'):
        m.single_turn('clamp')


def test_mixed_batch_rollout(tok, tiny):
    tasks = [m.single_turn(TRAIN[0]), TRAIN[1], m.single_turn(TRAIN[2]), TRAIN[3]]
    trajs = rollout_batch(tiny, [m.MixedTurnEnv() for _ in tasks], tasks, tok,
                          generator=torch.Generator().manual_seed(0))
    for t, task in zip(trajs, tasks):
        if task.name.endswith('+single'):
            assert t.info['turns'] == 1 and t.info['submitted']
