"""Tests for agentrl.advantages (Chapter 7). Every reference value is computed independently of the
code under test: plain-Python loops over the policy positions of each row, hand calculations, the
statistics module, and closed forms (lam = 1 gives G - V, lam = 0 gives the TD residual)."""
import statistics

import pytest
import torch

import agentrl.advantages as m
from agentrl.policies import TinyAgent

torch.set_num_threads(1)
INF, NAN = float('inf'), float('nan')


# ----------------------------------------------------------------------------- helpers
def ragged(B=6, T=17, seed=0, p=0.55):
    "A random ragged mask with tool gaps and right padding, one empty row, one full row."
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < p
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask &= torch.arange(T)[None] < lengths[:, None]          # right padding
    mask[1] = False                                            # no policy token at all
    mask[2] = True                                             # every position is a policy token
    return mask


def poison(x, mask, value):
    "Copy of x with `value` written on every position where mask is 0."
    return torch.where(mask, x, torch.full_like(x, value))


def py_gae(r, v, mask, gamma, lam):
    "GAE by a plain loop over the policy positions of each row (lists of floats) -> (A, returns)."
    B, T = len(r), len(r[0])
    A = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        policy = [t for t in range(T) if mask[b][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(policy):
            a = r[b][t] + gamma * next_v - v[b][t] + gamma * lam * next_a
            A[b][t], ret[b][t] = a, a + v[b][t]
            next_v, next_a = v[b][t], a
    return A, ret


def py_returns(r, mask, gamma):
    "Discounted return-to-go over policy positions only, by explicit sums."
    B, T = len(r), len(r[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        policy = [t for t in range(T) if mask[b][t]]
        for i, t in enumerate(policy):
            out[b][t] = sum(gamma ** j * r[b][u] for j, u in enumerate(policy[i:]))
    return out


def py_turns(r, v, mask, tid, gamma, lam):
    "Turn-level GAE by a plain loop: calls = runs of policy tokens with one turn id."
    B, T = len(r), len(r[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        calls = []                                            # list of lists of positions
        for t in range(T):
            if not mask[b][t]:
                continue
            if calls and tid[b][calls[-1][-1]] == tid[b][t]:
                calls[-1].append(t)
            else:
                calls.append([t])
        Rk = [sum(r[b][t] for t in c) for c in calls]
        Vk = [v[b][c[0]] for c in calls]
        next_v, next_a = 0.0, 0.0
        for k in reversed(range(len(calls))):
            a = Rk[k] + gamma * next_v - Vk[k] + gamma * lam * next_a
            for t in calls[k]:
                out[b][t] = a
            next_v, next_a = Vk[k], a
    return out


def tensor(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


# ----------------------------------------------------------------------------- outcome_rewards
def test_outcome_rewards_by_hand():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0],
                         [1, 1, 0, 0, 0, 0],
                         [0, 0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 1, 1]])
    out = m.outcome_rewards(torch.tensor([1.0, -0.5, 7.0, 2.0]), mask)
    want = torch.zeros(4, 6)
    want[0, 4], want[1, 1], want[3, 5] = 1.0, -0.5, 2.0       # row 2 has no policy token -> all zero
    assert out.dtype == torch.float64 and torch.equal(out, want)
    assert m.outcome_rewards(torch.tensor([3.0], dtype=torch.float64), torch.tensor([[True, False]])).dtype \
        == torch.float64


def test_outcome_rewards_bad_input():
    mask = torch.ones(2, 3)
    with pytest.raises(TypeError, match='rewards'):
        m.outcome_rewards([1.0, 2.0], mask)
    with pytest.raises(ValueError, match='rewards'):
        m.outcome_rewards(torch.tensor([1, 2]), mask)          # integer rewards
    with pytest.raises(ValueError, match='rewards'):
        m.outcome_rewards(torch.ones(2, 3), mask)              # [B, T] rewards
    with pytest.raises(ValueError, match='mask'):
        m.outcome_rewards(torch.ones(3), mask)                 # B mismatch
    with pytest.raises(ValueError, match='mask'):
        m.outcome_rewards(torch.ones(2), torch.full((2, 3), 2.0))
    with pytest.raises(ValueError, match='finite'):
        m.outcome_rewards(torch.tensor([1.0, NAN]), mask)
    with pytest.raises(TypeError, match='mask'):
        m.outcome_rewards(torch.ones(2), [[1, 0, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match='mask'):
        m.outcome_rewards(torch.ones(2), torch.ones(2))          # 1-D mask


# ----------------------------------------------------------------------------- returns_to_go
@pytest.mark.parametrize('gamma', [1.0, 0.9, 0.5, 0.0])
@pytest.mark.parametrize('pad', [1e30, -100.0, INF, NAN])
def test_returns_to_go_matches_loop_with_poisoned_padding(gamma, pad):
    mask = ragged(seed=3)
    r = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = py_returns(r.tolist(), mask.tolist(), gamma)
    got = m.returns_to_go(poison(r, mask, pad), mask, gamma)
    assert got.shape == mask.shape and got.dtype == torch.float64
    assert torch.allclose(got, tensor(want), atol=1e-12)
    assert bool((got[~mask] == 0).all())                       # exactly 0 off the mask, never NaN


def test_returns_to_go_gamma_one_is_suffix_sum_and_mask_dtypes():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    want = torch.tensor([[1 + 3 + 4.0, 0, 3 + 4.0, 4.0, 0]])   # 2 and 5 sit on masked positions: skipped
    for mk in (mask, mask.bool(), mask.float()):
        assert torch.equal(m.returns_to_go(r, mk), want)
    # gamma counts policy tokens only: the gap at position 1 costs no discount
    assert m.returns_to_go(r, mask, 0.5)[0, 0].item() == pytest.approx(1 + 0.5 * 3 + 0.25 * 4)


@pytest.mark.parametrize('kwargs, word', [
    (dict(gamma=1.5), 'gamma'), (dict(gamma=-0.1), 'gamma'), (dict(gamma=True), 'gamma'),
    (dict(gamma='1'), 'gamma')])
def test_returns_to_go_bad_gamma(kwargs, word):
    with pytest.raises(ValueError, match=word):
        m.returns_to_go(torch.zeros(2, 3), torch.ones(2, 3), **kwargs)


def test_returns_to_go_bad_tensors():
    with pytest.raises(TypeError, match='rewards'):
        m.returns_to_go([[0.0]], torch.ones(1, 1))
    with pytest.raises(ValueError, match='rewards'):
        m.returns_to_go(torch.zeros(3), torch.ones(3))        # 1-D
    with pytest.raises(ValueError, match='mask'):
        m.returns_to_go(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match='finite'):
        m.returns_to_go(torch.tensor([[1.0, NAN]]), torch.ones(1, 2))   # NaN on a policy token


# ----------------------------------------------------------------------------- gae_advantages
@pytest.mark.parametrize('gamma, lam', [(1.0, 0.95), (0.99, 0.9), (0.7, 0.0), (1.0, 1.0), (0.0, 0.5)])
def test_gae_matches_loop_with_poisoned_padding(gamma, lam):
    mask = ragged(seed=5)
    g = torch.Generator().manual_seed(6)
    r = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    v = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    A_want, ret_want = py_gae(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    for pad_r, pad_v in [(1e30, -1e30), (INF, NAN), (-100.0, -100.0)]:
        A, ret = m.gae_advantages(poison(r, mask, pad_r), poison(v, mask, pad_v), mask, gamma, lam)
        assert A.shape == ret.shape == mask.shape
        assert torch.allclose(A, tensor(A_want), atol=1e-12)
        assert torch.allclose(ret, tensor(ret_want), atol=1e-12)
        assert bool((A[~mask] == 0).all() and (ret[~mask] == 0).all())


def test_gae_closed_forms():
    mask = ragged(seed=7)
    g = torch.Generator().manual_seed(8)
    r = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    v = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    G = tensor(py_returns(r.tolist(), mask.tolist(), 1.0))
    A, ret = m.gae_advantages(r, v, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(A, (G - v) * mask, atol=1e-12)        # lam = 1, gamma = 1: return minus value
    assert torch.allclose(ret, G, atol=1e-12)
    # lam = 0: the one-step TD residual r_t + gamma V(next policy token) - V_t, by hand
    A0, ret0 = m.gae_advantages(r, v, mask, gamma=0.8, lam=0.0)
    for b in range(mask.shape[0]):
        pol = [t for t in range(mask.shape[1]) if mask[b, t]]
        for i, t in enumerate(pol):
            nxt = v[b, pol[i + 1]].item() if i + 1 < len(pol) else 0.0
            assert A0[b, t].item() == pytest.approx(r[b, t].item() + 0.8 * nxt - v[b, t].item(), abs=1e-12)
            assert ret0[b, t].item() == pytest.approx(A0[b, t].item() + v[b, t].item(), abs=1e-12)


def test_gae_tiny_example_by_hand():
    # policy tokens at 0, 2, 3; a tool token at 1 carrying garbage; reward 1 at the end
    r = torch.tensor([[0.0, 9.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, -7.0, 0.25, 0.75]])
    mask = torch.tensor([[1, 0, 1, 1]])
    A, ret = m.gae_advantages(r, v, mask, gamma=0.5, lam=0.5)
    a3 = 1.0 - 0.75                                            # last token: r - V
    a2 = 0.0 + 0.5 * 0.75 - 0.25 + 0.25 * a3
    a0 = 0.0 + 0.5 * 0.25 - 0.5 + 0.25 * a2                    # skips position 1 entirely
    assert A.tolist()[0] == pytest.approx([a0, 0.0, a2, a3])
    assert ret.tolist()[0] == pytest.approx([a0 + 0.5, 0.0, a2 + 0.25, a3 + 0.75])


def test_gae_detached_and_dtype_promotion():
    v = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    r = torch.ones(2, 3)
    A, ret = m.gae_advantages(r, v, torch.ones(2, 3))
    assert A.dtype == ret.dtype == torch.float64
    assert not A.requires_grad and not ret.requires_grad


def test_gae_bad_input():
    r, v, mk = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match='values'):
        m.gae_advantages(r, torch.zeros(2, 4), mk)
    with pytest.raises(TypeError, match='values'):
        m.gae_advantages(r, None, mk)
    with pytest.raises(ValueError, match='lam'):
        m.gae_advantages(r, v, mk, lam=1.2)
    with pytest.raises(ValueError, match='gamma'):
        m.gae_advantages(r, v, mk, gamma=-1)
    with pytest.raises(ValueError, match='mask'):
        m.gae_advantages(r, v, torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match='values'):
        m.gae_advantages(r, torch.full((2, 3), INF), mk)       # inf on policy tokens is refused


# ----------------------------------------------------------------------------- critic
def small_agent(seed=0, V=20):
    torch.manual_seed(seed)
    return TinyAgent(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=32)


def test_make_critic_structure_and_independence():
    agent = small_agent()
    for p in agent.parameters():
        p.requires_grad_(False)                                # a frozen policy
    state = torch.random.get_rng_state()
    critic = m.make_critic(agent)
    assert torch.equal(state, torch.random.get_rng_state())    # no random draw
    assert isinstance(critic, TinyAgent) and critic is not agent
    assert tuple(critic.head.weight.shape) == (1, 16) and tuple(critic.head.bias.shape) == (1,)
    assert bool((critic.head.weight == 0).all() and (critic.head.bias == 0).all())
    assert all(p.requires_grad for p in critic.parameters())
    assert torch.equal(critic.tok_emb.weight, agent.tok_emb.weight)
    assert tuple(agent.head.weight.shape) == (20, 16)           # the policy keeps its head
    ids = torch.randint(0, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    assert tuple(critic(ids).shape) == (3, 5, 1)
    assert bool((critic(ids) == 0).all())
    # one optimiser step on the critic leaves the policy untouched
    before = [p.clone() for p in agent.parameters()]
    opt = torch.optim.SGD(critic.parameters(), lr=0.1)
    (critic(ids) - 1.0).pow(2).mean().backward()
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    assert critic.head.bias.item() != 0                        # while the critic did move


def test_make_critic_bad_input():
    with pytest.raises(TypeError, match='TinyAgent'):
        m.make_critic(torch.nn.Linear(3, 3))


def test_critic_values_alignment_and_causality():
    critic = m.make_critic(small_agent())
    with torch.no_grad():
        critic.head.weight.normal_(generator=torch.Generator().manual_seed(2))
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(3))
    vals = m.critic_values(critic, ids)
    assert vals.shape == (2, 7)
    assert torch.allclose(vals, critic(ids)[:, :-1, 0])
    # out[:, t] depends on ids[:, :t+1] only: the value of prefix t equals the last value of that prefix
    for t in range(7):
        assert torch.allclose(vals[:, t], critic(ids[:, :t + 1])[:, -1, 0], atol=1e-5)


def test_critic_values_bad_input():
    critic = m.make_critic(small_agent())
    with pytest.raises(ValueError, match='ids'):
        m.critic_values(critic, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match='ids'):
        m.critic_values(critic, torch.zeros(2, 4))             # float ids
    with pytest.raises(ValueError, match='critic'):
        m.critic_values(small_agent(), torch.zeros(2, 4, dtype=torch.long))   # a policy: [B, T, V]


# ----------------------------------------------------------------------------- explained_variance
def test_explained_variance_by_hand():
    target = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # residual [0, 0, 0, 1]: Var = 0.25 - 0.0625 = 0.1875; Var(target) = 1.25
    pred = torch.tensor([[1.0, 2.0, 3.0, 3.0, -5.0]])
    assert m.explained_variance(pred, target, mask) == pytest.approx(1 - 0.1875 / 1.25)
    assert m.explained_variance(target, target, mask) == 1.0
    assert m.explained_variance(target + 3.0, target, mask) == 1.0          # a constant offset is ignored
    assert m.explained_variance(torch.zeros(1, 5), target, mask) == pytest.approx(0.0)
    assert m.explained_variance(-target, target, mask) == pytest.approx(1 - 4.0)
    assert isinstance(m.explained_variance(pred, target, mask), float)


def test_explained_variance_degenerate_cases():
    t = torch.tensor([[0.3, 0.3, 0.3, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert m.explained_variance(torch.tensor([[0.0, 1.0, 2.0, 0.0]]), t, mask) == 0.0   # constant target
    assert m.explained_variance(t, t, torch.zeros(1, 4)) == 0.0                        # empty mask
    bad = torch.tensor([[1.0, 2.0, NAN, INF]])
    # garbage off the mask is ignored: residual [0, 1] -> Var 0.25; target [1, 3] -> Var 1.0
    assert m.explained_variance(bad, torch.tensor([[1.0, 3.0, NAN, 0.0]]), torch.tensor([[1, 1, 0, 0]])) \
        == pytest.approx(0.75)


def test_explained_variance_bad_input():
    with pytest.raises(ValueError, match='target'):
        m.explained_variance(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match='mask'):
        m.explained_variance(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3, 2))
    with pytest.raises(TypeError, match='pred'):
        m.explained_variance(0.5, torch.zeros(2, 3), torch.ones(2, 3))


# ----------------------------------------------------------------------------- group / RLOO
def hand_group(rewards, G, normalize_std=True, eps=1e-6):
    out = []
    for i in range(0, len(rewards), G):
        grp = rewards[i:i + G]
        mean = sum(grp) / G
        sd = statistics.stdev(grp)                              # unbiased (G - 1)
        out += [(x - mean) / (sd + eps) if normalize_std else x - mean for x in grp]
    return out


def test_group_advantages_by_hand():
    r = [1.0, 0.0, 0.0, 0.0, 0.2, 0.9, 0.4, 0.4, 3.0, -1.0, 2.0, 0.0]
    got = m.group_advantages(torch.tensor(r, dtype=torch.float64), 4)
    assert got.tolist() == pytest.approx(hand_group(r, 4), abs=1e-9)
    # the textbook case: one success in four -> (1 - 0.25) / 0.5 = 1.5 and -0.5
    assert m.group_advantages(torch.tensor([1.0, 0, 0, 0]), 4).tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5],
                                                                                          abs=1e-5)
    dr = m.group_advantages(torch.tensor(r), 4, normalize_std=False)
    assert dr.tolist() == pytest.approx(hand_group(r, 4, normalize_std=False), abs=1e-6)
    trl = m.group_advantages(torch.tensor(r, dtype=torch.float64), 6, eps=1e-4)
    assert trl.tolist() == pytest.approx(hand_group(r, 6, eps=1e-4), abs=1e-9)
    assert got.dtype == torch.float64 and got.shape == (12,)


@pytest.mark.parametrize('value, G', [(0.1, 7), (0.3, 5), (0.7, 3), (1.0, 8), (0.0, 2), (-2.6, 6)])
def test_all_equal_groups_are_exactly_zero(value, G):
    r = torch.cat([torch.full((G,), value), torch.tensor([1.0] + [0.0] * (G - 1))])
    for adv in (m.group_advantages(r, G), m.group_advantages(r, G, normalize_std=False),
                m.group_advantages(r, G, eps=0.0), m.rloo_advantages(r, G)):
        assert bool((adv[:G] == 0).all())                       # exactly 0.0, no residue, no NaN
        assert bool((adv[G:] != 0).all())                       # the mixed group still has signal


def test_float_residue_really_exists():
    "The all-equal test above is meaningful: the naive formula leaves a residue here."
    r = torch.full((7,), 0.1)
    assert (r - r.mean()).abs().max().item() > 0


def test_rloo_by_hand():
    r = [1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 1.0, 3.0]
    got = m.rloo_advantages(torch.tensor(r, dtype=torch.float64), 4).tolist()
    want = []
    for i in range(0, 8, 4):
        grp = r[i:i + 4]
        want += [x - (sum(grp) - x) / 3 for x in grp]
    assert got == pytest.approx(want, abs=1e-12)
    mean = sum(r[:4]) / 4
    assert got[0] == pytest.approx((r[0] - mean) * 4 / 3)       # (r - mean) G / (G - 1)
    assert m.rloo_advantages(torch.tensor([1.0, 0.0]), 2).tolist() == [1.0, -1.0]


@pytest.mark.parametrize('fn', [m.group_advantages, m.rloo_advantages])
def test_group_bad_input(fn):
    with pytest.raises(ValueError, match='group_size'):
        fn(torch.zeros(10), 4)                                   # 10 is not a multiple of 4
    with pytest.raises(ValueError, match='group_size'):
        fn(torch.zeros(4), 1)                                    # a group of one
    with pytest.raises(ValueError, match='group_size'):
        fn(torch.zeros(4), 2.0)
    with pytest.raises(ValueError, match='rewards'):
        fn(torch.zeros(2, 4), 4)
    with pytest.raises(ValueError, match='rewards'):
        fn(torch.tensor([1.0, NAN]), 2)
    with pytest.raises(ValueError, match='rewards'):
        fn(torch.tensor([1, 0]), 2)                              # integer rewards
    with pytest.raises(TypeError, match='rewards'):
        fn([1.0, 0.0], 2)


def test_group_bad_eps():
    with pytest.raises(ValueError, match='eps'):
        m.group_advantages(torch.zeros(4), 2, eps=-1e-6)


# ----------------------------------------------------------------------------- turn_advantages
def turn_batch(seed=0):
    "Ragged multi-call rows: each call is a run of policy tokens followed by tool tokens; padding last."
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 24
    mask = torch.zeros(B, T, dtype=torch.bool)
    tid = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        t, k = int(torch.randint(1, 3, (1,), generator=g)), 0
        tid[b, :t] = 0
        n_calls = [3, 0, 1, 4, 2][b]
        while k < n_calls and t < T:
            k += 1
            call = int(torch.randint(1, 4, (1,), generator=g))
            obs = int(torch.randint(0, 4, (1,), generator=g))
            mask[b, t:t + call] = True
            tid[b, t:t + call + obs] = k                          # the call and its tool output share id k
            t += call + obs
    return mask, tid


@pytest.mark.parametrize('gamma, lam', [(1.0, 0.95), (0.9, 0.8), (1.0, 0.0), (0.5, 1.0)])
def test_turn_advantages_match_loop_with_poison(gamma, lam):
    mask, tid = turn_batch()
    g = torch.Generator().manual_seed(9)
    r = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    v = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    want = py_turns(r.tolist(), v.tolist(), mask.tolist(), tid.tolist(), gamma, lam)
    got = m.turn_advantages(poison(r, mask, INF), poison(v, mask, NAN), mask, tid, gamma, lam)
    assert got.shape == mask.shape
    assert torch.allclose(got, tensor(want), atol=1e-12)
    assert bool((got[~mask] == 0).all())
    # values inside a call (after its first token) are never read
    later = mask & torch.roll(mask, 1, dims=1) & (torch.roll(tid, 1, dims=1) == tid)
    v2 = torch.where(later, torch.full_like(v, 1e6), v)
    assert torch.allclose(m.turn_advantages(r, v2, mask, tid, gamma, lam), got, atol=1e-12)


def test_turn_advantages_closed_forms():
    # one row: call 1 = positions 1-2, tool at 3-4, call 2 = positions 5-7, padding at 8
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1, 0]])
    tid = torch.tensor([[0, 1, 1, 1, 1, 2, 2, 2, -1]])
    r = torch.tensor([[0.0, 0.1, 0.2, 5.0, 5.0, 0.0, 0.0, 1.0, 9.0]])
    v = torch.tensor([[0.0, 0.4, 3.0, 0.0, 0.0, 0.7, -2.0, 8.0, 0.0]])
    A = m.turn_advantages(r, v, mask, tid, gamma=1.0, lam=1.0)
    a2 = 1.0 - 0.7                                              # R_2 - V_2
    a1 = (0.1 + 0.2) + 1.0 - 0.4                                # lam = gamma = 1: sum of later rewards - V_1
    assert A.tolist()[0] == pytest.approx([0, a1, a1, 0, 0, a2, a2, a2, 0])
    A0 = m.turn_advantages(r, v, mask, tid, gamma=0.5, lam=0.0)
    assert A0[0, 1].item() == pytest.approx(0.3 + 0.5 * 0.7 - 0.4)
    # the numbering of calls does not matter, only where it changes
    assert torch.equal(m.turn_advantages(r, v, mask, tid * 10 + 3, 1.0, 1.0), A)


def test_turn_equals_token_gae_for_one_token_calls():
    "When every call is one token, turn-level GAE is token-level GAE."
    mask, _ = turn_batch(seed=2)
    tid = torch.arange(mask.shape[1]).expand(mask.shape).clone()   # every position its own id
    g = torch.Generator().manual_seed(3)
    r = torch.randn(mask.shape, generator=g)
    v = torch.randn(mask.shape, generator=g)
    A_tok, _ = m.gae_advantages(r, v, mask, 0.9, 0.7)
    assert torch.allclose(m.turn_advantages(r, v, mask, tid, 0.9, 0.7), A_tok, atol=1e-6)


def test_turn_advantages_bad_input():
    r, v, mk = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match='turn_ids'):
        m.turn_advantages(r, v, mk, torch.zeros(2, 3))           # float ids
    with pytest.raises(ValueError, match='turn_ids'):
        m.turn_advantages(r, v, mk, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match='turn_ids'):
        m.turn_advantages(r, v, mk, [[0, 0, 0]] * 2)
    with pytest.raises(ValueError, match='lam'):
        m.turn_advantages(r, v, mk, torch.zeros(2, 3, dtype=torch.long), lam=2)


def test_argument_checks_are_chapter_6s():
    # the type and mask checks are imported from agentrl.policy_gradient, not repeated
    import agentrl.advantages as m
    import agentrl.policy_gradient as pg
    assert m._check_float is pg._check_float and m._check_mask is pg._check_mask
    assert not hasattr(m, '_floating') and not hasattr(m, '_as_mask')
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r'gae_advantages: mask must have shape \[2, 3\] \(no broadcasting\)'):
        m.gae_advantages(r, r, torch.ones(3))
    with pytest.raises(TypeError, match='returns_to_go: rewards'):
        m.returns_to_go([[0.0]], torch.ones(1, 1))
    with pytest.raises(ValueError, match='outcome_rewards: mask must hold only 0 and 1'):
        m.outcome_rewards(torch.ones(1), torch.tensor([[0.5, 1.0]]))
