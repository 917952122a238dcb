"""Tests for agentrl.distill (Chapter 16). Expected values come from the definition of the KL written as
loops over positions and ids (0 log 0 = 0, p log(p / 0) = inf), closed forms (0 for equal models, the
softmax gradient of the reverse KL), and the argument checks of the cached helpers."""
import inspect
import math

import pytest
import torch

import agentrl as arl
import agentrl.distill as m
from agentrl.trajectories import collate

torch.set_num_threads(1)
INDEX = ('distill_loss',)


def loops(p_logits, q_logits, mask):
    "Mean over mask-1 positions of sum_v p_v log(p_v / q_v), written out."
    total, count = 0.0, 0
    B, T, V = p_logits.shape
    for b in range(B):
        for t in range(T):
            if mask[b, t] == 0:
                continue
            p = torch.softmax(p_logits[b, t], -1).tolist()
            q = torch.softmax(q_logits[b, t], -1).tolist()
            for v in range(V):
                if p[v] > 0:
                    total += math.inf if q[v] == 0 else p[v] * math.log(p[v] / q[v])
            count += 1
    return total / count


def close(a, b):
    return a == b if math.isinf(b) else abs(a - b) < 1e-12


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(3)
    return 3 * torch.randn(3, 5, 7, generator=g), 3 * torch.randn(3, 5, 7, generator=g)


MASK = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 1, 0, 1, 1]])


def test_index_name_and_signature():
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    assert str(inspect.signature(m.distill_loss)) == "(student_logits, teacher_logits, mask, kind='reverse_kl')"
    assert m.DISTILL_KINDS == ('reverse_kl', 'forward_kl')


@pytest.mark.parametrize('kind', ['reverse_kl', 'forward_kl'])
def test_matches_the_loops(logits, kind):
    s, t = logits
    p, q = (s, t) if kind == 'reverse_kl' else (t, s)
    assert close(m.distill_loss(s, t, MASK, kind).item(), loops(p, q, MASK))


def test_default_kind_is_reverse(logits):
    s, t = logits
    assert m.distill_loss(s, t, MASK).item() == m.distill_loss(s, t, MASK, 'reverse_kl').item()
    assert m.distill_loss(s, t, MASK).item() != m.distill_loss(s, t, MASK, 'forward_kl').item()


def _rule_out(x, where):
    x = x.clone()
    for b, t, v in where:
        x[b, t, v] = -math.inf
    return x


@pytest.mark.parametrize('kind', ['reverse_kl', 'forward_kl'])
@pytest.mark.parametrize('who', ['both', 'teacher', 'student'])
def test_minus_inf_logits_match_the_loops(logits, kind, who):
    s, t = logits
    where = [(0, 0, 1), (0, 0, 4), (1, 3, 0), (2, 4, 6)]
    if who in ('both', 'student'):
        s = _rule_out(s, where)
    if who in ('both', 'teacher'):
        t = _rule_out(t, where)
    p, q = (s, t) if kind == 'reverse_kl' else (t, s)
    got, want = m.distill_loss(s, t, MASK, kind).item(), loops(p, q, MASK)
    assert not math.isnan(got)
    assert close(got, want)
    infinite = (who == 'teacher' and kind == 'reverse_kl') or (who == 'student' and kind == 'forward_kl')
    assert math.isinf(got) == infinite and (got > 0 or not infinite)


def test_both_minus_inf_keeps_a_finite_gradient(logits):
    s, t = logits
    where = [(0, 0, 1), (1, 3, 0)]
    s = _rule_out(s, where).requires_grad_()
    t = _rule_out(t, where)
    for kind in m.DISTILL_KINDS:
        s.grad = None
        m.distill_loss(s, t, MASK, kind).backward()
        assert bool(torch.isfinite(s.grad).all())


def test_equal_models_give_zero_and_kl_is_nonnegative(logits):
    s, t = logits
    for kind in m.DISTILL_KINDS:
        assert m.distill_loss(t, t, MASK, kind).item() == pytest.approx(0.0, abs=1e-14)
        assert m.distill_loss(s, t, MASK, kind).item() > 0


def test_shift_invariance_and_large_logits(logits):
    "Adding a constant to a row changes no probability; logits of 1e4 do not overflow."
    s, t = logits
    for kind in m.DISTILL_KINDS:
        a = m.distill_loss(s, t, MASK, kind).item()
        b = m.distill_loss(s + 1e4, t - 1e4, MASK, kind).item()
        assert abs(a - b) < 1e-9


def test_no_gradient_reaches_the_teacher(logits):
    s, t = (x.clone().requires_grad_() for x in logits)
    for kind in m.DISTILL_KINDS:
        loss = m.distill_loss(s, t * 2.0, MASK, kind)          # a non-leaf teacher: still detached
        assert not loss.grad_fn is None
        (gs,) = torch.autograd.grad(loss, [s])
        assert bool((gs[MASK == 0] == 0).all())
        with pytest.raises(RuntimeError):
            torch.autograd.grad(m.distill_loss(s, t, MASK, kind), [t])


def test_reverse_kl_gradient_closed_form(logits):
    s, t = (x.clone() for x in logits)
    s.requires_grad_()
    m.distill_loss(s, t, MASK).backward()
    ls, lt = torch.log_softmax(s.detach(), -1), torch.log_softmax(t, -1)
    p = ls.exp()
    kl = (p * (ls - lt)).sum(-1, keepdim=True)
    want = p * (ls - lt - kl) / MASK.sum() * MASK[..., None]
    assert torch.allclose(s.grad, want, atol=1e-12, rtol=0)


def test_forward_kl_gradient_is_softmax_minus_teacher(logits):
    "d/dz of KL(t || softmax z) = (softmax z - t) per position, divided by the scored positions."
    s, t = (x.clone() for x in logits)
    s.requires_grad_()
    m.distill_loss(s, t, MASK, 'forward_kl').backward()
    want = (torch.softmax(s.detach(), -1) - torch.softmax(t, -1)) / MASK.sum() * MASK[..., None]
    assert torch.allclose(s.grad, want, atol=1e-12, rtol=0)


def test_masked_positions_change_nothing(logits):
    s, t = logits
    s2, t2 = s.clone(), t.clone()
    s2[MASK == 0] = math.nan
    t2[0, 3] = -math.inf
    t2[2, 0] = math.inf
    for kind in m.DISTILL_KINDS:
        assert m.distill_loss(s2, t2, MASK, kind).item() == m.distill_loss(s, t, MASK, kind).item()


def test_mask_dtypes_agree(logits):
    s, t = logits
    want = m.distill_loss(s, t, MASK).item()
    for mk in (MASK.bool(), MASK.double(), MASK.int()):
        assert m.distill_loss(s, t, mk).item() == want


def test_one_position_is_the_mean_of_its_term(logits):
    s, t = logits
    one = torch.zeros(3, 5)
    one[1, 2] = 1
    assert close(m.distill_loss(s, t, one).item(), loops(s[1:2, 2:3], t[1:2, 2:3], torch.ones(1, 1)))


def test_works_on_a_collate_batch_with_the_shifted_mask(tok, tiny):
    "logits[:, :-1] pair with collate's [B, T-1] action mask; the loss is the loop over each unpadded episode."
    import random
    from agentrl.gym import make_tasks, scripted_policy
    from agentrl.grpo import RLConfig, make_env, randomize_names
    from agentrl.trajectories import scripted_rollout
    rng = random.Random(0)
    trajs = [scripted_rollout(scripted_policy(k, seed=1), make_env(RLConfig()), randomize_names(t, rng), tok)
             for k in ('oracle', 'blind') for t in make_tasks('train')[:3]]
    torch.manual_seed(5)
    other = arl.TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2)
    b = collate(trajs, tok.pad_id)
    with torch.no_grad():
        got = m.distill_loss(tiny(b['ids'])[:, :-1], other(b['ids'])[:, :-1], b['action_mask']).item()
        total, count = 0.0, 0
        for tr in trajs:
            ls = torch.log_softmax(tiny(tr.ids[None])[0], -1)
            lt = torch.log_softmax(other(tr.ids[None])[0], -1)
            for pos in range(len(tr) - 1):
                if tr.action_mask[pos] == 1:
                    total += float((ls[pos].exp() * (ls[pos] - lt[pos])).sum())
                    count += 1
    assert count == int(b['action_mask'].sum())
    assert abs(got - total / count) < 1e-12


def test_errors(logits):
    s, t = logits
    with pytest.raises(ValueError, match='kind'):
        m.distill_loss(s, t, MASK, 'kl')
    with pytest.raises(TypeError, match='student_logits'):
        m.distill_loss(s.tolist(), t, MASK)
    with pytest.raises(TypeError, match='teacher_logits'):
        m.distill_loss(s, None, MASK)
    with pytest.raises(TypeError, match='mask'):
        m.distill_loss(s, t, MASK.tolist())
    with pytest.raises(ValueError, match=r'student_logits.*\[B, T, V\]'):
        m.distill_loss(s[0], t[0], MASK[0])
    with pytest.raises(ValueError, match='student_logits'):
        m.distill_loss(s.long(), t, MASK)
    with pytest.raises(ValueError, match='teacher_logits must have the shape'):
        m.distill_loss(s, t[:, :, :6], MASK)
    with pytest.raises(ValueError, match=r'mask must have shape'):
        m.distill_loss(s, t, MASK[:, :-1])
    with pytest.raises(ValueError, match='only 0 and 1'):
        m.distill_loss(s, t, MASK * 2)
    with pytest.raises(ValueError, match='no 1'):
        m.distill_loss(s, t, torch.zeros_like(MASK))
    bad = s.clone()
    bad[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match='NaN'):
        m.distill_loss(bad, t, MASK)
    bad[0, 0, 0] = math.inf
    with pytest.raises(ValueError, match=r'\+inf'):
        m.distill_loss(s, bad, MASK)
    bad[0, 0] = -math.inf
    with pytest.raises(ValueError, match='every id'):
        m.distill_loss(bad, t, MASK)


# ---------------------------------------------------------------- cached helpers: argument checks only
def test_make_distill_agent_rejects_bad_arguments(tok):
    with pytest.raises(TypeError, match='tok'):
        m.make_distill_agent('tok', 'on-policy reverse KL')
    with pytest.raises(ValueError, match='method'):
        m.make_distill_agent(tok, 'distill harder')
    for kw, what in ((dict(seed=-1), 'seed'), (dict(seed=1.0), 'seed'), (dict(teacher_seed=-2), 'teacher_seed'),
                     (dict(rounds=0), 'rounds'), (dict(round_episodes=4), 'round_episodes'),
                     (dict(round_episodes=12), 'multiple of the group size')):
        with pytest.raises(ValueError, match=what):
            m.make_distill_agent(tok, 'on-policy reverse KL', **kw)


def test_make_student_base_rejects_bad_arguments(tok):
    with pytest.raises(TypeError, match='tok'):
        m.make_student_base(None)
    with pytest.raises(ValueError, match='seed'):
        m.make_student_base(tok, seed=-1)
    with pytest.raises(ValueError, match='seed'):
        m.make_student_base(tok, seed=True)


def test_runs_table_and_budget():
    assert set(m.DISTILL_RUNS) == {'SFT on teacher episodes', 'forward KL on teacher episodes',
                                   'on-policy reverse KL'}
    assert m.DISTILL_BUDGET == m.DISTILL_ROUNDS * m.DISTILL_ROUND_EPISODES == 2048
    assert m.DISTILL_ROUND_EPISODES % 8 == 0
    for fields in m.DISTILL_RUNS.values():
        assert fields['data'] in ('teacher', 'student') and fields['loss'] in ('sft',) + m.DISTILL_KINDS
    assert m.DISTILL_RUNS['on-policy reverse KL'] == dict(data='student', loss='reverse_kl')


def test_student_is_smaller_than_the_teacher(tok):
    torch.manual_seed(0)
    small = arl.TinyAgent(vocab_size=len(tok), **m.STUDENT_SIZES)
    big = arl.TinyAgent(vocab_size=len(tok))
    size = lambda x: sum(p.numel() for p in x.parameters())
    assert size(small) == 49_504 and size(big) == 173_568


def test_kl_steps_lower_the_reverse_kl_toward_a_teacher(tok, tiny):
    "A few _kl_steps on fixed episodes move the student toward the teacher and never touch the teacher."
    import copy
    import random
    from agentrl.gym import make_tasks, scripted_policy
    from agentrl.grpo import RLConfig, make_env, randomize_names
    from agentrl.trajectories import scripted_rollout
    rng = random.Random(1)
    trajs = [scripted_rollout(scripted_policy('oracle'), make_env(RLConfig()), randomize_names(t, rng), tok)
             for t in make_tasks('train')[:8]]
    torch.manual_seed(7)
    teacher = arl.TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2).eval()
    before_t = copy.deepcopy(teacher.state_dict())
    student = copy.deepcopy(tiny)
    b = collate(trajs, tok.pad_id)

    def kl():
        with torch.no_grad():
            return m.distill_loss(student(b['ids'])[:, :-1], teacher(b['ids'])[:, :-1], b['action_mask']).item()

    start = kl()
    losses = m._kl_steps(student, teacher, trajs, tok, 'reverse_kl', steps=6, lr=0.01, seed=0)
    assert len(losses) == 6 and kl() < 0.5 * start
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before_t.items())


def test_cache_key_follows_code_not_prose():
    "The run's code hash ignores docstrings: the fingerprint of _code_only equals that of the stripped source."
    from agentrl.grpo import _code_only
    for f in (m._train_distill, m._kl_steps, m.distill_loss):
        text = _code_only(f)
        assert '"""' not in text and 'Defined in Section' not in text
