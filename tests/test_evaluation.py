"""Tests for agentrl.evaluation (Chapter 17). Expected values come from exact integers (math.comb, Fraction),
brute-force enumeration of every k-subset, the exact expectation of pass@k over a binomial count, hand-solved
Wilson quadratics, the exact bootstrap distribution of a mean enumerated over all N^N resamples and the closed
form of its spread, bootstrap loops written out with the same generator, the sample-size formula with
hard-coded normal quantiles, the power it promises and textbook sample sizes, and Chapter 15's pass_rate, which
returns the episodes that sample_counts counts."""
import itertools
import math
from fractions import Fraction
from statistics import NormalDist

import pytest
import torch

import agentrl as arl
import agentrl.evaluation as m
from agentrl.grpo import RLConfig, evaluate, make_rl_base
from agentrl.gym import make_tasks
from agentrl.sft import pass_rate

torch.set_num_threads(1)
INDEX = ('sample_counts', 'pass_at_k', 'wilson_interval', 'bootstrap_ci', 'paired_bootstrap_diff', 'required_units')
Z975, Z80, Z90 = 1.959963984540054, 0.8416212335729143, 1.2815515655446004   # standard normal quantiles


def test_index_exported_with_sections():
    for name in INDEX:
        assert name in m.__all__ and hasattr(arl, name)
        assert 'Defined in Section 17.' in getattr(m, name).__doc__


# ---------------------------------------------------------------- pass_at_k
def exact_pass(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_matches_exact_integers():
    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert m.pass_at_k(n, c, k) == pytest.approx(float(exact_pass(n, c, k)), abs=1e-13)


def test_pass_at_k_matches_enumeration_of_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                share = Fraction(sum(any(outcomes[i] for i in s) for s in subsets), len(subsets))
                assert m.pass_at_k(n, c, k) == pytest.approx(float(share), abs=1e-13)


def test_pass_at_k_edges():
    assert m.pass_at_k(10, 0, 3) == 0.0                       # no success: no subset holds one
    assert m.pass_at_k(10, 8, 3) == 1.0                       # n - c = 2 < k: every subset holds one
    assert m.pass_at_k(10, 4, 1) == pytest.approx(0.4, abs=1e-15)    # pass@1 = c / n
    assert m.pass_at_k(1, 1, 1) == 1.0
    assert isinstance(m.pass_at_k(5, 2, 2), float)


def test_pass_at_k_large_n_stays_finite_and_exact():
    for n, c, k in ((2000, 5, 1000), (5000, 1, 4999), (3000, 1500, 10)):
        assert m.pass_at_k(n, c, k) == pytest.approx(float(exact_pass(n, c, k)), rel=1e-12, abs=1e-15)


def test_pass_at_k_tensor_matches_scalar_loop():
    c = torch.tensor([0, 1, 2, 5, 7, 16])
    got = m.pass_at_k(16, c, 4)
    assert got.shape == (6,) and got.dtype == torch.float64
    want = torch.tensor([float(exact_pass(16, int(x), 4)) for x in c])
    assert torch.allclose(got, want, atol=1e-13)
    grid = torch.tensor([[0, 3], [16, 8]], dtype=torch.int32)          # any shape, any integer dtype
    assert m.pass_at_k(16, grid, 2).shape == (2, 2)


@pytest.mark.parametrize('p', [Fraction(1, 10), Fraction(1, 2), Fraction(7, 9)])
def test_pass_at_k_is_unbiased_over_a_binomial_count(p):
    "E over c ~ Binomial(n, p) of the estimate is 1 - (1 - p)^k: exactly in rationals, to 1e-12 for the function."
    for n in range(1, 13):
        pmf = [math.comb(n, c) * p ** c * (1 - p) ** (n - c) for c in range(n + 1)]
        assert sum(pmf) == 1
        for k in range(1, n + 1):
            truth = 1 - (1 - p) ** k
            assert sum(w * exact_pass(n, c, k) for c, w in enumerate(pmf)) == truth
            plug_in = sum(w * (1 - (1 - Fraction(c, n)) ** k) for c, w in enumerate(pmf))
            assert plug_in < truth if k >= 2 else plug_in == truth          # the plug-in is biased low
            got = m.pass_at_k(n, torch.arange(n + 1), k)                      # every count at once
            assert float(sum(float(w) * x for w, x in zip(pmf, got.tolist()))) == pytest.approx(float(truth),
                                                                                              abs=1e-12)


def test_pass_at_k_is_exactly_one_when_every_subset_holds_a_success():
    got = m.pass_at_k(20, torch.arange(21), 5)
    assert bool((got[16:] == 1.0).all())                                  # n - c = 4 or fewer failures < k = 5
    assert bool((got[:16] < 1.0).all()) and got[0].item() == 0.0
    assert m.pass_at_k(7, 7, 7) == 1.0 and m.pass_at_k(7, 0, 7) == 0.0


def test_pass_at_k_many_counts_at_large_n():
    "O(n) memory: 100,000 counts at n = 5000 (a [100000, 5000] float table would need 4 GB)."
    c = torch.randint(0, 5001, (100_000,), generator=torch.Generator().manual_seed(0))
    got = m.pass_at_k(5000, c, 10)
    assert got.shape == (100_000,) and bool(((got >= 0) & (got <= 1)).all())
    for i in (0, 1, 2, 99_999):
        assert got[i].item() == pytest.approx(float(exact_pass(5000, int(c[i]), 10)), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize('args, err, words', [
    ((8, 3, 9), ValueError, 'k must be <= n'),
    ((8, 9, 2), ValueError, 'c must lie in'),
    ((8, -1, 2), ValueError, 'c must lie in'),
    ((0, 0, 1), ValueError, 'n must be'),
    ((8, 3, 0), ValueError, 'k must be'),
    ((8, 3.0, 2), TypeError, 'c must be an int'),
    ((8, True, 2), TypeError, 'c must be an int'),
    ((8.0, 3, 2), TypeError, 'n must be an int'),
    ((8, 3, 2.0), TypeError, 'k must be an int'),
    ((8, torch.tensor([1.0]), 2), TypeError, 'c must be an int'),
    ((8, torch.tensor([1, 9]), 2), ValueError, 'c must lie in'),
])
def test_pass_at_k_errors(args, err, words):
    with pytest.raises(err, match=words):
        m.pass_at_k(*args)


# ---------------------------------------------------------------- wilson_interval
def wilson_by_hand(c, n, z=1.96):
    "Roots of (1 + z^2/n) p^2 - (2c/n + z^2/n) p + (c/n)^2 = 0, the p with |c/n - p| = z sqrt(p(1-p)/n)."
    a, b, cc = 1 + z * z / n, -(2 * c / n + z * z / n), (c / n) ** 2
    disc = math.sqrt(b * b - 4 * a * cc)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


def test_wilson_hand_values():
    assert m.wilson_interval(0, 10) == (0.0, pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2), abs=1e-14))
    lo, hi = m.wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + 1.96 ** 2), abs=1e-14)
    for c, n, z in ((3, 10, 1.96), (1, 16, 1.96), (8, 16, 1.0), (37, 50, 2.576)):
        assert m.wilson_interval(c, n, z) == pytest.approx(wilson_by_hand(c, n, z), abs=1e-12)


def test_wilson_bounds_are_exact_at_the_ends_and_inside_unit_interval():
    for n in (1, 2, 7, 16, 100):
        lo, hi = m.wilson_interval(torch.arange(n + 1), n)
        assert lo[0].item() == 0.0 and hi[-1].item() == 1.0
        assert bool((lo >= 0).all() and (hi <= 1).all() and (lo < hi).all())
        rate = torch.arange(n + 1) / n
        assert bool((lo <= rate).all() and (rate <= hi).all())


def test_wilson_tensor_matches_scalar_loop():
    c = torch.tensor([[0, 3], [9, 16]])
    lo, hi = m.wilson_interval(c, 16, z=1.5)
    assert lo.shape == (2, 2) and lo.dtype == torch.float64
    for i in range(2):
        for j in range(2):
            assert (lo[i, j].item(), hi[i, j].item()) == pytest.approx(m.wilson_interval(int(c[i, j]), 16, 1.5))


@pytest.mark.parametrize('args, err, words', [
    ((3, 0), ValueError, 'n must be'),
    ((17, 16), ValueError, 'successes must lie in'),
    ((3, 10, 0.0), ValueError, 'z must lie in'),
    ((3, 10, float('nan')), ValueError, 'z must lie in'),
    ((3, 10, float('inf')), ValueError, 'z must lie in'),
    ((0.5, 10), TypeError, 'successes must be an int'),
    ((torch.tensor([0.5]), 10), TypeError, 'successes must be an int'),
    ((3, 10.0), TypeError, 'n must be an int'),
    ((3, 10, '1.96'), TypeError, 'z must be a real'),
])
def test_wilson_errors(args, err, words):
    with pytest.raises(err, match=words):
        m.wilson_interval(*args)


# ---------------------------------------------------------------- bootstrap
def percentile(sorted_means, q):
    "Linear interpolation between order statistics at position q (B - 1), as numpy's default."
    pos = q * (len(sorted_means) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_means) - 1)
    return sorted_means[lo] + (pos - lo) * (sorted_means[hi] - sorted_means[lo])


def loop_bootstrap(values, n_boot, alpha, seed):
    g = torch.Generator().manual_seed(seed)
    n = len(values)
    means = []
    for _ in range(n_boot):
        idx = torch.randint(n, (n,), generator=g).tolist()
        means.append(sum(float(values[i]) for i in idx) / n)
    means.sort()
    return percentile(means, alpha / 2), percentile(means, 1 - alpha / 2)


@pytest.mark.parametrize('alpha', [0.05, 0.2])
def test_bootstrap_matches_explicit_loop(alpha):
    values = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0, 1.0, 0.3])
    got = m.bootstrap_ci(values, n_boot=500, alpha=alpha, generator=torch.Generator().manual_seed(11))
    assert got == pytest.approx(loop_bootstrap(values.tolist(), 500, alpha, 11), abs=1e-12)


def test_bootstrap_default_generator_is_seed_zero_and_inputs_untouched():
    values = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0])
    before = values.clone()
    assert m.bootstrap_ci(values) == m.bootstrap_ci(values, generator=torch.Generator().manual_seed(0))
    assert torch.equal(values, before)
    assert m.bootstrap_ci(torch.tensor([2, 2, 2])) == (2.0, 2.0)        # no spread, integer input


def exact_bootstrap(values):
    "Every one of the N^N equally likely resamples, enumerated -> sorted list of (mean, probability), exact."
    n, atoms = len(values), {}
    for idx in itertools.product(range(n), repeat=n):
        mean = sum(Fraction(values[i]) for i in idx) / n
        atoms[mean] = atoms.get(mean, 0) + Fraction(1, n ** n)
    return sorted(atoms.items())


def atom_at(dist, q):
    "The value whose step of the exact CDF contains level q, and the distance of q from the step's ends."
    below = 0
    for x, p in dist:
        if below < q < below + p:
            return x, min(q - below, below + p - q)
        below += p
    raise AssertionError(f'level {q} falls on a jump of the CDF')


def test_exact_bootstrap_spread_is_the_closed_form():
    "The resampled means have variance s^2 (N-1)/N / N: checks the enumeration used below."
    for values in ([0, 1, 3, 10], [0, 2, 7], [1, 4, 6, 15]):
        n = len(values)
        dist = exact_bootstrap(values)
        mean = Fraction(sum(values), n)
        assert sum(p for _, p in dist) == 1 and sum(x * p for x, p in dist) == mean
        s2 = sum((Fraction(v) - mean) ** 2 for v in values) / (n - 1)           # sample variance
        assert sum((x - mean) ** 2 * p for x, p in dist) == s2 * (n - 1) / n / n


def far_from_jumps(q, gap, n_boot):
    "The level q lies at least five Monte Carlo sd, sqrt(q (1 - q) / n_boot), from a jump of the exact CDF."
    return float(gap) >= 5 * math.sqrt(float(q) * (1 - float(q)) / n_boot)


@pytest.mark.parametrize('values, alpha', [([0, 1, 3, 10], 0.05), ([0, 1, 3, 10], 0.2), ([0, 2, 7], 0.1),
                                           ([1, 9, 12, 15], 0.3), ([-2, 0, 5], 0.2)])
def test_bootstrap_matches_the_exact_bootstrap_distribution(values, alpha):
    """With N = 3 or 4 units the bootstrap distribution of the mean is known exactly; 40,000 resamples put
    both percentiles on the exact atom, since each level is at least five Monte Carlo sd from a jump (checked
    here: 7 to 32 sd for these cases)."""
    dist = exact_bootstrap(values)
    q_lo, q_hi = Fraction(alpha) / 2, 1 - Fraction(alpha) / 2
    (lo_x, lo_gap), (hi_x, hi_gap) = atom_at(dist, q_lo), atom_at(dist, q_hi)
    assert far_from_jumps(q_lo, lo_gap, 40_000) and far_from_jumps(q_hi, hi_gap, 40_000)
    lo, hi = m.bootstrap_ci(torch.tensor(values, dtype=torch.float64), n_boot=40_000, alpha=alpha,
                            generator=torch.Generator().manual_seed(1))
    assert (lo, hi) == pytest.approx((float(lo_x), float(hi_x)), abs=1e-12)


def test_paired_bootstrap_matches_the_exact_distribution_of_the_differences():
    a = torch.tensor([1.0, 5.0, 2.0, 9.0])
    b = torch.tensor([1.0, 4.0, 0.0, -1.0])                                  # differences 0, 1, 2, 10
    dist = exact_bootstrap([0, 1, 2, 10])
    diff, lo, hi = m.paired_bootstrap_diff(a, b, n_boot=40_000, alpha=0.2, generator=torch.Generator().manual_seed(2))
    (lo_x, lo_gap), (hi_x, hi_gap) = atom_at(dist, Fraction(1, 10)), atom_at(dist, Fraction(9, 10))
    assert far_from_jumps(Fraction(1, 10), lo_gap, 40_000) and far_from_jumps(Fraction(9, 10), hi_gap, 40_000)
    assert diff == 3.25 and (lo, hi) == pytest.approx((float(lo_x), float(hi_x)), abs=1e-12)


def test_bootstrap_spread_matches_the_closed_form_for_many_units():
    "At alpha = 2 Phi(-1) the half-width approaches one sd of the resampled means, s sqrt((N-1)/N) / sqrt(N)."
    values = torch.rand(60, generator=torch.Generator().manual_seed(3))
    alpha = 2 * NormalDist().cdf(-1.0)
    lo, hi = m.bootstrap_ci(values, n_boot=40_000, alpha=alpha, generator=torch.Generator().manual_seed(4))
    n = values.numel()
    want = values.std().item() * math.sqrt((n - 1) / n) / math.sqrt(n)
    assert (hi - lo) / 2 == pytest.approx(want, rel=0.03)


def test_paired_bootstrap_matches_loop_over_pairs():
    a = torch.tensor([0.9, 0.2, 0.7, 0.4, 1.0, 0.1, 0.6, 0.3])
    b = torch.tensor([0.8, 0.2, 0.5, 0.45, 0.9, 0.0, 0.6, 0.1])
    diff, lo, hi = m.paired_bootstrap_diff(a, b, n_boot=400, alpha=0.1, generator=torch.Generator().manual_seed(5))
    assert diff == pytest.approx(sum(x - y for x, y in zip(a.tolist(), b.tolist())) / 8, abs=1e-15)
    g = torch.Generator().manual_seed(5)
    means = []
    for _ in range(400):
        idx = torch.randint(8, (8,), generator=g).tolist()      # one index draws both values of a unit
        means.append(sum(a[i].item() - b[i].item() for i in idx) / 8)
    means.sort()
    assert (lo, hi) == pytest.approx((percentile(means, 0.05), percentile(means, 0.95)), abs=1e-12)


def test_paired_constant_difference_has_zero_width():
    a = torch.linspace(0.1, 1.0, 10)
    b = a - 0.05
    _, lo, hi = m.paired_bootstrap_diff(a, b)
    assert lo == pytest.approx(0.05) and hi == pytest.approx(0.05)


@pytest.mark.parametrize('kwargs, err, words', [
    (dict(values=[0.1, 0.2]), TypeError, 'values must be a torch.Tensor'),
    (dict(values=torch.tensor([0.1])), ValueError, 'N >= 2'),
    (dict(values=torch.ones(2, 3)), ValueError, 'shape \\[N\\]'),
    (dict(values=torch.tensor([0.1, float('nan')])), ValueError, 'NaN or inf'),
    (dict(values=torch.tensor([True, False])), TypeError, 'real numbers'),
    (dict(values=torch.ones(3), n_boot=1), ValueError, 'n_boot'),
    (dict(values=torch.ones(3), n_boot=10.0), TypeError, 'n_boot'),
    (dict(values=torch.ones(3), alpha=0.0), ValueError, 'alpha'),
    (dict(values=torch.ones(3), generator=0), TypeError, 'generator'),
])
def test_bootstrap_errors(kwargs, err, words):
    with pytest.raises(err, match=words):
        m.bootstrap_ci(**kwargs)


def test_paired_errors_name_the_argument():
    with pytest.raises(ValueError, match='same shape|one shape'):
        m.paired_bootstrap_diff(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match='b must be'):
        m.paired_bootstrap_diff(torch.ones(3), [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match='a must have'):
        m.paired_bootstrap_diff(torch.ones(1), torch.ones(1))


# ---------------------------------------------------------------- required_units
@pytest.mark.parametrize('sd, effect, power, zp', [
    (0.3, 0.05, 0.8, Z80), (0.1, 0.05, 0.8, Z80), (1.0, 0.5, 0.9, Z90), (0.43, 0.05, 0.8, Z80), (2.0, 0.1, 0.8, Z80)])
def test_required_units_hand_formula(sd, effect, power, zp):
    want = math.ceil(((Z975 + zp) * sd / effect) ** 2)
    assert m.required_units(sd, effect, power=power) == want


def test_required_units_known_values_and_scaling():
    assert m.required_units(0.3, 0.05) == 283                  # (2.8016 * 6)^2 = 282.56
    assert m.required_units(1.0, 1.0) == 8                     # 2.8016^2 = 7.85
    assert m.required_units(10.0, 0.01, alpha=0.01) > m.required_units(10.0, 0.01)
    assert m.required_units(0.001, 1.0) == 1                   # never fewer than one unit
    assert isinstance(m.required_units(0.3, 0.05), int)


def normal_power(n_units, sd, effect, alpha):
    "Power of the two-sided z-test with n_units units (the far tail ignored, as the sample-size formula does)."
    return NormalDist().cdf(math.sqrt(n_units) * effect / sd - NormalDist().inv_cdf(1 - alpha / 2))


@pytest.mark.parametrize('sd, effect, alpha, power', [
    (0.3, 0.05, 0.05, 0.8), (0.309, 0.05, 0.05, 0.8), (1.0, 0.5, 0.05, 0.9), (0.2, 0.07, 0.01, 0.8),
    (2.0, 0.1, 0.1, 0.95), (1.0, 0.9, 0.05, 0.5)])
def test_required_units_is_the_smallest_count_with_the_power(sd, effect, alpha, power):
    n_units = m.required_units(sd, effect, alpha=alpha, power=power)
    assert normal_power(n_units, sd, effect, alpha) >= power - 1e-9
    assert n_units == 1 or normal_power(n_units - 1, sd, effect, alpha) < power


def test_required_units_textbook_values():
    "Two-sided z-test, alpha 0.05, power 0.8: n = 7.85 / d^2 with d = effect / sd (Cohen, 1988)."
    assert m.required_units(2.0, 1.0) == 32                   # d = 0.5 ("medium"): 31.4 -> 32
    assert m.required_units(1.0, 0.8) == 13                   # d = 0.8 ("large"): 12.3 -> 13
    assert m.required_units(1.0, 0.2) == 197                  # d = 0.2 ("small"): 196.2 -> 197


def test_required_units_does_not_round_up_an_integer():
    sd = 4 / (Z975 + Z80)                                      # (z * sd / 1)^2 = 16 up to rounding
    assert m.required_units(sd, 1.0) == 16


@pytest.mark.parametrize('kwargs, err, words', [
    (dict(sd=0.0, effect=0.1), ValueError, 'sd'),
    (dict(sd=-1.0, effect=0.1), ValueError, 'sd'),
    (dict(sd=float('inf'), effect=0.1), ValueError, 'sd'),
    (dict(sd=0.3, effect=0.0), ValueError, 'effect'),
    (dict(sd=0.3, effect=0.1, alpha=1.0), ValueError, 'alpha'),
    (dict(sd=0.3, effect=0.1, power=1.0), ValueError, 'power'),
    (dict(sd=0.3, effect=0.1, power=0.01), ValueError, 'power'),
    (dict(sd='0.3', effect=0.1), TypeError, 'sd'),
    (dict(sd=0.3, effect=None), TypeError, 'effect'),
])
def test_required_units_errors(kwargs, err, words):
    with pytest.raises(err, match=words):
        m.required_units(**kwargs)


# ---------------------------------------------------------------- sample_counts
@pytest.fixture(scope='module')
def base(tok):
    return make_rl_base(tok)


def test_sample_counts_counts_the_episodes_of_pass_rate(tok, base):
    "pass_rate (Chapter 15) draws the same episodes from the same seed and returns them: count them per task."
    tasks = make_tasks('test')[:6]
    counts = m.sample_counts(base, tasks, tok, 8, generator=torch.Generator().manual_seed(3))
    _, trajs = pass_rate(base, tasks, tok, n_samples=8, seed=3)
    want = [sum(int(t.info['submitted'] and t.info['hidden_pass']) for t in trajs[8 * i:8 * i + 8])
            for i in range(len(tasks))]
    assert counts.tolist() == want
    assert counts.dtype == torch.int64 and counts.shape == (6,)


def test_sample_counts_sum_is_evaluate_pass_rate(tok, base):
    tasks = make_tasks('heldout')[:5]
    cfg = RLConfig(seed=4)
    counts = m.sample_counts(base, tasks, tok, 4, cfg=cfg)                # generator None: cfg.seed + 1
    stats = evaluate(base, tasks, tok, n_samples=4, cfg=cfg)
    assert counts.sum().item() / 20 == stats['pass_rate']
    assert bool(((counts >= 0) & (counts <= 4)).all())


def test_sample_counts_one_sample_and_mode_restored(tok, tiny):
    tiny.train()
    counts = m.sample_counts(tiny, make_tasks('test')[:3], tok, 1, generator=torch.Generator().manual_seed(0))
    assert counts.shape == (3,) and bool(((counts == 0) | (counts == 1)).all())
    assert tiny.training


@pytest.mark.parametrize('kwargs, err, words', [
    (dict(n=0), ValueError, 'n must be'),
    (dict(n=2.0), TypeError, 'n must be an int'),
    (dict(n=2, generator=5), TypeError, 'generator'),
    (dict(n=2, cfg='default'), TypeError, 'cfg'),
])
def test_sample_counts_errors(tok, tiny, kwargs, err, words):
    with pytest.raises(err, match=words):
        m.sample_counts(tiny, make_tasks('test')[:2], tok, **kwargs)
    with pytest.raises(ValueError, match='tasks'):
        m.sample_counts(tiny, [], tok, 2)
    with pytest.raises(TypeError, match='model must be a TinyAgent'):
        m.sample_counts('agent', make_tasks('test')[:2], tok, 2)
    with pytest.raises(TypeError, match='tok must be a Tokenizer'):
        m.sample_counts(tiny, make_tasks('test')[:2], 'tok', 2)
