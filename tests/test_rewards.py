"""Tests for agentrl.rewards (Chapter 11). Expected values come from hand-written formulas over the
info dict, counts by plain loops and closed forms of the flip probabilities; runs are tiny and seeded."""
import copy
import inspect
import math
import pickle
import random

import pytest
import torch

import agentrl as arl
import agentrl.rewards as m
from agentrl.gym import BugFixEnv, hidden_reward, make_tasks, public_reward, run_episode, scripted_policy
from agentrl.grpo import EditBudgetEnv, RLConfig, make_env, train_rl
from agentrl.trajectories import rollout_batch

torch.set_num_threads(1)
TEST = make_tasks('test')
INDEX = ('make_reward', 'LoggedEnv', 'log_by_step', 'reward_dashboard', 'flaky_reward')


def info(**kw):
    "A terminal info with every key the reward terms read (a failed, unsubmitted episode by default)."
    base = dict(submitted=False, hidden_pass=False, public_pass=False, exploit=False, invalid=0, turns=6)
    base.update(kw)
    return base


def test_index_names_reachable_with_their_signatures():
    for name in INDEX:
        assert getattr(arl, name) is getattr(m, name)
    sig = lambda f: str(inspect.signature(f))
    assert sig(m.make_reward) == ("(kind='hidden', exploit_penalty=0.0, invalid_penalty=0.0, step_penalty=0.0, "
                                  "wrong_submit=0.0)")
    assert sig(m.log_by_step) == '(history, log, n_eval=0)'
    assert sig(m.reward_dashboard) == '(infos)'
    assert sig(m.flaky_reward) == '(reward, false_neg=0.0, false_pos=0.0, seed=0)'


# ---------------------------------------------------------------- make_reward
@pytest.mark.parametrize('kw', [dict(), dict(exploit_penalty=0.7), dict(invalid_penalty=0.1),
                                dict(step_penalty=0.05), dict(wrong_submit=-0.5),
                                dict(exploit_penalty=1.0, invalid_penalty=0.2, step_penalty=0.03, wrong_submit=-0.25)])
@pytest.mark.parametrize('kind', ['hidden', 'public'])
def test_make_reward_matches_the_formula_on_every_outcome(kind, kw):
    reward = m.make_reward(kind, **kw)
    for sub in (False, True):
        for hp in (False, True):
            for pp in (False, True):
                for ex in (False, True):
                    for inv, turns in ((0, 1), (2, 4), (5, 6)):
                        i = info(submitted=sub, hidden_pass=hp, public_pass=pp, exploit=ex, invalid=inv, turns=turns)
                        score = 1.0 if sub and (hp if kind == 'hidden' else pp) else 0.0
                        want = (score - kw.get('exploit_penalty', 0) * ex - kw.get('invalid_penalty', 0) * inv
                                - kw.get('step_penalty', 0) * turns
                                + (kw.get('wrong_submit', 0) if sub and score == 0 else 0))
                        assert reward(i) == pytest.approx(want, abs=1e-15)
                        assert isinstance(reward(i), float)


def test_make_reward_without_terms_pays_what_the_chapter_4_rewards_pay():
    env_infos = [run_episode(scripted_policy(k, seed=3), BugFixEnv(), t)[1]
                 for k in ('oracle', 'hacker', 'blind', 'random') for t in TEST[:10]]
    for i in env_infos:
        assert m.make_reward('hidden')(i) == hidden_reward(i)
        assert m.make_reward('public')(i) == public_reward(i)
    # the hacker passes the public tests and fails the hidden ones on every task
    hack = [i for i in env_infos if i['exploit']]
    assert hack and all(public_reward(i) == 1.0 and hidden_reward(i) == 0.0 for i in hack[:10])


def test_make_reward_repr_and_use_inside_an_environment():
    r = m.make_reward('public', exploit_penalty=1.0, step_penalty=0.1)
    assert repr(r) == "make_reward(kind='public', exploit_penalty=1.0, step_penalty=0.1)"
    assert repr(m.make_reward()) == "make_reward(kind='hidden')"
    reward, i = run_episode(scripted_policy('hacker'), EditBudgetEnv(6, r, 1), TEST[0])
    assert i['exploit'] and i['turns'] == 4
    assert reward == pytest.approx(1.0 - 1.0 - 0.4)


@pytest.mark.parametrize('kw, match', [(dict(kind='tests'), 'kind'), (dict(kind=['hidden']), 'kind'), (dict(exploit_penalty=-1.0), 'exploit_penalty'),
                                       (dict(invalid_penalty=math.nan), 'invalid_penalty'),
                                       (dict(step_penalty=math.inf), 'step_penalty'),
                                       (dict(wrong_submit=math.nan), 'wrong_submit'),
                                       (dict(wrong_submit=True), 'wrong_submit')])
def test_make_reward_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        m.make_reward(**kw)


def test_make_reward_rejects_bad_info():
    with pytest.raises(TypeError, match='info'):
        m.make_reward()(['submitted'])
    with pytest.raises(ValueError, match='turns'):
        m.make_reward(step_penalty=0.1)({'submitted': True, 'hidden_pass': True})
    with pytest.raises(ValueError, match='hidden_pass'):
        m.make_reward()({'submitted': True})


# ---------------------------------------------------------------- LoggedEnv
def test_logged_env_logs_each_episode_once_whichever_way_it_ends(tiny, tok):
    log = []
    envs = [m.LoggedEnv(make_env(RLConfig()), log) for _ in range(24)]        # the env allows 6 turns ...
    tasks = [TEST[i % len(TEST)] for i in range(24)]
    trajs = rollout_batch(tiny, envs, tasks, tok, max_turns=2,                 # ... the rollout only 2
                          generator=torch.Generator().manual_seed(0))
    ended_by_rollout = sum(t.info['truncated'] for t in trajs)                # through env.finish
    assert ended_by_rollout > 0
    assert len(log) == 24
    by_reward = sorted((i['reward'], i['task'], i['turns'], i['submitted']) for i in log)
    assert by_reward == sorted((t.reward, t.info['task'], t.info['turns'], t.info['submitted']) for t in trajs)
    assert all(env.log is log for env in envs)
    assert not any('overflow' in i for i in log)                # the rollout adds it after the copy


def test_logged_env_is_transparent_to_a_rollout(tiny, tok):
    gen = lambda: torch.Generator().manual_seed(5)
    plain = rollout_batch(tiny, [make_env(RLConfig()) for _ in range(8)], TEST[:8], tok, generator=gen())
    logged = rollout_batch(tiny, [m.LoggedEnv(make_env(RLConfig())) for _ in range(8)], TEST[:8], tok,
                           generator=gen())
    for a, b in zip(plain, logged):
        assert torch.equal(a.ids, b.ids) and a.reward == b.reward


def test_logged_env_entry_is_a_copy_with_the_reward():
    env = m.LoggedEnv(EditBudgetEnv(6, m.make_reward('public', exploit_penalty=0.5), 1))
    reward, i = run_episode(scripted_policy('hacker'), env, TEST[1])
    assert len(env.log) == 1 and env.log[0]['reward'] == reward == 0.5
    assert 'reward' not in i and env.log[0] is not i
    assert env.max_turns == 6 and env.done                          # attributes come from the wrapped env
    clone = copy.deepcopy(env)                                      # copy and pickle do not recurse
    assert clone.log == env.log and pickle.loads(pickle.dumps(env)).max_turns == 6


def test_logged_env_rejects_bad_arguments():
    with pytest.raises(TypeError, match='env'):
        m.LoggedEnv(object())
    with pytest.raises(TypeError, match='log'):
        m.LoggedEnv(BugFixEnv(), log=())


# ---------------------------------------------------------------- log_by_step, reward_dashboard
def test_log_by_step_splits_a_real_run(tiny, tok):
    model, log = copy.deepcopy(tiny), []
    cfg = RLConfig(seed=1, group_size=2, tasks_per_step=2, eval_samples=1, minibatches=1)
    heldout = make_tasks('heldout')[:3]
    history = train_rl(model, make_tasks('train'), tok, cfg, 3, eval_tasks=heldout, eval_every=2,
                       env_factory=lambda: m.LoggedEnv(make_env(cfg), log))
    assert len(log) == 3 * 4 + 3 * 3                                # 3 steps of 4, evaluations at 0, 2 and the end
    steps = m.log_by_step(history, log, n_eval=3)
    assert [len(s) for s in steps] == [4, 4, 4]
    assert steps[0] == log[3:7] and steps[1] == log[7:11] and steps[2] == log[14:18]
    for row, infos in zip(history, steps):
        assert m.reward_dashboard(infos)['hidden_pass'] == pytest.approx(row['pass_rate'], abs=1e-15)
        assert sum(i['reward'] for i in infos) / 4 == pytest.approx(row['reward'], abs=1e-15)
    with pytest.raises(ValueError, match='n_eval'):
        m.log_by_step(history, log)
    with pytest.raises(ValueError, match='n_eval'):
        m.log_by_step(history, log, n_eval=-1)
    with pytest.raises(ValueError, match='history'):
        m.log_by_step([], log)
    with pytest.raises(ValueError, match='episodes'):
        m.log_by_step([{'step': 0}], log)


def test_reward_dashboard_counts_by_hand():
    infos = [info(submitted=True, public_pass=True, hidden_pass=True),
             info(submitted=True, public_pass=True, exploit=True),
             info(submitted=True, public_pass=True, exploit=True),
             info(submitted=False, public_pass=True, hidden_pass=True),   # passes, but never submitted
             info(submitted=True)]
    d = m.reward_dashboard(infos)
    assert d == {'public_pass': 3 / 5, 'hidden_pass': 1 / 5, 'exploit': 2 / 5, 'gap': 3 / 5 - 1 / 5, 'episodes': 5}
    with pytest.raises(ValueError, match='non-empty'):
        m.reward_dashboard([])
    with pytest.raises(ValueError, match='exploit'):
        m.reward_dashboard([{'submitted': True, 'public_pass': True, 'hidden_pass': True}])
    with pytest.raises(TypeError, match='info'):
        m.reward_dashboard([1])


# ---------------------------------------------------------------- flaky_reward
def test_flaky_reward_flip_rates_match_their_probabilities():
    n, a, b = 40_000, 0.3, 0.15
    noisy = m.flaky_reward(hidden_reward, false_neg=a, false_pos=b, seed=2)
    p = sum(noisy(info(submitted=True, hidden_pass=True)) for _ in range(n)) / n
    q = sum(noisy(info(submitted=True)) for _ in range(n)) / n
    sd = lambda x: math.sqrt(x * (1 - x) / n)
    assert abs(p - (1 - a)) < 5 * sd(a) and abs(q - b) < 5 * sd(b)
    assert all(noisy(info(submitted=False)) == 0.0 for _ in range(1000))   # no submission, no verdict to flip


def test_flaky_reward_is_a_seeded_stream_and_exact_at_zero_rates():
    f1, f2 = (m.flaky_reward(hidden_reward, 0.5, 0.5, seed=9) for _ in range(2))
    i1, i2 = info(submitted=True, hidden_pass=True), info(submitted=True)
    assert [f1(i1 if k % 3 else i2) for k in range(200)] == [f2(i1 if k % 3 else i2) for k in range(200)]
    rng = random.Random(9)                                    # the same draws, by hand
    f3 = m.flaky_reward(hidden_reward, 0.5, 0.5, seed=9)
    for k in range(200):
        u = rng.random()
        want = (0.0 if u < 0.5 else 1.0) if k % 3 else (1.0 if u < 0.5 else 0.0)
        assert f3(i1 if k % 3 else i2) == want
    exact = m.flaky_reward(public_reward)
    for i in (i1, i2, info(submitted=True, public_pass=True)):
        assert exact(i) == public_reward(i)


def test_flaky_reward_rejects_bad_arguments():
    with pytest.raises(TypeError, match='reward'):
        m.flaky_reward(0.5)
    for kw, match in ((dict(false_neg=1.5), 'false_neg'), (dict(false_pos=-0.1), 'false_pos'),
                      (dict(false_pos=math.nan), 'false_pos'), (dict(seed=1.5), 'seed')):
        with pytest.raises(ValueError, match=match):
            m.flaky_reward(hidden_reward, **kw)
    with pytest.raises(ValueError, match='submitted'):
        m.flaky_reward(hidden_reward)({'hidden_pass': True})
    shaped = m.flaky_reward(m.make_reward(step_penalty=0.1))
    with pytest.raises(ValueError, match='0 or 1'):
        shaped(info(submitted=True, hidden_pass=True, turns=3))


# ---------------------------------------------------------------- the cached runs
def test_make_reward_agent_rejects_bad_arguments(tok):
    for kw, match in ((dict(seed=-1), 'seed'), (dict(base_seed=1.0), 'base_seed'), (dict(steps=0), 'steps'),
                      (dict(kind='both'), 'kind'), (dict(false_neg=2.0), 'false_neg'),
                      (dict(exploit_penalty=1.0, false_pos=0.2), 'exploit_penalty')):
        with pytest.raises(ValueError, match=match):
            m.make_reward_agent(tok, **kw)
    assert set(m.REWARD_RUNS) >= {'public', 'public + exploit penalty'}


from conftest import small_base  # noqa: E402


def test_make_reward_agent_is_the_logged_run_and_caches_it(tok, monkeypatch, tmp_path):
    import agentrl.grpo as grpo
    monkeypatch.setattr(grpo, 'make_rl_base', small_base)
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    # with the hidden verdict and no noise, the logged run is Chapter 9's run, weights and history
    model, history, seconds = m.make_reward_agent(tok, kind='hidden', seed=1, steps=2)
    book, book_history = grpo.make_grpo_agent(tok, base_seed=0, seed=1, steps=2)
    assert same(model, book) and seconds > 0
    for row, ref in zip(history, book_history):
        assert {k: v for k, v in row.items() if not k.startswith('log_')} == ref
        assert row['log_hidden_pass'] == pytest.approx(row['pass_rate'], abs=1e-15)
        assert row['log_episodes'] == 64
    # the public-reward run, written out by hand
    ref = small_base(tok, 0)
    cfg = RLConfig(seed=1, reward='public')
    ref_history = train_rl(ref, make_tasks('train'), tok, cfg, 2, eval_tasks=make_tasks('heldout'), eval_every=25)
    pub, pub_history, _ = m.make_reward_agent(tok, kind='public', seed=1, steps=2)
    assert same(pub, ref)
    assert [{k: v for k, v in r.items() if not k.startswith('log_')} for r in pub_history] == ref_history
    assert all(r['log_public_pass'] >= r['log_hidden_pass'] for r in pub_history)
    n_files = len(list(tmp_path.glob('rl_run-*.pt')))
    assert n_files == 3                                      # hidden logged, hidden book, public
    monkeypatch.setattr(m, 'train_rl', lambda *a, **k: pytest.fail('trained instead of loading the cache'))
    again, again_history, _ = m.make_reward_agent(tok, kind='public', seed=1, steps=2)
    assert again_history == pub_history and same(again, pub)
