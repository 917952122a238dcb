"""Tests for agentrl.trajectories (Chapter 5: trajectories, templates and masks)."""
import itertools
import random

import pytest
import torch
import torch.nn as nn

import agentrl.trajectories as m
from agentrl.gym import (GYM_MESSAGES, GYM_NAMES, OP_NAMES, OPS, POLICY_KINDS, TOOL_NAMES, BugFixEnv,
                         compact_source, format_results, make_tasks, run_episode, run_tests, scripted_policy)
from agentrl.policies import TinyAgent, sampling_log_probs, sequence_log_probs
from agentrl.trajectories import (MAX_CALL_TOKENS, OWNER_ENV, OWNER_POLICY, OWNER_PROMPT, SPECIAL_TOKENS, Episode,
                                  Tokenizer, Trajectory, build_tokenizer, collate, generate_call, make_trajectory,
                                  pad_rows, rollout, rollout_batch, scripted_rollout)

torch.set_num_threads(1)
TASKS = make_tasks('all')
TRAIN = [t for t in TASKS if t.split == 'train']
CLAMP = TASKS[0]
TOK = build_tokenizer(TASKS)


def fresh_model(seed=0, **fields):
    torch.manual_seed(seed)
    return TinyAgent(vocab_size=len(TOK), **fields)


MODEL = fresh_model()


def rigged(token, V=len(TOK)):
    """A TinyAgent whose logits are constant: `token` has all the mass (a deterministic policy)."""
    model = fresh_model()
    head = nn.Linear(model.config.d_model, V, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-30.0)
        head.bias[token] = 30.0
    model.head = head
    return model


def brute_force_logp(model, ids, temperature=1.0):
    """log mu(ids[t+1] | ids[:t+1]) by running the model on every prefix separately (no cache, no batch)."""
    out = []
    with torch.no_grad():
        for t in range(len(ids) - 1):
            logits = model(torch.tensor([ids[:t + 1]]))[0, -1]
            out.append(sampling_log_probs(logits, temperature)[ids[t + 1]].item())
    return torch.tensor(out)


def check_alignment(traj, model=None, temperature=1.0, tol=1e-5):
    """The contract of a Trajectory, checked against its owner sequence and (optionally) the model."""
    T = len(traj)
    assert traj.ids.shape == (T,) and traj.owner.shape == (T,) and traj.turn.shape == (T,)
    assert traj.action_mask.shape == (T - 1,) and traj.sample_logp.shape == (T - 1,)
    for t in range(T - 1):
        assert traj.action_mask[t].item() == (1.0 if traj.owner[t + 1].item() == OWNER_POLICY else 0.0)
    assert bool((traj.sample_logp[traj.action_mask == 0] == 0).all())
    assert traj.ids[0].item() == TOK.bos_id and traj.owner[0].item() == OWNER_PROMPT
    if model is not None and traj.action_mask.sum() > 0:
        on = traj.action_mask.bool()
        with torch.no_grad():
            if temperature == 1.0:
                ref = sequence_log_probs(model, traj.ids[None])[0]
            else:
                logits = model(traj.ids[None])[0, :-1]
                ref = sampling_log_probs(logits, temperature).gather(-1, traj.ids[1:, None]).squeeze(-1)
        assert (ref[on] - traj.sample_logp[on]).abs().max().item() < tol


class Recorder(BugFixEnv):
    """A BugFixEnv that remembers every action text it received and every observation it sent."""
    def reset(self, task):
        self.received, self.sent = [], []
        return super().reset(task)

    def step(self, action_text):
        self.received.append(action_text)
        obs, reward, done, info = super().step(action_text)
        self.sent.append(obs)
        return obs, reward, done, info


# ---------------------------------------------------------------- Tokenizer

def test_specials_have_fixed_ids_and_order_is_deterministic():
    words = ['zeta', 'alpha', '<call>', 'mid', 'alpha']
    a, b = Tokenizer(words), Tokenizer(reversed(words))
    assert a.vocab == b.vocab
    assert a.vocab[:6] == list(SPECIAL_TOKENS)
    assert a.vocab[6:] == ['alpha', 'mid', 'zeta']
    assert (a.pad_id, a.unk_id, a.bos_id, a.nl_id, a.call_id, a.end_call_id) == (0, 1, 2, 3, 4, 5)
    assert len(a) == 9 and 'V=9' in repr(a)


def test_encode_decode_by_hand():
    tok = Tokenizer(['a', 'b', 'c'])
    a, b, c = tok.index['a'], tok.index['b'], tok.index['c']
    assert tok.encode('a b\nc') == [a, b, 3, c]
    assert tok.encode('a\n\nb') == [a, 3, 3, b]
    assert tok.encode('\na') == [3, a] and tok.encode('a\n') == [a, 3]
    assert tok.encode('') == [] and tok.encode('   ') == []
    assert tok.encode('a  x\tb') == [a, 1, b]                     # unknown -> unk, count kept
    assert tok.decode([a, b, 3, c]) == 'a b\nc'
    assert tok.decode(torch.tensor([c, 1, 4])) == 'c <unk> <call>'
    assert tok.unknown_words('a x y x') == ['x', 'y']


def test_encode_decode_roundtrip_on_random_ids_and_covered_text():
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(len(TOK)) for _ in range(rng.randrange(0, 12))]
        assert TOK.encode(TOK.decode(ids)) == ids
    env, policy = BugFixEnv(), scripted_policy('random', seed=0)
    for task in TASKS:
        texts = [env.reset(task)]
        done = False
        while not done:
            action = policy(texts)
            obs, _, done, _ = env.step(action)
            texts += [action, obs]
        for text in texts:                                  # gym text: single spaces, '\n' between lines
            assert TOK.decode(TOK.encode(text)) == text


def test_tokenizer_bad_input():
    with pytest.raises(TypeError, match='words'):
        Tokenizer('abc')
    with pytest.raises(TypeError, match='words'):
        Tokenizer(['a', 3])
    with pytest.raises(ValueError, match='words'):
        Tokenizer(['a b'])
    with pytest.raises(ValueError, match='words'):
        Tokenizer([''])
    with pytest.raises(TypeError, match='text'):
        TOK.encode(None)
    with pytest.raises(ValueError, match='ids'):
        TOK.decode([len(TOK)])
    with pytest.raises(ValueError, match='ids'):
        TOK.decode([-1])
    with pytest.raises(TypeError, match='ids'):
        TOK.decode([1.0])
    with pytest.raises(ValueError, match='ids'):
        TOK.decode(torch.tensor([1.0]))
    with pytest.raises(TypeError, match='text'):
        TOK.unknown_words(3)


# ---------------------------------------------------------------- build_tokenizer

def test_build_tokenizer_covers_every_reachable_observation():
    """Independent enumeration: every source reachable by up to two repair ops, its read view,
    its test report and the edit message; every gym message, name, tool and op."""
    missing = set()
    for task in TASKS:
        missing |= set(TOK.unknown_words(task.prompt))
        for ops in itertools.chain([()], itertools.product(OPS, repeat=1), itertools.product(OPS, repeat=2)):
            src = task.buggy
            for op in ops:
                new = OPS[op](src, task.public)
                missing |= set(TOK.unknown_words(f"{op} {'applied' if new != src else 'changed nothing'}"))
                src = new
            missing |= set(TOK.unknown_words(compact_source(src)))
            missing |= set(TOK.unknown_words(format_results(run_tests(src, task.public, task.fn_name), task.public)))
    for text in list(GYM_MESSAGES.values()) + list(GYM_NAMES) + list(OP_NAMES) + list(TOOL_NAMES):
        missing |= set(TOK.unknown_words(text))
    assert not missing
    assert all(str(n) in TOK.index for n in range(-20, 101))
    assert '<call>' in TOK.index and TOK.index['</call>'] == TOK.end_call_id


def test_build_tokenizer_is_split_independent_and_covers_renames():
    assert build_tokenizer(TRAIN).vocab == TOK.vocab
    assert build_tokenizer([]).vocab == TOK.vocab
    for task in TASKS[::7]:
        for name in GYM_NAMES[::9]:
            if name in task.buggy.replace(task.fn_name, ''):
                continue
            renamed = task.renamed(name)
            assert not TOK.unknown_words(compact_source(renamed.buggy)) and not TOK.unknown_words(renamed.prompt)


def test_build_tokenizer_adds_words_of_custom_tasks_and_rejects_bad_input():
    import dataclasses
    odd = dataclasses.replace(CLAMP, prompt='please repair frobnicate now')
    tok = build_tokenizer([odd])
    assert {'please', 'repair', 'frobnicate', 'now'} <= set(tok.vocab)
    with pytest.raises(TypeError, match='tasks'):
        build_tokenizer(CLAMP)
    with pytest.raises(TypeError, match='tasks'):
        build_tokenizer(['clamp'])


# ---------------------------------------------------------------- Episode, Trajectory, make_trajectory

def test_hand_built_episode_with_known_ids():
    tok = Tokenizer(['go', 'ok', 'x'])
    go, ok, x = tok.index['go'], tok.index['ok'], tok.index['x']
    ep = Episode(tok, 'x x')
    ep.add_call([4, go, 5], [-0.5, -1.0, -0.25])
    ep.add_observation([ok])
    ep.add_call([4, 5])
    ep.finish(1.0, {'done': True})
    traj = make_trajectory(ep)
    assert traj.ids.tolist() == [2, x, x, 4, go, 5, ok, 4, 5]
    assert traj.owner.tolist() == [0, 0, 0, 1, 1, 1, 2, 1, 1]
    assert traj.turn.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert traj.action_mask.tolist() == [0, 0, 1, 1, 1, 0, 1, 1]
    assert traj.sample_logp.tolist() == [0, 0, -0.5, -1.0, -0.25, 0, 0, 0]
    assert traj.reward == 1.0 and traj.info == {'done': True} and len(traj) == 9
    assert traj.ids.dtype == torch.long and traj.action_mask.dtype == torch.float64


def test_episode_edges_and_errors():
    tok = Tokenizer(['w'])
    ep = Episode(tok, 'w w w w', max_len=3)                   # prompt cut to the context
    assert ep.ids == [2, 6, 6] and ep.room == 0
    ep = Episode(tok, 'w', max_len=6)
    ep.add_call([])                                           # an empty call still uses a turn
    assert ep.calls == 1 and len(ep) == 2
    with pytest.raises(ValueError, match='fit'):
        ep.add_call([4, 5, 5, 5, 5])
    with pytest.raises(ValueError, match='logps'):
        ep.add_call([4], [0.0, 0.0])
    with pytest.raises(ValueError, match='ids'):
        ep.add_observation([99])
    with pytest.raises(TypeError, match='ids'):
        ep.add_observation('w')
    with pytest.raises(ValueError, match='finished'):
        make_trajectory(ep)
    ep.finish(0.0, {})
    with pytest.raises(ValueError, match='finished'):
        ep.add_call([4])
    with pytest.raises(TypeError, match='tok'):
        Episode('tok', 'w')
    with pytest.raises(TypeError, match='prompt'):
        Episode(tok, 3)
    with pytest.raises(ValueError, match='max_len'):
        Episode(tok, 'w', max_len=0)
    with pytest.raises(TypeError, match='episode'):
        make_trajectory('episode')


def test_rejected_call_leaves_the_episode_unchanged():
    # Hand-computed: a rejected call must not count as a turn, so the next accepted call is turn 1.
    tok = Tokenizer(['w'])
    ep = Episode(tok, 'w', max_len=6)                         # [<bos>, w]: room 4
    for bad_ids, bad_logps, error in [([4, 5, 5, 5, 5], None, ValueError),      # 5 ids, room 4
                                      ([4, 99], None, ValueError),              # id outside the vocabulary
                                      ('w', None, TypeError),                   # text, not ids
                                      ([4, 5], [0.0, 'a'], ValueError),         # logp not a number
                                      ([4, 5], [0.0, 0.5], ValueError),         # positive log-probability
                                      ([4, 5], [float('nan'), 0.0], ValueError),
                                      ([4, 5], [-float('inf'), 0.0], ValueError),
                                      ([4, 5], [0.0], ValueError)]:             # one logp short
        with pytest.raises(error):
            ep.add_call(bad_ids, bad_logps)
        assert ep.calls == 0 and ep.ids == [2, 6] and ep.turn == [0, 0] and ep.logp == [0.0, 0.0]
    ep.add_call([4, 5], [-0.5, -0.25])
    assert ep.calls == 1 and ep.turn == [0, 0, 1, 1] and ep.logp == [0.0, 0.0, -0.5, -0.25]
    with pytest.raises(ValueError, match='fit'):
        ep.add_observation([6, 6, 6])                         # room 2
    assert ep.ids == [2, 6, 4, 5] and ep.owner == [0, 0, 1, 1]
    ep.add_call([4], [0])                                     # an int 0 is a valid log-probability
    assert ep.calls == 2 and ep.turn == [0, 0, 1, 1, 2] and ep.logp[-1] == 0.0


def test_trajectory_refuses_impossible_values():
    good = dict(ids=torch.tensor([2, 4, 5, 6]), action_mask=torch.tensor([1.0, 1.0, 0.0]),
                sample_logp=torch.tensor([-0.5, 0.0, 0.0]), owner=torch.tensor([0, 1, 1, 2]),
                turn=torch.tensor([0, 1, 1, 1]), reward=1.0, info={})
    Trajectory(**good)
    for field, bad in [('action_mask', torch.tensor([0.5, 1.0, 0.0])), ('action_mask', torch.tensor([1.0, 7.0, 0.0])),
                       ('action_mask', torch.tensor([1.0, 1.0, -1.0])), ('owner', torch.tensor([0, 1, 1, 9])),
                       ('owner', torch.tensor([-1, 1, 1, 2])), ('sample_logp', torch.tensor([0.5, 0.0, 0.0])),
                       ('sample_logp', torch.tensor([-0.5, float('nan'), 0.0])),
                       ('sample_logp', torch.tensor([-float('inf'), 0.0, 0.0]))]:
        with pytest.raises(ValueError, match=field):
            Trajectory(**{**good, field: bad})
    # off the mask the sampler's log-prob is never used, so its value is not checked there
    Trajectory(**{**good, 'sample_logp': torch.tensor([-0.5, 0.0, 3.0])})


def test_trajectory_validation_names_the_field():
    good = dict(ids=torch.tensor([2, 4, 5]), action_mask=torch.tensor([1.0, 1.0]),
                sample_logp=torch.zeros(2), owner=torch.tensor([0, 1, 1]), turn=torch.tensor([0, 1, 1]),
                reward=0.0, info={})
    Trajectory(**good)
    for field, bad in [('ids', torch.tensor([2.0, 4.0, 5.0])), ('action_mask', torch.ones(3)),
                       ('sample_logp', torch.zeros(2, dtype=torch.float32)), ('owner', torch.tensor([0, 1])),
                       ('turn', [0, 1, 1])]:
        with pytest.raises(ValueError, match=field):
            Trajectory(**{**good, field: bad})
    with pytest.raises(TypeError, match='reward'):
        Trajectory(**{**good, 'reward': '1'})
    with pytest.raises(TypeError, match='info'):
        Trajectory(**{**good, 'info': None})


# ---------------------------------------------------------------- scripted_rollout

def test_scripted_oracle_matches_an_independent_transcript():
    env = Recorder()
    traj = scripted_rollout(scripted_policy('oracle'), env, CLAMP, TOK)
    expect = [TOK.bos_id] + TOK.encode(CLAMP.prompt)
    for k, (action, obs) in enumerate(zip(env.received, env.sent)):
        expect += TOK.encode(action)
        if k < len(env.sent) - 1:                            # the terminal observation is not logged
            expect += TOK.encode(obs)
    assert traj.ids.tolist() == expect
    assert traj.reward == 1.0 and traj.info['submitted'] and not traj.info['overflow']
    assert int(traj.action_mask.sum()) == sum(len(TOK.encode(a)) for a in env.received)
    assert bool((traj.sample_logp == 0).all())
    assert traj.turn[traj.owner == OWNER_POLICY].unique().tolist() == [1, 2, 3, 4]
    check_alignment(traj)


def test_scripted_rewards_equal_run_episode():
    for kind in POLICY_KINDS:
        a, b = scripted_policy(kind, seed=5), scripted_policy(kind, seed=5)
        for task in TASKS:
            traj = scripted_rollout(a, BugFixEnv(), task, TOK, max_len=2048)
            reward, info = run_episode(b, BugFixEnv(), task)
            assert traj.reward == reward and traj.info['turns'] == info['turns']
            check_alignment(traj)


def test_scripted_overflow_turn_cap_and_empty_calls():
    policy = scripted_policy('random', seed=3)
    for task in TASKS[:40]:
        traj = scripted_rollout(policy, BugFixEnv(), task, TOK, max_len=48)
        assert len(traj) <= 48
        if traj.info['overflow']:
            assert traj.reward == 0.0 and not traj.info['submitted']
        check_alignment(traj)
    tiny = scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, TOK, max_len=5)
    assert len(tiny) == 5 and tiny.info['overflow'] and tiny.action_mask.sum() == 0
    capped = scripted_rollout(lambda obs: '<call> read </call>', BugFixEnv(), CLAMP, TOK, max_turns=2)
    assert capped.info['truncated'] and capped.info['turns'] == 2 and not capped.info['overflow']
    silent = scripted_rollout(lambda obs: '', BugFixEnv(max_turns=3), CLAMP, TOK)
    assert silent.info['invalid'] == 3 and silent.action_mask.sum() == 0 and silent.turn.max() == 2


def test_scripted_rollout_bad_input():
    with pytest.raises(TypeError, match='policy'):
        scripted_rollout('oracle', BugFixEnv(), CLAMP, TOK)
    with pytest.raises(TypeError, match='policy'):
        scripted_rollout(lambda obs: 3, BugFixEnv(), CLAMP, TOK)
    with pytest.raises(ValueError, match='max_turns'):
        scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, TOK, max_turns=0)
    with pytest.raises(ValueError, match='max_len'):
        scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, TOK, max_len=1.5)
    with pytest.raises(TypeError, match='tok'):
        scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, 'tok')


# ---------------------------------------------------------------- generate_call

def test_generate_call_logps_match_brute_force_at_two_temperatures():
    prefix = [TOK.bos_id] + TOK.encode(CLAMP.prompt)
    gen = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.5):
        call, logps = generate_call(MODEL, prefix, TOK, temperature, gen)
        assert 1 <= len(call) <= MAX_CALL_TOKENS and len(logps) == len(call)
        assert call[-1] == TOK.end_call_id or len(call) == MAX_CALL_TOKENS
        ref = brute_force_logp(MODEL, prefix + call, temperature)[len(prefix) - 1:]
        assert (ref - torch.tensor(logps)).abs().max().item() < 1e-5


def test_generate_call_stops_and_respects_the_context():
    prefix = [TOK.bos_id] + TOK.encode(CLAMP.prompt)
    ends = rigged(TOK.end_call_id)
    call, logps = generate_call(ends, prefix, TOK)
    assert call == [TOK.end_call_id] and abs(logps[0]) < 1e-6
    babble = rigged(TOK.index['read'])
    call, _ = generate_call(babble, prefix, TOK)
    assert call == [TOK.index['read']] * MAX_CALL_TOKENS
    L = MODEL.config.max_len
    assert len(generate_call(MODEL, (prefix * L)[:L - 2], TOK)[0]) <= 2
    assert generate_call(MODEL, (prefix * L)[:L], TOK) == ([], [])
    assert generate_call(MODEL, (prefix * L)[:L + 5], TOK) == ([], [])
    a = generate_call(MODEL, prefix, TOK, generator=torch.Generator().manual_seed(3))
    b = generate_call(MODEL, prefix, TOK, generator=torch.Generator().manual_seed(3))
    assert a == b


def test_generate_call_bad_input():
    prefix = [TOK.bos_id]
    with pytest.raises(TypeError, match='model'):
        generate_call('model', prefix, TOK)
    with pytest.raises(TypeError, match='ids'):
        generate_call(MODEL, torch.tensor(prefix), TOK)
    with pytest.raises(ValueError, match='ids'):
        generate_call(MODEL, [], TOK)
    with pytest.raises(ValueError, match='ids'):
        generate_call(MODEL, [len(TOK) + 50], TOK)
    with pytest.raises(ValueError, match='temperature'):
        generate_call(MODEL, prefix, TOK, temperature=0)
    with pytest.raises(TypeError, match='generator'):
        generate_call(MODEL, prefix, TOK, generator=0)
    with pytest.raises(TypeError, match='tok'):
        generate_call(MODEL, prefix, None)
    with pytest.raises(ValueError, match='vocab_size'):
        generate_call(TinyAgent(vocab_size=10), prefix, TOK)


# ---------------------------------------------------------------- rollout

def test_rollout_alignment_and_token_in_token_out():
    for seed in range(3):
        env = Recorder()
        traj = rollout(MODEL, env, TASKS[seed * 20], TOK, generator=torch.Generator().manual_seed(seed))
        check_alignment(traj, MODEL)
        # what the env received is the decoded call; what it sent is logged as its encoding
        calls = [traj.ids[(traj.turn == k) & (traj.owner == OWNER_POLICY)].tolist() for k in range(1, traj.turn.max() + 1)]
        obs = [traj.ids[(traj.turn == k) & (traj.owner == OWNER_ENV)].tolist() for k in range(1, traj.turn.max() + 1)]
        assert env.received == [TOK.decode(c) for c in calls]
        assert obs[:-1] == [TOK.encode(o) for o in env.sent[:len(obs) - 1]]
    cool = rollout(MODEL, BugFixEnv(), CLAMP, TOK, temperature=0.7, generator=torch.Generator().manual_seed(1))
    check_alignment(cool, MODEL, temperature=0.7)


def test_rollout_keeps_sampled_newlines_as_ids():
    model = rigged(TOK.nl_id)                          # a policy that only ever writes line breaks
    traj = rollout(model, BugFixEnv(max_turns=2), CLAMP, TOK)
    policy_ids = traj.ids[traj.owner == OWNER_POLICY]
    assert policy_ids.tolist() == [TOK.nl_id] * (2 * MAX_CALL_TOKENS)
    assert traj.info['invalid'] == 2 and traj.info['truncated']


def test_rollout_is_deterministic_and_survives_a_small_context():
    a = rollout(MODEL, BugFixEnv(), CLAMP, TOK, generator=torch.Generator().manual_seed(9))
    b = rollout(MODEL, BugFixEnv(), CLAMP, TOK, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.sample_logp, b.sample_logp)
    short = fresh_model(max_len=30)
    for seed in range(3):
        traj = rollout(short, BugFixEnv(), CLAMP, TOK, generator=torch.Generator().manual_seed(seed))
        assert len(traj) <= 30 and traj.info['overflow'] and traj.reward == 0.0
        check_alignment(traj, short)
    tiny = fresh_model(max_len=8)                      # the prompt alone overflows
    traj = rollout(tiny, BugFixEnv(), CLAMP, TOK)
    assert len(traj) == 8 and traj.action_mask.sum() == 0 and traj.info['overflow']
    with pytest.raises(ValueError, match='max_turns'):
        rollout(MODEL, BugFixEnv(), CLAMP, TOK, max_turns=-1)


# ---------------------------------------------------------------- pad_rows

def test_pad_rows_values_by_loop_and_errors():
    rng = random.Random(1)
    rows = [torch.tensor([rng.randrange(9) for _ in range(n)], dtype=torch.long) for n in (3, 0, 5, 1)]
    out = pad_rows(rows, 6, -7)
    assert out.shape == (4, 6) and out.dtype == torch.long
    for b, row in enumerate(rows):
        for j in range(6):
            assert out[b, j].item() == (row[j].item() if j < len(row) else -7)
    floats = pad_rows([torch.tensor([0.5]), torch.tensor([1.5, 2.5])], 2, 0.0)
    assert floats.tolist() == [[0.5, 0.0], [1.5, 2.5]]
    assert pad_rows([torch.tensor([True])], 3, False).tolist() == [[True, False, False]]
    with pytest.raises(ValueError, match=r'rows\[2\]'):
        pad_rows(rows, 4, 0)
    with pytest.raises(ValueError, match='rows'):
        pad_rows([], 4, 0)
    with pytest.raises(ValueError, match=r'rows\[1\]'):
        pad_rows([torch.tensor([1]), torch.tensor([1.0])], 4, 0)
    with pytest.raises(ValueError, match=r'rows\[0\]'):
        pad_rows([torch.zeros(2, 2, dtype=torch.long)], 4, 0)
    with pytest.raises(ValueError, match=r'rows\[0\]'):
        pad_rows([[1, 2]], 4, 0)
    with pytest.raises(ValueError, match='value'):
        pad_rows(rows, 6, 0.5)
    with pytest.raises(ValueError, match='length'):
        pad_rows(rows, -1, 0)


# ---------------------------------------------------------------- rollout_batch

def test_rollout_batch_alignment_replay_and_determinism():
    group = [t for t in TASKS[::10] for _ in range(2)]
    gen = torch.Generator().manual_seed(4)
    batch = rollout_batch(MODEL, [BugFixEnv() for _ in group], group, TOK, generator=gen)
    assert len(batch) == len(group)
    for traj, task in zip(batch, group):
        check_alignment(traj, MODEL)
        assert traj.info['task'] == task.name
        # replaying the decoded calls on a fresh environment reproduces the logged observations
        env = Recorder()
        env.reset(task)
        K = int(traj.turn.max())
        for k in range(1, K + 1):
            call = traj.ids[(traj.turn == k) & (traj.owner == OWNER_POLICY)].tolist()
            obs, reward, done, _ = env.step(TOK.decode(call))
            logged = traj.ids[(traj.turn == k) & (traj.owner == OWNER_ENV)].tolist()
            assert logged == ([] if done or k == K else TOK.encode(obs))
        assert reward == traj.reward
    again = rollout_batch(MODEL, [BugFixEnv() for _ in group], group, TOK, generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.sample_logp, b.sample_logp) for a, b in zip(batch, again))
    nocache = m._lockstep(MODEL, [BugFixEnv() for _ in group], group, TOK, 6, 1.0,
                          torch.Generator().manual_seed(4), use_cache=False)
    for a, b in zip(batch, nocache):
        assert torch.equal(a.ids, b.ids)
        assert (a.sample_logp - b.sample_logp).abs().max().item() < 1e-5


def test_rollout_batch_equals_rollout_for_a_deterministic_policy():
    for token in (TOK.end_call_id, TOK.index['submit'], TOK.call_id):
        model = rigged(token)
        batch = rollout_batch(model, [BugFixEnv() for _ in TASKS[:4]], TASKS[:4], TOK)
        for traj, task in zip(batch, TASKS[:4]):
            one = rollout(model, BugFixEnv(), task, TOK)
            assert torch.equal(traj.ids, one.ids) and torch.equal(traj.owner, one.owner)
            assert torch.equal(traj.turn, one.turn) and traj.reward == one.reward
            assert (traj.sample_logp - one.sample_logp).abs().max().item() < 1e-5


def test_rollout_batch_ragged_episodes_and_one_forward_per_token_step():
    envs = [BugFixEnv(max_turns=k) for k in (1, 6, 2, 5, 3, 4, 1, 6)]
    tasks = TASKS[::10][:len(envs)]
    trace = []
    batch = m._lockstep(MODEL, envs, tasks, TOK, 6, 1.0, torch.Generator().manual_seed(0), trace=trace)
    for traj, env in zip(batch, envs):
        assert int(traj.turn.max()) == env.max_turns and traj.info['truncated']
        check_alignment(traj, MODEL)
    # every forward serves the whole batch: the count is the longest episode's number of sampled
    # tokens (its first token of each call shares the forward that reads the observation)
    longest = max(int(t.action_mask.sum()) for t in batch)
    assert len(trace) == longest
    assert all(codes.count(m._DONE) + codes.count(m._WAIT) + codes.count(m._READ) + codes.count(m._SAMPLE)
               == len(batch) for codes in trace)


def test_rollout_batch_small_context_and_sampled_specials():
    short = fresh_model(max_len=36)
    batch = rollout_batch(short, [BugFixEnv() for _ in range(6)], TASKS[:6], TOK,
                          generator=torch.Generator().manual_seed(0))
    for traj in batch:
        assert len(traj) <= 36 and traj.info['overflow']
        check_alignment(traj, short)
    pads = rigged(TOK.pad_id)                             # a policy that writes <pad>: real actions
    traj = rollout_batch(pads, [BugFixEnv(max_turns=1)], [CLAMP], TOK)[0]
    assert traj.ids[traj.owner == OWNER_POLICY].tolist() == [TOK.pad_id] * MAX_CALL_TOKENS
    batch = collate([traj], TOK.pad_id)
    assert int(batch['attention_mask'].sum()) == len(traj) and int(batch['action_mask'].sum()) == MAX_CALL_TOKENS


def test_rollout_batch_ragged_overflow_never_crashes():
    import dataclasses
    long = dataclasses.replace(CLAMP, prompt=CLAMP.prompt + ' fix the bug')     # 4 tokens longer
    for L in (16, 23, 31, 40):
        model = fresh_model(max_len=L)
        for pair in ([long, TASKS[1]], [TASKS[1], long]):
            out = rollout_batch(model, [BugFixEnv() for _ in pair], pair, TOK, generator=torch.Generator().manual_seed(L))
            for traj in out:
                assert len(traj) <= L and traj.info['overflow']
                check_alignment(traj, model)
    tiny = fresh_model(max_len=8)                       # every prompt fills the context
    out = rollout_batch(tiny, [BugFixEnv() for _ in range(3)], TASKS[:3], TOK)
    assert [len(t) for t in out] == [8, 8, 8] and all(t.info['overflow'] and t.action_mask.sum() == 0 for t in out)


def test_rollout_batch_bad_input():
    with pytest.raises(ValueError, match='envs'):
        rollout_batch(MODEL, [BugFixEnv()], TASKS[:2], TOK)
    env = BugFixEnv()
    with pytest.raises(ValueError, match='envs'):
        rollout_batch(MODEL, [env, env], TASKS[:2], TOK)
    with pytest.raises(ValueError, match='envs'):
        rollout_batch(MODEL, [], [], TOK)
    with pytest.raises(ValueError, match='temperature'):
        rollout_batch(MODEL, [BugFixEnv()], TASKS[:1], TOK, temperature=-1.0)
    with pytest.raises(ValueError, match='max_turns'):
        rollout_batch(MODEL, [BugFixEnv()], TASKS[:1], TOK, max_turns=0)


# ---------------------------------------------------------------- collate

def test_collate_by_loop():
    trajs = [rollout(MODEL, BugFixEnv(), CLAMP, TOK, generator=torch.Generator().manual_seed(0)),
             scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, TOK),
             scripted_rollout(scripted_policy('blind', seed=0), BugFixEnv(), CLAMP, TOK)]
    b = collate(trajs, TOK.pad_id)
    assert set(b) == {'ids', 'attention_mask', 'action_mask', 'sample_logp', 'turn_ids', 'rewards'}
    T = max(len(t) for t in trajs)
    assert b['ids'].shape == b['attention_mask'].shape == (3, T)
    assert b['action_mask'].shape == b['sample_logp'].shape == b['turn_ids'].shape == (3, T - 1)
    assert b["rewards"].shape == (3,) and b["rewards"].dtype == torch.float64
    for r, traj in enumerate(trajs):
        n = len(traj)
        for t in range(T):
            real = t < n
            assert b['attention_mask'][r, t].item() == int(real)
            assert b['ids'][r, t].item() == (traj.ids[t].item() if real else TOK.pad_id)
        for t in range(T - 1):
            real = t < n - 1
            assert b['action_mask'][r, t].item() == (traj.action_mask[t].item() if real else 0.0)
            assert b['sample_logp'][r, t].item() == (traj.sample_logp[t].item() if real else 0.0)
            assert b['turn_ids'][r, t].item() == (traj.turn[t + 1].item() if real else -1)
        assert b['rewards'][r].item() == traj.reward
    # padding never enters a mask, and right padding leaves real positions' scores unchanged
    assert b['action_mask'][b['attention_mask'][:, 1:] == 0].sum() == 0
    with torch.no_grad():
        padded = sequence_log_probs(MODEL, b['ids'])
        for r, traj in enumerate(trajs):
            alone = sequence_log_probs(MODEL, traj.ids[None])[0]
            assert (padded[r, :len(alone)] - alone).abs().max().item() < 1e-5


def test_collate_bad_input():
    traj = scripted_rollout(scripted_policy('oracle'), BugFixEnv(), CLAMP, TOK)
    with pytest.raises(ValueError, match='trajs'):
        collate([], TOK.pad_id)
    with pytest.raises(TypeError, match='trajs'):
        collate([traj, 'traj'], TOK.pad_id)
    with pytest.raises(TypeError, match='trajs'):
        collate(traj, TOK.pad_id)                              # a bare Trajectory, not a list
    with pytest.raises(TypeError, match='trajs'):
        collate({'a': traj}, TOK.pad_id)
    with pytest.raises(ValueError, match='pad_id'):
        collate([traj], -1)
    with pytest.raises(TypeError, match='pad_id'):
        collate([traj], True)
    with pytest.raises(TypeError, match='pad_id'):
        collate([traj], 0.0)
    assert collate((traj,), 0)['ids'].shape == (1, len(traj))  # a tuple is accepted
