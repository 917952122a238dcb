"""Tests for agentrl.ppo (Chapter 8): values by hand, gradients by autograd, bad input."""
import math

import pytest
import torch

from agentrl.ppo import ppo_policy_loss, value_loss
from agentrl.policy_gradient import reinforce_loss

D = torch.float64


def one_token(r, A, **kw):
    "Loss, gradient d loss / d log pi and stats of a single policy token with ratio r and advantage A."
    logp = torch.tensor([[math.log(r)]], dtype=D, requires_grad=True)
    loss, st = ppo_policy_loss(logp, torch.zeros(1, 1, dtype=D), torch.tensor([A], dtype=D),
                               torch.ones(1, 1), **kw)
    loss.backward()
    return float(loss.detach()), float(logp.grad), st


# (r, A, kwargs, expected loss, expected gradient), each worked out by hand from
# loss = -min(rA, clip(r)A) [and for A < 0 with dual clip c: min(that, c|A|)].
HAND = [
    (1.1, 2.0, {}, -2.2, -2.2),                          # inside the range: -rA, gradient -rA
    (1.5, 2.0, {}, -2.4, 0.0),                           # A > 0 above 1.2: -1.2 * 2, flat
    (0.5, 2.0, {}, -1.0, -1.0),                          # A > 0 below 0.8: unclipped term is smaller
    (0.5, -1.0, {}, 0.8, 0.0),                           # A < 0 below 0.8: 0.8 * 1, flat
    (1.5, -1.0, {}, 1.5, 1.5),                           # A < 0 above 1.2: unclipped, keeps gradient
    (1.25, 1.0, dict(clip_high=0.28), -1.25, -1.25),     # clip-higher: 1.25 still inside
    (1.5, 1.0, dict(clip_high=0.28), -1.28, 0.0),        # clip-higher: capped at 1.28
    (0.85, -1.0, dict(clip_low=0.1), 0.9, 0.0),          # asymmetric lower range 0.9
    (2.0, -1.0, dict(dual_clip=3.0), 2.0, 2.0),          # dual clip not reached
    (5.0, -1.0, dict(dual_clip=3.0), 3.0, 0.0),          # dual clip: loss capped at c|A| = 3
    (5.0, -0.5, dict(dual_clip=2.0), 1.0, 0.0),          # c|A| = 2 * 0.5
    (5.0, 1.0, dict(dual_clip=3.0), -1.2, 0.0),          # dual clip ignores A > 0
    (3.0, 0.0, {}, 0.0, 0.0),                            # zero advantage
    (10.0, 1.0, dict(clip_low=1.0, clip_high=math.inf), -10.0, -10.0),   # no clip at all
]


@pytest.mark.parametrize('r,A,kw,loss,grad', HAND)
def test_single_token_by_hand(r, A, kw, loss, grad):
    got_loss, got_grad, _ = one_token(r, A, **kw)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    assert got_grad == pytest.approx(grad, abs=1e-12)


def brute_force_token(r, A, lo, hi, c):
    "Piecewise definition written out case by case (independent of min/max)."
    if A > 0:
        return -A * (1 + hi) if r > 1 + hi else -A * r
    if A < 0:
        value = -A * (1 - lo) if r < 1 - lo else -A * r
        if c is not None and value > -A * c:
            value = -A * c
        return value
    return 0.0


def test_random_tokens_against_brute_force_every_mode():
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    log_r = torch.randn(B, T, generator=g, dtype=D)
    old = torch.randn(B, T, generator=g, dtype=D) - 2
    adv = torch.randn(B, T, generator=g, dtype=D)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    mask[0] = 0                                          # an empty row
    mask[1, 0] = 1
    lo, hi, c = 0.2, 0.28, 3.0
    per = [[brute_force_token(math.exp(log_r[b, t]), float(adv[b, t]), lo, hi, c) for t in range(T)]
           for b in range(B)]
    rows = [b for b in range(B) if mask[b].sum() > 0]
    n_tok = int(mask.sum())
    sums = {b: sum(per[b][t] for t in range(T) if mask[b, t]) for b in rows}
    counts = {b: int(mask[b].sum()) for b in rows}
    expected = {
        'token_mean': sum(sums.values()) / n_tok,
        'seq_mean_token_mean': sum(sums[b] / counts[b] for b in rows) / len(rows),
        'seq_mean_token_sum': sum(sums.values()) / len(rows),
        'seq_mean_token_sum_norm': sum(s / 16.0 for s in sums.values()) / len(rows),
    }
    for mode, want in expected.items():
        nc = 16.0 if mode == 'seq_mean_token_sum_norm' else None
        loss, _ = ppo_policy_loss(old + log_r, old, adv, mask, lo, hi, mode=mode, dual_clip=c, norm_const=nc)
        assert float(loss) == pytest.approx(want, rel=1e-10, abs=1e-12), mode


def test_gradient_zero_exactly_where_clip_binds():
    r = torch.tensor([0.5, 0.9, 1.1, 1.3, 3.0, 0.5, 0.9, 1.1, 1.3, 2.5, 6.0], dtype=D)
    A = torch.tensor([1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1], dtype=D)
    # hand: binds for A>0 when r > 1.28, for A<0 when r < 0.8, dual clip for A<0 when r > 3
    binds = [False, False, False, True, True, True, False, False, False, False, True]
    logp = r.log()[None].clone().requires_grad_(True)
    loss, st = ppo_policy_loss(logp, torch.zeros_like(logp), A[None], torch.ones_like(logp),
                               clip_low=0.2, clip_high=0.28, mode='seq_mean_token_sum', dual_clip=3.0)
    loss.backward()
    for t, b in enumerate(binds):
        want = 0.0 if b else float(-A[t] * r[t])
        assert float(logp.grad[0, t]) == pytest.approx(want, abs=1e-12), t
    assert st['clip_frac'] == pytest.approx(3 / 11)           # r=1.3,3.0 (A>0) and r=0.5 (A<0)
    assert st['clip_frac_high'] == pytest.approx(2 / 11)
    assert st['clip_frac_low'] == pytest.approx(1 / 11)
    assert st['dual_clip_frac'] == pytest.approx(1 / 11)      # r = 6


def test_stats_by_hand_with_padding():
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.3], [-0.7, -1.2, -0.1, -0.1]], dtype=D)
    lr = torch.tensor([[0.5, -0.1, -0.5, 0.2], [0.3, 0.0, 0.1, 9.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, -0.5], dtype=D)
    loss, st = ppo_policy_loss(old + lr, old, adv, mask, clip_low=0.2, clip_high=0.28)
    kept = [0.5, -0.1, -0.5, 0.2, 0.3, 0.0, 0.1]
    ratios = [math.exp(x) for x in kept]
    assert st['ratio_min'] == pytest.approx(math.exp(-0.5))
    assert st['ratio_max'] == pytest.approx(math.exp(0.5))
    assert st['ratio_mean'] == pytest.approx(sum(ratios) / 7)
    assert st['approx_kl'] == pytest.approx(sum(r - 1 - x for r, x in zip(ratios, kept)) / 7)
    assert st['ppo_kl'] == pytest.approx(-sum(kept) / 7)
    assert st['clip_frac'] == pytest.approx(1 / 7)            # only exp(0.5) = 1.65 > 1.28 with A > 0
    assert st['dual_clip_frac'] == 0.0
    hand = [-1.28, -math.exp(-0.1), -math.exp(-0.5), -math.exp(0.2),
            0.5 * math.exp(0.3), 0.5, 0.5 * math.exp(0.1)]
    assert float(loss) == pytest.approx(sum(hand) / 7)
    assert all(isinstance(v, float) for v in st.values())


def test_advantages_per_row_equal_per_token_broadcast():
    g = torch.Generator().manual_seed(1)
    logp, old = torch.randn(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=D)
    mask = torch.ones(3, 4)
    a, sa = ppo_policy_loss(logp, old, adv, mask, dual_clip=3.0)
    b, sb = ppo_policy_loss(logp, old, adv[:, None].expand(3, 4).clone(), mask, dual_clip=3.0)
    assert float(a) == float(b) and sa == sb


def test_first_step_gradient_equals_reinforce():
    g = torch.Generator().manual_seed(2)
    logp = torch.randn(4, 6, generator=g, dtype=D).requires_grad_(True)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.rand(4, 6, generator=g) < 0.8).long()
    for mode in ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum'):
        g1 = torch.autograd.grad(ppo_policy_loss(logp, logp.detach(), adv, mask, mode=mode, dual_clip=3.0)[0], logp)[0]
        g2 = torch.autograd.grad(reinforce_loss(logp, adv, mask, mode=mode), logp)[0]
        assert torch.allclose(g1, g2, atol=1e-12), mode


def test_no_clip_settings_give_plain_ratio_loss():
    g = torch.Generator().manual_seed(3)
    logp, old = torch.randn(2, 5, generator=g, dtype=D), torch.randn(2, 5, generator=g, dtype=D)
    adv = torch.randn(2, 5, generator=g, dtype=D)
    loss, st = ppo_policy_loss(logp, old, adv, torch.ones(2, 5), clip_low=1.0, clip_high=math.inf)
    assert float(loss) == pytest.approx(float((-(logp - old).exp() * adv).mean()))
    assert st['clip_frac'] == 0.0


def test_extreme_log_ratios_stay_finite():
    logp = torch.tensor([[1000.0, -1000.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -math.inf, 0.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    for kw in ({}, dict(dual_clip=3.0), dict(clip_low=1.0, clip_high=math.inf)):
        logp.grad = None
        loss, st = ppo_policy_loss(logp, old, adv, torch.ones(1, 4), **kw)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), kw
        assert all(math.isfinite(v) for v in st.values()), kw
        assert st['ratio_max'] == pytest.approx(math.exp(20.0), rel=1e-6)
        assert st['ratio_min'] == pytest.approx(math.exp(-20.0), rel=1e-6)
    # the clamp's gradient is 0 beyond +-20: only token 3 (ratio 1) moves
    assert logp.grad[0, :3].abs().max() == 0 and logp.grad[0, 3] != 0


def test_padding_garbage_is_ignored_and_old_logp_detached():
    logp = torch.tensor([[-0.1, float('nan')]], requires_grad=True)
    old = torch.tensor([[-0.2, float('inf')]], requires_grad=True)
    adv = torch.tensor([[1.0, float('nan')]])
    loss, st = ppo_policy_loss(logp, old, adv, torch.tensor([[1, 0]]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-math.exp(0.1))
    assert logp.grad[0, 1] == 0 and old.grad is None


def test_empty_mask_gives_zero_and_neutral_stats():
    logp = torch.randn(2, 3, requires_grad=True)
    loss, st = ppo_policy_loss(logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    loss.backward()
    assert float(loss.detach()) == 0.0 and logp.grad.abs().sum() == 0
    assert st['clip_frac'] == 0.0 and st['approx_kl'] == 0.0 and st['ratio_max'] == 1.0


def test_dtype_follows_logp():
    loss, _ = ppo_policy_loss(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D),
                              torch.ones(1, dtype=D), torch.ones(1, 2))
    assert loss.dtype == D and loss.dim() == 0


@pytest.mark.parametrize('kwargs,match', [
    (dict(old_logp=torch.zeros(2, 4)), 'old_logp'),
    (dict(advantages=torch.zeros(3)), 'advantages'),
    (dict(advantages=torch.zeros(2, 4)), 'advantages'),
    (dict(advantages=torch.zeros(2, dtype=torch.long)), 'advantages'),
    (dict(mask=torch.ones(2)), 'mask'),
    (dict(mask=torch.full((2, 3), 2)), 'mask'),
    (dict(clip_low=-0.1), 'clip_low'),
    (dict(clip_low=1.5), 'clip_low'),
    (dict(clip_low=float('nan')), 'clip_low'),
    (dict(clip_high=-0.2), 'clip_high'),
    (dict(clip_high=True), 'clip_high'),
    (dict(dual_clip=1.0), 'dual_clip'),
    (dict(dual_clip=0.5), 'dual_clip'),
    (dict(dual_clip=math.inf), 'dual_clip'),
    (dict(mode='token-mean'), 'mode'),
    (dict(norm_const=5.0), 'norm_const'),
    (dict(logp=torch.zeros(2, 3, dtype=torch.long)), 'logp'),
    (dict(logp=torch.zeros(6)), 'logp'),
    (dict(logp=torch.tensor([[0.0, float('nan'), 0.0], [0.0, 0.0, 0.0]])), 'logp'),
    (dict(advantages=torch.tensor([float('nan'), 0.0])), 'advantages'),
])
def test_policy_loss_bad_input(kwargs, match):
    args = dict(logp=torch.zeros(2, 3), old_logp=torch.zeros(2, 3), advantages=torch.zeros(2),
                mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ppo_policy_loss(**args)


def test_policy_loss_type_errors():
    with pytest.raises(TypeError, match='logp'):
        ppo_policy_loss([[0.0]], torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1))
    with pytest.raises(TypeError, match='advantages'):
        ppo_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), [0.0], torch.ones(1, 1))
    with pytest.raises(TypeError, match='mask'):
        ppo_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), [[1]])


# ---------------------------------------------------------------- value_loss

def test_value_loss_by_hand():
    v_old = torch.full((1, 5), 0.5, dtype=D)
    ret = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]], dtype=D)
    v = torch.tensor([[0.6, 0.9, 1.4, 0.9, 0.2]], dtype=D, requires_grad=True)
    loss = value_loss(v, v_old, ret, torch.ones(1, 5), clip=0.2)
    loss.backward()
    # clipped predictions: 0.6, 0.7, 0.7, 0.7, 0.3; per token 0.5 * max of the two squared errors
    per = [0.5 * 0.4 ** 2, 0.5 * 0.3 ** 2, 0.5 * 0.4 ** 2, 0.5 * 0.9 ** 2, 0.5 * 0.3 ** 2]
    assert float(loss.detach()) == pytest.approx(sum(per) / 5)
    # gradient (v - R) / 5 where the unclipped error is selected, 0 where the clipped one is
    want = [(-0.4) / 5, 0.0, 0.4 / 5, 0.9 / 5, 0.0]
    assert v.grad[0].tolist() == pytest.approx(want, abs=1e-12)


def test_value_loss_mask_and_no_clip():
    g = torch.Generator().manual_seed(4)
    v, v_old, ret = (torch.randn(3, 4, generator=g, dtype=D) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    loss = value_loss(v, v_old, ret, mask, clip=math.inf)
    keep = mask.bool()
    assert float(loss) == pytest.approx(float(0.5 * ((v - ret)[keep] ** 2).mean()))
    v2 = v.clone()
    v2[~keep] = float('nan')                          # padding may hold anything
    assert float(value_loss(v2, v_old, ret, mask, clip=math.inf)) == pytest.approx(float(loss))
    assert float(value_loss(v, v_old, ret, torch.zeros(3, 4))) == 0.0


def test_value_loss_zero_clip_freezes_gradient_toward_target():
    v_old = torch.tensor([[0.0, 0.0]], dtype=D)
    ret = torch.tensor([[1.0, 1.0]], dtype=D)
    v = torch.tensor([[0.5, -0.5]], dtype=D, requires_grad=True)
    value_loss(v, v_old, ret, torch.ones(1, 2), clip=0.0).backward()
    # token 0 moved toward the target: clipped error (1.0) larger -> no gradient;
    # token 1 moved away: unclipped error (1.5) larger -> gradient (v - R) / 2
    assert v.grad[0].tolist() == pytest.approx([0.0, -0.75])


@pytest.mark.parametrize('kwargs,match', [
    (dict(old_values=torch.zeros(2, 4)), 'old_values'),
    (dict(returns=torch.zeros(2)), 'returns'),
    (dict(mask=torch.ones(3, 3)), 'mask'),
    (dict(values=torch.zeros(6)), 'values'),
    (dict(clip=-0.1), 'clip'),
    (dict(clip=float('nan')), 'clip'),
    (dict(returns=torch.tensor([[0.0, float('nan'), 0.0], [0.0, 0.0, 0.0]])), 'returns'),
])
def test_value_loss_bad_input(kwargs, match):
    args = dict(values=torch.zeros(2, 3), old_values=torch.zeros(2, 3), returns=torch.zeros(2, 3),
                mask=torch.ones(2, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        value_loss(**args)
    with pytest.raises(TypeError, match='values'):
        value_loss([[0.0]], torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1))


# ---------------------------------------------------------------- non-finite input on policy tokens

@pytest.mark.parametrize('adv', [
    torch.tensor([math.inf, 0.0]),                                   # [B]: row 0 has policy tokens
    torch.tensor([[0.0, -math.inf, 0.0], [0.0, 0.0, 0.0]]),          # [B, T]
])
def test_policy_loss_refuses_infinite_advantage_on_policy_token(adv):
    with pytest.raises(ValueError, match='advantages'):
        ppo_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), adv, torch.ones(2, 3))


@pytest.mark.parametrize('value', [-math.inf, math.inf])
def test_policy_loss_refuses_nan_log_ratio_on_policy_token(value):
    logp = torch.zeros(2, 3)
    old = torch.zeros(2, 3)
    logp[1, 2] = old[1, 2] = value                                   # inf - inf = NaN
    with pytest.raises(ValueError, match='logp - old_logp'):
        ppo_policy_loss(logp, old, torch.ones(2), torch.ones(2, 3))


def test_policy_loss_accepts_any_garbage_off_mask():
    # padding holds -inf/-inf log-probs and infinite advantages; only token (0, 0) counts
    logp = torch.tensor([[math.log(1.1), -math.inf, 0.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.0, -math.inf, math.inf]], dtype=D)
    adv = torch.tensor([[2.0, math.inf, -math.inf]], dtype=D)
    loss, st = ppo_policy_loss(logp, old, adv, torch.tensor([[1, 0, 0]]))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.1 * 2.0)         # r = 1.1 inside the clip: -r A
    assert logp.grad[0].tolist() == pytest.approx([-2.2, 0.0, 0.0])  # d(-r A)/d log r = -r A
    assert all(math.isfinite(v) for v in st.values())


def test_dual_clip_message_and_small_c_accepted():
    with pytest.raises(ValueError, match=r'\(1, inf\)'):
        ppo_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), dual_clip=1.0)
    # c = 1.1 is accepted; a token with A = -1 at r = 1.15 (inside [0.8, 1.2]) is then frozen
    loss0, grad0, _ = one_token(1.15, -1.0)
    loss1, grad1, st = one_token(1.15, -1.0, dual_clip=1.1)
    assert (loss0, grad0) == pytest.approx((1.15, 1.15))            # -r A and its gradient -A r
    assert (loss1, grad1) == pytest.approx((1.1, 0.0))              # capped at c |A|, no gradient
    assert st['dual_clip_frac'] == 1.0 and st['clip_frac'] == 0.0


def test_modes_on_ragged_rows_with_empty_row():
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    adv = torch.tensor([[2.0, 9.0, 9.0, 9.0], [1.0, -1.0, 4.0, 9.0], [9.0] * 4], dtype=D)
    logp = torch.full((3, 4), -0.5, dtype=D)                          # r = 1: token loss -A
    # by hand: token losses -2 | -1, 1, -4; the empty row is absent
    want = {'token_mean': -6 / 4, 'seq_mean_token_mean': (-2 + -4 / 3) / 2,
            'seq_mean_token_sum': (-2 + -4) / 2, 'seq_mean_token_sum_norm': (-2 / 4 + -4 / 4) / 2}
    for mode, w in want.items():
        assert float(ppo_policy_loss(logp, logp, adv, mask, mode=mode)[0]) == pytest.approx(w), mode


@pytest.mark.parametrize('name', ['values', 'old_values', 'returns'])
@pytest.mark.parametrize('bad', [math.inf, -math.inf])
def test_value_loss_refuses_infinite_on_policy_token(name, bad):
    args = dict(values=torch.zeros(2, 3), old_values=torch.zeros(2, 3), returns=torch.zeros(2, 3))
    args[name][1, 1] = bad
    with pytest.raises(ValueError, match=name):
        value_loss(mask=torch.ones(2, 3), **args)
    mask = torch.ones(2, 3)
    mask[1, 1] = 0                                                    # the same value on padding is ignored
    assert float(value_loss(mask=mask, **args)) == 0.0
