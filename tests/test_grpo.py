"""Tests for agentrl.grpo (Chapter 9). Expected values are computed by hand, by plain loops, or
from the environment's own infos; training runs are tiny and seeded."""
import math
import random
import re

import pytest
import torch

import agentrl.grpo as m
from agentrl.gym import (BugFixEnv, GYM_NAMES, HONEST_OPS, make_tasks, public_reward,
                         run_episode, scripted_policy)
from agentrl.policies import TinyAgent, snap_weights
from agentrl.ppo import ppo_policy_loss
from agentrl.trajectories import collate, scripted_rollout

torch.set_num_threads(1)
TRAIN, HELDOUT = make_tasks('train'), make_tasks('heldout')



def call(tool, arg=None):
    return f'<call> {tool} {arg} </call>' if arg else f'<call> {tool} </call>'


# ---------------------------------------------------------------- RLConfig
def test_config_defaults_and_validation():
    c = m.RLConfig()
    assert (c.group_size, c.tasks_per_step, c.epochs, c.minibatches) == (8, 8, 1, 2)
    assert (c.clip_low, c.clip_high, c.kl_coef, c.advantage, c.level) == (0.2, 0.28, 0.0, 'grpo', 'token')
    assert c.max_edits == 1 and c.randomize_names and c.drop_equal_groups and c.reward == 'hidden'
    for field, bad in [('group_size', 1), ('tasks_per_step', 0), ('lr', 0.0), ('lr', float('nan')),
                       ('clip_low', 1.5), ('dual_clip', 1.0), ('advantage', 'ppo'), ('kl_kind', 'k4'),
                       ('level', 'episode'), ('reward', 'judge'), ('loss_agg_mode', 'mean'),
                       ('max_edits', 0), ('temperature', 0.0), ('randomize_names', 1)]:
        with pytest.raises(ValueError, match=field):
            m.RLConfig(**{field: bad})
    with pytest.raises(ValueError, match='norm_const'):
        m.RLConfig(norm_const=10.0)                       # only with seq_mean_token_sum_norm
    m.RLConfig(norm_const=10.0, loss_agg_mode='seq_mean_token_sum_norm')
    m.RLConfig(max_edits=None)


# ---------------------------------------------------------------- advantages
def test_compute_advantages_by_hand_and_equal_groups():
    r = [1., 0., 0., 0., 1., 1., 0., 0., 0., 0., 0., 0., 1., 1., 1., 1.]
    batch = {'rewards': torch.tensor(r)}
    G = 4
    for kind in m.ADVANTAGE_KINDS:
        adv = m.compute_advantages(batch, m.RLConfig(group_size=G, advantage=kind)).tolist()
        for g in range(4):
            grp = r[g * G:(g + 1) * G]
            mean = sum(grp) / G
            std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
            for j, x in enumerate(grp):
                if kind == 'grpo':
                    want = 0.0 if std == 0 else (x - mean) / (std + 1e-6)
                elif kind == 'drgrpo':
                    want = x - mean
                elif kind == 'rloo':
                    want = x - (sum(grp) - x) / (G - 1)
                elif kind == 'reward':
                    want = x                                # REINFORCE: no baseline
                else:
                    want = x - sum(r) / len(r)              # batch mean over all 16 rewards (= 0.4375)
                assert adv[g * G + j] == pytest.approx(want, abs=1e-5)
        if kind in ('grpo', 'drgrpo', 'rloo'):
            assert adv[8:16] == [0.0] * 8                   # all-equal groups: exactly zero
    assert m.compute_advantages({'rewards': torch.tensor([1., 0., 0.])},        # groups ignored
                                m.RLConfig(group_size=4, advantage='batch_mean')).tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError):
        m.compute_advantages({'rewards': torch.ones(6)}, m.RLConfig(group_size=4))
    with pytest.raises(ValueError, match='rewards'):
        m.compute_advantages({}, m.RLConfig())
    with pytest.raises(TypeError, match='cfg'):
        m.compute_advantages(batch, None)


# ---------------------------------------------------------------- KL
def test_kl_penalty_by_hand():
    logp = torch.tensor([[-1.0, -0.5, -2.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0]])
    d = [-0.5, 0.0, 1.0]                                   # ref - logp
    want = {'k1': [-x for x in d], 'k2': [0.5 * x * x for x in d],
            'k3': [math.exp(x) - x - 1 for x in d]}
    for kind, values in want.items():
        got = m.kl_penalty(logp, ref, kind)[0].tolist()
        assert got == pytest.approx(values, abs=1e-6)
    assert bool((m.kl_penalty(torch.randn(5, 7), torch.randn(5, 7)) >= 0).all())   # k3 >= 0
    # the gradient flows into logp only
    lp = logp.clone().requires_grad_(True)
    rf = ref.clone().requires_grad_(True)
    m.kl_penalty(lp, rf, 'k3').sum().backward()
    assert rf.grad is None and lp.grad is not None
    # d/dlogp k3 = 1 - exp(d)
    assert lp.grad[0].tolist() == pytest.approx([1 - math.exp(x) for x in d], abs=1e-6)
    with pytest.raises(ValueError, match='kind'):
        m.kl_penalty(logp, ref, 'k4')
    with pytest.raises(ValueError, match='shape'):
        m.kl_penalty(logp, ref[:, :2])
    with pytest.raises(TypeError, match='logp'):
        m.kl_penalty([[0.0]], ref)


# ---------------------------------------------------------------- GSPO
def test_gspo_loss_matches_hand_computation():
    logp = torch.tensor([[-0.5, -1.0, -0.2, 0.0],
                         [-2.0, -0.1, 0.0, 0.0],
                         [-0.3, 0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-0.6, -1.0, -0.25, 0.0],
                        [-2.0, -0.1003, 0.0, 0.0],
                        [-0.3001, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])   # last row: no policy token
    adv = torch.tensor([1.0, -1.0, 5.0])
    loss, stats = m.gspo_policy_loss(logp, old, adv, mask)
    lo, hi = 1 - 3e-4, 1 + 4e-4
    terms = []
    for i in range(2):
        toks = [j for j in range(4) if mask[i, j]]
        s = math.exp(sum(logp[i, j].item() - old[i, j].item() for j in toks) / len(toks))
        terms.append(-min(s * adv[i].item(), min(max(s, lo), hi) * adv[i].item()))
    assert loss.item() == pytest.approx(sum(terms) / 2, abs=1e-6)
    assert stats['clip_frac'] == pytest.approx(0.5)         # row 0 clipped (s = e^0.05), row 1 not
    loss.backward()
    s1 = math.exp(0.0003 / 2)
    assert logp.grad[0].tolist() == pytest.approx([0.0] * 4, abs=1e-7)       # clipped: no gradient
    assert logp.grad[1].tolist() == pytest.approx([s1 / 4, s1 / 4, 0, 0], abs=1e-6)
    assert logp.grad[2].tolist() == [0.0] * 4
    # an all-zero mask gives 0, not NaN
    z, _ = m.gspo_policy_loss(logp.detach(), old, adv, torch.zeros(3, 4))
    assert z.item() == 0.0
    with pytest.raises(ValueError, match='advantages'):
        m.gspo_policy_loss(logp, old, torch.ones(3, 4), mask)
    with pytest.raises(ValueError, match='mask'):
        m.gspo_policy_loss(logp, old, adv, mask * 2)
    with pytest.raises(ValueError, match='clip_low'):
        m.gspo_policy_loss(logp, old, adv, mask, clip_low=1.0)


def test_policy_loss_dispatches_by_level():
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0])
    tok_cfg = m.RLConfig(clip_low=0.1, clip_high=0.15, loss_agg_mode='seq_mean_token_mean')
    got, _ = m.policy_loss(logp, old, adv, mask, tok_cfg)
    want, _ = ppo_policy_loss(logp, old, adv, mask, 0.1, 0.15, mode='seq_mean_token_mean')
    assert got.item() == pytest.approx(want.item(), abs=1e-7)
    seq_cfg = m.RLConfig(level='sequence', clip_low=3e-4, clip_high=4e-4)
    got, _ = m.policy_loss(logp, old, adv, mask, seq_cfg)
    want, _ = m.gspo_policy_loss(logp, old, adv, mask)
    assert got.item() == pytest.approx(want.item(), abs=1e-7)
    with pytest.raises(TypeError, match='cfg'):
        m.policy_loss(logp, old, adv, mask, {})


# ---------------------------------------------------------------- gym pieces
def test_randomize_names_never_uses_a_source_word():
    rng = random.Random(0)
    for task in TRAIN + HELDOUT:
        words = set(re.findall(r'\w+', task.buggy + ' ' + task.fixed))
        for _ in range(10):
            new = m.randomize_names(task, rng)
            assert new.fn_name in GYM_NAMES and new.fn_name not in words
            assert new.fn_name != task.fn_name and f'def {new.fn_name}(' in new.buggy
            assert new.hidden == task.hidden and new.op == task.op
            assert new.prompt.split()[4] == new.fn_name
    # deterministic given the rng seed
    a = [m.randomize_names(t, random.Random(5)).fn_name for t in TRAIN[:5]]
    b = [m.randomize_names(t, random.Random(5)).fn_name for t in TRAIN[:5]]
    assert a == b
    with pytest.raises(TypeError, match='rng'):
        m.randomize_names(TRAIN[0], 0)
    with pytest.raises(TypeError, match='task'):
        m.randomize_names('clamp', random.Random(0))


def test_edit_budget_env_stops_applying_edits():
    task = TRAIN[0]                                          # swap_minmax repairs it
    wrong = next(op for op in HONEST_OPS if op != task.op)
    for budget, want_reward in ((1, 0.0), (2, 1.0)):
        env = m.EditBudgetEnv(max_edits=budget)
        env.reset(task)
        obs1, *_ = env.step(call('edit', wrong))
        obs2, *_ = env.step(call('edit', task.op))
        obs3, *_ = env.step(call('edit', task.op))           # third edit: over any budget here
        _, reward, done, info = env.step(call('submit'))
        assert done and reward == want_reward
        assert info['edits'] == 3 and len(info['ops']) == budget
        assert obs3 == f'{task.op} changed nothing'
        assert info['first_edit_right'] is False
    # None: no limit, identical to BugFixEnv
    spam = lambda obs: call('edit', HONEST_OPS[len(obs) - 1]) if len(obs) <= 5 else call('submit')
    for t in TRAIN[:10]:
        assert run_episode(spam, m.EditBudgetEnv(max_edits=None), t)[0] == run_episode(spam, BugFixEnv(), t)[0]
    with pytest.raises(ValueError, match='max_edits'):
        m.EditBudgetEnv(max_edits=0)


def test_make_env():
    env = m.make_env(m.RLConfig(max_turns=4, max_edits=2, reward='public'))
    assert isinstance(env, m.EditBudgetEnv) and env.max_turns == 4 and env.max_edits == 2
    assert env.reward_fn is public_reward
    assert m.make_env(m.RLConfig()) is not m.make_env(m.RLConfig())
    with pytest.raises(TypeError, match='cfg'):
        m.make_env(None)


def test_make_rl_base_uses_two_oracle_sets_in_ten(tok, monkeypatch):
    seen = {}
    monkeypatch.setattr(m, 'make_base_agent', lambda tok, **kw: seen.update(kw) or 'agent')
    assert m.make_rl_base(tok, seed=3) == 'agent'
    kinds = seen['kinds']
    assert len(kinds) == 10 and kinds.count('oracle') == 2 and kinds.count('random') == kinds.count('blind') == 4
    assert set(kinds) == {'random', 'blind', 'oracle'} and seen['seed'] == 3
    assert seen['steps'] == m.RL_BASE_STEPS == 1200


# ---------------------------------------------------------------- sampling and stats
def test_behavior_stats_by_hand(tok):
    trajs = [scripted_rollout(scripted_policy(kind, seed=1), m.EditBudgetEnv(), t, tok)
             for kind in ('oracle', 'blind', 'random') for t in TRAIN[:4]]
    s = m.behavior_stats(trajs)
    n = len(trajs)
    assert s['episodes'] == n
    assert s['pass_rate'] == pytest.approx(sum(t.info['submitted'] and t.info['hidden_pass'] for t in trajs) / n)
    for key in ('reads', 'tests', 'edits', 'turns'):
        assert s[key] == pytest.approx(sum(t.info[key] for t in trajs) / n)
    assert s['first_edit_right'] == pytest.approx(sum(t.info['first_edit_right'] for t in trajs) / n)
    assert s['length'] == pytest.approx(sum(float(t.action_mask.sum()) for t in trajs) / n)
    assert m.behavior_stats(trajs[:4])['pass_rate'] == 1.0            # the oracle
    with pytest.raises(ValueError):
        m.behavior_stats([])


def test_sample_groups_layout(tiny, tok):
    cfg = m.RLConfig(group_size=3, max_turns=2)
    trajs = m.sample_groups(tiny, None, TRAIN[:4], tok, cfg, torch.Generator().manual_seed(0))
    assert len(trajs) == 12
    for g in range(4):
        infos = [t.info for t in trajs[3 * g:3 * g + 3]]
        assert {i['task'] for i in infos} == {TRAIN[g].name}
        assert len({i['fn_name'] for i in infos}) == 1                # one name per group
    again = m.sample_groups(tiny, None, TRAIN[:4], tok, cfg, torch.Generator().manual_seed(0))
    assert [t.ids.tolist() for t in trajs] == [t.ids.tolist() for t in again]
    with pytest.raises(TypeError, match='generator'):
        m.sample_groups(tiny, None, TRAIN[:4], tok, cfg, 0)


PATTERN = [1, 0, 0, 0,  0, 0, 0, 0,  1, 1, 1, 1,  0, 1, 0, 1,  0, 0, 0, 0,  1, 1, 0, 0]


def fixed_rewards(pattern):
    "env_factory whose k-th environment pays pattern[k % len(pattern)], whatever the agent does."
    count = [0]

    def factory():
        value = float(pattern[count[0] % len(pattern)])
        count[0] += 1
        return m.EditBudgetEnv(max_turns=3, reward_fn=lambda info: value)
    return factory


def test_sample_step_drops_equal_groups(tiny, tok):
    cfg = m.RLConfig(group_size=4, max_turns=3)
    kept, sampled = m.sample_step(tiny, fixed_rewards(PATTERN), TRAIN[:6], tok, cfg,
                                  torch.Generator().manual_seed(3))
    assert [t.reward for t in sampled] == PATTERN
    mixed = [0, 3, 5]                                        # groups whose rewards differ
    assert [t.ids.tolist() for t in kept] == [t.ids.tolist() for g in mixed for t in sampled[4 * g:4 * g + 4]]
    assert [t.reward for t in kept] == [r for g in mixed for r in PATTERN[4 * g:4 * g + 4]]
    kept_all, sampled_all = m.sample_step(tiny, fixed_rewards(PATTERN), TRAIN[:6], tok,
                                          m.RLConfig(group_size=4, max_turns=3, drop_equal_groups=False),
                                          torch.Generator().manual_seed(3))
    assert len(kept_all) == len(sampled_all) == 24
    # an untrained policy never passes the hidden tests: every group is dropped
    kept0, _ = m.sample_step(tiny, None, TRAIN[:4], tok, m.RLConfig(group_size=2, max_turns=2),
                             torch.Generator().manual_seed(0))
    assert kept0 == []


def test_evaluate_counts_and_restores_mode(tiny, tok):
    tiny.train()
    s = m.evaluate(tiny, HELDOUT[:3], tok, n_samples=2, cfg=m.RLConfig(max_turns=2))
    assert s['episodes'] == 6 and s['pass_rate'] == 0.0
    assert tiny.training
    assert m.evaluate(tiny, HELDOUT[:3], tok, n_samples=2, cfg=m.RLConfig(max_turns=2)) == s   # seeded
    with pytest.raises(ValueError, match='n_samples'):
        m.evaluate(tiny, HELDOUT[:3], tok, n_samples=0)


# ---------------------------------------------------------------- update and loop
def _batch(tok):
    trajs = [scripted_rollout(scripted_policy(kind, seed=2), m.EditBudgetEnv(), t, tok)
             for t in TRAIN[:2] for kind in ('oracle', 'blind')]
    return collate(trajs, tok.pad_id)


def test_rl_update(tiny, tok):
    import copy
    batch = _batch(tok)
    cfg = m.RLConfig(group_size=2)
    model = copy.deepcopy(tiny)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    stats = m.rl_update(model, opt, batch, torch.zeros(4), cfg)      # zero advantages: no change
    assert set(stats) == set(m.UPDATE_KEYS) and stats['loss'] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    stats = m.rl_update(model, opt, batch, adv, m.RLConfig(group_size=2, epochs=2, minibatches=2),
                        generator=torch.Generator().manual_seed(0))
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert stats['entropy'] > 0 and stats['grad_norm'] > 0 and stats['approx_kl'] >= 0
    # the oracle's log-probs go up, the blind episodes' go down
    ref = copy.deepcopy(tiny)
    lp_new = m._policy_logp(model, batch['ids'], batch['action_mask'], 1.0)[0].sum(-1)
    lp_old = m._policy_logp(ref, batch['ids'], batch['action_mask'], 1.0)[0].sum(-1)
    assert bool((lp_new[adv > 0] > lp_old[adv > 0]).all()) and bool((lp_new[adv < 0] < lp_old[adv < 0]).all())
    stats = m.rl_update(model, opt, batch, adv, m.RLConfig(group_size=2, kl_coef=0.1), ref_model=ref)
    assert stats['kl'] > 0
    with pytest.raises(ValueError, match='ref_model'):
        m.rl_update(model, opt, batch, adv, m.RLConfig(group_size=2, kl_coef=0.1))
    with pytest.raises(ValueError, match='advantages'):
        m.rl_update(model, opt, batch, torch.zeros(3), cfg)
    with pytest.raises(ValueError, match='advantages'):           # token advantages need the token level
        m.rl_update(model, opt, batch, torch.zeros(4, batch['ids'].shape[1] - 1), m.RLConfig(group_size=2, level='sequence'))


def test_rl_update_token_advantages_equal_to_episode_ones(tiny, tok):
    "A [B, T-1] advantage that repeats each episode's value on every token is the [B] update, step for step."
    import copy
    batch = _batch(tok)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.25])
    per_token = adv[:, None].expand(-1, batch['action_mask'].shape[1]).clone()
    cfg = m.RLConfig(group_size=2, epochs=2, minibatches=2)
    models = [copy.deepcopy(tiny) for _ in range(2)]
    stats = []
    for model, a in zip(models, (adv, per_token)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        stats.append(m.rl_update(model, opt, batch, a, cfg, generator=torch.Generator().manual_seed(0)))
    assert stats[0] == stats[1]
    assert all(torch.equal(x, y) for x, y in zip(models[0].parameters(), models[1].parameters()))


def test_train_rl_smoke_is_deterministic(tok):
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3, eval_samples=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        model = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
        runs.append(m.train_rl(model, TRAIN, tok, cfg, 2, eval_tasks=HELDOUT[:2], eval_every=1,
                               env_factory=fixed_rewards([1, 0, 0, 0])))
    h = runs[0]
    assert len(h) == 2 and [r['step'] for r in h] == [0, 1]
    assert h[-1]['episodes'] == 8 and all(r['groups'] == 2 for r in h)
    for key in ('reward', 'pass_rate', 'kept_groups', 'clip_frac', 'approx_kl', 'entropy', 'eval_pass_rate'):
        assert all(key in r for r in h)
    assert 'final_eval_pass_rate' in h[-1]
    assert all(r['updated'] and r['kept_groups'] == 1 for r in h)
    nan_eq = lambda a, b: a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    assert all(nan_eq(r1[k], r2[k]) for r1, r2 in zip(*runs) for k in r1)
    with pytest.raises(ValueError, match='steps'):
        m.train_rl(model, TRAIN, tok, cfg, -1)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_a_lower_precision_agent_trains_in_its_own_dtype(tok, dtype):
    """The library follows the model's dtype: sampling, collate, advantages and the update all run,
    the weights stay in that dtype, and the trajectories keep their float64 log-probs."""
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3, eval_samples=1)
    torch.manual_seed(1)
    model = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, dtype=dtype)
    trajs = m.sample_groups(model, None, TRAIN[:2], tok, cfg, torch.Generator().manual_seed(0))
    assert all(t.sample_logp.dtype == torch.float64 for t in trajs)
    history = m.train_rl(model, TRAIN, tok, cfg, 2, env_factory=fixed_rewards([1, 0, 0, 0]))
    assert all(p.dtype == dtype for p in model.parameters())
    assert all(r['updated'] and math.isfinite(r['loss']) and math.isfinite(r['grad_norm']) for r in history)


def test_train_rl_step_without_update_says_so(tok, capsys):
    """All groups with equal rewards: no update, no statistics (never NaN), and the log says why."""
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3)
    torch.manual_seed(1)
    model = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    before = [p.detach().clone() for p in model.parameters()]
    snap_weights(before, cfg.weight_grid)              # train_rl starts by snapping; nothing else may move
    history = m.train_rl(model, TRAIN, tok, cfg, 2, log_every=1, env_factory=fixed_rewards([0, 0, 0, 0]))
    assert all(not r['updated'] and r['kept_groups'] == 0 and r['tokens'] == 0 for r in history)
    assert all(not set(m.UPDATE_KEYS) & set(r) for r in history)
    assert all(not (isinstance(v, float) and math.isnan(v)) for r in history for v in r.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    out = capsys.readouterr().out
    assert out.count('no update: all 2 groups had equal rewards') == 2 and 'nan' not in out


def test_policy_logp_by_length_equals_one_padded_pass(tiny, tok):
    """Grouping rows by length changes the cost, not the values or the gradients."""
    import copy
    trajs = [scripted_rollout(scripted_policy(kind, seed=s), m.EditBudgetEnv(), t, tok)
             for t in TRAIN[:6] for kind, s in (('oracle', 1), ('blind', 2), ('random', 3))]
    batch = collate(trajs, tok.pad_id)
    lengths = batch['attention_mask'].sum(-1)
    assert len(set(lengths.tolist())) > 3                               # really ragged
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    one, h1 = m._policy_logp(a, batch['ids'], batch['action_mask'], 0.7, with_entropy=True)
    chunked, h2 = m._policy_logp(b, batch['ids'], batch['action_mask'], 0.7, with_entropy=True, lengths=lengths)
    assert (one - chunked).abs().max().item() < 1e-12 and abs(h1 - h2) < 1e-12
    assert bool((chunked[batch['action_mask'] == 0] == 0).all())
    (one * torch.arange(one.shape[1])).sum().backward()
    (chunked * torch.arange(one.shape[1])).sum().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        assert (p.grad - q.grad).abs().max().item() < 1e-10


def test_train_rl_keeps_weights_on_the_grid(tok):
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3)
    torch.manual_seed(1)
    model = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    m.train_rl(model, TRAIN, tok, cfg, 2, env_factory=fixed_rewards([1, 0, 0, 0]))
    scaled = [p.detach() / cfg.weight_grid for p in model.parameters()]
    assert all(torch.equal(s, torch.round(s)) for s in scaled)
    free = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    m.train_rl(free, TRAIN, tok, m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3, weight_grid=None), 2,
               env_factory=fixed_rewards([1, 0, 0, 0]))
    assert not all(torch.equal(p / cfg.weight_grid, torch.round(p / cfg.weight_grid)) for p in free.parameters())
    with pytest.raises(ValueError, match='weight_grid'):
        m.RLConfig(weight_grid=-1.0)


from conftest import small_base  # noqa: E402


def test_make_grpo_agent_is_the_run_and_caches_it(tok, monkeypatch, tmp_path):
    monkeypatch.setattr(m, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    model, history = m.make_grpo_agent(tok, base_seed=1, seed=2, steps=1)
    ref = small_base(tok, seed=1)                       # the same run, written out by hand
    ref_history = m.train_rl(ref, TRAIN, tok, m.RLConfig(seed=2), 1, eval_tasks=HELDOUT, eval_every=25)
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert history == ref_history and same(model, ref) and not model.training
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 1
    monkeypatch.setattr(m, 'train_rl', lambda *a, **k: pytest.fail('trained instead of loading the cache'))
    again, again_history = m.make_grpo_agent(tok, base_seed=1, seed=2, steps=1)
    assert again_history == history and same(again, model)
    for bad in (dict(base_seed=-1), dict(seed=1.5), dict(steps=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            m.make_grpo_agent(tok, **bad)


# ---------------------------------------------------------------- Section 9.9: the side-by-side
def test_train_actor_critic_fits_the_critic_and_matches_gae_by_hand(tok, tiny):
    import copy
    from agentrl.advantages import make_critic
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3, drop_equal_groups=False, minibatches=1)
    model, critic = copy.deepcopy(tiny), make_critic(tiny)
    critic_before = copy.deepcopy(critic)
    history, out = m.train_actor_critic(model, TRAIN, tok, cfg, 2, critic=critic, lam=1.0,
                                        env_factory=fixed_rewards([1, 0, 0, 1]))
    assert out is critic and len(history) == 2 and all(r['updated'] for r in history)
    assert all(math.isfinite(r['value_loss']) and r['value_loss'] > 0 for r in history)
    # step 0: the critic predicts 0 everywhere, and a constant prediction explains nothing
    assert history[0]['explained_variance'] == pytest.approx(0.0, abs=1e-12)
    assert not all(torch.equal(a, b) for a, b in zip(critic.parameters(), critic_before.parameters()))
    scaled = [p.detach() / cfg.weight_grid for p in critic.parameters()]      # the critic is snapped too
    assert all(torch.equal(s, torch.round(s)) for s in scaled)
    for bad, match in ((dict(lam=1.5), 'lam'), (dict(value_clip=-1.0), 'value_clip'),
                       (dict(critic_lr=0.0), 'critic_lr'), (dict(critic='critic'), 'critic')):
        with pytest.raises((ValueError, TypeError), match=match):
            m.train_actor_critic(copy.deepcopy(tiny), TRAIN, tok, cfg, 1, **bad)


def test_train_actor_critic_first_value_loss_by_hand(tok, tiny):
    "With a zero critic, lam = 1 and one critic step, the value loss is 0.5 * token mean of reward^2."
    import copy
    cfg = m.RLConfig(group_size=2, tasks_per_step=2, max_turns=3, drop_equal_groups=False, minibatches=1)
    seen = []
    real_collate = m.collate

    def spy(trajs, pad_id):
        batch = real_collate(trajs, pad_id)
        seen.append(batch)
        return batch
    import unittest.mock
    with unittest.mock.patch.object(m, 'collate', spy):
        history, _ = m.train_actor_critic(copy.deepcopy(tiny), TRAIN, tok, cfg, 1, lam=1.0,
                                          env_factory=fixed_rewards([1, 0, 0, 1]))
    batch = seen[0]
    mask = batch['action_mask'].double()
    want = 0.5 * float((mask * batch['rewards'][:, None] ** 2).sum() / mask.sum())
    assert history[0]['value_loss'] == pytest.approx(want, abs=1e-12)


def test_make_method_agent_runs_each_method_and_shares_the_book_run(tok, monkeypatch, tmp_path):
    monkeypatch.setattr(m, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    book, book_history = m.make_grpo_agent(tok, base_seed=0, seed=1, steps=1)
    model, history, seconds = m.make_method_agent(tok, 'DAPO (book default)', base_seed=0, seed=1, steps=1)
    assert history == book_history and seconds > 0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), book.state_dict().values()))
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 1                   # one entry for both names
    _, ac_history, _ = m.make_method_agent(tok, 'PPO actor-critic', base_seed=0, seed=1, steps=1)
    assert 'value_loss' in ac_history[0] or not ac_history[0]['updated']
    ref = small_base(tok, 0)                                                # REINFORCE, written out by hand
    trainer, fields = m.METHODS['REINFORCE']
    ref_history = m.train_rl(ref, TRAIN, tok, m.RLConfig(seed=1, **fields), 1, eval_tasks=HELDOUT, eval_every=25)
    _, r_history, _ = m.make_method_agent(tok, 'REINFORCE', base_seed=0, seed=1, steps=1)
    assert r_history == ref_history
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 3
    with pytest.raises(ValueError, match='method'):
        m.make_method_agent(tok, 'TRPO')


def test_methods_table_is_what_section_9_8_says():
    f = {name: m.RLConfig(**fields) for name, (_, fields) in m.METHODS.items()}
    assert f['REINFORCE'].advantage == 'reward' and f['REINFORCE+baseline'].advantage == 'batch_mean'
    assert f['DAPO (book default)'] == m.RLConfig()
    assert (f['GSPO'].level, f['GSPO'].clip_low, f['GSPO'].clip_high) == ('sequence', 3e-4, 4e-4)
    assert f['GRPO'].kl_coef == 0.04 and f['GRPO'].loss_agg_mode == 'seq_mean_token_mean'
    assert f['RLOO'].minibatches == 1 and f['Dr. GRPO'].loss_agg_mode == 'seq_mean_token_sum_norm'
    assert m.METHODS['PPO actor-critic'][0] == 'train_actor_critic'
    assert not any(c.drop_equal_groups for n, c in f.items() if n not in ('DAPO (book default)', 'GSPO'))


def test_evaluate_by_body_is_a_loop_over_evaluate(tok, tiny):
    tasks = make_tasks('test')[:4]
    rates = m.evaluate_by_body(tiny, tasks, tok, n_samples=2, seed=3)
    variants = list(dict.fromkeys(t.variant for t in tasks))
    assert list(rates) == variants
    for k, v in enumerate(variants):
        eps = [t for t in tasks if t.variant == v for _ in range(2)]
        s = m.evaluate(tiny, eps, tok, generator=torch.Generator().manual_seed(3 + k))
        assert rates[v] == s['pass_rate']
    with pytest.raises(ValueError, match='n_samples'):
        m.evaluate_by_body(tiny, tasks, tok, n_samples=0)
    with pytest.raises(ValueError, match='tasks'):
        m.evaluate_by_body(tiny, [], tok)


def test_cache_key_follows_code_not_prose(tmp_path, monkeypatch):
    import importlib
    src = 'def f(x):\n    """Doubles x."""\n    return 2 * x  # twice\n'
    variants = {'a': src, 'b': src.replace('Doubles x.', 'Returns twice x; see Section 9.6.').replace('# twice', '# 2x'),
                'c': src.replace('2 * x', '3 * x')}
    monkeypatch.syspath_prepend(str(tmp_path))
    code = {}
    for name, text in variants.items():
        (tmp_path / f'mod_{name}.py').write_text(text)
        code[name] = m._code_only(importlib.import_module(f'mod_{name}'))
    assert code['a'] == code['b'] != code['c']
    assert 'Doubles' not in code['a'] and 'twice' not in code['a']
