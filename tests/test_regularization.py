"""Tests for agentrl.regularization (Chapter 10). Expected values come from hand formulas, plain loops
and autograd of the exact KL and entropy on small vocabularies; training runs are tiny and seeded."""
import copy
import dataclasses
import math

import pytest
import torch

import agentrl as arl
import agentrl.regularization as m
from agentrl.grpo import RLConfig, compute_advantages, kl_penalty, rl_update, sample_groups, train_rl
from agentrl.gym import make_tasks
from agentrl.policies import sequence_log_probs
from agentrl.trajectories import collate

torch.set_num_threads(1)
TRAIN = make_tasks('train')
INDEX = ('kl_estimate', 'entropy_bonus', 'regularized_update', 'sequence_kl', 'train_regularized')



@pytest.fixture(scope='module')
def batch(tiny, tok):
    "64 episodes of the tiny policy on 8 train tasks (groups of 8), collated."
    return collate(sample_groups(tiny, None, TRAIN[:8], tok, RLConfig(), torch.Generator().manual_seed(0)), tok.pad_id)


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_index_names_reachable_with_their_signatures():
    import inspect
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    sig = lambda f: str(inspect.signature(f))
    assert sig(m.kl_estimate) == "(logp, ref_logp, kind='k3')"
    assert sig(m.entropy_bonus) == '(logits, mask)'
    assert sig(m.regularized_update) == ('(model, optimizer, batch, advantages, cfg, ref_model=None, generator=None, '
                                         'entropy_coef=0.0)')
    assert sig(m.sequence_kl) == '(batch, ref_model, temperature=1.0)'
    assert sig(m.train_regularized) == ('(model, tasks, tok, cfg, steps, entropy_coef=0.0, kl_in_reward=False, '
                                        'ref_model=None)')


# ---------------------------------------------------------------- kl_estimate
def test_kl_estimate_values_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -0.5, -0.5]])
    d = [-0.5, 1.5, 0.0]
    want = {'k1': [-x for x in d], 'k2': [x * x / 2 for x in d], 'k3': [math.exp(x) - 1 - x for x in d]}
    want['k1+'], want['k3+'] = want['k1'], want['k3']
    for kind in m.KL_ESTIMATORS:
        assert m.kl_estimate(logp, ref, kind)[0].tolist() == pytest.approx(want[kind], abs=1e-15)


def test_kl_estimate_gradients_by_hand():
    d = torch.tensor([-2.0, -0.3, 0.0, 0.7, 3.0])
    for kind, want in (('k1', torch.ones(5)), ('k2', -d), ('k3', 1 - d.exp()), ('k1+', -d), ('k3+', -d)):
        logp = torch.full((5,), -4.0, requires_grad=True)
        m.kl_estimate(logp, (logp + d).detach(), kind).sum().backward()
        assert torch.allclose(logp.grad, want, atol=1e-14, rtol=0), kind


def _exact_expected_gradient(kind, z_pol, lp_ref):
    "E over v ~ pi of grad kind(v) w.r.t. the policy logits, summed exactly over the vocabulary."
    z = z_pol.clone().requires_grad_(True)
    p = z_pol.softmax(-1)                                     # sampling weights: constants
    (p * m.kl_estimate(z.log_softmax(-1), lp_ref, kind)).sum().backward()
    return z.grad


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_expected_gradients_match_autograd_of_exact_kls(seed):
    g = torch.Generator().manual_seed(seed)
    z_pol, z_ref = torch.randn(7, generator=g), torch.randn(7, generator=g)
    lp_ref = z_ref.log_softmax(-1)

    def grad_of(f):
        z = z_pol.clone().requires_grad_(True)
        f(z).backward()
        return z.grad
    rev = grad_of(lambda z: (z.softmax(-1) * (z.log_softmax(-1) - lp_ref)).sum())      # KL(pi || ref)
    fwd = grad_of(lambda z: (lp_ref.exp() * (lp_ref - z.log_softmax(-1))).sum())      # KL(ref || pi)
    want = {'k1': torch.zeros(7), 'k2': rev, 'k3': fwd, 'k1+': rev, 'k3+': rev}
    for kind, target in want.items():
        assert (_exact_expected_gradient(kind, z_pol, lp_ref) - target).abs().max() < 1e-12, kind
    # and the unbiased kinds' values average to the exact KL (exact expectation, no sampling)
    p, lp = z_pol.softmax(-1), z_pol.log_softmax(-1)
    exact = float((p * (lp - lp_ref)).sum())
    for kind in ('k1', 'k3', 'k1+', 'k3+'):
        assert float((p * m.kl_estimate(lp, lp_ref, kind)).sum()) == pytest.approx(exact, abs=1e-12)


def test_reward_placement_is_the_episode_kl_gradient_and_loss_placement_misses_visitation():
    "Two-token episodes: sum_t k1 as a reward (score function) = grad of the episode KL; k2 in the loss is not."
    g = torch.Generator().manual_seed(3)
    z1_0, z2_0 = torch.randn(3, generator=g), torch.randn(3, 3, generator=g)
    ref1, ref2 = torch.randn(3, generator=g).log_softmax(-1), torch.randn(3, 3, generator=g).log_softmax(-1)
    ref_pair = ref1[:, None] + ref2
    pair = lambda z1, z2: z1.log_softmax(-1)[:, None] + z2.log_softmax(-1)
    w = pair(z1_0, z2_0).exp()
    # independent: loop over the 9 episodes for the exact episode KL
    def kl_loop(z1, z2):
        total = 0.0
        for a in range(3):
            for b in range(3):
                lp = z1.log_softmax(-1)[a] + z2[a].log_softmax(-1)[b]
                total = total + lp.exp() * (lp - ref_pair[a, b])
        return total

    def grads(f):
        z1, z2 = z1_0.clone().requires_grad_(True), z2_0.clone().requires_grad_(True)
        f(z1, z2).backward()
        return torch.cat([z1.grad, z2.grad.flatten()])
    true = grads(kl_loop)
    reward = grads(lambda z1, z2: (w * (pair(z1, z2) - ref_pair).detach() * pair(z1, z2)).sum())
    assert (reward - true).abs().max() < 1e-12

    def in_loss(z1, z2):
        l1, l2 = z1.log_softmax(-1)[:, None].expand(3, 3), z2.log_softmax(-1)
        return (w * (m.kl_estimate(l1, ref1[:, None].expand(3, 3), 'k2') + m.kl_estimate(l2, ref2, 'k2'))).sum()
    loss = grads(in_loss)
    assert (loss[3:] - true[3:]).abs().max() < 1e-12           # the last token: the same
    assert (loss[:3] - true[:3]).abs().max() > 1e-3            # the first token misses the visitation term


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_kl_estimate_extreme_log_ratios_are_finite(dtype):
    d = torch.tensor([-50.0, -20.0, 0.0, 20.0, 50.0], dtype=dtype)
    for kind in m.KL_ESTIMATORS:
        logp = torch.full((5,), -60.0, dtype=dtype, requires_grad=True)
        v = m.kl_estimate(logp, (logp + d).detach(), kind)
        v.sum().backward()
        assert torch.isfinite(v).all() and torch.isfinite(logp.grad).all(), (kind, dtype)
        if kind.startswith('k3') or kind == 'k2':
            assert (v >= 0).all()
    v = m.kl_estimate(torch.zeros(3, dtype=dtype), torch.tensor([0.0, 50.0, -50.0], dtype=dtype), 'k3')
    assert v[1].item() == pytest.approx(math.exp(50) - 51, rel=1e-5) and v[2].item() == pytest.approx(49.0, rel=1e-6)


def test_k3_never_negative_and_precise_near_zero():
    d = torch.linspace(-30, 30, 10001)
    k3 = m.kl_estimate(torch.zeros_like(d), d, 'k3')
    assert (k3 >= 0).all()
    small = torch.tensor([1e-9, -1e-9, 1e-6])
    got = m.kl_estimate(torch.zeros(3), small, 'k3')
    assert torch.allclose(got, small ** 2 / 2 + small ** 3 / 6, rtol=1e-6, atol=0)


def test_kl_estimate_agrees_with_kl_penalty_where_no_clamp_binds():
    g = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(4, 6, generator=g) * 3, -torch.rand(4, 6, generator=g) * 3
    for kind in ('k1', 'k2', 'k3'):
        assert (m.kl_estimate(logp, ref, kind) - kl_penalty(logp, ref, kind)).abs().max() < 1e-12


def test_kl_estimate_detaches_the_reference():
    ref = torch.tensor([-1.0, -2.0], requires_grad=True)
    logp = torch.tensor([-1.5, -1.0], requires_grad=True)
    m.kl_estimate(logp, ref, 'k3').sum().backward()
    assert ref.grad is None and logp.grad is not None


def test_kl_estimate_errors_name_the_argument():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match='logp'):
        m.kl_estimate([0.0], x)
    with pytest.raises(TypeError, match='ref_logp'):
        m.kl_estimate(x, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match='shape'):
        m.kl_estimate(x, torch.zeros(3, 2))
    with pytest.raises(ValueError, match='kind'):
        m.kl_estimate(x, x, 'k4')


# ---------------------------------------------------------------- entropy_bonus
def _loop_entropy(z, mask):
    total, n = 0.0, 0
    for idx in mask.nonzero().tolist():
        row = z[tuple(idx)]
        keep = [v for v in range(row.shape[0]) if bool(row[v] > -math.inf)]
        lse = torch.logsumexp(row[keep], 0)
        total = total - sum((row[v] - lse).exp() * (row[v] - lse) for v in keep)
        n += 1
    return total / max(n, 1)


def test_entropy_bonus_value_and_gradient_against_a_loop():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(3, 5, 7, generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.4).double()
    logits[0, 0, 3:] = -math.inf
    mask[0, 0] = 1.0
    z1, z2 = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    v, want = m.entropy_bonus(z1, mask), _loop_entropy(z2, mask)
    v.backward(); want.backward()
    assert abs(v.item() - want.item()) < 1e-12
    assert (z1.grad - z2.grad).abs().max() < 1e-12
    assert torch.isfinite(z1.grad).all()


def test_entropy_bonus_masks_before_the_softmax():
    logits = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
    logits[0, 1] = math.nan                               # garbage at a masked position
    logits[1, 0] = -math.inf                              # an all -inf row, masked
    logits[1, 2, 0] = math.inf                            # +inf, masked
    logits[0, 2, 1:] = -math.inf                          # a single finite token at a policy position
    z = logits.clone().requires_grad_(True)
    v = m.entropy_bonus(z, mask)
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(z.grad).all()
    assert (z.grad[mask == 0] == 0).all()
    assert abs(v.item() - _loop_entropy(logits, mask).item()) < 1e-12


def test_entropy_bonus_uniform_onehot_and_degenerate_masks():
    V = 5
    uniform = torch.zeros(1, 2, V)
    assert m.entropy_bonus(uniform, torch.ones(1, 2)).item() == pytest.approx(math.log(V), abs=1e-15)
    onehot = torch.full((1, 1, V), -math.inf)
    onehot[0, 0, 2] = 0.0
    assert m.entropy_bonus(onehot, torch.ones(1, 1)).item() == 0.0
    z = torch.full((2, 3, V), math.nan, requires_grad=True)
    v = m.entropy_bonus(z, torch.zeros(2, 3))                # no policy position at all
    v.backward()
    assert v.item() == 0.0 and (z.grad == 0).all()
    assert m.entropy_bonus(torch.zeros(2, 0, V), torch.zeros(2, 0)).item() == 0.0     # no positions
    bools = m.entropy_bonus(torch.randn(2, 3, V), torch.tensor([[True, False, True], [False, False, True]]))
    assert torch.isfinite(bools)


def test_entropy_bonus_float32():
    logits = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(4)).float()
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    v = m.entropy_bonus(logits, mask)
    assert v.dtype == torch.float32
    assert abs(v.item() - _loop_entropy(logits.double(), mask).item()) < 1e-5


def test_entropy_bonus_errors_name_the_argument():
    logits, mask = torch.zeros(2, 3, 4), torch.ones(2, 3)
    with pytest.raises(TypeError, match='logits'):
        m.entropy_bonus(torch.zeros(2, 3, 4, dtype=torch.long), mask)
    with pytest.raises(TypeError, match='mask'):
        m.entropy_bonus(logits, [[1, 1, 1]])
    with pytest.raises(ValueError, match='mask'):
        m.entropy_bonus(logits, torch.ones(2, 4))
    with pytest.raises(ValueError, match='mask'):
        m.entropy_bonus(logits, torch.full((2, 3), 2.0))
    bad = logits.clone()
    bad[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match='NaN'):
        m.entropy_bonus(bad, mask)
    bad = logits.clone()
    bad[1, 2] = -math.inf
    with pytest.raises(ValueError, match='all -inf'):
        m.entropy_bonus(bad, mask)


# ---------------------------------------------------------------- regularized_update
def _update(fn, model, batch, cfg, ref, **kw):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    adv = compute_advantages(batch, cfg)
    stats = fn(model, opt, batch, adv, cfg, ref_model=ref, generator=torch.Generator().manual_seed(0), **kw)
    return model, stats


def _moved(tiny, batch):
    "A copy of tiny after one update, so that it differs from its reference."
    return _update(rl_update, tiny, batch, RLConfig(lr=0.01), None)[0]


@pytest.mark.parametrize('kind', ['k1', 'k2'])
def test_regularized_update_is_rl_update_bit_for_bit(tiny, batch, kind):
    moved = _moved(tiny, batch)
    for cfg in (RLConfig(), RLConfig(kl_coef=0.3, kl_kind=kind), RLConfig(epochs=2, minibatches=4)):
        a, sa = _update(rl_update, moved, batch, cfg, tiny)
        b, sb = _update(m.regularized_update, moved, batch, cfg, tiny)
        assert same_weights(a, b)
        for key in ('loss', 'clip_frac', 'approx_kl', 'grad_norm', 'kl'):
            assert sa[key] == sb[key], key
        assert abs(sa['entropy'] - sb['entropy']) < 1e-12


def test_regularized_update_k3_matches_kl_penalty_without_clamp(tiny, batch):
    moved = _moved(tiny, batch)
    cfg = RLConfig(kl_coef=0.3, kl_kind='k3')
    a, sa = _update(rl_update, moved, batch, cfg, tiny)
    b, sb = _update(m.regularized_update, moved, batch, cfg, tiny)
    assert max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters())) < 1e-12
    assert abs(sa['kl'] - sb['kl']) < 1e-12


def test_regularized_update_entropy_gradient_against_autograd(tiny, batch):
    "One full-batch step with lr small: the applied gradient is that of policy_loss - c * full-vocabulary entropy."
    cfg = RLConfig(minibatches=1, max_grad_norm=1e9)
    coef = 0.5
    model = copy.deepcopy(tiny)
    captured = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured['g'] = torch.cat([p.grad.flatten() for p in model.parameters()])
    adv = compute_advantages(batch, cfg)
    m.regularized_update(model, Capture(model.parameters(), lr=0.0), batch, adv, cfg, entropy_coef=coef)
    # independent: the full [B, T-1, V] logits, a plain loop-free formula for the policy term and the entropy
    ref = copy.deepcopy(tiny)
    logits = ref(batch['ids'])[:, :-1]
    mask = batch['action_mask']
    logp = logits.log_softmax(-1).gather(-1, batch['ids'][:, 1:, None])[..., 0]
    policy = -(adv[:, None] * torch.exp(logp - logp.detach()) * mask).sum() / mask.sum()
    p = logits.softmax(-1)
    ent = (-(p * logits.log_softmax(-1)).sum(-1) * mask).sum() / mask.sum()
    (policy - coef * ent).backward()
    want = torch.cat([q.grad.flatten() for q in ref.parameters()])
    assert (captured['g'] - want).abs().max() < 1e-10


def test_regularized_update_kinds_and_stats(tiny, batch):
    moved = _moved(tiny, batch)
    for kind in m.KL_ESTIMATORS:
        _, st = _update(m.regularized_update, moved, batch, m.RegularizedConfig(kl_coef=0.2, kl_kind=kind), tiny,
                        entropy_coef=0.01)
        assert set(st) == {'loss', 'clip_frac', 'approx_kl', 'entropy', 'grad_norm', 'kl'}
        assert all(math.isfinite(v) for v in st.values())
        if kind in ('k2', 'k3', 'k3+'):
            assert st['kl'] >= 0


def test_regularized_update_errors(tiny, batch):
    opt = torch.optim.AdamW(copy.deepcopy(tiny).parameters())
    adv = compute_advantages(batch, RLConfig())
    with pytest.raises(TypeError, match='cfg'):
        m.regularized_update(tiny, opt, batch, adv, {'kl_coef': 0})
    with pytest.raises(ValueError, match='entropy_coef'):
        m.regularized_update(tiny, opt, batch, adv, RLConfig(), entropy_coef=-0.1)
    with pytest.raises(ValueError, match='entropy_coef'):
        m.regularized_update(tiny, opt, batch, adv, RLConfig(), entropy_coef=float('nan'))
    with pytest.raises(ValueError, match='ref_model'):
        m.regularized_update(tiny, opt, batch, adv, RLConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match='advantages'):
        m.regularized_update(tiny, opt, batch, adv[:3], RLConfig())
    cfg = RLConfig()
    cfg.kl_kind = 'k5'                                       # bypassing RLConfig's check
    with pytest.raises(ValueError, match='kl_kind'):
        m.regularized_update(tiny, opt, batch, adv, cfg)


def test_regularized_config():
    c = m.RegularizedConfig(kl_coef=0.1, kl_kind='k3+')
    assert c.kl_kind == 'k3+' and isinstance(c, RLConfig)
    assert dataclasses.replace(c, kl_coef=0.0).kl_kind == 'k3+'
    for kind in m.KL_ESTIMATORS:
        m.RegularizedConfig(kl_kind=kind)
    with pytest.raises(ValueError, match='kl_kind'):
        m.RegularizedConfig(kl_kind='k2+')
    with pytest.raises(ValueError, match='group_size'):
        m.RegularizedConfig(group_size=1, kl_kind='k1+')


# ---------------------------------------------------------------- sequence_kl
def test_sequence_kl_against_a_loop_and_padding(tiny, tok, batch):
    moved = _moved(tiny, batch)
    trajs = sample_groups(moved, None, TRAIN[:4], tok, RLConfig(), torch.Generator().manual_seed(5))
    b = collate(trajs, tok.pad_id)
    got = m.sequence_kl(b, tiny)
    with torch.no_grad():
        want = torch.stack([((t.sample_logp - sequence_log_probs(tiny, t.ids[None])[0]) * t.action_mask).sum()
                            for t in trajs])
    assert (got - want).abs().max() < 1e-12
    padded = {k: v.clone() for k, v in b.items()}
    n = len(trajs)
    padded['ids'] = torch.cat([b['ids'], torch.full((n, 3), tok.pad_id)], 1)
    padded['attention_mask'] = torch.cat([b['attention_mask'], torch.zeros(n, 3, dtype=torch.long)], 1)
    padded['action_mask'] = torch.cat([b['action_mask'], torch.zeros(n, 3)], 1)
    padded['sample_logp'] = torch.cat([b['sample_logp'], torch.full((n, 3), math.nan)], 1)
    assert (m.sequence_kl(padded, tiny) - got).abs().max() < 1e-12
    # garbage at the masked positions inside the rows changes nothing either
    garbage = dict(b, sample_logp=torch.where(b['action_mask'].bool(), b['sample_logp'], math.nan))
    assert (m.sequence_kl(garbage, tiny) - got).abs().max() < 1e-12


def test_sequence_kl_zero_against_itself_and_temperature(tiny, tok):
    for temp in (1.0, 0.7):
        c = RLConfig(temperature=temp)
        b = collate(sample_groups(tiny, None, TRAIN[:2], tok, c, torch.Generator().manual_seed(6)), tok.pad_id)
        assert m.sequence_kl(b, tiny, temperature=temp).abs().max() < 1e-12
    assert m.sequence_kl(b, tiny, temperature=1.0).abs().max() > 1e-3       # scored at the wrong temperature


def test_sequence_kl_empty_mask_and_errors(tiny, batch):
    empty = dict(batch, action_mask=torch.zeros_like(batch['action_mask']))
    assert (m.sequence_kl(empty, tiny) == 0).all()
    with pytest.raises(TypeError, match='batch'):
        m.sequence_kl([1, 2], tiny)
    with pytest.raises(ValueError, match='sample_logp'):
        m.sequence_kl({'ids': batch['ids'], 'action_mask': batch['action_mask']}, tiny)
    with pytest.raises(ValueError, match='temperature'):
        m.sequence_kl(batch, tiny, temperature=0.0)
    with pytest.raises(ValueError, match='action_mask'):
        m.sequence_kl(dict(batch, action_mask=batch['action_mask'][:, :-1]), tiny)


# ---------------------------------------------------------------- train_regularized
def test_train_regularized_zero_coefficients_is_train_rl(tiny, tok):
    a, b = copy.deepcopy(tiny), copy.deepcopy(tiny)
    ha = train_rl(a, TRAIN, tok, RLConfig(), 2)
    hb = m.train_regularized(b, TRAIN, tok, RLConfig(), 2)
    assert same_weights(a, b)
    assert [r['reward'] for r in ha] == [r['reward'] for r in hb]


def test_train_regularized_kl_in_reward_shapes_the_advantages(tiny, tok, monkeypatch):
    "With kl_in_reward, the advantages are compute_advantages of r - beta * sequence_kl, and no KL is in the loss."
    seen = []
    real = m.regularized_update

    def spy(model, optimizer, batch, advantages, cfg, ref_model=None, generator=None, entropy_coef=0.0):
        seen.append((batch, advantages, cfg, ref_model))
        return real(model, optimizer, batch, advantages, cfg, ref_model, generator, entropy_coef)
    monkeypatch.setattr(m, 'regularized_update', spy)
    model = copy.deepcopy(tiny)
    ref = copy.deepcopy(tiny)
    cfg = m.RegularizedConfig(kl_coef=0.5, drop_equal_groups=False)     # the tiny policy never passes
    h = m.train_regularized(model, TRAIN, tok, cfg, 3, kl_in_reward=True, ref_model=ref)
    assert len(seen) == 3
    for batch, adv, cfg, ref_model in seen:
        assert cfg.kl_coef == 0.0 and ref_model is None
        seq = m.sequence_kl(batch, ref)
        task = batch['rewards'] + 0.5 * seq                      # the shaping undone: 0/1 task rewards again
        assert (task - task.round()).abs().max() < 1e-9 and set(task.round().tolist()) <= {0.0, 1.0}
        assert torch.equal(adv, compute_advantages(batch, cfg))               # advantages of the shaped rewards
    assert all('ref_kl' in r for r in h if r['updated'])


def test_train_regularized_errors(tiny, tok):
    with pytest.raises(ValueError, match='entropy_coef'):
        m.train_regularized(tiny, TRAIN, tok, RLConfig(), 1, entropy_coef=-1.0)
    with pytest.raises(ValueError, match='kl_in_reward'):
        m.train_regularized(tiny, TRAIN, tok, RLConfig(), 1, kl_in_reward=1)
    with pytest.raises(ValueError, match='steps'):
        m.train_regularized(tiny, TRAIN, tok, RLConfig(), -1)
    with pytest.raises(TypeError, match='cfg'):
        m.train_regularized(tiny, TRAIN, tok, None, 1)


def test_make_regularized_agent_errors(tok):
    for kw, name in ((dict(seed=-1), 'seed'), (dict(base_seed=1.5), 'base_seed'), (dict(steps=0), 'steps'),
                     (dict(entropy_coef=-0.1), 'entropy_coef'), (dict(kl_in_reward='yes'), 'kl_in_reward'),
                     (dict(kl_kind='k4'), 'kl_kind')):
        with pytest.raises(ValueError, match=name):
            m.make_regularized_agent(tok, **kw)
