"""Tests for agentrl.sft (Chapter 15). Expected values come from closed forms (ln V for a model whose logits
are all zero, ln 2 and log(1 + e^-z) for DPO), brute-force loops over positions, Chapter 6's behaviour-cloning
loop run on the same demonstrations, and Chapter 9's evaluate run with the same settings."""
import copy
import inspect
import math
import pathlib
import random
import sys

import pytest
import torch

import agentrl as arl
import agentrl.sft as m
from agentrl.gym import make_tasks, scripted_policy
from agentrl.grpo import RLConfig, evaluate, make_env, randomize_names
from agentrl.policies import TinyAgent
from agentrl.policy_gradient import _behaviour_clone, reinforce_loss
from agentrl.trajectories import collate, scripted_rollout

torch.set_num_threads(1)
TRAIN, HELDOUT = make_tasks('train'), make_tasks('heldout')
INDEX = ('sft_loss', 'sft_train', 'pass_rate', 'action_entropy', 'dpo_loss')


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.fixture(scope='module')
def demos(tok):
    "Oracle and blind episodes on renamed train tasks (lengths differ, so batches pad)."
    rng = random.Random(0)
    out = []
    for kind in ('oracle', 'blind'):
        policy = scripted_policy(kind, seed=1)
        out += [scripted_rollout(policy, make_env(RLConfig()), randomize_names(t, rng), tok)
                for t in TRAIN[:6]]
    return out


def test_index_names_reachable_with_their_signatures():
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    sig = lambda f: str(inspect.signature(f))
    assert sig(m.sft_loss) == '(model, batch)'
    assert sig(m.sft_train) == ('(model, trajs, tok, steps=100, lr=0.003, batch_size=32, seed=0, hook=None, '
                                'every=10)')
    assert sig(m.pass_rate) == "(model, tasks, tok, n_samples=4, temperature=1.0, seed=0, reward='hidden')"
    assert sig(m.action_entropy) == '(model, batch)'
    assert sig(m.dpo_loss) == '(policy_logp_chosen, policy_logp_rejected, ref_chosen, ref_rejected, beta=0.1)'


# ---------------------------------------------------------------- sft_loss
def test_sft_loss_of_a_zero_model_is_ln_v(tok, demos):
    model = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()                                   # every logit 0: a uniform next-token distribution
    loss = m.sft_loss(model, collate(demos, tok.pad_id))
    assert loss.item() == pytest.approx(math.log(len(tok)), abs=1e-12)


def test_sft_loss_matches_a_loop_over_policy_positions(tiny, tok, demos):
    batch = collate(demos, tok.pad_id)
    total, count = 0.0, 0
    for b, traj in enumerate(demos):
        with torch.no_grad():
            logp = torch.log_softmax(tiny(traj.ids[None])[0], -1)          # the episode alone, unpadded
        for t in range(len(traj) - 1):
            if traj.action_mask[t] == 1:
                total -= float(logp[t, traj.ids[t + 1]])
                count += 1
    assert count == int(batch['action_mask'].sum())
    assert m.sft_loss(tiny, batch).item() == pytest.approx(total / count, abs=1e-12)


def test_sft_loss_gradient_on_successes_is_reinforce_with_the_reward(tiny, tok, demos):
    "Filtering to reward-1 episodes and imitating them is REINFORCE with A = r, rescaled (Section 15.3)."
    batch = collate(demos, tok.pad_id)
    keep = batch['rewards'] == 1.0
    assert 0 < int(keep.sum()) < len(demos)
    kept = collate([t for t, k in zip(demos, keep.tolist()) if k], tok.pad_id)
    g_sft = torch.autograd.grad(m.sft_loss(tiny, kept), list(tiny.parameters()))
    logp = arl.sequence_log_probs(tiny, batch['ids'])
    g_pg = torch.autograd.grad(reinforce_loss(logp, batch['rewards'], batch['action_mask']),
                               list(tiny.parameters()))
    scale = float(batch['action_mask'].sum() / kept['action_mask'].sum())      # all tokens / kept tokens
    for a, b in zip(g_sft, g_pg):
        assert torch.allclose(a, scale * b, atol=1e-12, rtol=0)


def test_sft_loss_rejects_bad_input(tiny, tok, demos):
    batch = collate(demos[:2], tok.pad_id)
    with pytest.raises(TypeError, match='model'):
        m.sft_loss(lambda ids: ids, batch)
    with pytest.raises(TypeError, match='batch'):
        m.sft_loss(tiny, [batch])
    with pytest.raises(ValueError, match='action_mask'):
        m.sft_loss(tiny, {'ids': batch['ids']})
    with pytest.raises(ValueError, match=r'\[B, T-1\]'):
        m.sft_loss(tiny, dict(batch, action_mask=batch['action_mask'][:, 1:]))
    with pytest.raises(ValueError, match='0.0 and 1.0'):
        m.sft_loss(tiny, dict(batch, action_mask=batch['action_mask'] * 0.5))
    with pytest.raises(ValueError, match='no policy token'):
        m.sft_loss(tiny, dict(batch, action_mask=torch.zeros_like(batch['action_mask'])))
    with pytest.raises(ValueError, match='ids'):
        m.sft_loss(tiny, dict(batch, ids=batch['ids'].double()))


# ---------------------------------------------------------------- sft_train
def test_sft_train_is_make_base_agents_cloning_loop(tiny, tok):
    "Same demonstrations, seed, steps, batch size and lr: the weights of Chapter 6's loop, bit for bit."
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    import agentrl.policy_gradient as pg
    real = pg.make_tasks
    pg.make_tasks = lambda split='train', seed=0: real(split, seed)[:10]     # a small train split
    try:
        _behaviour_clone(a, tok, 4, ('oracle', 'blind'), 2, 7, 8, 0.003)
    finally:
        pg.make_tasks = real
    trajs = []
    for kind in ('oracle', 'blind'):
        policy, env = scripted_policy(kind, seed=4), arl.BugFixEnv()
        for _ in range(2):
            trajs.extend(scripted_rollout(policy, env, t, tok) for t in TRAIN[:10])
    losses = m.sft_train(b, trajs, tok, steps=7, lr=0.003, batch_size=8, seed=4)
    assert len(losses) == 7 and all(math.isfinite(x) for x in losses)
    assert same(a, b)


def test_sft_train_lowers_the_loss_and_calls_the_hook(tiny, tok, demos):
    model = copy.deepcopy(tiny).eval()
    before = m.sft_loss(model, collate(demos, tok.pad_id)).item()
    calls = []
    losses = m.sft_train(model, demos, tok, steps=25, lr=0.01, batch_size=4, seed=1, hook=calls.append,
                         every=10)
    assert calls == [10, 20]
    assert len(losses) == 25
    after = m.sft_loss(model, collate(demos, tok.pad_id)).item()
    assert after < 0.5 * before
    assert not model.training                                      # back in the mode it had
    m.sft_train(model.train(), demos, tok, steps=1)
    assert model.training


def test_sft_train_is_seeded_and_zero_steps_change_nothing(tiny, tok, demos):
    runs = []
    for seed in (2, 2, 3):
        model = copy.deepcopy(tiny)
        m.sft_train(model, demos, tok, steps=3, batch_size=4, seed=seed)
        runs.append(model)
    assert same(runs[0], runs[1]) and not same(runs[0], runs[2])
    model = copy.deepcopy(tiny)
    assert m.sft_train(model, demos, tok, steps=0) == []
    assert same(model, tiny)


def test_sft_train_rejects_bad_arguments(tiny, tok, demos):
    for kw, err, match in ((dict(steps=-1), ValueError, 'steps'), (dict(lr=0.0), ValueError, 'lr'),
                           (dict(batch_size=0), ValueError, 'batch_size'),
                           (dict(every=0), ValueError, 'every'),
                           (dict(hook=3), TypeError, 'hook'), (dict(seed=1.5), ValueError, 'seed')):
        with pytest.raises(err, match=match):
            m.sft_train(copy.deepcopy(tiny), demos, tok, **kw)
    with pytest.raises(ValueError, match='trajs'):
        m.sft_train(tiny, [], tok)
    with pytest.raises(TypeError, match='trajs'):
        m.sft_train(tiny, [demos[0].ids], tok)
    with pytest.raises(TypeError, match='tok'):
        m.sft_train(tiny, demos, None)


# ---------------------------------------------------------------- pass_rate
@pytest.mark.parametrize('reward', ['hidden', 'public'])
def test_pass_rate_agrees_with_evaluate(tiny, tok, reward):
    tasks = HELDOUT[:5]
    rate, trajs = m.pass_rate(tiny, tasks, tok, n_samples=3, temperature=1.3, seed=11, reward=reward)
    stats = evaluate(tiny, tasks, tok, n_samples=3, temperature=1.3,
                     generator=torch.Generator().manual_seed(11), cfg=RLConfig(reward=reward))
    assert rate == stats['reward']
    assert len(trajs) == 15 and rate == sum(t.reward for t in trajs) / 15
    if reward == 'hidden':
        assert rate == stats['pass_rate']
    # episodes 3i .. 3i+2 play task i, all three under one new name
    for i, task in enumerate(tasks):
        names = {t.info['task'] for t in trajs[3 * i:3 * i + 3]}
        assert len(names) == 1


def test_pass_rate_of_a_trained_style_policy_by_hand(tok):
    "A model is not needed for the bookkeeping: the oracle's episodes all pass, the blind ones rarely."
    fresh = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    rate, trajs = m.pass_rate(fresh, TRAIN[:2], tok, n_samples=2, seed=0)
    assert rate == sum(t.info['submitted'] and t.info['hidden_pass'] for t in trajs) / 4


def test_pass_rate_rejects_bad_arguments(tiny, tok):
    with pytest.raises(ValueError, match='reward'):
        m.pass_rate(tiny, HELDOUT[:2], tok, reward='tests')
    with pytest.raises(ValueError, match='n_samples'):
        m.pass_rate(tiny, HELDOUT[:2], tok, n_samples=0)
    with pytest.raises(ValueError, match='tasks'):
        m.pass_rate(tiny, [], tok)
    with pytest.raises(ValueError, match='seed'):
        m.pass_rate(tiny, HELDOUT[:2], tok, seed='0')


# ---------------------------------------------------------------- action_entropy
def test_action_entropy_matches_a_loop_and_ln_v(tiny, tok, demos):
    batch = collate(demos, tok.pad_id)
    values = []
    with torch.no_grad():
        for traj in demos:
            logp = torch.log_softmax(tiny(traj.ids[None])[0], -1)           # [T, V]
            ent = -(logp.exp() * logp).sum(-1)                              # [T]
            values += [float(ent[t]) for t in range(len(traj) - 1) if traj.action_mask[t] == 1]
    got = m.action_entropy(tiny, batch)
    assert isinstance(got, float)
    assert got == pytest.approx(sum(values) / len(values), abs=1e-12)
    zero = TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    with torch.no_grad():
        for p in zero.parameters():
            p.zero_()
    assert m.action_entropy(zero, batch) == pytest.approx(math.log(len(tok)), abs=1e-12)
    with pytest.raises(ValueError, match='no policy token'):
        m.action_entropy(tiny, dict(batch, action_mask=torch.zeros_like(batch['action_mask'])))


# ---------------------------------------------------------------- dpo_loss
def test_dpo_loss_hand_values():
    t = lambda *v: torch.tensor(v, dtype=torch.float64)
    # an identical pair: margin 0, loss ln 2
    assert float(m.dpo_loss(t(-3.0), t(-3.0), t(-2.0), t(-2.0))) == pytest.approx(math.log(2), abs=1e-15)
    # margins 2 and -4 at beta 0.5: mean of log(1 + e^-1) and log(1 + e^2)
    got = m.dpo_loss(t(-1.0, -6.0), t(-4.0, -3.0), t(-2.0, -5.0), t(-3.0, -6.0), beta=0.5)
    # pair 1: (-1 + 2) - (-4 + 3) = 2; pair 2: (-6 + 5) - (-3 + 6) = -4
    want = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(2.0))) / 2
    assert float(got) == pytest.approx(want, abs=1e-14)


def test_dpo_loss_gradients_by_hand():
    beta, B = 0.1, 2
    pc = torch.tensor([-2.0, -5.0], requires_grad=True)
    pr = torch.tensor([-3.0, -1.0], requires_grad=True)
    rc = torch.tensor([-2.5, -4.0], requires_grad=True)
    rr = torch.tensor([-2.0, -2.0], requires_grad=True)
    m.dpo_loss(pc, pr, rc, rr, beta=beta).backward()
    margins = [(-2.0 + 2.5) - (-3.0 + 2.0), (-5.0 + 4.0) - (-1.0 + 2.0)]            # 1.5 and -2
    want = [-beta / (1 + math.exp(beta * z)) / B for z in margins]     # d/d pc = -beta sigma(-beta z) / B
    assert pc.grad.tolist() == pytest.approx(want, abs=1e-15)
    assert pr.grad.tolist() == pytest.approx([-w for w in want], abs=1e-15)
    assert rc.grad is None and rr.grad is None                                      # constants: no gradient


def test_dpo_loss_identical_pair_has_no_net_gradient():
    "Equal values in separate tensors: ln 2, and equal and opposite pushes of beta / (2B) on the two sides."
    beta, B = 0.1, 2
    pc = torch.tensor([-4.0, -7.5], requires_grad=True)
    pr = torch.tensor([-4.0, -7.5], requires_grad=True)                  # the same values, another tensor
    ref = torch.tensor([-3.0, -9.0])
    loss = m.dpo_loss(pc, pr, ref, ref.clone(), beta=beta)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2), abs=1e-15)
    assert pc.grad.tolist() == pytest.approx([-beta / (2 * B)] * B, abs=1e-15)    # sigma(0) = 1/2
    assert pr.grad.tolist() == pytest.approx([beta / (2 * B)] * B, abs=1e-15)
    assert (pc.grad + pr.grad).abs().max() == 0.0                                 # no net preference


def test_dpo_loss_one_episode_as_both_members_moves_no_weight(tiny, tok, demos):
    "Model level: the same episode scored twice through the model gives ln 2 and a zero parameter gradient."
    model = copy.deepcopy(tiny)
    ep = demos[:2]
    logp = m._summed_logp(model, ep + ep, tok)                               # [4]: the two episodes twice
    with torch.no_grad():
        ref = m._summed_logp(tiny, ep, tok) - 1.5                            # any constant reference
    loss = m.dpo_loss(logp[:2], logp[2:], ref, ref.clone())
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-15)
    assert max(g.abs().max().item() for g in grads) < 1e-15


def test_dpo_loss_treats_a_reference_with_a_graph_as_constant():
    "Reference terms computed from the policy's own graph still get no gradient: the loss detaches them."
    beta, B = 0.5, 2
    pc = torch.tensor([-2.0, -5.0], requires_grad=True)
    pr = torch.tensor([-3.0, -1.0], requires_grad=True)
    loss = m.dpo_loss(pc, pr, pc * 1.0, pr * 1.0, beta=beta)                 # reference = policy, with a graph
    loss.backward()
    # margins are 0, so each chosen gets -beta sigma(0) / B; not detached, every gradient would be 0
    assert pc.grad.tolist() == pytest.approx([-beta / (2 * B)] * B, abs=1e-15)
    assert pr.grad.tolist() == pytest.approx([beta / (2 * B)] * B, abs=1e-15)


def test_dpo_loss_keeps_float32_and_stays_finite_there():
    "float32 in, float32 out; a margin of -1000 at beta 0.1 (z = -100) where log(sigmoid) already fails."
    pc = torch.tensor([-1000.0, 3.0], dtype=torch.float32, requires_grad=True)
    zero = torch.zeros(2, dtype=torch.float32)
    loss = m.dpo_loss(pc, zero, zero, zero, beta=0.1)
    loss.backward()
    assert loss.dtype == torch.float32 and pc.grad.dtype == torch.float32
    want = ((100.0 + math.log1p(math.exp(-100.0))) + math.log1p(math.exp(-0.3))) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert torch.isfinite(pc.grad).all()
    assert math.isinf(float(torch.log(torch.sigmoid(torch.tensor(-110.0, dtype=torch.float32)))))


@pytest.mark.parametrize('beta', [0.1, 1.0])
def test_dpo_loss_is_finite_at_huge_margins(beta):
    for margin in (1000.0, -1000.0):
        pc = torch.tensor([margin], requires_grad=True)
        loss = m.dpo_loss(pc, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), beta=beta)
        loss.backward()
        z = beta * margin
        want = math.log1p(math.exp(-z)) if z > 0 else -z + math.log1p(math.exp(z))   # log(1 + e^-z), stably
        assert math.isfinite(loss.item()) and loss.item() == pytest.approx(want, rel=1e-15, abs=1e-300)
        sig = math.exp(-z) / (1 + math.exp(-z)) if z > 0 else 1 / (1 + math.exp(z))    # sigma(-z), stably
        assert math.isfinite(float(pc.grad))
        assert float(pc.grad) == pytest.approx(-beta * sig, rel=1e-12, abs=1e-300)
    # the naive log(sigmoid) is what fails there: sigmoid(-1000) underflows to 0 in float64
    assert math.isinf(float(torch.log(torch.sigmoid(torch.tensor(-1000.0)))))


def test_dpo_loss_rejects_bad_input():
    t = torch.tensor([-1.0, -2.0])
    with pytest.raises(TypeError, match='ref_chosen'):
        m.dpo_loss(t, t, [-1.0, -2.0], t)
    with pytest.raises(ValueError, match='policy_logp_rejected'):
        m.dpo_loss(t, torch.tensor([-1.0]), t, t)
    with pytest.raises(ValueError, match=r'\[B\]'):
        m.dpo_loss(t[None], t[None], t[None], t[None])
    with pytest.raises(ValueError, match='ref_rejected'):
        m.dpo_loss(t, t, t, torch.tensor([-1, -2]))
    with pytest.raises(ValueError, match='finite'):
        m.dpo_loss(torch.tensor([math.nan, 0.0]), t, t, t)
    for beta in (0.0, -0.1, math.inf, math.nan, True):
        with pytest.raises(ValueError, match='beta'):
            m.dpo_loss(t, t, t, t, beta=beta)


# ---------------------------------------------------------------- the cached runs
def test_make_sft_agent_rejects_bad_arguments(tok):
    for kw, match in ((dict(method='PPO'), 'method'), (dict(seed=-1), 'seed'),
                      (dict(base_seed=1.0), 'base_seed'), (dict(rounds=0), 'rounds'),
                      (dict(round_episodes=12), 'round_episodes')):
        with pytest.raises(ValueError, match=match):
            m.make_sft_agent(tok, **{'method': 'DPO', **kw})
    assert list(m.SFT_RUNS) == ['SFT (oracle)', 'rejection sampling', 'DPO']
    assert m.SFT_BUDGET == m.SFT_ROUNDS * m.SFT_ROUND_EPISODES == 50 * 64


def test_pairs_match_successes_and_failures_within_each_group(demos):
    wins = [t for t in demos if t.reward == 1.0]
    fails = [t for t in demos if t.reward != 1.0]
    group = [wins[0], fails[0], fails[1], wins[1]] + [fails[2]] * 4          # 2 wins, 6 failures
    pairs = m._pairs(group + [wins[2]] * 8, 8)                             # second group: all wins, no pair
    assert pairs == [(wins[0], fails[0]), (wins[1], fails[1])]


def test_dpo_round_starts_at_ln2_and_raises_the_margin(tiny, tok, demos):
    wins = [t for t in demos if t.reward == 1.0]
    fails = [t for t in demos if t.reward != 1.0]
    pairs = list(zip(wins, fails))
    model, ref = copy.deepcopy(tiny), copy.deepcopy(tiny).eval()
    assert m._pair_loss(model, ref, pairs, tok, 0.5) == pytest.approx(math.log(2), abs=1e-12)   # policy = ref
    stats = m._dpo_round(model, ref, pairs, tok, steps=6, lr=0.01, beta=0.5, pairs_per_step=3,
                         gen=torch.Generator().manual_seed(0))
    assert stats['chosen_shift'] - stats['rejected_shift'] > 0               # the margin grew
    assert m._pair_loss(model, ref, pairs, tok, 0.5) < math.log(2)           # so the loss fell
    assert same(ref, tiny)                                                   # the reference never moves


from conftest import recompiled, reworded, small_base  # noqa: E402


def test_make_sft_agent_runs_rounds_validates_like_train_rl_and_caches(tok, monkeypatch, tmp_path):
    import agentrl.grpo as grpo
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    model, history, seconds = m.make_sft_agent(tok, 'SFT (oracle)', seed=1, rounds=2, round_episodes=16)
    assert seconds > 0 and [r['episodes'] for r in history] == [0, 16, 32]
    assert [r['kept'] for r in history[1:]] == [16, 16] and all(r['pass_rate'] == 1.0 for r in history[1:])
    # round 0 is the starting model measured exactly as train_rl measures its step 0
    ref_history = grpo.train_rl(small_base(tok, 0), make_tasks('train'), tok, RLConfig(seed=1), 1,
                                eval_tasks=HELDOUT, eval_every=25)
    assert history[0]['eval_pass_rate'] == ref_history[0]['eval_pass_rate']
    assert not same(model, small_base(tok, 0))
    rs, rs_history, _ = m.make_sft_agent(tok, 'rejection sampling', seed=1, rounds=1, round_episodes=16)
    kept = rs_history[1]['kept']
    assert kept == round(16 * rs_history[1]['pass_rate'])                    # reward 1 = hidden pass
    assert same(rs, small_base(tok, 0)) == (kept == 0)                        # nothing kept, nothing learned
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 2                      # one file per run
    monkeypatch.setattr(m, 'evaluate',                                      # a run's first step, not hashed
                        lambda *a, **k: pytest.fail('trained instead of loading the cache'))
    again, again_history, _ = m.make_sft_agent(tok, 'SFT (oracle)', seed=1, rounds=2, round_episodes=16)
    assert again_history == history and same(again, model)


@pytest.mark.parametrize('data', ['reference', 'policy'])
def test_train_rounds_dpo_samples_from_the_right_model_and_pools_pairs(tiny, tok, demos, monkeypatch, data):
    wins = [t for t in demos if t.reward == 1.0]
    fails = [t for t in demos if t.reward != 1.0]
    episodes = wins[:3] + fails[:5] + wins[3:4] + fails[5:6] + [wins[4]] * 6       # 3 + 1 pairs in two groups
    seen = []

    def fake_round(model, tasks, tok, cfg, n, gen):
        seen.append(copy.deepcopy(model.state_dict()))
        return episodes
    monkeypatch.setattr(m, '_policy_round', fake_round)
    model = copy.deepcopy(tiny).eval()
    start = copy.deepcopy(model)
    history = m._train_rounds(model, TRAIN, tok, RLConfig(seed=0), 2, 16, HELDOUT[:2], data=data,
                              update='dpo', steps=3, lr=0.01, beta=0.5, pairs_per_step=2)
    assert [r['pairs'] for r in history[1:]] == [4, 4]
    assert history[1]['loss_before'] == pytest.approx(math.log(2), abs=1e-12)    # round 1: policy = reference
    assert history[2]['loss_before'] < math.log(2)                         # the same pairs, now learned
    first_is_start = all(torch.equal(seen[0][k], v) for k, v in start.state_dict().items())
    second_is_start = all(torch.equal(seen[1][k], v) for k, v in start.state_dict().items())
    assert first_is_start and second_is_start == (data == 'reference')              # who played round 2
    assert not same(model, start)


# ---------------------------------------------------------------- helpers of the runs
def test_length_batches_cover_every_item_once_per_pass():
    lengths = [5, 3, 9, 3, 7, 1, 8, 2, 6, 4]                                 # 10 items, batches of 4: 3 per pass
    batches = m._length_batches(lengths, 6, 4, torch.Generator().manual_seed(0))
    assert len(batches) == 6
    for first in (0, 3):                                                     # each pass is a partition
        seen = sorted(i for b in batches[first:first + 3] for i in b)
        assert seen == list(range(10))
        sizes = sorted(len(b) for b in batches[first:first + 3])
        assert sizes == [2, 4, 4]
    for b in batches:                                                        # a batch is a run of the length order
        others = [lengths[i] for i in range(10) if i not in b]
        lo, hi = min(lengths[i] for i in b), max(lengths[i] for i in b)
        assert sum(lo < x < hi for x in others) == 0


def test_oracle_round_plays_random_passes_under_fresh_names(tok):
    gen = torch.Generator().manual_seed(3)
    eps = m._oracle_round(TRAIN[:5], tok, RLConfig(), 12, gen)
    assert len(eps) == 12 and all(t.reward == 1.0 for t in eps)              # the oracle always passes
    bodies = [t.info['task'] for t in eps]
    assert len(set(bodies[:5])) == 5 and len(set(bodies[5:10])) == 5          # passes over the split
    original = {t.name: t.fn_name for t in TRAIN[:5]}
    assert all(t.info['fn_name'] != original[t.info['task']] for t in eps)    # every episode renamed
    assert len({t.info['fn_name'] for t in eps}) > 1                         # and not all alike


def test_rejection_sampling_trains_on_this_rounds_passes_only(tiny, tok, demos, monkeypatch):
    wins = [t for t in demos if t.reward == 1.0]
    fails = [t for t in demos if t.reward != 1.0]
    rounds = [wins[:2] + fails[:4], wins[2:5] + fails[:4]]                   # round 1: 2 passes, round 2: 3
    assert len(fails) >= 4
    calls, trained = iter(rounds), []
    monkeypatch.setattr(m, '_policy_round', lambda model, tasks, tok, cfg, n, gen: next(calls))
    monkeypatch.setattr(m, 'sft_train', lambda model, trajs, tok, **kw: trained.append(list(trajs)) or [0.5])
    history = m._train_rounds(copy.deepcopy(tiny), TRAIN, tok, RLConfig(seed=0), 2, 8, HELDOUT[:2],
                              data='policy', update='sft', steps=3, lr=0.01)
    assert trained == [wins[:2], wins[2:5]]                                  # never an earlier round's
    assert [r['kept'] for r in history[1:]] == [2, 3]
    assert [r['pass_rate'] for r in history[1:]] == [2 / 6, 3 / 7]


def test_action_entropy_ignores_the_token_at_a_last_policy_position(tiny, tok, demos):
    "The entropy at position t depends on ids[:t+1]; changing a target after which nothing is scored changes nothing."
    batch = collate(demos, tok.pad_id)
    mask = batch['action_mask']
    last = torch.tensor([int(row.nonzero().max()) for row in mask])          # last policy position per row
    only_last = torch.zeros_like(mask)
    only_last[torch.arange(len(mask)), last] = 1.0
    ids = batch['ids'].clone()
    ids[torch.arange(len(ids)), last + 1] = (ids[torch.arange(len(ids)), last + 1] + 1) % len(tok)
    a = m.action_entropy(tiny, dict(batch, action_mask=only_last))
    b = m.action_entropy(tiny, dict(batch, ids=ids, action_mask=only_last))
    assert a == b


def test_make_sft_agent_lr_override_names_its_own_run(tok, monkeypatch, tmp_path):
    import agentrl.grpo as grpo
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    model, _, _ = m.make_sft_agent(tok, 'SFT (oracle)', rounds=1, round_episodes=8)
    slow, _, _ = m.make_sft_agent(tok, 'SFT (oracle)', rounds=1, round_episodes=8, lr=0.001)
    assert len(list(tmp_path.glob('rl_run-*.pt'))) == 2 and not same(model, slow)
    monkeypatch.setattr(m, 'evaluate', lambda *a, **k: pytest.fail('trained instead of loading'))
    again, _, _ = m.make_sft_agent(tok, 'SFT (oracle)', rounds=1, round_episodes=8, lr=0.003)   # the default
    assert same(again, model)
    for lr in (0.0, 1.5, math.nan, '0.1'):
        with pytest.raises(ValueError, match='lr'):
            m.make_sft_agent(tok, 'DPO', lr=lr)
    assert set(m.SFT_CONTROL_LR) == set(m.SFT_RUNS)
    assert all(m.SFT_CONTROL_LR[k] != m.SFT_RUNS[k]['lr'] for k in m.SFT_RUNS)


def test_sft_cache_key_covers_every_function_a_run_executes(tok, demos, monkeypatch, tmp_path):
    """make_sft_agent's code hash (_sft_code) changes with the code of every library function that a run of
    any method executes outside the modules _rl_code hashes (found by tracing real runs, not read from the
    list _sft_code holds), and not with a docstring or comment, nor with code that no run executes."""
    import agentrl.grpo as grpo
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    in_rl_code = {f'{name}.py' for name in ('advantages', 'ppo', 'grpo', 'policies', 'gym', 'trajectories',
                                            'policy_gradient')}
    executed = {}                                              # name -> file of each top-level function run

    def watch(frame, event, arg):
        code = frame.f_code
        path = pathlib.Path(code.co_filename)
        if (event == 'call' and path.parent.name == 'agentrl' and path.name not in in_rl_code
                and '<' not in code.co_qualname):             # closures and lambdas are their parent's source
            executed[code.co_name] = path.name
    wins = [t for t in demos if t.reward == 1.0]
    fails = [t for t in demos if t.reward != 1.0]
    sample_groups = m.sample_groups

    def with_pairs(*args):                                     # the untrained base rarely passes: give DPO
        played = sample_groups(*args)                          # pairs, after the real sampling
        return wins[:4] + fails[:4] + played[8:]

    sys.setprofile(watch)
    try:
        for method, fields in m.SFT_RUNS.items():
            with monkeypatch.context() as patch:
                if fields['update'] == 'dpo':
                    patch.setattr(m, 'sample_groups', with_pairs)
                m.make_sft_agent(tok, method, seed=0, rounds=1, round_episodes=16)
    finally:
        sys.setprofile(None)
    assert {'make_sft_agent', '_train_rounds', 'sft_train', '_dpo_round', 'dpo_loss', '_oracle_round',
            '_check_trajs'} <= set(executed)                   # the trace saw all three kinds of run
    assert 'pass_rate' not in executed
    code = m._sft_code                                          # the original, called after each patch below
    with_pass = lambda src: src.rstrip() + '\n    pass\n'        # one more statement: other code, same names
    base = code()
    for name, file in sorted(executed.items()):
        fn = getattr(m, name)                                   # sft calls it by this name
        monkeypatch.setattr(m, name, recompiled(fn, tmp_path / f'{name}.py', with_pass))
        assert code() != base, f'{name} ({file}) is executed by a run but not in its key'
        monkeypatch.undo()
    assert code() == base
    monkeypatch.setattr(m, '_length_batches', recompiled(m._length_batches, tmp_path / 'reworded.py', reworded))
    assert code() == base                                       # prose and comments are not code
    monkeypatch.setattr(m, 'pass_rate', recompiled(m.pass_rate, tmp_path / 'pass_rate.py', with_pass))
    assert code() == base                                       # code no run executes
