"""Tests for agentrl.policies (Chapter 3). Reference values are computed independently:
plain-Python softmax, brute-force loops over positions and prefixes, explicit enumeration."""
import math

import pytest
import torch

import agentrl.policies as m

torch.set_num_threads(1)
NINF = float('-inf')


def py_log_softmax(row):
    "Log-softmax of a list of floats in plain Python (-inf entries allowed)."
    finite = [z for z in row if z != NINF]
    mx = max(finite)
    lse = mx + math.log(sum(math.exp(z - mx) for z in finite))
    return [z - lse if z != NINF else NINF for z in row]


def py_nucleus(probs, top_p):
    "Ids kept by top-p, by explicit enumeration: descending prob, lower id first on ties."
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    return set(kept)


# ----------------------------------------------------------------------------- selected_log_probs
def test_selected_log_probs_matches_hand_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 0.0, 3.0, -2.0]])
    ids = torch.tensor([0, 3])
    got = m.selected_log_probs(logits, ids)
    want = [py_log_softmax(logits[0].tolist())[0], py_log_softmax(logits[1].tolist())[3]]
    assert got.shape == (2,)
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    # closed form: uniform row -> log(1/4)
    assert m.selected_log_probs(torch.zeros(4), torch.tensor(2)).item() == pytest.approx(math.log(0.25), abs=1e-7)


def test_selected_log_probs_shapes_and_neg_inf():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 5, (2, 3), generator=torch.Generator().manual_seed(1))
    assert m.selected_log_probs(logits, ids).shape == (2, 3)
    masked = torch.tensor([0.0, NINF, 1.0])
    assert m.selected_log_probs(masked, torch.tensor(1)).item() == NINF
    assert math.isfinite(m.selected_log_probs(masked, torch.tensor(2)).item())
    x = masked.clone().requires_grad_(True)
    m.selected_log_probs(x, torch.tensor(2)).backward()
    assert torch.isfinite(x.grad).all() and x.grad[1] == 0


@pytest.mark.parametrize('ids, word', [
    (torch.tensor([0.0, 1.0]), 'ids'),                 # float ids
    (torch.tensor([0, 1, 2]), 'ids'),                  # wrong shape
    (torch.tensor([0, 4]), 'ids'),                     # out of range
    (torch.tensor([-1, 0]), 'ids'),                    # negative
])
def test_selected_log_probs_bad_ids(ids, word):
    with pytest.raises(ValueError, match=word):
        m.selected_log_probs(torch.zeros(2, 4), ids)


def test_selected_log_probs_bad_logits():
    with pytest.raises(ValueError, match='logits'):
        m.selected_log_probs(torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match='logits'):
        m.selected_log_probs(torch.full((2, 3), NINF), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match='logits'):
        m.selected_log_probs(torch.tensor([[0.0, float('nan')]]), torch.tensor([0]))


# ----------------------------------------------------------------------------- entropy_from_logits
def test_entropy_hand_values():
    z = [2.0, 1.0, 0.5, 0.0, -3.0]
    lp = py_log_softmax(z)
    want = -sum(math.exp(a) * a for a in lp)
    assert m.entropy_from_logits(torch.tensor(z)).item() == pytest.approx(want, abs=1e-6)
    assert m.entropy_from_logits(torch.zeros(3, 7)).tolist() == pytest.approx([math.log(7)] * 3, abs=1e-6)


def test_entropy_with_neg_inf_is_finite_and_correct():
    z = torch.tensor([[1.0, NINF, 0.0, NINF], [NINF, NINF, 5.0, NINF], [0.0, 0.0, NINF, NINF]])
    h = m.entropy_from_logits(z)
    lp = py_log_softmax([1.0, NINF, 0.0, NINF])
    want0 = -sum(math.exp(a) * a for a in lp if a != NINF)
    assert h[0].item() == pytest.approx(want0, abs=1e-6)
    assert h[1].item() == 0.0                               # all-but-one -inf: exactly 0
    assert h[2].item() == pytest.approx(math.log(2), abs=1e-6)
    x = z.clone().requires_grad_(True)
    m.entropy_from_logits(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[torch.isneginf(z)] == 0).all()


def test_entropy_gradient_matches_finite_difference():
    z = torch.tensor([0.3, -1.2, 2.0, 0.1], dtype=torch.float64, requires_grad=True)
    m.entropy_from_logits(z).backward()
    eps = 1e-6
    for i in range(4):
        e = torch.zeros(4, dtype=torch.float64)
        e[i] = eps
        fd = (m.entropy_from_logits(z.detach() + e) - m.entropy_from_logits(z.detach() - e)) / (2 * eps)
        assert z.grad[i].item() == pytest.approx(fd.item(), abs=1e-7)


def test_entropy_bad_input():
    with pytest.raises(ValueError, match='logits'):
        m.entropy_from_logits(torch.full((2, 3), NINF))
    with pytest.raises(ValueError, match='logits'):
        m.entropy_from_logits(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match='logits'):
        m.entropy_from_logits(torch.tensor(1.0))
    with pytest.raises(TypeError, match='logits'):
        m.entropy_from_logits([1.0, 2.0])


# ----------------------------------------------------------------------------- sampling_log_probs
def test_sampling_log_probs_default_is_log_softmax():
    z = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    got = m.sampling_log_probs(z)
    for r in range(3):
        assert got[r].tolist() == pytest.approx(py_log_softmax(z[r].tolist()), abs=1e-6)


def test_sampling_log_probs_temperature_by_hand():
    z = [2.0, 1.0, 0.0, -1.0]
    for T in [0.25, 0.7, 3.0]:
        want = py_log_softmax([v / T for v in z])
        assert m.sampling_log_probs(torch.tensor(z), T).tolist() == pytest.approx(want, abs=1e-5)


def test_sampling_log_probs_top_p_brute_force():
    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        z = 2.0 * torch.randn(10, generator=g, dtype=torch.float64)
        T = [0.5, 1.0, 1.7][trial % 3]
        top_p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        base = [math.exp(a) for a in py_log_softmax([v / T for v in z.tolist()])]
        kept = py_nucleus(base, top_p)
        got = m.sampling_log_probs(z, T, top_p)
        mass = sum(base[i] for i in kept)
        for i in range(10):
            if i in kept:
                assert got[i].item() == pytest.approx(math.log(base[i] / mass), abs=1e-9)
            else:
                assert got[i].item() == NINF
        assert sum(base[i] for i in kept) >= top_p - 1e-12                 # enough mass
        smallest = min(kept, key=lambda i: base[i])
        assert mass - base[smallest] < top_p + 1e-12                        # and the smallest such set


def test_sampling_log_probs_ties_keep_lower_id():
    got = m.sampling_log_probs(torch.tensor([1.0, 1.0, 1.0, 0.0]), 1.0, 0.5).exp()
    assert got.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0], abs=1e-6)
    got = m.sampling_log_probs(torch.tensor([0.0, 2.0, 2.0]), 1.0, 0.3)      # tie on the top token
    assert torch.isneginf(got).tolist() == [True, False, True]


def test_sampling_log_probs_edge_cases_nan_free():
    z = torch.tensor([[3.0, 1.0, NINF, 0.5], [0.0, 0.0, 0.0, 0.0]])
    for T, p in [(1e-30, 1.0), (1e-8, 0.5), (1.0, 1e-9), (1e30, 1.0), (1e-4, 1e-9)]:
        out = m.sampling_log_probs(z, T, p)
        assert not torch.isnan(out).any()
        assert torch.allclose(out.exp().sum(-1), torch.ones(2))
        assert (torch.isfinite(out).sum(-1) >= 1).all()                     # at least one token kept
    assert m.sampling_log_probs(z, 1e-30)[0].exp().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert m.sampling_log_probs(z, 1.0, 1e-9)[0].exp().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert m.sampling_log_probs(z)[0, 2].item() == NINF                     # an excluded logit stays excluded


def test_sampling_log_probs_gradient_finite():
    z = torch.randn(4, 9, generator=torch.Generator().manual_seed(4), requires_grad=True)
    out = m.sampling_log_probs(z, 0.7, 0.6)
    picked = out.gather(-1, out.argmax(-1, keepdim=True))
    picked.sum().backward()
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize('kwargs, word', [
    (dict(temperature=0.0), 'temperature'), (dict(temperature=-1.0), 'temperature'),
    (dict(temperature=float('nan')), 'temperature'), (dict(temperature=float('inf')), 'temperature'),
    (dict(temperature=True), 'temperature'), (dict(temperature='1'), 'temperature'),
    (dict(top_p=0.0), 'top_p'), (dict(top_p=1.5), 'top_p'), (dict(top_p=-0.1), 'top_p'),
    (dict(top_p=float('nan')), 'top_p'),
])
def test_sampling_log_probs_bad_args(kwargs, word):
    with pytest.raises(ValueError, match=word):
        m.sampling_log_probs(torch.zeros(2, 3), **kwargs)


# ----------------------------------------------------------------------------- sample_next
def test_sample_next_shapes_and_consistency():
    z = torch.randn(6, 11, generator=torch.Generator().manual_seed(5))
    ids, logp = m.sample_next(z, 0.8, 0.9, torch.Generator().manual_seed(0))
    assert ids.shape == (6,) and ids.dtype == torch.long
    assert logp.shape == (6,) and not logp.requires_grad
    table = m.sampling_log_probs(z, 0.8, 0.9)
    assert torch.equal(logp, table[torch.arange(6), ids])
    assert torch.isfinite(logp).all()                                     # never an excluded token


def test_sample_next_uses_generator():
    z = torch.zeros(50, 20)
    a = m.sample_next(z, generator=torch.Generator().manual_seed(7))[0]
    b = m.sample_next(z, generator=torch.Generator().manual_seed(7))[0]
    c = m.sample_next(z, generator=torch.Generator().manual_seed(8))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sample_next_frequencies_match_distribution():
    z = torch.tensor([1.5, 0.5, 0.0, -0.5, -2.0])
    n = 40000
    ids, _ = m.sample_next(z.expand(n, -1), 0.8, 0.95, torch.Generator().manual_seed(9))
    probs = [math.exp(a) for a in py_log_softmax([v / 0.8 for v in z.tolist()])]
    kept = py_nucleus(probs, 0.95)
    mass = sum(probs[i] for i in kept)
    freq = torch.bincount(ids, minlength=5).double() / n
    for i in range(5):
        p = probs[i] / mass if i in kept else 0.0
        assert abs(freq[i].item() - p) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / n) + 1e-12


def test_sample_next_greedy_limits():
    z = torch.randn(8, 30, generator=torch.Generator().manual_seed(10))
    for T, p in [(1e-6, 1.0), (1.0, 1e-9)]:
        ids, logp = m.sample_next(z, T, p, torch.Generator().manual_seed(0))
        assert torch.equal(ids, z.argmax(-1)) and (logp == 0).all()


def test_sample_next_bad_input():
    with pytest.raises(ValueError, match='logits'):
        m.sample_next(torch.zeros(3))
    with pytest.raises(ValueError, match='logits'):
        m.sample_next(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match='temperature'):
        m.sample_next(torch.zeros(2, 3), temperature=0)
    with pytest.raises(ValueError, match='top_p'):
        m.sample_next(torch.zeros(2, 3), top_p=2)
    with pytest.raises(TypeError, match='generator'):
        m.sample_next(torch.zeros(2, 3), generator=0)


# ----------------------------------------------------------------------------- TinyAgent
def make_agent(V=23, seed=0, **kw):
    torch.manual_seed(seed)
    return m.TinyAgent(vocab_size=V, **kw).eval()


def test_agent_config_validation():
    cfg = m.AgentConfig(vocab_size=10)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.max_len) == (64, 2, 4, 512)
    with pytest.raises(ValueError, match='n_heads'):
        m.AgentConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match='vocab_size'):
        m.AgentConfig(vocab_size=0)
    with pytest.raises(ValueError, match='d_model'):
        m.AgentConfig(vocab_size=5, d_model=32.0)
    with pytest.raises(TypeError, match='config'):
        m.TinyAgent('small')
    assert m.TinyAgent(cfg, d_model=32).config.d_model == 32


def test_agent_shapes_and_deterministic_init():
    a, b = make_agent(seed=1), make_agent(seed=1)
    ids = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(0))
    out = a(ids)
    assert out.shape == (3, 9, 23)
    assert a.hidden(ids).shape == (3, 9, 64)
    assert isinstance(a.head, torch.nn.Linear) and a.head.weight.shape == (23, 64) and a.head.bias is None
    assert torch.equal(out, b(ids))
    assert not torch.equal(out, make_agent(seed=2)(ids))
    assert torch.allclose(a.head(a.hidden(ids)), out)


def test_agent_is_causal():
    agent = make_agent()
    ids = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 5) % 23
    with torch.no_grad():
        d = (agent(ids) - agent(changed)).abs().amax(dim=(0, 2))
    assert (d[:7] == 0).all() and (d[7:] > 0).all()


def test_kv_cache_matches_full_forward():
    agent = make_agent()
    ids = torch.randint(0, 23, (3, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = agent(ids)
        cache = agent.new_cache()
        parts = [agent(ids[:, :4], kv_cache=cache)]
        for s, e in [(4, 5), (5, 9), (9, 10)] + [(t, t + 1) for t in range(10, 20)]:
            parts.append(agent(ids[:, s:e], kv_cache=cache))
    assert len(cache) == 20
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_kv_cache_with_left_padding_continues_positions_per_row():
    agent = make_agent()
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 23, (9,), generator=g), torch.randint(0, 23, (6,), generator=g)
    batch = torch.stack([a[:5], torch.cat([torch.zeros(2, dtype=torch.long), b[:3]])])   # [2, 5]
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref_a, ref_b = agent(a[None])[0], agent(b[None])[0]
        cache = agent.new_cache()
        first = agent(batch, position_ids=pos, attention_mask=mask, kv_cache=cache)
        assert torch.allclose(first[0], ref_a[:5], atol=1e-5) and torch.allclose(first[1, 2:], ref_b[:3], atol=1e-5)
        for t in range(3):                          # decode: positions continue per row, no new arguments
            step = agent(torch.stack([a[5 + t], b[3 + t]])[:, None], kv_cache=cache)
            assert torch.allclose(step[0, 0], ref_a[5 + t], atol=1e-5)
            assert torch.allclose(step[1, 0], ref_b[3 + t], atol=1e-5)


def test_padding_mask_and_packing():
    agent = make_agent()
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(0, 23, (7,), generator=g), torch.randint(0, 23, (4,), generator=g)
    with torch.no_grad():
        ref_a, ref_b = agent(a[None])[0], agent(b[None])[0]
        right = torch.stack([a, torch.cat([b, torch.zeros(3, dtype=torch.long)])])
        out = agent(right, attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3]))
        assert torch.allclose(out[1, :4], ref_b, atol=1e-5)
        seg = torch.tensor([0] * 7 + [1] * 4)
        packed = agent(torch.cat([a, b])[None], position_ids=torch.cat([torch.arange(7), torch.arange(4)])[None],
                       attention_mask=(seg[:, None] == seg[None, :])[None])[0]
        assert torch.allclose(packed[:7], ref_a, atol=1e-5) and torch.allclose(packed[7:], ref_b, atol=1e-5)
        # a query with no key to attend to (left pad, bool mask) stays finite
        left = agent(torch.cat([torch.zeros(2, dtype=torch.long), b])[None],
                     attention_mask=torch.tensor([[False, False] + [True] * 4]))
        assert torch.isfinite(left).all()


def test_agent_gradients_and_critic_head_swap():
    agent = make_agent()
    ids = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(5))
    m.sequence_log_probs(agent, ids).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in agent.parameters())
    agent.head = torch.nn.Linear(agent.config.d_model, 1)
    assert agent(ids).shape == (2, 8, 1)


@pytest.mark.parametrize('ids, word', [
    (torch.zeros(2, 5), 'ids'),                                   # float ids
    (torch.zeros(5, dtype=torch.long), 'ids'),                    # 1-D
    (torch.zeros(1, 2, 3, dtype=torch.long), 'ids'),              # 3-D
    (torch.full((1, 4), 23, dtype=torch.long), 'ids'),            # id == vocab
    (torch.full((1, 4), -1, dtype=torch.long), 'ids'),            # negative id
    (torch.zeros(1, 33, dtype=torch.long), 'max_len'),            # too long
    (torch.zeros(1, 0, dtype=torch.long), 'ids'),                 # empty
])
def test_agent_bad_ids(ids, word):
    agent = make_agent(max_len=32)
    with pytest.raises(ValueError, match=word):
        agent(ids)


def test_agent_bad_masks_positions_and_cache():
    agent = make_agent(max_len=16)
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match='attention_mask'):
        agent(ids, attention_mask=torch.ones(2, 4))                             # float mask
    with pytest.raises(ValueError, match='attention_mask'):
        agent(ids, attention_mask=torch.full((2, 4), 2))                        # not 0/1
    with pytest.raises(ValueError, match='attention_mask'):
        agent(ids, attention_mask=torch.ones(2, 5, dtype=torch.bool))           # wrong length
    with pytest.raises(ValueError, match='attention_mask'):
        agent(ids, attention_mask=torch.ones(2, 4, 4, dtype=torch.long))        # 3-D not bool
    with pytest.raises(ValueError, match='position'):
        agent(ids, position_ids=torch.full((2, 4), 16))                         # beyond max_len
    with pytest.raises(ValueError, match='position_ids'):
        agent(ids, position_ids=torch.zeros(2, 4))                              # float positions
    cache = agent.new_cache()
    with torch.no_grad():
        agent(torch.zeros(2, 14, dtype=torch.long), kv_cache=cache)
        with pytest.raises(ValueError, match='max_len'):
            agent(ids, kv_cache=cache)                                          # 14 + 4 > 16
        with pytest.raises(ValueError, match='batch'):
            agent(torch.zeros(3, 1, dtype=torch.long), kv_cache=cache)
    with pytest.raises(TypeError, match='kv_cache'):
        agent(ids, kv_cache={})


# ----------------------------------------------------------------------------- sequence_log_probs
def test_sequence_log_probs_against_prefix_loop_and_shift():
    agent = make_agent()
    ids = torch.randint(0, 23, (2, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = m.sequence_log_probs(agent, ids)
        assert got.shape == (2, 9)
        for b in range(2):
            for t in range(9):
                row = agent(ids[b:b + 1, :t + 1])[0, -1].tolist()              # sees ids[:t+1] only
                want = py_log_softmax(row)[ids[b, t + 1].item()]
                assert got[b, t].item() == pytest.approx(want, abs=1e-5)
        logits = agent(ids)
        same_position = m.selected_log_probs(logits[:, 1:], ids[:, 1:])       # off by one: logits at t+1
        no_shift = m.selected_log_probs(logits[:, :-1], ids[:, :-1])          # off by one: ids at t
    assert (got - same_position).abs().max() > 1e-3
    assert (got - no_shift).abs().max() > 1e-3


def test_sequence_log_probs_bad_input():
    agent = make_agent()
    with pytest.raises(ValueError, match='ids'):
        m.sequence_log_probs(agent, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match='ids'):
        m.sequence_log_probs(agent, torch.zeros(2, 5))
    with pytest.raises(ValueError, match='ids'):
        m.sequence_log_probs(agent, torch.zeros(5, dtype=torch.long))


# ----------------------------------------------------------------------------- chunked_log_probs
@pytest.mark.parametrize('chunk_size', [1, 7, 50, 64, 500])
def test_chunked_matches_full_values_and_grads(chunk_size):
    g = torch.Generator().manual_seed(11)
    h = torch.randn(2, 50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(37, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 37, (2, 50), generator=g)
    wts = torch.randn(2, 50, generator=g, dtype=torch.float64)
    got = m.chunked_log_probs(h, W, ids, chunk_size=chunk_size)
    # independent reference: per-position loop with an explicit softmax
    ref = torch.stack([torch.stack([torch.log(torch.exp(W @ h[b, t]) / torch.exp(W @ h[b, t]).sum())[ids[b, t]]
                                    for t in range(50)]) for b in range(2)])
    assert got.shape == (2, 50)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
    g_got = torch.autograd.grad((wts * got).sum(), (h, W))
    g_ref = torch.autograd.grad((wts * ref).sum(), (h, W))
    for a, b in zip(g_got, g_ref):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)


def test_chunked_with_agent_hidden_and_head():
    agent = make_agent()
    ids = torch.randint(0, 23, (2, 30), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        via = m.chunked_log_probs(agent.hidden(ids)[:, :-1], agent.head.weight, ids[:, 1:], chunk_size=8)
        assert torch.allclose(via, m.sequence_log_probs(agent, ids), atol=1e-5)


def test_chunked_bad_input():
    h, W, ids = torch.zeros(2, 5, 4), torch.zeros(9, 4), torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match='hidden'):
        m.chunked_log_probs(torch.zeros(5, 4), W, ids)
    with pytest.raises(ValueError, match='hidden'):
        m.chunked_log_probs(torch.zeros(2, 5, 4, dtype=torch.long), W, ids)
    with pytest.raises(ValueError, match='weight'):
        m.chunked_log_probs(h, torch.zeros(9, 3), ids)
    with pytest.raises(ValueError, match='weight'):
        m.chunked_log_probs(h, torch.zeros(9), ids)
    with pytest.raises(ValueError, match='ids'):
        m.chunked_log_probs(h, W, ids.float())
    with pytest.raises(ValueError, match='ids'):
        m.chunked_log_probs(h, W, ids[:, :4])
    with pytest.raises(ValueError, match='ids'):
        m.chunked_log_probs(h, W, torch.full((2, 5), 9))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match='chunk_size'):
            m.chunked_log_probs(h, W, ids, chunk_size=bad)


# ----------------------------------------------------------------------------- review fixes
def py_entropy(row):
    "Entropy of softmax(row) in plain Python floats (float64), -inf entries allowed."
    return -sum(math.exp(lp) * lp for lp in py_log_softmax(row) if lp != NINF)


@pytest.mark.parametrize('shift', [1e3, 1e4, 1e5])
def test_large_shift_keeps_float32_precision(shift):
    base = [0.0, 0.0, -1.0, -2.0]
    z = torch.tensor(base, dtype=torch.float32) + shift          # every entry exact in float32
    assert z.tolist() == [b + shift for b in base]
    # closed form: p = (e, e, 1, e^-1) / (2e + 1 + e^-1) after multiplying by e
    w = [1.0, 1.0, math.exp(-1.0), math.exp(-2.0)]
    zsum = sum(w)
    h_closed = -sum(x / zsum * math.log(x / zsum) for x in w)
    assert abs(h_closed - 1.1727) < 1e-4
    assert abs(m.entropy_from_logits(z).item() - h_closed) < 1e-5
    assert m.entropy_from_logits(z).item() <= math.log(4) + 1e-6
    got = m.selected_log_probs(z.expand(4, 4), torch.arange(4))
    want = [math.log(x / zsum) for x in w]
    assert max(abs(a - b) for a, b in zip(got.tolist(), want)) < 1e-5
    # random row in float32 against a float64 plain-Python reference on the same float32 values
    g = torch.Generator().manual_seed(3)
    r = (torch.randn(2, 50, generator=g) * 3).float() + shift
    r[1, 7:20] = NINF
    for row, h in zip(r.tolist(), m.entropy_from_logits(r).tolist()):
        assert abs(h - py_entropy(row)) < 1e-4
    ids = torch.tensor([3, 30])
    for b, lp in enumerate(m.selected_log_probs(r, ids).tolist()):
        assert abs(lp - py_log_softmax(r[b].tolist())[ids[b]]) < 1e-4
    # chunked: logits = weight @ hidden with hidden = (1, 1) and weight rows (base_v, shift): exact sums
    W = torch.tensor([[b_, shift] for b_ in base], dtype=torch.float32)      # [V=4, D=2]
    hid = torch.ones(1, 3, 2, dtype=torch.float32)                            # [B=1, T=3, D=2]
    out = m.chunked_log_probs(hid, W, torch.tensor([[0, 2, 3]]), chunk_size=2)
    assert max(abs(a - want[i]) for a, i in zip(out[0].tolist(), [0, 2, 3])) < 1e-5


def test_large_shift_gradients_finite_and_zero_on_masked():
    z = (torch.tensor([0.0, 0.0, -1.0, NINF]) + 1e5).requires_grad_(True)
    m.entropy_from_logits(z).backward()
    assert torch.isfinite(z.grad).all() and z.grad[3].item() == 0.0
    # dH/dz_i = -p_i (log p_i + H), closed form in float64 on the finite entries
    w = [1.0, 1.0, math.exp(-1.0)]
    p = [x / sum(w) for x in w]
    H = -sum(q * math.log(q) for q in p)
    for i in range(3):
        assert abs(z.grad[i].item() - (-p[i] * (math.log(p[i]) + H))) < 1e-5
    y = (torch.tensor([0.0, 0.0, -1.0, NINF]) + 1e5).requires_grad_(True)
    m.selected_log_probs(y, torch.tensor(2)).backward()
    assert torch.isfinite(y.grad).all()
    assert max(abs(a - b) for a, b in zip(y.grad.tolist(), [-p[0], -p[1], 1 - p[2], 0.0])) < 1e-5


def test_error_names_the_bad_row():
    with pytest.raises(ValueError, match=r'^logits is all -inf'):      # a single row: no index
        m.entropy_from_logits(torch.full((3,), NINF))
    z = torch.zeros(3, 4)
    z[2] = NINF
    with pytest.raises(ValueError, match=r'row \(2,\) of logits is all -inf'):
        m.entropy_from_logits(z)
    z = torch.zeros(2, 3, 4)
    z[1, 2, 0] = float('nan')
    with pytest.raises(ValueError, match=r'row \(1, 2\) of logits holds NaN'):
        m.selected_log_probs(z, torch.zeros(2, 3, dtype=torch.long))
    z = torch.zeros(2, 4)
    z[0, 1] = float('inf')
    with pytest.raises(ValueError, match=r'row \(0,\) of logits holds \+inf'):
        m.sampling_log_probs(z)
    # chunked names (b, t) in the full sequence, not within the chunk
    hid = torch.ones(2, 5, 2)
    hid[1, 4] = float('nan')
    with pytest.raises(ValueError, match=r'row \(1, 4\) of hidden @ weight.T'):
        m.chunked_log_probs(hid, torch.ones(3, 2), torch.zeros(2, 5, dtype=torch.long), chunk_size=2)


def test_chunked_log_probs_empty_sequence():
    hid = torch.zeros(3, 0, 4, requires_grad=True)
    out = m.chunked_log_probs(hid, torch.zeros(5, 4), torch.zeros(3, 0, dtype=torch.long))
    assert out.shape == (3, 0) and out.dtype == hid.dtype
    out.sum().backward()                                   # still part of the graph
    assert hid.grad.shape == (3, 0, 4)


def test_zero_dim_tensor_temperature_and_top_p():
    z = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    want = m.sampling_log_probs(z, 0.7, 0.9)
    assert torch.equal(m.sampling_log_probs(z, torch.tensor(0.7), torch.tensor(0.9)), want)
    ids, lp = m.sample_next(z, torch.tensor(0.7), 0.9, torch.Generator().manual_seed(0))
    assert torch.equal(lp, want[0, ids])
    with pytest.raises(ValueError, match='temperature'):
        m.sampling_log_probs(z, torch.tensor(0.0))
    with pytest.raises(ValueError, match='temperature'):
        m.sampling_log_probs(z, torch.tensor([0.7]))          # not 0-d
    with pytest.raises(ValueError, match='temperature'):
        m.sampling_log_probs(z, torch.tensor(True))
    with pytest.raises(ValueError, match='top_p'):
        m.sampling_log_probs(z, 1.0, torch.tensor(1.5))


def _agent(V=32):
    torch.manual_seed(0)
    return m.TinyAgent(vocab_size=V, max_len=64).eval()


def test_lockstep_decode_with_ragged_chunks_matches_rows_alone():
    agent = _agent()
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, 32, (3, 4), generator=g)
    lens = [[3, 1, 2], [1, 1, 1], [1, 4, 2], [1, 1, 1]]        # observation, token, observation, token
    plan = [[torch.randint(1, 32, (n,), generator=g) for n in step] for step in lens]
    rows = [torch.cat([prompt[b]] + [step[b] for step in plan]) for b in range(3)]
    with torch.no_grad():
        cache = agent.new_cache()
        outs = [[o] for o in agent(prompt, kv_cache=cache)]
        expect_next = [4, 4, 4]
        for step in plan:
            k = max(len(x) for x in step)
            feed = torch.stack([torch.cat([x, torch.zeros(k - len(x), dtype=torch.long)]) for x in step])
            mask = torch.tensor([[1] * len(x) + [0] * (k - len(x)) for x in step])   # 0/1 ints
            out = agent(feed, attention_mask=mask, kv_cache=cache)
            for b, x in enumerate(step):
                outs[b].append(out[b, :len(x)])
                expect_next[b] += len(x)                      # one past the last real token
            assert cache.next_pos.tolist() == expect_next
        for b in range(3):
            alone = agent(rows[b][None])[0]                   # unpadded, no cache
            assert (torch.cat(outs[b]) - alone).abs().max().item() < 1e-5


def test_masked_positions_without_cache_and_all_pad_chunk():
    agent = _agent()
    g = torch.Generator().manual_seed(6)
    a, b = torch.randint(1, 32, (7,), generator=g), torch.randint(1, 32, (4,), generator=g)
    with torch.no_grad():
        # left padding with the mask alone: positions are derived from the mask
        batch = torch.stack([a, torch.cat([torch.zeros(3, dtype=torch.long), b])])
        mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4])
        out = agent(batch, attention_mask=mask)
        assert (out[0] - agent(a[None])[0]).abs().max().item() < 1e-5
        assert (out[1, 3:] - agent(b[None])[0]).abs().max().item() < 1e-5
        # an all-padding chunk for one row leaves that row's next position unchanged
        cache = agent.new_cache()
        agent(torch.stack([a[:4], b]), kv_cache=cache)
        agent(torch.stack([a[4:6], torch.zeros(2, dtype=torch.long)]), attention_mask=torch.tensor([[1, 1], [0, 0]]),
              kv_cache=cache)
        assert cache.next_pos.tolist() == [6, 4]
        last = agent(torch.stack([a[6:7], b[:1]]), kv_cache=cache)[:, -1]
        assert (last[0] - agent(a[None])[0, -1]).abs().max().item() < 1e-5
        assert (last[1] - agent(torch.cat([b, b[:1]])[None])[0, -1]).abs().max().item() < 1e-5
        # explicit positions are used as given; next position follows the last real token
        cache = agent.new_cache()
        agent(torch.stack([a[:3], torch.cat([b[:1], torch.zeros(2, dtype=torch.long)])]),
              position_ids=torch.tensor([[0, 1, 2], [0, 9, 9]]),
              attention_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]), kv_cache=cache)
        assert cache.next_pos.tolist() == [3, 1]


# ----------------------------------------------------------------------------- sampling by inversion
def test_sample_next_is_inverse_cdf_of_its_own_uniforms():
    """Each id is the first whose cumulative probability exceeds the row's uniform draw (by a loop)."""
    z = torch.randn(64, 9, generator=torch.Generator().manual_seed(11))
    z[5, 3:] = NINF                                                     # a row with excluded tokens
    ids, _ = m.sample_next(z, 1.3, 0.8, torch.Generator().manual_seed(12))
    u = torch.rand(64, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(12))[:, 0]
    for b in range(64):
        probs = [math.exp(v) for v in m.sampling_log_probs(z[b], 1.3, 0.8).tolist()]
        target, acc = u[b].item() * sum(probs), 0.0
        want = next(i for i, p in enumerate(probs) if (acc := acc + p) > target)
        assert ids[b].item() == want
        assert probs[ids[b]] > 0                                        # never an excluded token


def test_sample_next_rounding_at_the_top_picks_the_last_kept_id():
    """u * total can round up to total; the draw then takes the last id with probability > 0."""
    z = torch.tensor([[0.0, 0.0, NINF, NINF]])
    orig = torch.rand
    try:
        torch.rand = lambda *a, **k: torch.ones(1, 1, dtype=torch.float64)   # the worst case, u = 1
        ids, logp = m.sample_next(z)
    finally:
        torch.rand = orig
    assert ids.tolist() == [1] and math.isclose(logp.item(), math.log(0.5))


def test_sample_next_follows_the_logits_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        z = torch.randn(4, 7, generator=torch.Generator().manual_seed(13)).to(dtype)
        ids, logp = m.sample_next(z, generator=torch.Generator().manual_seed(0))
        assert logp.dtype == dtype and ids.dtype == torch.long


# ----------------------------------------------------------------------------- number format
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float64])
def test_agent_dtype_sets_weights_and_outputs(dtype):
    agent = make_agent(dtype=dtype)
    assert all(p.dtype == dtype for p in agent.parameters())
    ids = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(1))
    assert agent(ids).dtype == dtype and m.sequence_log_probs(agent, ids).dtype == dtype


def test_agent_config_dtype_default_and_validation():
    assert m.AgentConfig(vocab_size=10).dtype == torch.float64
    with pytest.raises(ValueError, match='dtype'):
        m.AgentConfig(vocab_size=10, dtype=torch.int64)


def test_float32_and_float64_agents_agree_to_float32_precision():
    a64 = make_agent()
    a32 = make_agent()
    a32.to(torch.float32)
    ids = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        d = (a64(ids) - a32(ids).double()).abs().max().item()
    assert 0 < d < 1e-4


# ----------------------------------------------------------------------------- KV cache storage
def test_kv_cache_grows_in_place_and_matches_a_cat_cache():
    """Preallocated, doubled storage gives the logits of a plain forward; capacity at least doubles."""
    agent = make_agent()
    ids = torch.randint(0, 23, (2, 150), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = agent(ids)
        cache = agent.new_cache()
        outs, capacities = [agent(ids[:, :3], kv_cache=cache)], {cache.keys[0].shape[2]}
        for t in range(3, 150):
            outs.append(agent(ids[:, t:t + 1], kv_cache=cache))
            capacities.add(cache.keys[0].shape[2])
    assert (torch.cat(outs, 1) - full).abs().max().item() < 1e-12
    # 3 tokens -> 64 slots; the 65th token -> 2 * 65 = 130; the 131st -> 2 * 131 = 262
    assert sorted(capacities) == [64, 130, 262] and len(cache) == 150
    assert cache.keys[0].shape == (2, 4, 262, 16)             # [B, H, capacity, D/H]


def test_kv_cache_refuses_gradients():
    agent = make_agent()
    with pytest.raises(ValueError, match='no_grad'):
        agent(torch.zeros(1, 3, dtype=torch.long), kv_cache=agent.new_cache())


def test_kv_cache_compact_drops_padding_slots_and_keeps_logits():
    """Rows that waited leave padding slots; compact() removes them and later logits do not change."""
    agent = make_agent()
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(1, 23, (12,), generator=g), torch.randint(1, 23, (12,), generator=g)
    with torch.no_grad():
        cache = agent.new_cache()
        agent(torch.stack([a[:3], b[:3]]), kv_cache=cache)
        # row b waits (all padding) for two chunks while row a reads
        for s, e in [(3, 7), (7, 9)]:
            feed = torch.stack([a[s:e], torch.zeros(e - s, dtype=torch.long)])
            agent(feed, attention_mask=torch.tensor([[1] * (e - s), [0] * (e - s)]), kv_cache=cache)
        assert len(cache) == 9 and cache.key_mask[1].sum().item() == 3
        cache.compact()
        assert len(cache) == 9 and cache.key_mask[1].tolist() == [True] * 3 + [False] * 6
        out = agent(torch.stack([a[9:10], b[3:4]]), kv_cache=cache)[:, -1]
        alone_a = agent(torch.cat([a[:7], a[7:9], a[9:10]])[None])[0, -1]
        alone_b = agent(b[None, :4])[0, -1]
    assert (out[0] - alone_a).abs().max().item() < 1e-12 and (out[1] - alone_b).abs().max().item() < 1e-12
    # equal real counts: compact() removes every slot of shared padding and drops the mask
    with torch.no_grad():
        cache = agent.new_cache()
        agent(torch.stack([a[:4], b[:4]]), attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]]),
              kv_cache=cache)
        cache.compact()
    assert len(cache) == 2 and cache.key_mask is None


# ----------------------------------------------------------------------------- snapping to the grid
def test_snap_weights_rounds_to_the_grid_by_hand():
    w = torch.tensor([0.3, -1.0000004, 2.0 ** -21 * 3, 1e-9])
    m.snap_weights([w], grid=2.0 ** -20)
    # by hand: round(x * 2^20) / 2^20
    want = [round(0.3 * 2 ** 20) / 2 ** 20, -1.0, 2.0 ** -20 * 2, 0.0]   # 1.5 -> 2 (half to even)
    assert w.tolist() == want
    with pytest.raises(ValueError, match='grid'):
        m.snap_weights([w], grid=0.0)
    with pytest.raises(TypeError, match='tensors'):
        m.snap_weights([[0.1]])
    with pytest.raises(ValueError, match='floating'):
        m.snap_weights([torch.zeros(2, dtype=torch.long)])


def test_snapping_erases_a_difference_below_the_grid():
    """Two copies 1e-17 apart snap to identical tensors (unless a weight sits on a midpoint)."""
    a = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 0.05
    b = a + 1e-17 * torch.randn(1000, generator=torch.Generator().manual_seed(1))
    m.snap_weights([a, b])
    assert torch.equal(a, b) and m.WEIGHT_GRID == 2.0 ** -20
