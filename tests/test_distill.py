"""Tests for agentrl.distill (Chapter 16). Expected values come from the definition of the KL written as
loops over positions and ids in log-probabilities (0 log 0 = 0, p log(p / 0) = inf, also where p underflows),
closed forms (0 for equal models, the softmax gradient of the reverse KL), counts taken by an independent
forward hook and by a spy on who plays (the accounting of _train_distill), and the argument checks and
cache key of the cached helpers."""
import inspect
import math

import pytest
import torch

import agentrl as arl
import agentrl.distill as m
from agentrl.trajectories import collate
from conftest import recompiled, reworded

torch.set_num_threads(1)
INDEX = ('distill_loss',)


def loops(p_logits, q_logits, mask):
    "Mean over mask-1 positions of sum_v p_v log(p_v / q_v), written out in log-probabilities (p_v > 0 iff log p_v > -inf)."
    total, count = 0.0, 0
    B, T, V = p_logits.shape
    for b in range(B):
        for t in range(T):
            if mask[b, t] == 0:
                continue
            lp = [x - math.log(sum(math.exp(y - max(p_logits[b, t].tolist())) for y in p_logits[b, t].tolist()))
                  - max(p_logits[b, t].tolist()) for x in p_logits[b, t].tolist()]
            lq = [x - math.log(sum(math.exp(y - max(q_logits[b, t].tolist())) for y in q_logits[b, t].tolist()))
                  - max(q_logits[b, t].tolist()) for x in q_logits[b, t].tolist()]
            for v in range(V):
                if lp[v] > -math.inf:                          # 0 log 0 = 0 only where p_v is exactly 0
                    total += math.inf if lq[v] == -math.inf else math.exp(lp[v]) * (lp[v] - lq[v])
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
    """The numbers Section 16.4 states: 16 rounds of 128 episodes (16 groups of 8), 8 steps, 2,048 episodes played;
    the run's defaults are those constants, and 8 minibatches of 32 of a round's 128 episodes use each one twice."""
    assert (m.DISTILL_ROUNDS, m.DISTILL_ROUND_EPISODES, m.DISTILL_STEPS, m.DISTILL_BUDGET) == (16, 128, 8, 2048)
    sig = inspect.signature(m.make_distill_agent).parameters
    assert (sig['rounds'].default, sig['round_episodes'].default) == (16, 128)
    train = inspect.signature(m._train_distill).parameters
    assert (train['steps'].default, train['lr'].default) == (8, 0.003)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 60, (128,), generator=g).tolist()
    batches = m._length_batches(lengths, 8, 32, torch.Generator().manual_seed(1))
    assert len(batches) == 8 and all(len(b) == 32 for b in batches)
    uses = [0] * 128
    for b in batches:
        for i in b:
            uses[i] += 1
    assert uses == [2] * 128                                    # every episode of the round used exactly twice
    assert m.DISTILL_RUNS == {'SFT on teacher episodes': dict(data='teacher', loss='sft'),
                              'forward KL on teacher episodes': dict(data='teacher', loss='forward_kl'),
                              'on-policy reverse KL': dict(data='student', loss='reverse_kl')}


def test_student_is_smaller_than_the_teacher(tok):
    torch.manual_seed(0)
    small = arl.TinyAgent(vocab_size=len(tok), **m.STUDENT_SIZES)
    big = arl.TinyAgent(vocab_size=len(tok))
    size = lambda x: sum(p.numel() for p in x.parameters())
    assert size(small) == 49_504 and size(big) == 173_568


def _oracle_trajs(tok, n, seed=1):
    import random
    from agentrl.gym import make_tasks, scripted_policy
    from agentrl.grpo import RLConfig, make_env, randomize_names
    from agentrl.trajectories import scripted_rollout
    rng = random.Random(seed)
    return [scripted_rollout(scripted_policy('oracle'), make_env(RLConfig()), randomize_names(t, rng), tok)
            for t in make_tasks('train')[:n]]


def _small(tok, seed):
    torch.manual_seed(seed)
    return arl.TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2).eval()


def test_underflowing_weight_still_counts():
    "log p = -800 is finite (p > 0) though exp underflows to 0.0: against q = 0 the KL is +inf, not 0."
    s = torch.tensor([[[0.0, -800.0, 1.0]]])                   # student: id 1 has log-probability about -801
    t = torch.tensor([[[0.0, -math.inf, 1.0]]])                # teacher: id 1 impossible
    one = torch.ones(1, 1)
    assert torch.log_softmax(s, -1)[0, 0, 1].exp().item() == 0.0      # the probability underflows
    assert m.distill_loss(s, t, one, 'reverse_kl').item() == math.inf == loops(s, t, one)
    assert close(m.distill_loss(s, t, one, 'forward_kl').item(), loops(t, s, one))   # finite, by the loops
    # finite on both sides: the underflowing term is p (log p - log q) ~ 1e-348 * 800, i.e. 0 in float64
    t2 = torch.tensor([[[0.0, -5.0, 1.0]]])
    assert close(m.distill_loss(s, t2, one).item(), loops(s, t2, one))
    assert math.isfinite(m.distill_loss(s, t2, one).item())


def test_infinite_loss_is_returned_with_a_finite_gradient_elsewhere(logits):
    "+inf where only the teacher rules out an id (reverse KL); the gradient never becomes NaN."
    s, t = logits
    s = s.clone().requires_grad_()
    t = _rule_out(t, [(0, 0, 2)])
    loss = m.distill_loss(s, t, MASK)
    assert loss.item() == math.inf
    loss.backward()
    assert not bool(torch.isnan(s.grad).any())


def test_kl_steps_lower_the_reverse_kl_toward_a_teacher(tok, tiny):
    "A few _kl_steps on fixed episodes move the student toward the stored teacher logits; the teacher is untouched."
    import copy
    trajs = _oracle_trajs(tok, 8)
    teacher = _small(tok, 7)
    before_t = copy.deepcopy(teacher.state_dict())
    student = copy.deepcopy(tiny)
    b = collate(trajs, tok.pad_id)
    t_logits = m._score_round(teacher, trajs, tok)
    with torch.no_grad():
        full = teacher(b['ids'])
    for i, tr in enumerate(trajs):                              # scored once, row by row as the batch scores it
        assert t_logits[i].shape == (len(tr) - 1, len(tok))
        assert torch.allclose(t_logits[i], full[i, :len(tr) - 1], atol=1e-12, rtol=0)

    def kl():
        with torch.no_grad():
            return m.distill_loss(student(b['ids'])[:, :-1], teacher(b['ids'])[:, :-1], b['action_mask']).item()

    start = kl()
    losses = m._kl_steps(student, trajs, t_logits, tok, 'reverse_kl', steps=6, lr=0.01, seed=0)
    assert len(losses) == 6 and kl() < 0.5 * start
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before_t.items())


def test_kl_steps_refuse_an_infinite_loss(tok, tiny):
    "A teacher that rules out an id the student can produce: _kl_steps raises and the student's weights stay."
    import copy
    trajs = _oracle_trajs(tok, 4)
    t_logits = [x.clone() for x in m._score_round(_small(tok, 7), trajs, tok)]
    t_logits[0][:, 5] = -math.inf                               # id 5 impossible for the teacher everywhere
    student = copy.deepcopy(tiny)
    arl.snap_weights(student.parameters())                      # on the grid already, as _kl_steps leaves it
    before = copy.deepcopy(student.state_dict())
    with pytest.raises(ValueError, match='not stepping'):
        m._kl_steps(student, trajs, t_logits, tok, 'reverse_kl', steps=2, lr=0.01, seed=0)
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in before.items())
    # the forward KL on the same logits is finite (the teacher's zero weight cancels the term): it trains
    assert len(m._kl_steps(student, trajs, t_logits, tok, 'forward_kl', steps=2, lr=0.01, seed=0)) == 2


@pytest.mark.parametrize('method', list(m.DISTILL_RUNS))
def test_train_distill_plays_scores_and_counts(tok, monkeypatch, method):
    "A 2-round run of 8 episodes: who plays, what the teacher computes (counted by an independent hook), teacher unchanged."
    import copy
    from agentrl.gym import make_tasks
    from agentrl.grpo import RLConfig
    teacher, student = _small(tok, 11), _small(tok, 12)
    before_t, before_s = copy.deepcopy(teacher.state_dict()), copy.deepcopy(student.state_dict())
    played, sampling = [], {'passes': 0, 'positions': 0}
    real_round = m._policy_round

    def spy(model, tasks, tok_, cfg, n, gen):
        who = 'teacher' if model is teacher else 'student' if model is student else '?'
        calls = []
        h = model.ln_f.register_forward_hook(lambda mod, a, out: calls.append(out.shape[0] * out.shape[1]))
        try:
            trajs = real_round(model, tasks, tok_, cfg, n, gen)
        finally:
            h.remove()
        if who == 'teacher':
            sampling['passes'] += len(calls)
            sampling['positions'] += sum(calls)
        played.append((who, trajs))
        return trajs

    monkeypatch.setattr(m, '_policy_round', spy)
    fields = m.DISTILL_RUNS[method]
    hist = m._train_distill(student, teacher, make_tasks('train'), tok, RLConfig(seed=0), 2, 8,
                            make_tasks('heldout')[:2], **fields)
    assert [who for who, _ in played] == [fields['data']] * 2 and all(len(t) == 8 for _, t in played)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before_t.items())
    assert any(not torch.equal(v, student.state_dict()[k]) for k, v in before_s.items())
    last = hist[-1]
    assert [h['round'] for h in hist] == [0, 1, 2]
    lens = [len(tr) for _, trajs in played for tr in trajs]
    scored = fields['loss'] != 'sft'
    want_scoring_positions = sum(8 * max(len(tr) for tr in trajs) for _, trajs in played) if scored else 0
    assert last['teacher_sampled'] == (16 if fields['data'] == 'teacher' else 0)
    assert last['student_episodes'] == (16 if fields['data'] == 'student' else 0)
    assert last['teacher_scored'] == (16 if scored else 0)
    assert last['teacher_tokens'] == sum(lens) * ((fields['data'] == 'teacher') + scored)
    assert last['teacher_passes'] == sampling['passes'] + (2 if scored else 0)   # one pass of 8 per round
    assert last['teacher_positions'] == sampling['positions'] + want_scoring_positions
    assert (last['student_positions'] > 0) == (fields['data'] == 'student')
    assert hist[1]['pass_rate'] == sum(t.reward for t in played[0][1]) / 8
    assert all(math.isfinite(h['loss']) for h in hist[1:])


def test_cache_key_follows_the_code_of_every_function_the_run_calls(tok, monkeypatch, tmp_path):
    """make_distill_agent's key (_distill_key) changes with the code of this chapter's loop and of the Chapter 15
    functions it calls, not with their docstrings or comments, and not with Chapter 15 code it never calls."""
    import agentrl.sft as sft
    key = lambda: m._distill_key(tok, 'on-policy reverse KL', 0, 0, 16, 128, torch.float64)
    base = key()
    assert m._distill_key(tok, 'on-policy reverse KL', 1, 0, 16, 128, torch.float64) != base
    changed = lambda src: src.replace('tie[i])', '-tie[i])', 1)
    assert changed(inspect.getsource(sft._length_batches)) != inspect.getsource(sft._length_batches)
    same = recompiled(sft._length_batches, tmp_path / 'same_code.py', reworded)
    other = recompiled(sft._length_batches, tmp_path / 'other_code.py', changed)
    monkeypatch.setattr(m, '_length_batches', same)
    assert key() == base                                        # prose and comments are not code
    monkeypatch.setattr(m, '_length_batches', other)
    assert key()['code'] != base['code']                        # one changed character of Chapter 15's code
    monkeypatch.undo()
    assert key() == base
    for where, name in ((m, 'sft_train'), (m, '_policy_round'), (m, '_kl_steps'), (m, '_score_round'),
                        (m, '_train_distill'), (m, 'distill_loss'), (m, '_count_forwards'),
                        (m, 'make_distill_agent'), (m, 'make_student_base'),
                        (sft, 'sft_loss'), (sft, '_check_batch'), (sft, '_check_rounds')):
        monkeypatch.setattr(where, name, other)                 # any function with different code
        assert key()['code'] != base['code'], name
        monkeypatch.undo()
    monkeypatch.setattr(sft, 'dpo_loss', other)                 # Chapter 15 code a distillation run never calls
    monkeypatch.setattr(sft, 'make_sft_agent', other)
    monkeypatch.setattr(sft, 'pass_rate', other)
    assert key() == base


def test_student_base_key_follows_its_code_and_hyperparameters(tok, monkeypatch, tmp_path):
    """make_student_base's key (_student_key) changes with its learning rate, demonstrations, batch and steps and
    with the code of make_student_base, not with its docstring; make_distill_agent's key holds the student's key."""
    key = lambda: m._student_key(tok, 0, torch.float64)
    run_key = lambda: m._distill_key(tok, 'SFT on teacher episodes', 0, 0, 16, 128, torch.float64)
    base, run_base = key(), run_key()
    assert m._student_key(tok, 1, torch.float64) != base
    for name, value in (('_STUDENT_LR', 0.001), ('_STUDENT_DEMOS', 4), ('_STUDENT_BATCH', 16),
                        ('STUDENT_BASE_STEPS', 200)):
        monkeypatch.setattr(m, name, value)
        assert key() != base and run_key() != run_base, name
        monkeypatch.undo()
    assert key() == base and run_key() == run_base
    fn = m.make_student_base
    other_doc = recompiled(fn, tmp_path / 'reworded.py',
                           lambda src: src.replace(src.split('"""')[1], 'Another docstring.', 1))
    edited = recompiled(fn, tmp_path / 'edited.py', lambda src: src.replace('return model.eval()', 'return model', 1))
    monkeypatch.setattr(m, 'make_student_base', other_doc)
    assert key() == base and run_key() == run_base            # prose is not code
    monkeypatch.setattr(m, 'make_student_base', edited)
    assert key()['own_code'] != base['own_code'] and run_key() != run_base


@pytest.mark.parametrize('seed', [0, 3])
def test_sft_and_forward_kl_see_the_same_episodes(tok, monkeypatch, seed):
    "Within a seed, SFT and the forward KL learn from token-identical teacher episodes in every round."
    from agentrl.gym import make_tasks
    from agentrl.grpo import RLConfig
    seen = {}
    real_round = m._policy_round
    for method in ('SFT on teacher episodes', 'forward KL on teacher episodes'):
        teacher, student = _small(tok, 11), _small(tok, 12)
        rounds = []

        def spy(model, tasks, tok_, cfg, n, gen):
            trajs = real_round(model, tasks, tok_, cfg, n, gen)
            rounds.append([t.ids.clone() for t in trajs])
            return trajs

        monkeypatch.setattr(m, '_policy_round', spy)
        m._train_distill(student, teacher, make_tasks('train'), tok, RLConfig(seed=seed), 2, 8,
                         make_tasks('heldout')[:1], **m.DISTILL_RUNS[method])
        monkeypatch.undo()
        seen[method] = rounds
    a, b = seen.values()
    assert len(a) == len(b) == 2 and all(len(r) == 8 for r in a)
    assert all(torch.equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
