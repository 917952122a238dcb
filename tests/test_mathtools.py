"""Tests for agentrl.mathtools (Appendix A). Reference values are computed by hand or by plain loops."""
import math

import pytest
import torch

from agentrl.mathtools import mc_mean_and_stderr


def loop_mean_stderr(values):
    """Reference: mean and s/sqrt(n) with the n-1 denominator, in plain Python floats."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def test_hand_computation():
    mean, se = mc_mean_and_stderr(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert mean.item() == pytest.approx(2.5)
    # deviations -1.5, -0.5, 0.5, 1.5 -> sum of squares 5 -> s^2 = 5/3 -> se = sqrt(5/3)/2
    assert se.item() == pytest.approx(math.sqrt(5 / 3) / 2, rel=1e-6)


def test_two_samples_minimum():
    mean, se = mc_mean_and_stderr(torch.tensor([0.0, 2.0]))
    assert mean.item() == pytest.approx(1.0)
    assert se.item() == pytest.approx(1.0)          # s^2 = (1 + 1)/1 = 2, se = sqrt(2/2)


def test_constant_samples_give_zero_not_nan():
    mean, se = mc_mean_and_stderr(torch.full((5,), 3.25))
    assert mean.item() == 3.25 and se.item() == 0.0


def test_batched_shapes_and_values_match_loop():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    mean, se = mc_mean_and_stderr(x)
    assert mean.shape == (3, 4) and se.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            ref_mean, ref_se = loop_mean_stderr(x[i, j].tolist())
            assert mean[i, j].item() == pytest.approx(ref_mean, abs=1e-12)
            assert se[i, j].item() == pytest.approx(ref_se, abs=1e-12)


@pytest.mark.parametrize('shape', [(6,), (2, 6), (2, 3, 6), (0, 6)])
def test_output_shape_drops_last_axis(shape):
    mean, se = mc_mean_and_stderr(torch.ones(shape))
    assert mean.shape == shape[:-1] and se.shape == shape[:-1]


def test_float64_precision_and_dtype():
    x = 1e8 + torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    mean, se = mc_mean_and_stderr(x)
    assert mean.dtype == torch.float64 and se.dtype == torch.float64
    assert mean.item() == 1e8 + 2.5
    assert se.item() == pytest.approx(math.sqrt(5 / 3) / 2, rel=1e-9)


def test_float32_kept():
    mean, se = mc_mean_and_stderr(torch.tensor([1.0, 2.0], dtype=torch.float32))
    assert mean.dtype == torch.float32 and se.dtype == torch.float32


def test_integer_and_bool_give_float64():
    mean, se = mc_mean_and_stderr(torch.tensor([0, 1, 1, 0, 1]))
    assert mean.dtype == torch.float64 and se.dtype == torch.float64
    assert mean.item() == pytest.approx(0.6, abs=1e-15)
    assert se.item() == pytest.approx(math.sqrt(0.3 / 5), rel=1e-12)   # s^2 = 1.2/4
    mean_b, se_b = mc_mean_and_stderr(torch.tensor([False, True, True, False, True]))
    assert mean_b.dtype == torch.float64
    assert mean_b.item() == pytest.approx(0.6) and se_b.item() == pytest.approx(se.item())


def test_large_integers_keep_full_precision():
    # float32 stores only multiples of 4 near 2^25; by hand: mean 2^25 + 2, s^2 = (1 + 1)/1 = 2, se = sqrt(2/2) = 1
    mean, se = mc_mean_and_stderr(torch.tensor([2 ** 25 + 1, 2 ** 25 + 3]))
    assert mean.dtype == torch.float64
    assert mean.item() == 33554434.0
    assert se.item() == 1.0


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float64(dtype):
    # squares of +-1000 overflow float16 (max 65504); by hand s^2 = 2e6, se = sqrt(2e6 / 2) = 1000
    mean, se = mc_mean_and_stderr(torch.tensor([-1000.0, 1000.0], dtype=dtype))
    assert mean.dtype == dtype and se.dtype == dtype
    assert mean.item() == 0.0
    assert se.item() == 1000.0
    # 1000 draws of 0.1 summed in float16 would drift; the float64 loop is the reference
    x = torch.full((1000,), 0.1, dtype=dtype)
    ref_mean, _ = loop_mean_stderr(x.double().tolist())
    mean, se = mc_mean_and_stderr(x)
    assert mean.item() == ref_mean and se.item() == 0.0


def test_stderr_tracks_sigma_over_sqrt_n():
    # 4000 seeded repeats of n = 50 draws with sigma = 2: spread of the means and the
    # average reported stderr both approach 2 / sqrt(50) = 0.2828.
    gen = torch.Generator().manual_seed(1)
    x = 2.0 * torch.randn(4000, 50, generator=gen, dtype=torch.float64)
    mean, se = mc_mean_and_stderr(x)
    target = 2.0 / math.sqrt(50)
    assert mean.std().item() == pytest.approx(target, rel=0.05)
    assert se.mean().item() == pytest.approx(target, rel=0.05)


def test_differentiable():
    x = torch.tensor([1.0, 2.0, 4.0], requires_grad=True)
    mean, _ = mc_mean_and_stderr(x)
    mean.backward()
    assert torch.allclose(x.grad, torch.full((3,), 1 / 3))


@pytest.mark.parametrize('bad', [[1.0, 2.0], (1.0, 2.0), 3.0])
def test_non_tensor_raises_type_error(bad):
    with pytest.raises(TypeError, match='^mc_mean_and_stderr: samples'):
        mc_mean_and_stderr(bad)


def test_complex_raises_type_error():
    with pytest.raises(TypeError, match='^mc_mean_and_stderr: samples'):
        mc_mean_and_stderr(torch.tensor([1 + 1j, 2 + 0j]))


@pytest.mark.parametrize('bad', [torch.tensor(1.0), torch.tensor([5.0]), torch.ones(3, 1), torch.ones(3, 0)])
def test_too_few_samples_raise_value_error(bad):
    with pytest.raises(ValueError, match='^mc_mean_and_stderr: samples'):
        mc_mean_and_stderr(bad)


@pytest.mark.parametrize('value', [float('nan'), float('inf'), float('-inf')])
def test_non_finite_raises_value_error(value):
    with pytest.raises(ValueError, match='^mc_mean_and_stderr: samples'):
        mc_mean_and_stderr(torch.tensor([[1.0, 2.0], [value, 0.0]]))
