"""Tests for agentrl.debugging (Chapter 18). References are independent of the code under test: hand loops
over the trajectories (owner codes, per-episode forward passes, losses written out token by token),
brute-force splits, and arl.rl_update and arl.train_rl themselves for the healthy trainer."""
import copy
import dataclasses

import pytest
import torch

import agentrl.debugging as d
from agentrl.grpo import RLConfig, rl_update, compute_advantages, sample_groups
from agentrl.gym import make_tasks
from agentrl.policies import TinyAgent, sampling_log_probs, entropy_from_logits
from agentrl.trajectories import collate, OWNER_POLICY

torch.set_num_threads(1)
TRAIN = make_tasks('train')


@pytest.fixture(scope='module')
def model(tok):
    torch.manual_seed(1)
    return TinyAgent(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2).eval()


@pytest.fixture(scope='module')
def trajs(model, tok):
    "Three groups of four episodes with ragged lengths; rewards set by hand so every group has signal."
    cfg = RLConfig(group_size=4, temperature=0.8)
    with torch.no_grad():
        out = sample_groups(model, None, TRAIN[:3], tok, cfg, torch.Generator().manual_seed(0))
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    return [dataclasses.replace(t, reward=r) for t, r in zip(out, rewards)]


def cfg_of(**kw):
    base = dict(group_size=4, kl_coef=0.1, temperature=0.8, minibatches=2, weight_grid=None)
    base.update(kw)
    return RLConfig(**base)


def grads(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def hand_logp(model, t, temperature):
    "log pi(ids[t+1]) at temperature for one episode, by one forward pass: [T-1]."
    logits = model(t.ids[None])[0, :-1]
    return sampling_log_probs(logits, temperature).gather(-1, t.ids[1:, None])[:, 0]


# ---------------------------------------------------------------- log_metrics
def test_log_metrics_by_hand(trajs):
    cfg = cfg_of()
    row = d.log_metrics(trajs, cfg, {'entropy': 0.5, 'clip_frac': 0.1, 'other': 3})
    n = len(trajs)
    assert row['reward'] == pytest.approx(sum(t.reward for t in trajs) / n, abs=1e-15)
    assert row['length'] == pytest.approx(sum(float(t.action_mask.sum()) for t in trajs) / n, abs=1e-12)
    assert row['zero_var_groups'] == 0.0 and row['episodes'] == n
    passed = 0
    for t in trajs:                          # submitted and passing every hidden test, whatever the reward
        if t.info['submitted'] and t.info['hidden_pass']:
            passed += 1
    assert row['pass_rate'] == pytest.approx(passed / n, abs=1e-15)
    forged = [dataclasses.replace(t, info={**t.info, 'submitted': True, 'hidden_pass': i < 3})
              for i, t in enumerate(trajs)]
    assert d.log_metrics(forged, cfg)['pass_rate'] == pytest.approx(3 / n, abs=1e-15)
    assert row['entropy'] == 0.5 and row['clip_frac'] == 0.1 and 'other' not in row
    same = [dataclasses.replace(t, reward=1.0) for t in trajs[:4]] + list(trajs[4:])
    assert d.log_metrics(same, cfg)['zero_var_groups'] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match='group_size'):
        d.log_metrics(trajs[:5], cfg)
    with pytest.raises(ValueError, match='sampled'):
        d.log_metrics([], cfg)
    with pytest.raises(TypeError, match='cfg'):
        d.log_metrics(trajs, 'cfg')


# ---------------------------------------------------------------- prepare_batch, make_ref
def test_prepare_batch_healthy_and_faults_by_hand(model, trajs, tok):
    cfg = cfg_of()
    batch = collate(trajs, tok.pad_id)
    B, T = batch['ids'].shape
    mask, old, adv = d.prepare_batch(model, batch, cfg)
    assert torch.equal(mask, batch['action_mask'])
    assert torch.equal(adv, compute_advantages(batch, cfg))
    with torch.no_grad():
        for i, t in enumerate(trajs):
            n = len(t) - 1
            want = hand_logp(model, t, 0.8) * t.action_mask
            assert (old[i, :n] - want).abs().max() < 1e-12
            assert (old[i, n:] == 0).all()
            want1 = hand_logp(model, t, 1.0) * t.action_mask            # the 'temperature' fault scores at 1
            old1 = d.prepare_batch(model, batch, cfg, 'temperature')[1]
            assert (old1[i, :n] - want1).abs().max() < 1e-12
    shifted = d.prepare_batch(model, batch, cfg, 'mask_shift')[0]
    for i in range(B):
        for t in range(T - 1):
            assert shifted[i, t] == (batch['action_mask'][i, t - 1] if t > 0 else 0.0)
    padded = d.prepare_batch(model, batch, cfg, 'pad_in_loss')[0]
    for i, t in enumerate(trajs):
        n = len(t) - 1
        assert torch.equal(padded[i, :n], t.action_mask) and (padded[i, n:] == 1).all()
    ratio_gap = (d.prepare_batch(model, batch, cfg, 'old_logp_padding')[1] - old).abs().max()
    assert ratio_gap > 1e-3                                            # shorter rows are scored elsewhere
    assert d.make_ref(model, cfg) is not model and d.make_ref(model, cfg, 'ref_is_policy') is model
    assert d.make_ref(model, cfg_of(kl_coef=0.0)) is None
    with pytest.raises(ValueError, match='bug'):
        d.prepare_batch(model, batch, cfg, 'typo')


def test_old_logp_padding_scores_left_padded_rows_by_hand(model, trajs, tok):
    "The fault's old log-probs are those of each episode with its padding moved to the front, scored unmasked."
    cfg = cfg_of()
    batch = collate(trajs, tok.pad_id)
    B, T = batch['ids'].shape
    old = d.prepare_batch(model, batch, cfg, 'old_logp_padding')[1]
    assert any(len(t) < T for t in trajs)                             # some rows really are padded
    with torch.no_grad():
        for i, t in enumerate(trajs):
            n = len(t)
            row = torch.cat([torch.full((T - n,), tok.pad_id, dtype=t.ids.dtype), t.ids])   # pads first
            logits = model(row[None])[0, :-1]                         # no attention mask, no position ids
            lp = sampling_log_probs(logits, 0.8).gather(-1, row[1:, None])[:, 0]            # [T-1]
            want = lp[T - n:] * t.action_mask                         # the entries that predict ids[1:n]
            assert (old[i, :n - 1] - want).abs().max() < 1e-12, i
            assert (old[i, n - 1:] == 0).all()


# ---------------------------------------------------------------- gradient accumulation
def test_any_split_equals_flat_grad_and_the_per_token_loss(model, trajs, tok):
    batch = collate(trajs, tok.pad_id)
    B = batch['ids'].shape[0]
    for kw in ({}, {'loss_agg_mode': 'seq_mean_token_mean'}, {'loss_agg_mode': 'seq_mean_token_sum_norm'},
               {'level': 'sequence', 'clip_low': 3e-4, 'clip_high': 4e-4}):
        cfg = cfg_of(**kw)
        m = copy.deepcopy(model).train()
        mask, old, adv = d.prepare_batch(m, batch, cfg)
        whole, _ = d.flat_grad(m, batch, mask, old, adv, cfg)
        gen = torch.Generator().manual_seed(5)
        for sizes in ([1, B - 1], [3, 1, 5, B - 9], [2] * (B // 2)):
            order = torch.randperm(B, generator=gen)
            m.zero_grad(set_to_none=True)
            start = 0
            for s in sizes:
                d.minibatch_backward(m, batch, order[start:start + s], mask, old, adv, cfg)
                start += s
            assert (grads(m) - whole).norm() / whole.norm() < 1e-12, (kw, sizes)
    # token_mean by hand: at ratio 1 the loss is -(sum over policy tokens of A_i) / N and its gradient that
    # of -(sum of A_i log pi) / N, one episode at a time
    cfg = cfg_of(kl_coef=0.0)
    m = copy.deepcopy(model).train()
    mask, old, adv = d.prepare_batch(m, batch, cfg)
    whole, stats = d.flat_grad(m, batch, mask, old, adv, cfg)
    N = sum(float(t.action_mask.sum()) for t in trajs)
    assert stats['loss'] == pytest.approx(-sum(float(adv[i]) * float(t.action_mask.sum())
                                                for i, t in enumerate(trajs)) / N, abs=1e-12)
    m.zero_grad(set_to_none=True)
    loss = sum(-float(adv[i]) * (hand_logp(m, t, 0.8) * t.action_mask).sum() for i, t in enumerate(trajs)) / N
    loss.backward()
    assert (grads(m) - whole).norm() / whole.norm() < 1e-12


def test_microbatch_norm_is_the_mean_of_microbatch_means(model, trajs, tok):
    "The fault weights each equal-size part's own token mean by 1 / parts, by a brute-force loop."
    batch = collate(trajs, tok.pad_id)
    cfg = cfg_of(kl_coef=0.0)
    m = copy.deepcopy(model).train()
    mask, old, adv = d.prepare_batch(m, batch, cfg)
    parts = torch.arange(12).split(4)
    for rows in parts:
        d.minibatch_backward(m, batch, rows, mask, old, adv, cfg, bug='microbatch_norm')
    faulty = grads(m)
    m.zero_grad(set_to_none=True)
    loss = 0.0
    for rows in parts:
        n = sum(float(trajs[i].action_mask.sum()) for i in rows)
        loss = loss + sum(-float(adv[i]) * (hand_logp(m, trajs[i], 0.8) * trajs[i].action_mask).sum()
                          for i in rows) / n / len(parts)
    loss.backward()
    assert (grads(m) - faulty).norm() / faulty.norm() < 1e-12
    whole, _ = d.flat_grad(m, batch, mask, old, adv, cfg)
    assert (whole - faulty).norm() / whole.norm() > 1e-3              # ragged rows: the weights differ


@pytest.mark.parametrize('kind', ['k1', 'k3'])
def test_accumulation_away_from_step_0_with_a_reference(model, trajs, tok, kind):
    """Perturbed weights (ratio away from 1, some tokens clipped) and a separate reference: any split, and the
    reference's log-probs passed once (as debug_update passes them), give the gradient of a loss written out
    token by token."""
    cfg = cfg_of(kl_kind=kind)
    batch = collate(trajs, tok.pad_id)
    B, T = batch['ids'].shape
    mask, old, adv = d.prepare_batch(model, batch, cfg)          # pi_old: the unperturbed model
    m, ref = copy.deepcopy(model).train(), copy.deepcopy(model).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for net in (m, ref):
            for p in net.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    stats = d.minibatch_backward(m, batch, torch.arange(B), mask, old, adv, cfg, ref_model=ref)
    whole = grads(m)
    assert stats['clip_frac'] > 0 and abs(stats['kl']) > 1e-3
    # the loss by hand, one episode and one token at a time
    m.zero_grad(set_to_none=True)
    N = sum(float(t.action_mask.sum()) for t in trajs)
    loss = 0.0
    for i, t in enumerate(trajs):
        lp = hand_logp(m, t, 0.8)
        with torch.no_grad():
            ref_lp = hand_logp(ref, t, 0.8)
        for pos in range(len(t) - 1):
            if t.action_mask[pos] == 0:
                continue
            r = torch.exp(lp[pos] - old[i, pos])
            a = float(adv[i])
            surrogate = torch.maximum(-a * r, -a * r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high))
            dlt = ref_lp[pos] - lp[pos]
            kl = -dlt if kind == 'k1' else torch.exp(dlt) - dlt - 1
            loss = loss + (surrogate + cfg.kl_coef * kl) / N
    loss.backward()
    assert (grads(m) - whole).norm() / whole.norm() < 1e-12
    ref_logp = torch.zeros(B, T - 1)
    with torch.no_grad():
        for i, t in enumerate(trajs):
            ref_logp[i, :len(t) - 1] = hand_logp(ref, t, 0.8) * t.action_mask
    order = torch.randperm(B, generator=gen)
    for kw in ({'ref_model': ref}, {'ref_logp': ref_logp}):
        for sizes in ([1, B - 1], [3, 1, 5, B - 9], [2] * (B // 2)):
            m.zero_grad(set_to_none=True)
            start = 0
            for size in sizes:
                d.minibatch_backward(m, batch, order[start:start + size], mask, old, adv, cfg, **kw)
                start += size
            assert (grads(m) - whole).norm() / whole.norm() < 1e-12, (kw.keys(), sizes)


# ---------------------------------------------------------------- debug_update is rl_update
@pytest.mark.parametrize('kw', [{}, {'epochs': 2, 'minibatches': 3}, {'kl_coef': 0.0, 'minibatches': 1},
                                {'loss_agg_mode': 'seq_mean_token_sum_norm', 'kl_kind': 'k2'},
                                {'level': 'sequence', 'clip_low': 3e-4, 'clip_high': 4e-4},
                                {'dual_clip': 3.0, 'lr': 3e-2}])
def test_debug_update_gives_rl_updates_weights(model, trajs, tok, kw):
    cfg = cfg_of(**kw)
    batch = collate(trajs, tok.pad_id)
    ref = copy.deepcopy(model).eval()
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    oa = torch.optim.AdamW(a.parameters(), lr=cfg.lr, weight_decay=0.0)
    ob = torch.optim.AdamW(b.parameters(), lr=cfg.lr, weight_decay=0.0)
    ra = rl_update(a, oa, batch, compute_advantages(batch, cfg), cfg, ref_model=ref,
                   generator=torch.Generator().manual_seed(2))
    rb = d.debug_update(b, ob, batch, cfg, ref_model=ref, generator=torch.Generator().manual_seed(2))
    assert max(float((x - y).detach().abs().max()) for x, y in zip(a.parameters(), b.parameters())) < 1e-12
    assert any(float((x - y).detach().abs().max()) > 0 for x, y in zip(a.parameters(), model.parameters()))
    assert rb['loss'] == pytest.approx(ra['loss'], abs=1e-12)
    assert rb['grad_norm'] == pytest.approx(ra['grad_norm'], abs=1e-12)


def test_debug_update_stats_are_per_token(model, trajs, tok):
    "One step: entropy is the mean over every policy token (a hand loop), the ratio is 1, nothing clips."
    cfg = cfg_of(kl_coef=0.0, minibatches=1)
    batch = collate(trajs, tok.pad_id)
    m = copy.deepcopy(model)
    with torch.no_grad():
        ents = torch.cat([entropy_from_logits(m(t.ids[None])[0, :-1][t.action_mask.bool()] / 0.8)
                          for t in trajs])
    s = d.debug_update(m, torch.optim.AdamW(m.parameters(), lr=1e-3), batch, cfg)
    assert s['entropy'] == pytest.approx(float(ents.mean()), abs=1e-12)
    assert s['tokens'] == len(ents) and s['steps'] == 1 and s['clip_frac'] == 0.0
    assert abs(s['start_ratio_min'] - 1) < 1e-12 and abs(s['start_ratio_max'] - 1) < 1e-12
    with pytest.raises(ValueError, match='ref_model'):
        d.debug_update(m, torch.optim.AdamW(m.parameters()), batch, cfg_of())
    with pytest.raises(ValueError, match='minibatches'):
        d.debug_update(m, torch.optim.AdamW(m.parameters()), batch, cfg_of(kl_coef=0.0, minibatches=13))


def test_debug_update_kl_is_the_token_mean_of_k3_across_microbatches(model, trajs, tok):
    """One optimizer step over the 12 rows (microbatches of 8 and 4) against a perturbed reference: the logged kl
    is the mean of k3 = exp(d) - d - 1, d = log pi_ref - log pi, over every policy token, by a hand loop."""
    assert d.MICRO_ROWS == 8 and len(trajs) == 12
    cfg = cfg_of(minibatches=1)
    batch = collate(trajs, tok.pad_id)
    m, ref = copy.deepcopy(model), copy.deepcopy(model).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        per_row = []
        for t in trajs:
            keep = t.action_mask.bool()
            dlt = hand_logp(ref, t, 0.8)[keep] - hand_logp(model, t, 0.8)[keep]
            per_row.append(torch.exp(dlt) - dlt - 1)
    s = d.debug_update(m, torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=0.0), batch, cfg,
                       ref_model=ref)
    token_mean = float(torch.cat(per_row).mean())
    assert s['kl'] == pytest.approx(token_mean, abs=1e-12)
    by_micro = [float(torch.cat(per_row[i:i + 8]).mean()) for i in (0, 8)]
    assert abs(sum(by_micro) / 2 - token_mean) > 1e-6                # a mean of microbatch means differs


def test_ref_is_policy_kl_is_zero_then_measures_the_step(model, trajs, tok):
    """With the policy as its reference the reference log-probs are the step's old ones: one optimizer step logs
    a KL of 0; with two, the second minibatch's KL is k3 against the scores before the update, written out by
    hand (the first step replayed by hand: policy gradient at ratio 1, norm clip, AdamW)."""
    batch = collate(trajs, tok.pad_id)
    cfg1 = cfg_of(minibatches=1)
    m = copy.deepcopy(model)
    s = d.debug_update(m, torch.optim.AdamW(m.parameters(), lr=cfg1.lr, weight_decay=0.0), batch, cfg1,
                       ref_model=d.make_ref(m, cfg1, 'ref_is_policy'), bug='ref_is_policy')
    assert abs(s['kl']) < 1e-12
    cfg = cfg_of(minibatches=2)
    m = copy.deepcopy(model)
    s = d.debug_update(m, torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=0.0), batch, cfg,
                       ref_model=d.make_ref(m, cfg, 'ref_is_policy'), bug='ref_is_policy')
    first, second = range(0, 6), range(6, 12)                        # no generator: rows in batch order
    adv = compute_advantages(batch, cfg)
    h = copy.deepcopy(model).train()
    with torch.no_grad():
        before = [hand_logp(h, t, 0.8) for t in trajs]
    n1 = sum(float(trajs[i].action_mask.sum()) for i in first)
    loss = sum(-float(adv[i]) * (hand_logp(h, trajs[i], 0.8) * trajs[i].action_mask).sum() for i in first) / n1
    opt = torch.optim.AdamW(h.parameters(), lr=cfg.lr, weight_decay=0.0)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(h.parameters(), cfg.max_grad_norm)
    opt.step()
    k3_sum = 0.0
    with torch.no_grad():
        for i in second:
            keep = trajs[i].action_mask.bool()
            dlt = before[i][keep] - hand_logp(h, trajs[i], 0.8)[keep]
            k3_sum += float((torch.exp(dlt) - dlt - 1).sum())
    N = sum(float(t.action_mask.sum()) for t in trajs)
    assert k3_sum > 1e-6
    assert s['kl'] == pytest.approx(k3_sum / N, abs=1e-10)            # the first step's part is 0


# ---------------------------------------------------------------- padding
def test_pad_batch_fills_and_leaves_the_gradient(model, trajs, tok):
    batch = collate(trajs, tok.pad_id)
    B, T = batch['ids'].shape
    p = d.pad_batch(batch, 5, tok.pad_id)
    assert p['ids'].shape == (B, T + 5) and p['action_mask'].shape == (B, T + 4)
    assert (p['ids'][:, T:] == tok.pad_id).all() and (p['turn_ids'][:, T - 1:] == -1).all()
    assert (p['attention_mask'][:, T:] == 0).all() and (p['sample_logp'][:, T - 1:] == 0).all()
    assert torch.equal(p['ids'][:, :T], batch['ids']) and p['rewards'] is batch['rewards']
    cfg = cfg_of()
    m = copy.deepcopy(model)
    g0 = d.flat_grad(m, batch, *d.prepare_batch(m, batch, cfg), cfg)[0]
    g1 = d.flat_grad(m, p, *d.prepare_batch(m, p, cfg), cfg)[0]
    assert (g1 - g0).norm() / g0.norm() < 1e-12
    with pytest.raises(ValueError, match='extra'):
        d.pad_batch(batch, -1)


# ---------------------------------------------------------------- checks
def owned_by_hand(trajs, T):
    "1 where the Trajectory's owner code says the policy wrote ids[t+1], by a loop over positions: [B, T-1]."
    owned = torch.zeros(len(trajs), T - 1)
    for i, t in enumerate(trajs):
        for pos in range(len(t) - 1):
            owned[i, pos] = 1.0 if int(t.owner[pos + 1]) == OWNER_POLICY else 0.0
    return owned


def test_healthy_trainer_passes_every_check(model, trajs, tok):
    res = d.sanity_checks(model, trajs, tok, cfg_of())
    assert set(res) == {'mask_is_owned', 'old_logp_is_model', 'ratio_one_at_start', 'reference_frozen',
                        'policy_moved', 'sampler_agrees', 'gradient_is_pg', 'accumulation_matches',
                        'padding_invariant'}
    assert all(ok for _, ok in res.values()), res
    assert all(v < 1e-12 for name, (v, _) in res.items() if name != 'policy_moved'), res
    # the owner mask, built here position by position from the owner codes, is the healthy trainer's mask
    batch = collate(trajs, tok.pad_id)
    owned = owned_by_hand(trajs, batch['ids'].shape[1])
    assert torch.equal(d.prepare_batch(model, batch, cfg_of())[0], owned)
    # and mask_is_owned counts the positions where a faulty mask leaves it
    shifted = d.prepare_batch(model, batch, cfg_of(), 'mask_shift')[0]
    want = sum(int(shifted[i, t] != owned[i, t]) for i in range(len(trajs)) for t in range(owned.shape[1]))
    assert want > 0
    assert d.sanity_checks(model, trajs, tok, cfg_of(), bug='mask_shift')['mask_is_owned'] == (want, False)


FAILS = {   # every check each fault fails on the fixture's batch (k3, token_mean)
    'ref_is_policy': {'reference_frozen'},
    'old_logp_padding': {'old_logp_is_model', 'sampler_agrees', 'ratio_one_at_start', 'gradient_is_pg',
                         'padding_invariant'},
    # on the notebook's batch mask_shift also fails ratio_one_at_start and accumulation_matches, failures of the
    # scorer's chunking, not of the fault: whether the shifted mask's position past a row's end is scored depends
    # on which rows share a chunk of _policy_logp (the notebook hatches both and does not count them)
    'mask_shift': {'mask_is_owned', 'old_logp_is_model', 'sampler_agrees', 'gradient_is_pg',
                   'padding_invariant'},
    'pad_in_loss': {'mask_is_owned', 'gradient_is_pg', 'padding_invariant'},
    'microbatch_norm': {'accumulation_matches'},
    'adv_not_detached': {'gradient_is_pg'},
    'temperature': {'old_logp_is_model', 'sampler_agrees', 'gradient_is_pg'},
}


@pytest.mark.parametrize('bug', list(d.BUGS))
def test_each_fault_fails_its_checks_by_a_margin(model, trajs, tok, bug):
    res = d.sanity_checks(model, trajs, tok, cfg_of(), bug=bug)
    failed = {name for name, (_, ok) in res.items() if not ok}
    assert failed == FAILS[bug], (bug, res)
    for name in failed:                      # far from the tolerance: a count, or 1000 times CHECK_TOL
        v = res[name][0]
        assert (v > 0) if isinstance(v, int) else (v > 1e3 * d.CHECK_TOL), (name, v)
    for name, (v, ok) in res.items():        # and what passes, passes by the same margin
        if ok and name != 'policy_moved':
            assert v < 1e-3 * d.CHECK_TOL, (name, v)


@pytest.mark.parametrize('kind', ['k1', 'k2', 'k3'])
def test_adv_not_detached_is_invisible_at_ratio_one_under_k1(model, trajs, tok, kind):
    """At ratio 1 the undetached advantage adds beta grad(mean log pi): the gradient of the k1 penalty itself.
    Under k1 the faulty gradient is the healthy one; under k2 and k3 (zero gradient at ratio 1) it is not."""
    cfg = cfg_of(kl_kind=kind)
    batch = collate(trajs, tok.pad_id)
    m = copy.deepcopy(model)
    inputs = d.prepare_batch(m, batch, cfg)
    healthy = d.flat_grad(m, batch, *inputs, cfg)[0]
    faulty = d.flat_grad(m, batch, *inputs, cfg, bug='adv_not_detached')[0]
    gap = float((faulty - healthy).norm() / healthy.norm())
    res = d.sanity_checks(model, trajs, tok, cfg, bug='adv_not_detached')
    if kind == 'k1':
        assert gap < 1e-12 and all(ok for _, ok in res.values()), (gap, res)
    else:
        # the extra term, by hand: beta times the gradient of the token mean of log pi
        m.zero_grad(set_to_none=True)
        N = sum(float(t.action_mask.sum()) for t in trajs)
        extra = cfg.kl_coef * sum((hand_logp(m, t, 0.8) * t.action_mask).sum() for t in trajs) / N
        extra.backward()
        assert (faulty - healthy - grads(m)).norm() / grads(m).norm() < 1e-10
        assert not res['gradient_is_pg'][1]


def test_policy_moved_fails_when_nothing_moves(model, trajs, tok):
    cfg = cfg_of()
    cfg.lr = 0.0                             # RLConfig refuses lr 0; a frozen optimizer, set after the checks
    res = d.sanity_checks(model, trajs, tok, cfg)
    assert res['policy_moved'] == (0.0, False)
    assert {name for name, (_, ok) in res.items() if not ok} == {'policy_moved'}


@pytest.mark.parametrize('kw', [{'loss_agg_mode': 'seq_mean_token_sum_norm'},
                                {'loss_agg_mode': 'seq_mean_token_mean'},
                                {'level': 'sequence', 'clip_low': 3e-4, 'clip_high': 4e-4}, {'kl_kind': 'k1'},
                                {'kl_kind': 'k2', 'minibatches': 1}, {'kl_coef': 0.0}])
def test_healthy_trainer_passes_every_check_in_every_mode(model, trajs, tok, kw):
    res = d.sanity_checks(model, trajs, tok, cfg_of(**kw))
    assert all(ok for _, ok in res.values()), (kw, res)
    assert all(v < 1e-12 for name, (v, _) in res.items() if name != 'policy_moved'), (kw, res)
    assert not d.sanity_checks(model, trajs, tok, cfg_of(**kw), bug='mask_shift')['mask_is_owned'][1]


def test_step_checks_reads_an_independent_mask(model, trajs, tok):
    cfg = cfg_of()
    batch = collate(trajs, tok.pad_id)
    T = batch['ids'].shape[1]
    owned = torch.zeros(len(trajs), T - 1)
    logp = torch.zeros(len(trajs), T - 1)
    with torch.no_grad():
        for i, t in enumerate(trajs):
            own = (t.owner[1:] == OWNER_POLICY).double()
            owned[i, :len(t) - 1] = own
            logp[i, :len(t) - 1] = hand_logp(model, t, 0.8) * own
    before = [p.detach().clone() for p in model.parameters()]
    res = d.step_checks(model, batch, owned, logp, cfg)
    assert all(ok for _, ok in res.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))     # the model is untouched
    wrong = owned.clone()
    wrong[0, 0] = 1 - wrong[0, 0]
    assert d.step_checks(model, batch, wrong, logp, cfg)['mask_is_owned'] == (1, False)


# ---------------------------------------------------------------- the loop
def test_train_logged_is_deterministic_and_logs_the_dashboard(model, tok):
    cfg = RLConfig(group_size=2, tasks_per_step=3, kl_coef=0.05, temperature=0.8, drop_equal_groups=False,
                   eval_samples=1)
    runs = []
    for _ in range(2):
        m = copy.deepcopy(model)
        runs.append(d.train_logged(m, TRAIN[:6], tok, cfg, 2, eval_tasks=TRAIN[6:8], eval_every=1))
    assert runs[0] == runs[1]
    row = runs[0][1]
    for key in ('reward', 'pass_rate', 'length', 'zero_var_groups', 'entropy', 'kl', 'clip_frac', 'grad_norm',
                'ratio_min', 'ratio_max', 'eval_pass_rate', 'final_eval_pass_rate'):
        assert key in row
    with pytest.raises(ValueError, match='bug'):
        d.train_logged(copy.deepcopy(model), TRAIN[:6], tok, cfg, 1, bug='nope')


def test_train_logged_without_a_bug_is_train_rl(model, tok):
    "Two steps of train_logged(bug=None) and of train_rl: the same weights, the same shared history columns."
    from agentrl.grpo import train_rl
    cfg = RLConfig(group_size=2, tasks_per_step=3, kl_coef=0.05, temperature=0.8, drop_equal_groups=False,
                   eval_samples=1)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ha = train_rl(a, TRAIN[:6], tok, cfg, 2, eval_tasks=TRAIN[6:8], eval_every=1)
    hb = d.train_logged(b, TRAIN[:6], tok, cfg, 2, eval_tasks=TRAIN[6:8], eval_every=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), model.state_dict().values()))
    for ra, rb in zip(ha, hb):
        assert ra['updated'] and rb['updated']
        for key in ('step', 'reward', 'pass_rate', 'kept_groups', 'updated', 'eval_pass_rate', 'tokens'):
            assert ra[key] == rb[key], key
        for key in ('loss', 'grad_norm'):                    # means over optimizer steps in both
            assert rb[key] == pytest.approx(ra[key], abs=1e-12), key
    assert ha[-1]['final_eval_pass_rate'] == hb[-1]['final_eval_pass_rate']


def test_make_debug_run_is_train_logged_and_caches_it(tok, monkeypatch, tmp_path):
    from conftest import small_base
    monkeypatch.setattr(d, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    model, history = d.make_debug_run(tok, 'mask_shift', seed=1, steps=1, base_seed=2)
    ref = small_base(tok, seed=2)                          # the same run, written out by hand
    ref_history = d.train_logged(ref, TRAIN, tok, RLConfig(seed=1, **d.DEBUG_CFG), 1, bug='mask_shift',
                                 eval_tasks=make_tasks('heldout'), eval_every=d.DEBUG_EVAL_EVERY)
    assert history == ref_history and not model.training
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), ref.state_dict().values()))
    assert len(list(tmp_path.glob('debug_run-*.pt'))) == 1
    monkeypatch.setattr(d, 'sample_step', lambda *a, **k: pytest.fail('trained instead of loading the cache'))
    again = d.make_debug_run(tok, 'mask_shift', seed=1, steps=1, base_seed=2)[1]
    assert again == history
    for bad in (dict(bug='typo'), dict(seed=-1), dict(steps=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            d.make_debug_run(tok, **bad)
