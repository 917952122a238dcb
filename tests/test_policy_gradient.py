"""Tests for agentrl.policy_gradient (Chapter 6). Expected values are computed by hand or by plain loops."""
import math

import pytest
import torch

import agentrl.policy_gradient as m

# A ragged batch: rows of 4, 2, 1 and 0 policy tokens (the last row is empty).
X = [[1.0, 2.0, 3.0, 4.0],
     [5.0, 6.0, float('nan'), 8.0],      # NaN sits on padding: must not leak
     [0.0, 7.0, 0.0, 0.0],
     [9.0, 9.0, 9.0, 9.0]]
MASK = [[1, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 0, 0]]


def _rows():
    "Masked values of each row, by a plain loop."
    return [[x for x, k in zip(xr, mr) if k] for xr, mr in zip(X, MASK)]


def _hand(mode, c=4.0):
    rows = [r for r in _rows() if r]                 # non-empty rows only
    if mode == 'token_mean':
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == 'seq_mean_token_mean':
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == 'seq_mean_token_sum':
        return sum(sum(r) for r in rows) / len(rows)
    return sum(sum(r) / c for r in rows) / len(rows)


def test_hand_numbers_are_what_we_think():
    # 10 + 11 + 7 = 28 over 7 tokens; row means 2.5, 5.5, 7; three non-empty rows
    assert _hand('token_mean') == pytest.approx(4.0)
    assert _hand('seq_mean_token_mean') == pytest.approx(5.0)
    assert _hand('seq_mean_token_sum') == pytest.approx(28 / 3)
    assert _hand('seq_mean_token_sum_norm') == pytest.approx(28 / 12)


@pytest.mark.parametrize('mode', m.LOSS_AGG_MODES)
@pytest.mark.parametrize('mask_dtype', [torch.bool, torch.long, torch.float32])
def test_aggregate_modes_match_hand(mode, mask_dtype):
    x = torch.tensor(X)
    mask = torch.tensor(MASK).to(mask_dtype)
    got = m.aggregate_loss(x, mask, mode)
    assert got.shape == ()
    assert float(got) == pytest.approx(_hand(mode), rel=1e-6)


def test_norm_const_explicit():
    got = m.aggregate_loss(torch.tensor(X), torch.tensor(MASK), 'seq_mean_token_sum_norm', norm_const=10)
    assert float(got) == pytest.approx(_hand('seq_mean_token_sum_norm', c=10.0))


@pytest.mark.parametrize('mode', m.LOSS_AGG_MODES)
def test_aggregate_gradient_is_token_weight(mode):
    # d loss / d x[b, t] is the weight of token (b, t): check against the formula per mode.
    x = torch.tensor(X).nan_to_num(0.0).requires_grad_(True)
    m.aggregate_loss(x, torch.tensor(MASK), mode).backward()
    n = [sum(r) for r in MASK]                      # 4, 2, 1, 0
    R, N, T = 3, 7, 4
    for b in range(4):
        for t in range(4):
            if not MASK[b][t]:
                w = 0.0
            elif mode == 'token_mean':
                w = 1 / N
            elif mode == 'seq_mean_token_mean':
                w = 1 / (R * n[b])
            elif mode == 'seq_mean_token_sum':
                w = 1 / R
            else:
                w = 1 / (R * T)
            assert float(x.grad[b, t]) == pytest.approx(w, abs=1e-7)


@pytest.mark.parametrize('mode', m.LOSS_AGG_MODES)
def test_all_zero_mask_gives_zero_not_nan(mode):
    x = torch.randn(3, 5, requires_grad=True)
    out = m.aggregate_loss(x, torch.zeros(3, 5), mode)
    assert float(out.detach()) == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(3, 5))


def test_aggregate_validation():
    x, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match='mode'):
        m.aggregate_loss(x, mask, 'token-mean')
    with pytest.raises(ValueError, match='mask'):
        m.aggregate_loss(x, torch.ones(2, 1))          # would broadcast silently
    with pytest.raises(ValueError, match='per_token'):
        m.aggregate_loss(torch.zeros(6), torch.ones(6))
    with pytest.raises(ValueError, match='per_token'):
        m.aggregate_loss(torch.zeros(2, 3, dtype=torch.long), mask)
    with pytest.raises(TypeError, match='per_token'):
        m.aggregate_loss([[0.0]], torch.ones(1, 1))
    with pytest.raises(ValueError, match='norm_const'):
        m.aggregate_loss(x, mask, 'token_mean', norm_const=4)
    with pytest.raises(ValueError, match='norm_const'):
        m.aggregate_loss(x, mask, 'seq_mean_token_sum_norm', norm_const=0)
    with pytest.raises(ValueError, match='mask'):
        m.aggregate_loss(x, torch.full((2, 3), 0.5))


def test_masked_mean_values():
    x, mask = torch.tensor(X), torch.tensor(MASK)
    assert float(m.masked_mean(x, mask)) == pytest.approx(28 / 7)
    rows = m.masked_mean(x, mask, dim=1)
    assert rows.tolist() == pytest.approx([2.5, 5.5, 7.0, 0.0])
    cols = m.masked_mean(x, mask, dim=0)           # columns: [1,5], [2,6,7], [3], [4]
    assert cols.tolist() == pytest.approx([3.0, 5.0, 3.0, 4.0])
    assert m.masked_mean(x, mask, dim=-1).tolist() == pytest.approx(rows.tolist())
    assert float(m.masked_mean(torch.randn(2, 3), torch.zeros(2, 3))) == 0.0


def test_masked_mean_validation():
    with pytest.raises(ValueError, match='mask'):
        m.masked_mean(torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match='dim'):
        m.masked_mean(torch.zeros(2, 3), torch.ones(2, 3), dim=2)
    with pytest.raises(ValueError, match='x'):
        m.masked_mean(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3))
    with pytest.raises(TypeError, match='mask'):
        m.masked_mean(torch.zeros(2, 3), [[1, 1, 1], [1, 1, 1]])


@pytest.mark.parametrize('mode', m.LOSS_AGG_MODES)
def test_reinforce_gradient_hand(mode):
    # loss = sum_bt w_bt * (-A_b * logp_bt), so d loss / d logp_bt = -A_b * w_bt.
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, -0.7]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0], requires_grad=True)
    loss = m.reinforce_loss(logp, adv, mask, mode)
    loss.backward()
    n, R, N, T = [2, 3], 2, 5, 3
    w = {'token_mean': lambda b: 1 / N, 'seq_mean_token_mean': lambda b: 1 / (R * n[b]),
         'seq_mean_token_sum': lambda b: 1 / R, 'seq_mean_token_sum_norm': lambda b: 1 / (R * T)}[mode]
    value = 0.0
    for b in range(2):
        for t in range(3):
            g = -[2.0, -1.0][b] * w(b) if mask[b, t] else 0.0
            assert float(logp.grad[b, t]) == pytest.approx(g, abs=1e-7)
            value += g * float(logp.detach()[b, t])
    assert float(loss.detach()) == pytest.approx(value, abs=1e-6)
    assert adv.grad is None                       # advantages are detached


def test_reinforce_finite_difference_and_token_advantages():
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 1, 2], [3, 3, 1]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    adv = torch.tensor([[0.5, -1.0, 2.0], [1.5, 9.0, -0.5]], dtype=torch.float64)

    def f(th):
        logp = torch.log_softmax(th, -1).gather(-1, ids[..., None]).squeeze(-1)
        return m.reinforce_loss(logp, adv, mask, 'seq_mean_token_mean')
    f(theta).backward()
    eps = 1e-6
    for idx in [(0, 0, 0), (0, 2, 3), (1, 1, 3), (1, 2, 1)]:
        tp, tm = theta.detach().clone(), theta.detach().clone()
        tp[idx] += eps
        tm[idx] -= eps
        fd = (f(tp) - f(tm)) / (2 * eps)
        assert float(theta.grad[idx]) == pytest.approx(float(fd), abs=1e-7)
    assert float(theta.grad[1, 1].abs().sum()) == 0.0      # masked token: no gradient


def test_reinforce_validation():
    logp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match='advantages'):
        m.reinforce_loss(logp, torch.zeros(3), mask)
    with pytest.raises(ValueError, match='advantages'):
        m.reinforce_loss(logp, torch.zeros(2, 1), mask)
    with pytest.raises(ValueError, match='logp'):
        m.reinforce_loss(torch.zeros(6), torch.zeros(6), torch.ones(6))
    with pytest.raises(ValueError, match='mask'):
        m.reinforce_loss(logp, torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(TypeError, match='advantages'):
        m.reinforce_loss(logp, [1.0, 2.0], mask)
    for bad in (float('nan'), float('inf'), -float('inf')):
        with pytest.raises(ValueError, match='advantages'):
            m.reinforce_loss(logp, torch.tensor([0.0, bad]), mask)
        with pytest.raises(ValueError, match='advantages'):
            m.reinforce_loss(logp, torch.tensor([[0.0, 0.0, 0.0], [0.0, bad, 0.0]]), mask)


def test_reinforce_non_finite_advantages_off_the_mask_are_ignored():
    # Hand value: token_mean over the 3 masked tokens of -A * logp = -(1*-1 + 1*-2 + 2*-4) / 3 = 11/3.
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, float('nan')], [2.0, float('inf'), float('nan')]])
    assert m.reinforce_loss(logp, adv, mask).item() == pytest.approx(11 / 3)
    # a NaN advantage for a row with no policy token is harmless too: that row is absent
    empty = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert m.reinforce_loss(logp, torch.tensor([1.0, float('nan')]), empty).item() == pytest.approx(1.5)


# ---------------------------------------------------------------- Sections 6.5-6.6: agents and steps
from agentrl.trajectories import Trajectory, build_tokenizer, collate          # noqa: E402
from agentrl.gym import make_tasks                                            # noqa: E402
from agentrl.policies import TinyAgent                                        # noqa: E402


def _traj(n_tokens, n_policy, reward, **info):
    """A hand-built Trajectory: n_tokens ids, the last n_policy positions belong to the policy."""
    mask = torch.zeros(n_tokens - 1)
    if n_policy:
        mask[-n_policy:] = 1.0
    base = dict(submitted=True, hidden_pass=False, turns=1, invalid=0)
    base.update(info)
    return Trajectory(ids=torch.arange(n_tokens) % 7, action_mask=mask, sample_logp=torch.zeros(n_tokens - 1),
                      owner=torch.zeros(n_tokens, dtype=torch.long), turn=torch.zeros(n_tokens, dtype=torch.long),
                      reward=reward, info=base)


def test_rollout_stats_hand_built():
    trajs = [_traj(10, 4, 1.0, submitted=True, hidden_pass=True, turns=4, invalid=0),
             _traj(6, 3, 0.0, submitted=False, hidden_pass=True, turns=6, invalid=2),   # passing but unsubmitted
             _traj(5, 2, 0.5, submitted=True, hidden_pass=False, turns=2, invalid=1)]
    st = m.rollout_stats(trajs)
    assert set(st) == {'reward', 'pass_rate', 'valid_calls', 'submit_rate', 'turns', 'action_tokens'}
    assert all(isinstance(v, float) for v in st.values())
    assert st['reward'] == pytest.approx(1.5 / 3)
    assert st['pass_rate'] == pytest.approx(1 / 3)        # only the submitted pass counts
    assert st['valid_calls'] == pytest.approx(1 - 3 / 12)  # pooled over 12 calls
    assert st['submit_rate'] == pytest.approx(2 / 3)
    assert st['turns'] == pytest.approx(12 / 3)
    assert st['action_tokens'] == pytest.approx(9 / 3)


def test_rollout_stats_validation():
    with pytest.raises(ValueError, match='trajs'):
        m.rollout_stats([])
    with pytest.raises(TypeError, match='trajs'):
        m.rollout_stats(_traj(5, 2, 0.0))
    with pytest.raises(TypeError, match=r'trajs\[1\]'):
        m.rollout_stats([_traj(5, 2, 0.0), {'reward': 1.0}])
    bad = _traj(5, 2, 0.0)
    del bad.info['invalid']
    with pytest.raises(ValueError, match='invalid'):
        m.rollout_stats([bad])


@pytest.fixture(scope='module')
def tok():
    return build_tokenizer(make_tasks('all'))


def test_make_base_agent_deterministic(tok, monkeypatch):
    monkeypatch.setenv('AGENTRL_CACHE', 'off')          # train every time: determinism of training itself
    kw = dict(kinds=('blind',), episodes_per_task=1, steps=3, batch_size=4)
    a, b = m.make_base_agent(tok, seed=3, **kw), m.make_base_agent(tok, seed=3, **kw)
    c = m.make_base_agent(tok, seed=4, **kw)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert not a.training and a.config.vocab_size == len(tok)


def test_make_base_agent_learns_the_grammar(tok):
    # 20 steps on blind play: the NLL of the call tokens must fall well below uniform guessing (log V).
    from agentrl.gym import BugFixEnv, scripted_policy
    from agentrl.trajectories import scripted_rollout
    from agentrl.policies import sequence_log_probs
    model = m.make_base_agent(tok, kinds=('blind',), episodes_per_task=1, steps=20, batch_size=16)
    demo = [scripted_rollout(scripted_policy('blind', 9), BugFixEnv(), t, tok) for t in make_tasks('train')[:8]]
    batch = collate(demo, tok.pad_id)
    with torch.no_grad():
        nll = -m.masked_mean(sequence_log_probs(model, batch['ids']), batch['action_mask'])
    assert float(nll) < 0.5 * math.log(len(tok))


SMALL = dict(kinds=('blind',), episodes_per_task=1, steps=4, batch_size=8)


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    import pathlib
    monkeypatch.delenv('AGENTRL_CACHE', raising=False)
    assert m.cache_dir() == pathlib.Path.home() / '.cache' / 'agentrl'
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    assert m.cache_dir() == tmp_path
    monkeypatch.setenv('AGENTRL_CACHE', 'off')
    assert m.cache_dir() is None


def test_weights_cache_loads_bit_identical_weights_without_training(tok, monkeypatch, tmp_path):
    monkeypatch.setenv('AGENTRL_CACHE', 'off')
    fresh = m.make_base_agent(tok, seed=2, **SMALL)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    first = m.make_base_agent(tok, seed=2, **SMALL)                   # trains and stores
    assert len(list(tmp_path.glob('make_base_agent-*.pt'))) == 1
    def no_training(*args, **kwargs):
        raise AssertionError('a cached call must not train')
    monkeypatch.setattr(m, '_behaviour_clone', no_training)
    second = m.make_base_agent(tok, seed=2, **SMALL)                  # loads
    assert _same_weights(fresh, first) and _same_weights(fresh, second)
    assert not second.training
    after_load = torch.rand(3)                                        # global generator after a cached call
    monkeypatch.undo()
    monkeypatch.setenv('AGENTRL_CACHE', 'off')
    m.make_base_agent(tok, seed=2, **SMALL)
    assert torch.equal(torch.rand(3), after_load)                     # ... is where training leaves it


def test_weights_cache_key_covers_the_arguments(tok, monkeypatch, tmp_path):
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    a = m.make_base_agent(tok, seed=2, **SMALL)
    b = m.make_base_agent(tok, seed=3, **SMALL)
    c = m.make_base_agent(tok, seed=2, **{**SMALL, 'steps': 5})
    assert len(list(tmp_path.glob('make_base_agent-*.pt'))) == 3
    assert not _same_weights(a, b) and not _same_weights(a, c)


def test_weights_cache_replaces_a_damaged_file(tok, monkeypatch, tmp_path):
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    good = m.make_base_agent(tok, seed=2, **SMALL)
    (path,) = tmp_path.glob('make_base_agent-*.pt')
    path.write_bytes(b'not a checkpoint')
    again = m.make_base_agent(tok, seed=2, **SMALL)
    assert _same_weights(good, again) and path.stat().st_size > 1000


def test_weights_cache_two_processes_at_once(tmp_path):
    """Two processes that want the same weights at the same moment: one file, identical weights."""
    import os
    import subprocess
    import sys
    code = ("import torch; from agentrl.gym import make_tasks; from agentrl.trajectories import build_tokenizer; "
            "from agentrl.policy_gradient import make_base_agent; tok = build_tokenizer(make_tasks('all')); "
            "m = make_base_agent(tok, seed=5, kinds=('blind',), episodes_per_task=1, steps=30, batch_size=8); "
            "print(repr(sum(p.sum().item() for p in m.parameters())))")
    env = dict(os.environ, AGENTRL_CACHE=str(tmp_path), OMP_NUM_THREADS='1')
    procs = [subprocess.Popen([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    sums = [p.communicate(timeout=240)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and sums[0] == sums[1]
    assert len(list(tmp_path.glob('make_base_agent-*.pt'))) == 1 and not list(tmp_path.glob('*.tmp*'))


def test_make_base_agent_validation(tok):
    with pytest.raises(ValueError, match='kinds'):
        m.make_base_agent(tok, kinds=())
    with pytest.raises(ValueError, match='steps'):
        m.make_base_agent(tok, steps=0)
    with pytest.raises(ValueError, match='batch_size'):
        m.make_base_agent(tok, batch_size=-1)
    with pytest.raises(ValueError, match='lr'):
        m.make_base_agent(tok, lr=0.0)


def _tiny_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 20, (3, 6), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=torch.float32)
    return {'ids': ids, 'action_mask': mask}


def _manual_grads(model, batch, adv):
    """Gradient of the token_mean REINFORCE loss written out with plain tensor ops."""
    model.zero_grad()
    logits = model(batch['ids'])[:, :-1]                                   # [B, T-1, V]
    logp = torch.log_softmax(logits, -1).gather(-1, batch['ids'][:, 1:, None]).squeeze(-1)
    mask = batch['action_mask']
    loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_policy_gradient_step_is_sgd_on_the_loss():
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=16)
    batch, adv = _tiny_batch(), torch.tensor([1.0, -0.5, 2.0])
    ref = TinyAgent(model.config)
    ref.load_state_dict(model.state_dict())
    loss_ref, grads = _manual_grads(ref, batch, adv)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = m.policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, adv, max_grad_norm=None)
    assert out['loss'] == pytest.approx(loss_ref, abs=1e-6)
    norm = torch.cat([g.flatten() for g in grads.values()]).norm()
    assert out['grad_norm'] == pytest.approx(float(norm), rel=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(p.detach(), before[n] - 0.1 * grads[n], atol=1e-6)


def test_policy_gradient_step_clips():
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=16)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    out = m.policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=1.0), _tiny_batch(),
                                 torch.tensor([50.0, -50.0, 80.0]), max_grad_norm=0.01)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert out['grad_norm'] > 0.01                             # reported before clipping
    assert float((after - before).norm()) == pytest.approx(0.01, rel=1e-3)


def test_policy_gradient_step_validation():
    model = TinyAgent(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = _tiny_batch()
    with pytest.raises(TypeError, match='batch'):
        m.policy_gradient_step(model, opt, [batch], torch.zeros(3))
    with pytest.raises(ValueError, match='action_mask'):
        m.policy_gradient_step(model, opt, {'ids': batch['ids']}, torch.zeros(3))
    with pytest.raises(ValueError, match='action_mask'):
        m.policy_gradient_step(model, opt, {'ids': batch['ids'], 'action_mask': torch.ones(3, 6)}, torch.zeros(3))
    with pytest.raises(ValueError, match='advantages'):
        m.policy_gradient_step(model, opt, batch, torch.zeros(4))
    T = batch['ids'].shape[1]
    with pytest.raises(ValueError, match=r'\[B, T-1\]=\[3, ' + str(T - 1) + r'\]'):
        m.policy_gradient_step(model, opt, batch, torch.zeros(3, T))       # [B, T] is one column too many
    with pytest.raises(ValueError, match='advantages'):
        m.policy_gradient_step(model, opt, batch, torch.full((3,), float('nan')))
    with pytest.raises(ValueError, match='max_grad_norm'):
        m.policy_gradient_step(model, opt, batch, torch.zeros(3), max_grad_norm=0)


def test_make_base_agent_does_not_depend_on_the_default_dtype(tok, monkeypatch):
    """The weights follow AgentConfig.dtype, whatever torch's default dtype is (no hidden float32 draw)."""
    monkeypatch.setenv('AGENTRL_CACHE', 'off')
    a = m.make_base_agent(tok, seed=2, **SMALL)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        b = m.make_base_agent(tok, seed=2, **SMALL)
    finally:
        torch.set_default_dtype(previous)
    assert _same_weights(a, b)
