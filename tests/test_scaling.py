"""Tests for agentrl.scaling (Chapter 14). Expected values come from hand-worked packings, a brute-force
search over all partitions, each sequence run alone through the model, the plain selected_log_probs on
full logits, and task rewards fixed by construction; runs are tiny and seeded."""
import inspect
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest
import torch

import agentrl as arl
import agentrl.grpo as grpo
import agentrl.scaling as m
from agentrl.gym import make_tasks, scripted_policy
from agentrl.grpo import EditBudgetEnv, RLConfig
from agentrl.policies import TinyAgent, chunked_log_probs, selected_log_probs, sequence_log_probs
from agentrl.policy_gradient import LOSS_AGG_MODES, aggregate_loss
from agentrl.trajectories import Trajectory, collate, scripted_rollout

torch.set_num_threads(1)
ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = make_tasks('train')
INDEX = {'pack_sequences': '(trajs, max_tokens, pad_id=0)',
         'packed_logits': '(model, ids, position_ids, segment_ids)',
         'token_budget_batches': '(lengths, max_tokens)',
         'checkpointed_log_probs': '(hidden, weight, ids, chunk_size=1024)',
         'filter_by_pass_rate': '(tasks, pass_rates, low=0.0, high=1.0)',
         'train_curriculum': '(model, tasks, tok, cfg, steps, low=0.0, high=1.0, revisit=1)'}


def test_index_names_reachable_with_their_signatures():
    for name, sig in INDEX.items():
        assert getattr(arl, name) is getattr(m, name)
        assert str(inspect.signature(getattr(m, name))) == sig


def toy_traj(ids, policy=None, reward=0.0):
    "A Trajectory with the given ids; policy: positions (in the [T-1] layout) that are action tokens."
    T = len(ids)
    mask = torch.zeros(T - 1, dtype=torch.float64)
    for p in (policy or []):
        mask[p] = 1.0
    logp = -0.5 * mask
    return Trajectory(ids=torch.tensor(ids), action_mask=mask, sample_logp=logp,
                      owner=torch.zeros(T, dtype=torch.long), turn=torch.zeros(T, dtype=torch.long),
                      reward=reward)


@pytest.fixture(scope='module')
def episodes(tok):
    "36 scripted episodes (oracle, blind, random on 12 train tasks) of lengths 16 to 144."
    return [scripted_rollout(scripted_policy(k, seed=i), EditBudgetEnv(), TRAIN[i], tok)
            for i in range(12) for k in ('oracle', 'blind', 'random')]


@pytest.fixture(scope='module')
def model(tok):
    torch.manual_seed(1)
    return TinyAgent(vocab_size=len(tok), d_model=16, n_layers=2, n_heads=2)


# ---------------------------------------------------------------- pack_sequences
def test_pack_sequences_hand_worked_first_fit_decreasing():
    lengths = [5, 3, 9, 2, 2, 7]
    trajs = [toy_traj([7 + b] * n, reward=float(b)) for b, n in enumerate(lengths)]
    p = m.pack_sequences(trajs, 10, pad_id=0)
    # by hand: 9 -> row 0; 7 -> row 1; 5 -> row 2; 3 -> row 1 (7 + 3 = 10);
    #          2 -> row 2 (5 + 2); 2 -> row 2 (7 + 2)
    assert p['row'].tolist() == [2, 1, 0, 2, 2, 1]
    assert p['start'].tolist() == [0, 7, 0, 5, 7, 0]
    assert p['ids'].shape == (3, 10)                   # the fullest row holds 10 tokens
    assert p['ids'][2].tolist() == [7] * 5 + [10, 10, 11, 11, 0]
    assert p['segment_ids'][2].tolist() == [0] * 5 + [3, 3, 4, 4, -1]
    assert p['position_ids'][2].tolist() == [0, 1, 2, 3, 4, 0, 1, 0, 1, 0]
    assert p['attention_mask'][2].tolist() == [1] * 9 + [0]
    assert p['target_segments'][2].tolist() == [0, 0, 0, 0, -1, 3, -1, 4, -1]
    assert p['lengths'].tolist() == lengths
    assert p['rewards'].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_pack_sequences_places_every_token_once_and_recovers_collate(episodes, tok):
    p = m.pack_sequences(episodes, 256, tok.pad_id)
    R, L = p['ids'].shape
    assert L <= 256 and R == len(set(p['row'].tolist()))
    assert int(p['attention_mask'].sum()) == sum(len(t) for t in episodes)
    for b, t in enumerate(episodes):
        r, s, n = int(p['row'][b]), int(p['start'][b]), len(t)
        assert torch.equal(p['ids'][r, s:s + n], t.ids)
        assert torch.equal(p['position_ids'][r, s:s + n], torch.arange(n))
        assert bool((p['segment_ids'][r, s:s + n] == b).all())
        assert torch.equal(p['action_mask'][r, s:s + n - 1], t.action_mask)
        assert torch.equal(p['sample_logp'][r, s:s + n - 1], t.sample_logp)
        if s + n - 1 < L - 1:
            assert p['action_mask'][r, s + n - 1] == 0 and p['target_segments'][r, s + n - 1] != b
    batch = collate(episodes, tok.pad_id)
    for key in ('action_mask', 'sample_logp'):
        assert torch.equal(m.unpack_sequences(p[key], p), batch[key])
    # no row holds more than max_tokens, and each trajectory could not fit any earlier row when placed
    assert int(p['attention_mask'].sum(1).max()) <= 256


def test_pack_sequences_errors(episodes, tok):
    longest = max(len(t) for t in episodes)
    with pytest.raises(ValueError, match=r'trajs\[8\] has 144 tokens, more than max_tokens=143'):
        m.pack_sequences(episodes, longest - 1)
    with pytest.raises(ValueError, match='non-empty'):
        m.pack_sequences([], 10)
    with pytest.raises(TypeError, match='Trajectory'):
        m.pack_sequences([episodes[0], 'x'], 256)
    with pytest.raises(TypeError, match='list of Trajectory'):
        m.pack_sequences(episodes[0], 256)
    with pytest.raises(ValueError, match='max_tokens'):
        m.pack_sequences(episodes, 0)
    with pytest.raises(ValueError, match='max_tokens'):
        m.pack_sequences(episodes, 256.0)
    with pytest.raises(ValueError, match='pad_id'):
        m.pack_sequences(episodes, 256, pad_id=-1)
    with pytest.raises(TypeError, match='pad_id'):
        m.pack_sequences(episodes, 256, pad_id=0.0)


def test_unpack_sequences_errors(episodes, tok):
    p = m.pack_sequences(episodes, 256, tok.pad_id)
    with pytest.raises(TypeError, match='values must be a tensor'):
        m.unpack_sequences(p['action_mask'].tolist(), p)
    with pytest.raises(ValueError, match=r"action_mask'\]'s shape"):
        m.unpack_sequences(p['action_mask'][:, :-1], p)
    with pytest.raises(TypeError, match='dict of pack_sequences'):
        m.unpack_sequences(p['action_mask'], list(p))
    with pytest.raises(ValueError, match='lacks'):
        m.unpack_sequences(p['action_mask'], {'action_mask': p['action_mask']})


# ---------------------------------------------------------------- packed_logits
def test_packed_logits_equal_each_sequence_alone(episodes, model, tok):
    p = m.pack_sequences(episodes, 256, tok.pad_id)
    with torch.no_grad():
        logits = m.packed_logits(model, p['ids'], p['position_ids'], p['segment_ids'])
        assert logits.shape == (*p['ids'].shape, len(tok))
        for b, t in enumerate(episodes):
            r, s, n = int(p['row'][b]), int(p['start'][b]), len(t)
            alone = model(t.ids[None])[0]                               # [n, V], nothing else in the context
            assert (logits[r, s:s + n] - alone).abs().max() < 1e-12


def test_packed_loss_and_gradient_equal_the_padded_batch_in_every_mode(episodes, model, tok):
    p = m.pack_sequences(episodes, 256, tok.pad_id)
    batch = collate(episodes, tok.pad_id)
    adv = torch.linspace(-1.0, 1.0, len(episodes))
    params = list(model.parameters())
    for mode in LOSS_AGG_MODES:
        padded = aggregate_loss(-adv[:, None] * sequence_log_probs(model, batch['ids']), batch['action_mask'],
                                mode)
        g_pad = torch.autograd.grad(padded, params)
        logits = m.packed_logits(model, p['ids'], p['position_ids'], p['segment_ids'])
        logp = m.unpack_sequences(selected_log_probs(logits[:, :-1], p['ids'][:, 1:]), p)          # [B, T-1]
        packed = aggregate_loss(-adv[:, None] * logp, m.unpack_sequences(p['action_mask'], p), mode)
        g_pack = torch.autograd.grad(packed, params)
        assert abs(float(packed.detach() - padded.detach())) < 1e-12
        assert max(float((a - b).abs().max()) for a, b in zip(g_pad, g_pack)) < 1e-12


def test_packed_logits_need_the_mask_and_the_position_reset(episodes, model, tok):
    p = m.pack_sequences(episodes[:6], 256, tok.pad_id)
    with torch.no_grad():
        right = m.packed_logits(model, p['ids'], p['position_ids'], p['segment_ids'])
        no_mask = model(p['ids'], position_ids=p['position_ids'])     # causal over the whole row
    # tokens of every segment but the first of its row
    second = (p['segment_ids'] >= 0) & (p['position_ids'] != torch.arange(p['ids'].shape[1]))
    assert (right - no_mask)[second].abs().max() > 1e-3
    counting = torch.arange(p['ids'].shape[1]).expand_as(p['ids']).contiguous()
    with pytest.raises(ValueError, match='restart at 0'):
        m.packed_logits(model, p['ids'], counting, p['segment_ids'])


def test_packed_logits_errors(model, tok):
    ids = torch.tensor([[3, 4, 5, 6]])
    pos = torch.tensor([[0, 1, 0, 1]])
    seg = torch.tensor([[0, 0, 1, 1]])
    assert m.packed_logits(model, ids, pos, seg).shape == (1, 4, len(tok))
    with pytest.raises(ValueError, match='one contiguous run'):
        m.packed_logits(model, ids, torch.tensor([[0, 1, 0, 0]]), torch.tensor([[0, 0, 1, 0]]))
    with pytest.raises(ValueError, match='one contiguous run'):
        m.packed_logits(model, torch.tensor([[3, 4], [5, 6]]), torch.tensor([[0, 1], [0, 1]]),
                        torch.tensor([[0, 0], [0, 0]]))
    with pytest.raises(TypeError, match='TinyAgent'):
        m.packed_logits(lambda x: x, ids, pos, seg)
    with pytest.raises(ValueError, match='position_ids'):
        m.packed_logits(model, ids, pos.double(), seg)
    with pytest.raises(ValueError, match='segment_ids'):
        m.packed_logits(model, ids, pos, seg[:, :3])
    with pytest.raises(ValueError, match='>= 0'):
        m.packed_logits(model, ids, pos, torch.tensor([[0, 0, -2, -2]]))
    with pytest.raises(TypeError, match='ids'):
        m.packed_logits(model, [[3, 4]], pos, seg)


# ---------------------------------------------------------------- token_budget_batches
def partitions(items):
    "Every set partition of a list (brute force)."
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def test_token_budget_batches_is_valid_and_as_few_as_brute_force():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 7)
        lengths = [rng.randint(1, 12) for _ in range(n)]
        budget = rng.randint(max(lengths), 30)
        got = m.token_budget_batches(lengths, budget)
        assert sorted(i for b in got for i in b) == list(range(n))
        for b in got:
            assert len(b) * max(lengths[i] for i in b) <= budget
            assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
        best = min(len(p) for p in partitions(list(range(n)))
                   if all(len(b) * max(lengths[i] for i in b) <= budget for b in p))
        assert len(got) == best


def test_token_budget_batches_hand_example_and_errors():
    assert m.token_budget_batches([5, 3, 9, 2, 2, 7], 14) == [[2], [5, 0], [1, 3, 4]]
    assert m.token_budget_batches(torch.tensor([4, 4, 4]), 12) == [[0, 1, 2]]
    assert m.token_budget_batches([], 5) == []
    with pytest.raises(ValueError, match='sequence 1 has 9 tokens, more than max_tokens=8'):
        m.token_budget_batches([3, 9], 8)
    with pytest.raises(ValueError, match='>= 1'):
        m.token_budget_batches([3, 0], 8)
    with pytest.raises(TypeError, match='list of ints'):
        m.token_budget_batches([3, 2.5], 8)
    with pytest.raises(TypeError, match='integer tensor'):
        m.token_budget_batches(torch.tensor([3.0]), 8)
    with pytest.raises(ValueError, match='max_tokens'):
        m.token_budget_batches([3], 0)


# ---------------------------------------------------------------- checkpointed_log_probs
def test_checkpointed_log_probs_equal_chunked_and_full_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 37, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    ids = torch.randint(0, 50, (2, 37), generator=g)
    full = selected_log_probs(h @ w.T, ids)
    gf = torch.autograd.grad((full * torch.arange(37.0)).sum(), [h, w])
    for c in (1, 5, 16, 37, 100):
        out = m.checkpointed_log_probs(h, w, ids, chunk_size=c)
        ref = chunked_log_probs(h, w, ids, chunk_size=c)
        assert (out - full).abs().max() < 1e-12 and (out - ref).abs().max() < 1e-12
        gc = torch.autograd.grad((out * torch.arange(37.0)).sum(), [h, w])
        gr = torch.autograd.grad((ref * torch.arange(37.0)).sum(), [h, w])
        for a, b, d in zip(gc, gr, gf):
            assert (a - b).abs().max() < 1e-12 and (a - d).abs().max() < 1e-12


def saved_numels(fn):
    "Sizes (numel) of every tensor autograd saves for backward while fn() runs its forward pass."
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes


def test_checkpointed_log_probs_keep_no_logits_for_backward():
    B, T, D, V, c = 1, 64, 4, 500, 16
    g = torch.Generator().manual_seed(1)
    h = torch.randn(B, T, D, generator=g, requires_grad=True)
    w = torch.randn(V, D, generator=g, requires_grad=True)
    ids = torch.randint(0, V, (B, T), generator=g)
    _, chunked = saved_numels(lambda: chunked_log_probs(h, w, ids, chunk_size=c))
    _, ckpt = saved_numels(lambda: m.checkpointed_log_probs(h, w, ids, chunk_size=c))
    assert sum(n for n in chunked if n == B * c * V) >= T // c * B * c * V     # every chunk's log-softmax
    assert all(n < B * c * V for n in ckpt)                                  # no [B, c, V] tensor at all
    out, _ = saved_numels(lambda: m.checkpointed_log_probs(h, w, ids, chunk_size=c))
    out.sum().backward()                                                     # and backward still works
    assert h.grad is not None and w.grad is not None


def test_checkpointed_log_probs_without_grad_empty_and_errors():
    h, w = torch.randn(2, 6, 3), torch.randn(7, 3)
    ids = torch.randint(0, 7, (2, 6))
    with torch.no_grad():
        assert torch.equal(m.checkpointed_log_probs(h, w, ids, 4), chunked_log_probs(h, w, ids, 4))
    empty = m.checkpointed_log_probs(torch.randn(2, 0, 3), w, torch.zeros(2, 0, dtype=torch.long))
    assert empty.shape == (2, 0)
    with pytest.raises(ValueError, match='hidden'):
        m.checkpointed_log_probs(h[0], w, ids)
    with pytest.raises(ValueError, match='weight'):
        m.checkpointed_log_probs(h, torch.randn(7, 4), ids)
    with pytest.raises(ValueError, match='chunk_size'):
        m.checkpointed_log_probs(h, w, ids, 0)
    with pytest.raises(ValueError, match='lie in'):
        m.checkpointed_log_probs(h, w, ids + 7)
    with pytest.raises(TypeError):
        m.checkpointed_log_probs(h, w, ids.tolist())
    with pytest.raises(TypeError, match='hidden'):
        m.checkpointed_log_probs(h.tolist(), w, ids)
    with pytest.raises(TypeError, match='weight'):
        m.checkpointed_log_probs(h, w.tolist(), ids)
    with pytest.raises(ValueError, match='same dtype'):
        m.checkpointed_log_probs(h, w.float(), ids)
    bad = h.clone()
    bad[1, 4, 0] = float('nan')
    with pytest.raises(ValueError, match=r'row \(1, 4\)'):
        m.checkpointed_log_probs(bad, w, ids, 3)


# ---------------------------------------------------------------- filter_by_pass_rate
def test_filter_by_pass_rate_keeps_the_open_interval():
    tasks = TRAIN[:6]
    rates = [0.0, 0.125, 1.0, 0.5, 0.875, 0.25]
    assert m.filter_by_pass_rate(tasks, rates) == [tasks[1], tasks[3], tasks[4], tasks[5]]
    assert m.filter_by_pass_rate(tasks, rates, low=0.125, high=0.875) == [tasks[3], tasks[5]]
    assert m.filter_by_pass_rate(tasks, torch.tensor(rates), 0.2, 0.6) == [tasks[3], tasks[5]]
    assert m.filter_by_pass_rate([], []) == []


def test_filter_by_pass_rate_errors():
    tasks = TRAIN[:2]
    with pytest.raises(ValueError, match='one rate per task'):
        m.filter_by_pass_rate(tasks, [0.5])
    with pytest.raises(ValueError, match=r'pass_rates\[1\]'):
        m.filter_by_pass_rate(tasks, [0.5, 1.5])
    with pytest.raises(ValueError, match=r'pass_rates\[0\]'):
        m.filter_by_pass_rate(tasks, [float('nan'), 0.5])
    with pytest.raises(ValueError, match='low must be below high'):
        m.filter_by_pass_rate(tasks, [0.5, 0.5], 0.6, 0.6)
    with pytest.raises(ValueError, match='high'):
        m.filter_by_pass_rate(tasks, [0.5, 0.5], 0.0, 1.5)
    with pytest.raises(TypeError, match='Task'):
        m.filter_by_pass_rate(['t'], [0.5])
    with pytest.raises(TypeError, match='numbers'):
        m.filter_by_pass_rate(tasks, ['a', 0.5])


# ---------------------------------------------------------------- train_curriculum
def fixed_outcomes(monkeypatch, always, never):
    """Make every environment pay 1 on tasks in `always`, 0 on `never`, and alternate 1, 0, 1, ... on the rest
    (so their group pass rate is exactly 0.5 with an even group size)."""
    count = {}

    def reward(info):
        name = info['task']
        if name in always:
            return 1.0
        if name in never:
            return 0.0
        count[name] = count.get(name, 0) + 1
        return float(count[name] % 2)

    make = lambda cfg: EditBudgetEnv(cfg.max_turns, reward, cfg.max_edits)
    monkeypatch.setattr(grpo, 'make_env', make)
    monkeypatch.setattr(m, 'make_env', make)


def test_train_curriculum_draws_inside_tasks_plus_revisits(monkeypatch, tiny, tok):
    tasks = TRAIN[:10]
    always, never = {t.name for t in tasks[:2]}, {t.name for t in tasks[2:5]}
    fixed_outcomes(monkeypatch, always, never)
    model = TinyAgent(tiny.config)
    model.load_state_dict(tiny.state_dict())
    cfg = RLConfig(group_size=4, tasks_per_step=3, randomize_names=False)
    hist = m.train_curriculum(model, tasks, tok, cfg, 4, revisit=1)
    inside = {t.name for t in tasks[5:]}                          # the alternating tasks: estimate 0.5
    assert hist[0]['initial_episodes'] == 10 * 4
    for row in hist:
        assert (row['inside'], row['at_low'], row['at_high'], row['revisited']) == (5, 3, 2, 1)
        drawn = row['tasks']
        assert len(drawn) == 3 and len(set(drawn)) == 3
        assert sum(name in inside for name in drawn) == 2 and drawn[-1] not in inside
        assert row['groups'] == 3
    assert [r['episodes'] for r in hist] == [40 + 12 * k for k in range(1, 5)]
    assert all(r['updated'] and r['kept_groups'] == 2 for r in hist)      # the two alternating groups


def test_train_curriculum_refill_keeps_every_step_full(monkeypatch, tiny, tok):
    tasks = TRAIN[:10]
    fixed_outcomes(monkeypatch, {t.name for t in tasks[:2]}, {t.name for t in tasks[2:5]})
    inside = {t.name for t in tasks[5:]}
    cfg = RLConfig(group_size=2, tasks_per_step=8, randomize_names=False)
    for refill, n_out in ((False, 1), (True, 3)):        # 5 inside: 5 + 1 revisit, or filled up to 8
        model = TinyAgent(tiny.config)
        model.load_state_dict(tiny.state_dict())
        hist = m._train_curriculum(model, tasks, tok, cfg, 2, revisit=1, refill=refill)
        for row in hist:
            assert sum(n in inside for n in row['tasks']) == 5
            assert len(row['tasks']) == 5 + n_out and row['revisited'] == n_out
    with pytest.raises(TypeError, match='refill'):
        m._train_curriculum(tiny, tasks, tok, cfg, 1, refill=1)


def test_train_curriculum_revisit_zero_never_samples_outside(monkeypatch, tiny, tok):
    tasks = TRAIN[:6]
    fixed_outcomes(monkeypatch, {tasks[0].name}, {tasks[1].name})
    model = TinyAgent(tiny.config)
    model.load_state_dict(tiny.state_dict())
    cfg = RLConfig(group_size=2, tasks_per_step=8, randomize_names=False)
    hist = m.train_curriculum(model, tasks, tok, cfg, 3, revisit=0)
    assert all(sorted(r['tasks']) == sorted(t.name for t in tasks[2:]) for r in hist)
    assert all(r['revisited'] == 0 for r in hist)


def test_train_curriculum_with_nothing_inside_and_validation_like_train_rl(tiny, tok):
    model = TinyAgent(tiny.config)
    model.load_state_dict(tiny.state_dict())
    heldout = make_tasks('heldout')[:2]
    cfg = RLConfig(group_size=2, tasks_per_step=2, eval_samples=1)
    hist = m._train_curriculum(model, TRAIN[:4], tok, cfg, 3, revisit=2, eval_tasks=heldout, eval_every=2)
    assert [('eval_pass_rate' in r) for r in hist] == [True, False, True]
    assert 'final_eval_pass_rate' in hist[-1]
    # the untrained model passes nothing: nothing is inside, every step draws its 2 revisits
    assert all(r['revisited'] == 2 and len(r['tasks']) == 2 for r in hist)
    # the first validation is the one train_rl makes: same model, same generator seed
    model2 = TinyAgent(tiny.config)
    model2.load_state_dict(tiny.state_dict())
    ref = grpo.train_rl(model2, TRAIN[:4], tok, cfg, 1, eval_tasks=heldout, eval_every=2)
    assert ref[0]['eval_pass_rate'] == hist[0]['eval_pass_rate']
    assert ref[0]['eval_reward'] == hist[0]['eval_reward']


def test_train_curriculum_is_seeded_and_checks_its_arguments(tiny, tok):
    runs = []
    for _ in range(2):
        model = TinyAgent(tiny.config)
        model.load_state_dict(tiny.state_dict())
        runs.append((m.train_curriculum(model, TRAIN[:4], tok, RLConfig(group_size=2, tasks_per_step=2), 2),
                     torch.cat([p.flatten() for p in model.parameters()])))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    cfg = RLConfig(group_size=2)
    with pytest.raises(ValueError, match='revisit'):
        m.train_curriculum(tiny, TRAIN[:2], tok, cfg, 1, revisit=-1)
    with pytest.raises(ValueError, match='low must be below high'):
        m.train_curriculum(tiny, TRAIN[:2], tok, cfg, 1, low=0.5, high=0.5)
    with pytest.raises(ValueError, match='distinct names'):
        m.train_curriculum(tiny, [TRAIN[0], TRAIN[0]], tok, cfg, 1)
    with pytest.raises(TypeError, match='RLConfig'):
        m.train_curriculum(tiny, TRAIN[:2], tok, {}, 1)
    with pytest.raises(ValueError, match='steps'):
        m.train_curriculum(tiny, TRAIN[:2], tok, cfg, -1)
    with pytest.raises(TypeError, match='refill must be a bool'):
        m._train_curriculum(tiny, TRAIN[:2], tok, cfg, 1, refill=1)


def test_make_curriculum_agent_caches_and_checks(monkeypatch, tmp_path, tok):
    from conftest import small_base
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setattr(grpo, 'make_tasks', lambda split: make_tasks(split)[:3])
    calls = []                       # one per training step (the cache key hashes _train_curriculum's code)
    real = m._rl_loop
    monkeypatch.setattr(m, '_rl_loop', lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model, hist, seconds = m.make_curriculum_agent(tok, seed=0, steps=2)
    model2, hist2, _ = m.make_curriculum_agent(tok, seed=0, steps=2)
    assert calls == [1, 1] and hist == hist2 and seconds >= 0      # the second call trained nothing
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert 'final_eval_pass_rate' in hist[-1] and 'eval_pass_rate' in hist[0]
    with pytest.raises(ValueError, match='name must be one of'):
        m.make_curriculum_agent(tok, name='nope')
    with pytest.raises(ValueError, match='seed'):
        m.make_curriculum_agent(tok, seed=-1)


# ---------------------------------------------------------------- data parallelism (torchrun, 2 processes)
@pytest.mark.timeout(120)
def test_ddp_two_ranks_match_one_process():
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                          str(ROOT / 'scripts' / 'ddp_check.py'), '--steps', '2'],
                         capture_output=True, text=True, env=env, timeout=110)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT / 'scripts'))
    from ddp_check import fixed_batch
    trajs, _, _ = fixed_batch()                      # the same 12 episodes, counted here in one process
    half = len(trajs) // 2
    expected = [int(sum(t.action_mask.sum() for t in part)) for part in (trajs[:half], trajs[half:])]
    assert report['tokens_per_rank'] == expected and expected[0] != expected[1]
    assert report['global']['grad_max_abs_diff'] < 1e-12
    assert report['global']['weights_max_abs_diff_all_ranks'] < 1e-10
    assert report['local']['grad_rel_diff'] > 1e-3            # the per-rank mean is another gradient
