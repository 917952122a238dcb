"""Unit tests for agentrl.fundamentals (Chapter 2).

Expected values come from hand calculation, closed forms, Python loops and brute force
(iterated Bellman backups, enumeration of all 4^6 deterministic policies), never from the
functions under test themselves.
"""
import itertools
import math
import random
import warnings

import pytest
import torch

from agentrl.fundamentals import (REPAIR_ACTIONS, REPAIR_STATES, ImproperPolicyError, discounted_return, make_repair_mdp,
                                  policy_evaluation, repair_transitions, value_iteration)

S_IDX = {name: i for i, name in enumerate(REPAIR_STATES)}
A_IDX = {name: i for i, name in enumerate(REPAIR_ACTIONS)}
LIVE = REPAIR_STATES[:-1]


def policy_of(*names):
    """Deterministic policy [7, 4] from one action per live state; the 'done' row is left zero."""
    assert len(names) == 6
    pol = torch.zeros(7, 4, dtype=torch.float64)
    for s, name in enumerate(names):
        pol[s, A_IDX[name]] = 1.0
    return pol


CAREFUL = policy_of('read', 'edit', 'test', 'test', 'submit', 'edit')
READ_EDIT_SUBMIT = policy_of('read', 'edit', 'submit', 'submit', 'submit', 'edit')
BLIND = policy_of('edit', 'edit', 'submit', 'submit', 'submit', 'edit')


def hand_built_mdp(step_cost=0.0):
    """The repair MDP written out entry by entry, independently of make_repair_mdp."""
    nonzero = {
        ('unread', 'read'): {'read': 1.0}, ('unread', 'edit'): {'edited_ok': 0.3, 'edited_bad': 0.7},
        ('unread', 'test'): {'unread': 1.0},
        ('read', 'read'): {'read': 1.0}, ('read', 'edit'): {'edited_ok': 0.8, 'edited_bad': 0.2},
        ('read', 'test'): {'read': 1.0},
        ('edited_ok', 'read'): {'edited_ok': 1.0}, ('edited_ok', 'edit'): {'edited_ok': 0.3, 'edited_bad': 0.7},
        ('edited_ok', 'test'): {'passed': 1.0},
        ('edited_bad', 'read'): {'edited_bad': 1.0}, ('edited_bad', 'edit'): {'edited_ok': 0.3, 'edited_bad': 0.7},
        ('edited_bad', 'test'): {'failed': 1.0},
        ('passed', 'read'): {'passed': 1.0}, ('passed', 'edit'): {'edited_ok': 0.3, 'edited_bad': 0.7},
        ('passed', 'test'): {'passed': 1.0},
        ('failed', 'read'): {'failed': 1.0}, ('failed', 'edit'): {'edited_ok': 0.8, 'edited_bad': 0.2},
        ('failed', 'test'): {'failed': 1.0},
    }
    P = torch.zeros(7, 4, 7, dtype=torch.float64)
    R = torch.zeros(7, 4, dtype=torch.float64)
    for s in LIVE:
        nonzero[(s, 'submit')] = {'done': 1.0}
        for a in REPAIR_ACTIONS:
            R[S_IDX[s], A_IDX[a]] = -step_cost
    for (s, a), dist in nonzero.items():
        for t, p in dist.items():
            P[S_IDX[s], A_IDX[a], S_IDX[t]] = p
    R[S_IDX['edited_ok'], A_IDX['submit']] += 1.0
    R[S_IDX['passed'], A_IDX['submit']] += 1.0
    return P, R


def bellman_iterate(P, R, policy, gamma, sweeps):
    """V <- r_pi + gamma P_pi V with explicit Python loops (no einsum, no solve)."""
    S, A = R.shape
    V = [0.0] * S
    for _ in range(sweeps):
        new = []
        for s in range(S):
            total = 0.0
            for a in range(A):
                pa = policy[s, a].item()
                if pa == 0.0:
                    continue
                total += pa * (R[s, a].item() + gamma * sum(P[s, a, t].item() * V[t] for t in range(S)))
            new.append(total)
        V = new
    return torch.tensor(V, dtype=torch.float64)


def random_mdp(gen, S=5, A=3, terminal=(4,)):
    P = torch.rand(S, A, S, generator=gen, dtype=torch.float64)
    P = P / P.sum(-1, keepdim=True)
    R = torch.randn(S, A, generator=gen, dtype=torch.float64)
    for s in terminal:
        P[s] = 0.0
        R[s] = 0.0
    policy = torch.rand(S, A, generator=gen, dtype=torch.float64)
    return P, R, policy / policy.sum(-1, keepdim=True)


# ---------------------------------------------------------------- constants and repair_transitions

def test_constants():
    assert REPAIR_STATES == ('unread', 'read', 'edited_ok', 'edited_bad', 'passed', 'failed', 'done')
    assert REPAIR_ACTIONS == ('read', 'edit', 'test', 'submit')


def test_repair_transitions_each_live_state():
    hand_P, _ = hand_built_mdp()
    for state in LIVE:
        table = repair_transitions(state)
        assert tuple(table) == REPAIR_ACTIONS
        for action, outcomes in table.items():
            assert math.isclose(sum(p for _, p in outcomes), 1.0)
            for nxt, p in outcomes:
                assert p > 0
                assert math.isclose(hand_P[S_IDX[state], A_IDX[action], S_IDX[nxt]].item(), p)


def test_repair_transitions_informed_edit_and_guess():
    assert dict(repair_transitions('read')['edit']) == pytest.approx({'edited_ok': 0.8, 'edited_bad': 0.2})
    assert dict(repair_transitions('failed')['edit']) == pytest.approx({'edited_ok': 0.8, 'edited_bad': 0.2})
    for guess_state in ['unread', 'edited_ok', 'edited_bad', 'passed']:
        assert dict(repair_transitions(guess_state)['edit']) == pytest.approx({'edited_ok': 0.3, 'edited_bad': 0.7})
    assert repair_transitions('edited_ok')['test'] == [('passed', 1.0)]
    assert repair_transitions('edited_bad')['test'] == [('failed', 1.0)]
    assert repair_transitions('unread')['read'] == [('read', 1.0)]
    assert repair_transitions('read')['read'] == [('read', 1.0)]
    assert repair_transitions('unread')['test'] == [('unread', 1.0)]


def test_repair_transitions_bad_input():
    with pytest.raises(ValueError, match='terminal'):
        repair_transitions('done')
    with pytest.raises(ValueError, match='state'):
        repair_transitions('compiled')
    with pytest.raises(TypeError, match='state'):
        repair_transitions(3)


# ---------------------------------------------------------------- make_repair_mdp

@pytest.mark.parametrize('cost', [0.0, 0.05, 0.3])
def test_make_repair_mdp_matches_hand_built(cost):
    P, R = make_repair_mdp(step_cost=cost)
    hand_P, hand_R = hand_built_mdp(cost)
    assert P.shape == (7, 4, 7) and R.shape == (7, 4)
    assert P.dtype == torch.float64 and R.dtype == torch.float64
    assert torch.allclose(P, hand_P, atol=1e-15, rtol=0)
    assert torch.allclose(R, hand_R, atol=1e-15, rtol=0)
    assert torch.all(P[S_IDX['done']] == 0) and torch.all(R[S_IDX['done']] == 0)
    assert torch.allclose(P.sum(-1)[:-1], torch.ones(6, 4, dtype=torch.float64))


def test_make_repair_mdp_default_is_cost_free():
    P, R = make_repair_mdp()
    assert R.sum().item() == 2.0 and (R >= 0).all()


@pytest.mark.parametrize('bad', [-0.1, float('nan'), float('inf')])
def test_make_repair_mdp_rejects_bad_cost(bad):
    with pytest.raises(ValueError, match='step_cost'):
        make_repair_mdp(step_cost=bad)


@pytest.mark.parametrize('bad', ['0.1', None, True])
def test_make_repair_mdp_rejects_non_number(bad):
    with pytest.raises(TypeError, match='step_cost'):
        make_repair_mdp(step_cost=bad)


# ---------------------------------------------------------------- discounted_return

@pytest.mark.parametrize('gamma', [0.0, 0.5, 0.9, 1.0])
def test_discounted_return_matches_python_loop(gamma):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    got = discounted_return(rewards, gamma)
    assert got.shape == (3, 4) and got.dtype == torch.float64
    for i in range(3):
        for j in range(4):
            expected, weight = 0.0, 1.0
            for r in rewards[i, j].tolist():
                expected += weight * r
                weight *= gamma
            assert math.isclose(got[i, j].item(), expected, rel_tol=1e-12, abs_tol=1e-12)


def test_discounted_return_hand_values_and_edge_cases():
    r = torch.tensor([0.0, 0.0, 1.0, 0.0])
    assert discounted_return(r, 0.9).shape == ()
    assert math.isclose(discounted_return(r, 0.9).item(), 0.81, rel_tol=1e-6)
    assert discounted_return(torch.tensor([2.0, 5.0]), 0.0).item() == 2.0      # 0^0 = 1
    assert discounted_return(torch.tensor([1.0, 2.0, 3.0]), 1.0).item() == 6.0
    assert torch.equal(discounted_return(torch.zeros(2, 0), 0.9), torch.zeros(2))
    padded = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert discounted_return(padded, 0.7).item() == discounted_return(padded[:1], 0.7).item()
    assert math.isclose(discounted_return(r, torch.tensor(0.9)).item(), 0.81, rel_tol=1e-6)


def test_discounted_return_gradient_is_the_discount():
    r = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    discounted_return(r, 0.5).backward()
    assert torch.allclose(r.grad, torch.tensor([1, 0.5, 0.25, 0.125, 0.0625], dtype=torch.float64))


def test_discounted_return_low_precision_sums_in_float64():
    # closed form of a geometric series: sum_{t<300} 0.99^t = (1 - 0.99^300) / (1 - 0.99) = 95.0959...
    exact = (1 - 0.99 ** 300) / (1 - 0.99)
    for dtype, resolution in [(torch.bfloat16, 0.5), (torch.float16, 0.07), (torch.float32, 1e-4)]:
        got = discounted_return(torch.ones(300, dtype=dtype), 0.99)
        assert got.dtype == dtype
        assert abs(got.item() - exact) <= resolution      # one rounding of the result, not 300
    assert abs(discounted_return(torch.ones(300, dtype=torch.bfloat16), 0.99).item() - 83.0) > 10


def test_discounted_return_rejects_non_finite_rewards():
    for value in [float('nan'), float('inf'), float('-inf')]:
        rewards = torch.tensor([[0.0, 1.0], [value, 0.0]])
        with pytest.raises(ValueError, match='rewards'):
            discounted_return(rewards, 0.9)


def test_discounted_return_bad_input():
    with pytest.raises(TypeError, match='rewards'):
        discounted_return([0.0, 1.0], 0.9)
    with pytest.raises(TypeError, match='rewards'):
        discounted_return(torch.tensor([0, 1]), 0.9)
    with pytest.raises(ValueError, match='rewards'):
        discounted_return(torch.tensor(1.0), 0.9)
    for bad in [1.5, -0.1, float('nan')]:
        with pytest.raises(ValueError, match='gamma'):
            discounted_return(torch.ones(3), bad)
    with pytest.raises(TypeError, match='gamma'):
        discounted_return(torch.ones(3), '0.9')


# ---------------------------------------------------------------- policy_evaluation

@pytest.mark.parametrize('gamma', [0.6, 0.9, 0.99, 1.0])
def test_policy_evaluation_closed_forms(gamma):
    P, R = make_repair_mdp()
    careful = policy_evaluation(P, R, CAREFUL, gamma)
    # careful: V(ok) = gamma, V(read) = V(failed) = 0.8 g^2 / (1 - 0.2 g^2), V(unread) = g V(read)
    v_read = 0.8 * gamma ** 2 / (1 - 0.2 * gamma ** 2)
    expected = [gamma * v_read, v_read, gamma, gamma * v_read, 1.0, v_read, 0.0]
    assert torch.allclose(careful, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    res = policy_evaluation(P, R, READ_EDIT_SUBMIT, gamma)
    assert math.isclose(res[0].item(), 0.8 * gamma ** 2, abs_tol=1e-12)     # reward at t=2 w.p. 0.8
    blind = policy_evaluation(P, R, BLIND, gamma)
    assert math.isclose(blind[0].item(), 0.3 * gamma, abs_tol=1e-12)        # reward at t=1 w.p. 0.3
    for V in (careful, res, blind):
        assert V[S_IDX['passed']].item() == pytest.approx(1.0) and V[S_IDX['done']].item() == 0.0


def test_policy_evaluation_sample_chapter_numbers():
    P, R = make_repair_mdp()
    values = [round(policy_evaluation(P, R, pol, 0.9)[0].item(), 4) for pol in (CAREFUL, READ_EDIT_SUBMIT, BLIND)]
    assert values == [0.6959, 0.6480, 0.2700]


def test_policy_evaluation_step_cost_closed_forms():
    P, R = make_repair_mdp(step_cost=0.1)
    # at gamma = 1: careful takes 4.5 actions on average, read-edit-submit 3, blind 2
    assert math.isclose(policy_evaluation(P, R, CAREFUL, 1.0)[0].item(), 1 - 4.5 * 0.1, abs_tol=1e-12)
    assert math.isclose(policy_evaluation(P, R, READ_EDIT_SUBMIT, 1.0)[0].item(), 0.8 - 3 * 0.1, abs_tol=1e-12)
    assert math.isclose(policy_evaluation(P, R, BLIND, 1.0)[0].item(), 0.3 - 2 * 0.1, abs_tol=1e-12)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_policy_evaluation_matches_iterated_backup_random_mdp(seed):
    P, R, policy = random_mdp(torch.Generator().manual_seed(seed))
    got = policy_evaluation(P, R, policy, 0.8)
    expected = bellman_iterate(P, R, policy, 0.8, sweeps=200)              # 0.8^200 ~ 4e-20
    assert torch.allclose(got, expected, atol=1e-10)


def test_policy_evaluation_matches_iterated_backup_gamma_one():
    P, R = make_repair_mdp(step_cost=0.05)
    uniform = torch.full((7, 4), 0.25, dtype=torch.float64)                # proper: submits w.p. 1/4
    got = policy_evaluation(P, R, uniform, 1.0)
    assert torch.allclose(got, bellman_iterate(P, R, uniform, 1.0, sweeps=400), atol=1e-10)
    assert math.isclose(got[0].item(), 0.0154, abs_tol=5e-5)               # the uniform start of Section 2.5


def test_policy_evaluation_gradient_matches_finite_differences():
    P, R = make_repair_mdp(step_cost=0.05)
    logits = torch.randn(7, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = logits.clone().requires_grad_(True)
    policy_evaluation(P, R, torch.softmax(x, -1), 1.0)[0].backward()
    h = 1e-6
    for s, a in [(0, 0), (1, 1), (2, 3), (3, 2), (5, 1)]:
        up, down = logits.clone(), logits.clone()
        up[s, a] += h
        down[s, a] -= h
        fd = (policy_evaluation(P, R, torch.softmax(up, -1), 1.0)[0]
              - policy_evaluation(P, R, torch.softmax(down, -1), 1.0)[0]).item() / (2 * h)
        assert math.isclose(x.grad[s, a].item(), fd, abs_tol=1e-7)


def test_policy_evaluation_terminal_row_is_ignored_and_dtypes_promote():
    P, R = make_repair_mdp()
    with_row = CAREFUL.clone()
    with_row[S_IDX['done'], A_IDX['submit']] = 1.0
    assert torch.equal(policy_evaluation(P, R, CAREFUL, 0.9), policy_evaluation(P, R, with_row, 0.9))
    V = policy_evaluation(P, R, CAREFUL.float(), 0.9)
    assert V.dtype == torch.float64 and V.shape == (7,)


def test_policy_evaluation_singular_case_is_a_clear_value_error():
    P, R = make_repair_mdp()
    loop = torch.zeros(7, 4, dtype=torch.float64)
    loop[:, A_IDX['read']] = 1.0
    assert policy_evaluation(P, R, loop, 0.99)[0].item() == 0.0
    with pytest.raises(ValueError, match=r'singular') as info:
        policy_evaluation(P, R, loop, 1.0)
    # one error, two ways to catch it: a bad-input ValueError and the linear-algebra error
    assert isinstance(info.value, torch.linalg.LinAlgError) and isinstance(info.value, ImproperPolicyError)
    try:
        policy_evaluation(P, R, loop, 1.0)
    except torch.linalg.LinAlgError as err:          # the reader code of the sample chapter
        caught = err
    assert 'never reaches a terminal state' in str(caught)
    assert 'I - gamma*P_pi' in str(info.value) and 'never reaches a terminal state' in str(info.value)
    # a stochastic policy that only reads and tests is improper too
    dither = torch.zeros(7, 4, dtype=torch.float64)
    dither[:, A_IDX['read']] = 0.5
    dither[:, A_IDX['test']] = 0.5
    with pytest.raises(ValueError, match='singular'):
        policy_evaluation(P, R, dither, 1.0)
    # improper in one state only: read-edit-submit, except that 'passed' keeps testing
    partly = READ_EDIT_SUBMIT.clone()
    partly[S_IDX['passed']] = 0.0
    partly[S_IDX['passed'], A_IDX['test']] = 1.0
    with pytest.raises(ValueError, match=r'state\(s\) \[4\]'):
        policy_evaluation(P, R, partly, 1.0)
    assert policy_evaluation(P, R, partly, 0.9)[S_IDX['passed']].item() == 0.0


def test_policy_evaluation_bad_shapes():
    P, R = make_repair_mdp()
    with pytest.raises(ValueError, match='P must have shape'):
        policy_evaluation(P[0], R, CAREFUL, 0.9)
    with pytest.raises(ValueError, match='P must have shape'):
        policy_evaluation(P[:, :, :6], R, CAREFUL, 0.9)
    with pytest.raises(ValueError, match='R must have shape'):
        policy_evaluation(P, R[:, :3], CAREFUL, 0.9)
    with pytest.raises(ValueError, match='policy must have shape'):
        policy_evaluation(P, R, CAREFUL[:, :3], 0.9)
    with pytest.raises(ValueError, match='policy must have shape'):
        policy_evaluation(P, R, CAREFUL[0], 0.9)


def test_policy_evaluation_bad_types():
    P, R = make_repair_mdp()
    with pytest.raises(TypeError, match='P'):
        policy_evaluation(P.tolist(), R, CAREFUL, 0.9)
    with pytest.raises(TypeError, match='R'):
        policy_evaluation(P, R.long(), CAREFUL, 0.9)
    with pytest.raises(TypeError, match='policy'):
        policy_evaluation(P, R, CAREFUL.long(), 0.9)
    with pytest.raises(TypeError, match='gamma'):
        policy_evaluation(P, R, CAREFUL, None)


def test_policy_evaluation_bad_values():
    P, R = make_repair_mdp()
    short = CAREFUL.clone()
    short[S_IDX['read']] *= 0.9                                            # a live row summing to 0.9
    with pytest.raises(ValueError, match='policy.*sum to 1'):
        policy_evaluation(P, R, short, 0.9)
    negative = CAREFUL.clone()
    negative[0, 0], negative[0, 1] = 1.5, -0.5
    with pytest.raises(ValueError, match='policy'):
        policy_evaluation(P, R, negative, 0.9)
    for bad in [1.01, -0.5, float('nan'), float('inf')]:
        with pytest.raises(ValueError, match='gamma'):
            policy_evaluation(P, R, CAREFUL, bad)
    too_much = P.clone()
    too_much[0, 0, 0] = 0.5                                                # row sums to 1.5
    with pytest.raises(ValueError, match='P'):
        policy_evaluation(too_much, R, CAREFUL, 0.9)
    neg_P = P.clone()
    neg_P[0, 1, 2] = -0.1
    with pytest.raises(ValueError, match='P'):
        policy_evaluation(neg_P, R, CAREFUL, 0.9)
    terminal_reward = R.clone()
    terminal_reward[S_IDX['done'], 0] = 1.0
    with pytest.raises(ValueError, match='R must be zero on terminal'):
        policy_evaluation(P, terminal_reward, CAREFUL, 0.9)
    nan_R = R.clone()
    nan_R[0, 0] = float('nan')
    with pytest.raises(ValueError, match='R'):
        policy_evaluation(P, nan_R, CAREFUL, 0.9)


# ---------------------------------------------------------------- value_iteration

def all_deterministic_values(P, R, gamma):
    """V^pi [4096, 7] of every deterministic policy on the live states, by batched linear solves.

    Improper policies at gamma = 1 are dropped (their value is undefined or -inf)."""
    choices = torch.tensor(list(itertools.product(range(4), repeat=6)))    # [4096, 6]
    live = torch.arange(6)
    P_pi = P[live, choices][:, :, :6]                                      # [4096, 6, 6] among live states
    r_pi = R[live, choices]                                                # [4096, 6]
    system = torch.eye(6, dtype=torch.float64) - gamma * P_pi
    if gamma == 1.0:
        # proper iff P_pi^n -> 0; for 6 states, P_pi^256 is a safe test here
        power = torch.linalg.matrix_power(P_pi, 256).sum((-1, -2))
        keep = power < 1e-6
        system, r_pi, choices = system[keep], r_pi[keep], choices[keep]
    V = torch.linalg.solve(system, r_pi[..., None])[..., 0]
    return V, choices


@pytest.mark.parametrize('gamma,cost', [(0.9, 0.0), (0.5, 0.0), (0.95, 0.1), (1.0, 0.05), (1.0, 0.3), (1.0, 0.5)])
def test_value_iteration_matches_enumeration(gamma, cost):
    P, R = make_repair_mdp(step_cost=cost)
    V_star, actions = value_iteration(P, R, gamma)
    V_all, choices = all_deterministic_values(P, R, gamma)
    best = V_all.max(0).values                                             # per-state optimum over policies
    assert torch.allclose(V_star[:6], best, atol=1e-9)
    assert V_star[6].item() == 0.0
    # the returned greedy policy achieves the optimum from every state
    greedy = torch.nn.functional.one_hot(actions, 4).to(torch.float64)
    assert torch.allclose(policy_evaluation(P, R, greedy, gamma)[:6], best, atol=1e-9)
    assert actions.dtype == torch.int64 and actions.shape == (7,)


def test_value_iteration_sample_numbers_at_0_9():
    P, R = make_repair_mdp()
    V_star, actions = value_iteration(P, R, 0.9)
    assert [round(v, 3) for v in V_star.tolist()] == [0.773, 0.859, 1.0, 0.773, 1.0, 0.859, 0.0]
    assert [REPAIR_ACTIONS[a] for a in actions[:6].tolist()] == ['read', 'edit', 'submit', 'test', 'submit', 'edit']
    # hand: V*(failed) = 0.9 (0.8 + 0.2 * 0.9 V*(failed))
    assert math.isclose(V_star[S_IDX['failed']].item(), 0.72 / (1 - 0.162), rel_tol=1e-10)


def test_value_iteration_step_cost_table_at_gamma_one():
    expected = {0.0: 1.0, 0.05: 0.825, 0.1: 0.65, 0.2: 0.3, 0.3: -0.05, 0.5: -0.5}   # 1 - 3.5c, or -c
    plans = {}
    for cost, value in expected.items():
        V_star, actions = value_iteration(*make_repair_mdp(step_cost=cost), 1.0)
        assert math.isclose(V_star[0].item(), value, abs_tol=1e-9)
        plans[cost] = '/'.join(REPAIR_ACTIONS[a] for a in actions[:4].tolist())
    assert plans[0.0] == 'read/edit/read/edit'                             # documented first-index tie-break
    assert plans[0.05] == plans[0.3] == 'read/edit/submit/test'
    assert plans[0.5] == 'submit/edit/submit/submit'


def test_value_iteration_warns_without_convergence():
    P = torch.ones(1, 1, 1, dtype=torch.float64)                           # a self-loop paying 1 forever
    R = torch.ones(1, 1, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match='no convergence'):
        V, _ = value_iteration(P, R, 1.0, iters=50)
    assert V.item() == 50.0
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        V, _ = value_iteration(P, R, 0.5)                                   # contraction: converges to 2
    assert math.isclose(V.item(), 2.0, abs_tol=1e-11)


def test_value_iteration_tol_is_inclusive():
    # one live state whose only action pays 1 and ends the episode: V = [1, 0] after one sweep,
    # whose change is exactly 1; with iters=1 and tol=1 that sweep must count as converged
    P = torch.zeros(2, 1, 2, dtype=torch.float64)
    P[0, 0, 1] = 1.0
    R = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        V, actions = value_iteration(P, R, 1.0, iters=1, tol=1.0)
        assert V.tolist() == [1.0, 0.0] and actions.tolist() == [0, 0]
        V, _ = value_iteration(P, R, 1.0, tol=0)                   # second sweep changes nothing
        assert V.tolist() == [1.0, 0.0]


def test_value_iteration_tol_zero_reaches_exact_fixed_point():
    # stay with probability 0.5, end with 0.5, reward 1 per step: V = 1 / (1 - 0.5) = 2 at gamma 1
    P = torch.zeros(2, 1, 2, dtype=torch.float64)
    P[0, 0, 0] = P[0, 0, 1] = 0.5
    R = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        V, _ = value_iteration(P, R, 1.0, tol=0)
    assert V[0].item() == 2.0


def test_value_iteration_bad_input():
    P, R = make_repair_mdp()
    for bad in [1.5, -0.1, float('nan')]:
        with pytest.raises(ValueError, match='gamma'):
            value_iteration(P, R, bad)
    with pytest.raises(ValueError, match='P must have shape'):
        value_iteration(P[:, :, :5], R, 0.9)
    with pytest.raises(ValueError, match='R must have shape'):
        value_iteration(P, R[:5], 0.9)
    with pytest.raises(TypeError, match='P'):
        value_iteration(P.numpy(), R, 0.9)
    with pytest.raises(ValueError, match='iters'):
        value_iteration(P, R, 0.9, iters=0)
    with pytest.raises(TypeError, match='iters'):
        value_iteration(P, R, 0.9, iters=2.5)
    with pytest.raises(ValueError, match='tol'):
        value_iteration(P, R, 0.9, tol=-1e-3)
    with pytest.raises(TypeError, match='tol'):
        value_iteration(P, R, 0.9, tol='small')


def test_random_mdps_value_iteration_dominates_random_policies():
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    for _ in range(3):
        P, R, _ = random_mdp(gen)
        V_star, _ = value_iteration(P, R, 0.9)
        for _ in range(20):
            pol = torch.zeros(5, 3, dtype=torch.float64)
            for s in range(5):
                pol[s, rng.randrange(3)] = 1.0
            assert (bellman_iterate(P, R, pol, 0.9, sweeps=300) <= V_star + 1e-9).all()
