"""Tests for agentrl.gym (Chapter 4: the BugFix gym)."""
import dataclasses
import math
import random
import re
import signal
import threading
import time

import pytest

import agentrl.gym as m
from agentrl.gym import (Task, run_tests, sample_args, draw_tests, make_tasks, compact_source,
                         swap_minmax, fix_range_end, fix_comparison, add_zero_guard, fix_init,
                         hardcode_tests, parse_call, format_results, apply_tool, hidden_reward,
                         public_reward, BugFixEnv, infer_op, scripted_policy, run_episode, _tool)

TRAIN = make_tasks('train')
HELDOUT = make_tasks('heldout')
TEST = make_tasks('test')
ALL = make_tasks('all')

# Independent reference implementations of every variant, written from the variant's purpose.
REFERENCE = {
    'clamp': lambda x, lo, hi: sorted([lo, x, hi])[1],
    'clip_digit': lambda x: 0 if x < 0 else (9 if x > 9 else x),
    'spread': lambda xs: sorted(xs)[-1] - sorted(xs)[0],
    'floor_at': lambda x, lo: x if x >= lo else lo,
    'span': lambda lo, hi: hi - lo if hi > lo else 0,
    'cap_total': lambda xs, cap: cap if sum(xs) > cap else sum(xs),
    'sum_to': lambda n: n * (n + 1) // 2,
    'sum_all': lambda xs: sum(xs),
    'sum_first': lambda xs, k: sum(xs[:k]),
    'double_all': lambda xs: [x + x for x in xs],
    'sum_between': lambda lo, hi: (hi - lo + 1) * (lo + hi) // 2,
    'sum_tail': lambda xs, k: sum(xs[k:]),
    'can_afford': lambda price, budget: not price > budget,
    'count_upto': lambda xs, t: len([x for x in xs if not x > t]),
    'between': lambda x, lo, hi: x in range(lo, hi + 1),
    'is_sorted': lambda xs: xs == sorted(xs),
    'first_at_least': lambda xs, t: next((i for i, x in enumerate(xs) if x >= t), -1),
    'within': lambda a, b, tol: not abs(a - b) > tol,
    'ratio': lambda a, b: 0 if b == 0 else int(a / b),
    'remainder': lambda a, b: 0 if b == 0 else a - b * (a // b),
    'scaled': lambda x, a, b: 0 if b == 0 else (x * a) // b,
    'avg_pair': lambda a, b, n: 0 if n == 0 else (a + b) // n,
    'share_sum': lambda xs, n: 0 if n == 0 else sum(xs) // n,
    'leftover': lambda total, size: 0 if size == 0 else total % size,
    'sum_list': lambda xs: sum(xs),
    'product': lambda xs: math.prod(xs),
    'count_eq': lambda xs, t: xs.count(t),
    'sum_squares': lambda xs: sum(x ** 2 for x in xs),
    'dot': lambda xs, ys: sum(a * b for a, b in zip(xs, ys)),
    'prod_plus': lambda xs: math.prod(x + 1 for x in xs),
    # the test split
    'low_floor': lambda xs, lo: sorted(xs)[0] if sorted(xs)[0] > lo else lo,
    'distance': lambda a, b: abs(a - b),
    'take_first': lambda xs, k: xs[:k],
    'list_between': lambda lo, hi: list(range(lo, hi + 1)),
    'all_upto': lambda xs, t: not any(x > t for x in xs),
    'reaches': lambda x, lo: not x < lo,
    'excess_ratio': lambda a, b: 0 if b == 0 else a // b - 1,
    'groups_of': lambda xs, size: 0 if size == 0 else len(xs) // size,
    'length': lambda xs: len(xs),
    'sum_abs': lambda xs: sum(x if x > 0 else -x for x in xs),
}


def passes(source, tests, fn_name):
    return all(ok for ok, _ in run_tests(source, tests, fn_name))


def body(task):
    return compact_source(task.fixed).split('\n', 1)[1]


# ---------------------------------------------------------------- Task
def test_task_validation_and_renamed():
    t = TRAIN[0]
    with pytest.raises(ValueError, match='split'):
        dataclasses.replace(t, split='valid')
    with pytest.raises(ValueError, match='family'):
        dataclasses.replace(t, family='sorting')
    with pytest.raises(ValueError, match='op'):
        dataclasses.replace(t, op='rewrite')
    r = t.renamed('zzz')
    assert r.fn_name == 'zzz' and 'def zzz(' in r.buggy and 'def zzz(' in r.fixed
    assert 'zzz' in r.prompt.split() and t.fn_name not in r.prompt.split()
    assert passes(r.fixed, r.hidden, 'zzz') and not passes(r.buggy, r.hidden, 'zzz')
    with pytest.raises(ValueError, match='already occurs'):
        t.renamed('lo')            # a parameter of clamp
    with pytest.raises(ValueError, match='identifier'):
        t.renamed('not a name')
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.fn_name = 'x'


# ---------------------------------------------------------------- run_tests
def test_run_tests_values_and_failures():
    src = 'def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n'
    res = run_tests(src, [((3, 0, 5), 3), ((-2, 0, 5), 0), ((9, 0, 5), 4)], 'clamp')
    assert res == [(True, 3), (True, 0), (False, 5)]
    # strict type: 3.0 and True are not 3
    assert [ok for ok, _ in run_tests(src, [((3, 0, 5), 3.0), ((1, 0, 5), True)], 'clamp')] == [False, False]
    (ok, got), = run_tests('def f(a, b):\n    return a // b\n', [((1, 0), 0)], 'f')
    assert not ok and isinstance(got, ZeroDivisionError)
    (ok, got), = run_tests(src, [((1, 0, 5), 1)], 'missing')
    assert not ok and isinstance(got, NameError)
    (ok, got), = run_tests('def f(:\n', [((1,), 1)], 'f')
    assert not ok and isinstance(got, SyntaxError)
    assert run_tests(src, [], 'clamp') == []


def test_run_tests_copies_list_arguments():
    src = 'def f(xs):\n    xs.append(1)\n    return len(xs)\n'
    tests = [(([5],), 2)]
    assert run_tests(src, tests, 'f')[0][0] and run_tests(src, tests, 'f')[0][0]
    assert tests[0][0][0] == [5]


def test_run_tests_has_no_import():
    (ok, got), = run_tests("def f(x):\n    return __import__('os').getcwd()\n", [((1,), 1)], 'f')
    assert not ok and isinstance(got, NameError)


def test_run_tests_bad_input():
    with pytest.raises(TypeError, match='source'):
        run_tests(b'def f(): pass', [], 'f')
    with pytest.raises(TypeError, match='fn_name'):
        run_tests('def f(): pass', [], 3)
    with pytest.raises(ValueError, match='tests'):
        run_tests('def f(x): return x', [([1], 1)], 'f')       # args must be a tuple
    with pytest.raises(ValueError, match='tests'):
        run_tests('def f(x): return x', [((1,),)], 'f')


@pytest.mark.timeout(10)
def test_time_limit_cuts_off_a_loop():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip('the CPU timer only works in the main thread')
    spin = 'def spin(x):\n    while True:\n        x = x + 1\n'
    start = time.perf_counter()
    res = run_tests(spin, [((1,), 1), ((2,), 2)], 'spin')
    elapsed = time.perf_counter() - start
    assert all(not ok and isinstance(got, TimeoutError) for ok, got in res)
    assert elapsed < 2 * (2 * m.TIME_LIMIT) + 1.0          # two calls, each near TIME_LIMIT of CPU
    # the timer is disarmed afterwards: a normal call still works and is not interrupted later
    assert run_tests('def f(x):\n    return x\n', [((1,), 1)], 'f') == [(True, 1)]
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)   # no timer left armed


@pytest.mark.timeout(10)
def test_a_swallowed_timeout_is_raised_again():
    # the first TimeoutError is caught by the code under test; a one-shot timer would leave the second loop
    # running forever (pytest-timeout would end the test), the repeating timer interrupts it TIME_LIMIT later
    if threading.current_thread() is not threading.main_thread():
        pytest.skip('the CPU timer only works in the main thread')
    src = ('def stubborn(x):\n    try:\n        while True:\n            x = x + 1\n    except:\n'
           '        pass\n    while True:\n        x = x + 1\n')
    start = time.process_time()
    [(ok, got)] = run_tests(src, [((1,), 1)], 'stubborn')
    used = time.process_time() - start
    assert not ok and isinstance(got, TimeoutError)
    assert 2 * m.TIME_LIMIT * 0.9 <= used < 2 * m.TIME_LIMIT + 1.0      # two allowances of CPU time, not one
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)   # disarmed afterwards, repeat included


def test_garbage_collection_is_paused_during_test_calls():
    # the source calls what it is given: gc.isenabled, evaluated inside the timed call
    import gc
    if threading.current_thread() is not threading.main_thread():
        pytest.skip('the pause goes with the timer, which only works in the main thread')
    src = 'def probe(f):\n    return f()\n'
    assert gc.isenabled()
    assert run_tests(src, [((gc.isenabled,), False)], 'probe') == [(True, False)]
    assert gc.isenabled()                                   # restored afterwards
    gc.disable()
    try:                                                    # a caller that paused it keeps it paused
        assert run_tests(src, [((gc.isenabled,), False)], 'probe') == [(True, False)]
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_run_tests_outside_main_thread_and_untimed(monkeypatch):
    src = 'def f(x):\n    return x + 1\n'
    box = []
    worker = threading.Thread(target=lambda: box.append(run_tests(src, [((1,), 2), ((2,), 2)], 'f')))
    with pytest.warns(RuntimeWarning, match='TIME_LIMIT is not enforced'):
        worker.start(); worker.join(5)
    assert box == [[(True, 2), (False, 3)]]
    monkeypatch.setattr(m, 'TIME_LIMIT', 0)
    assert run_tests(src, [((1,), 2)], 'f') == [(True, 2)]


def test_prompt_and_messages_are_words():
    assert m.task_prompt('clamp') == 'fix the bug in clamp . tools : read edit test submit'
    for text in list(m.GYM_MESSAGES.values()) + [t.prompt for t in ALL]:
        assert text.isascii() and text == ' '.join(text.split())
    assert all(t.prompt == m.task_prompt(t.fn_name) for t in ALL)


def test_run_tests_is_fast_when_cached():
    t = TRAIN[0]
    run_tests(t.fixed, t.hidden, t.fn_name)
    start = time.perf_counter()
    for _ in range(200):
        run_tests(t.fixed, t.hidden, t.fn_name)
    assert (time.perf_counter() - start) / 200 < 0.005         # generous: ~20-50 us expected


# ---------------------------------------------------------------- sample_args / draw_tests
def test_sample_args_reproducible_and_small():
    for family, variants in m.VARIANTS.items():
        for variant in variants:
            a = [sample_args(family, variant, random.Random(3)) for _ in range(1)]
            b = [sample_args(family, variant, random.Random(3)) for _ in range(1)]
            assert a == b
            rng = random.Random(0)
            for _ in range(200):
                args = sample_args(family, variant, rng)
                assert isinstance(args, tuple)
                flat = [v for a in args for v in (a if isinstance(a, list) else [a])]
                assert all(isinstance(v, int) and abs(v) <= 20 for v in flat)


def test_sample_args_bad_input():
    with pytest.raises(ValueError, match='family'):
        sample_args('sorting', 'clamp', random.Random(0))
    with pytest.raises(ValueError, match='variant'):
        sample_args('minmax', 'median', random.Random(0))
    with pytest.raises(TypeError, match='rng'):
        sample_args('minmax', 'clamp', 0)


def test_draw_tests_guarantees():
    spec = m.VARIANTS['comparison']['can_afford']
    buggy, fixed = spec['buggy'].replace('NAME', 'f'), spec['fixed'].replace('NAME', 'f')
    for seed in range(20):
        public, hidden = draw_tests('comparison', 'can_afford', buggy, fixed, 'f', random.Random(seed),
                                    n_public=2, n_hidden=5)
        assert len(public) == 2 and len(hidden) == 5
        inputs = [repr(a) for a, _ in public + hidden]
        assert len(set(inputs)) == 7
        assert all(want == (a[0] <= a[1]) for a, want in public + hidden)
        assert not passes(buggy, public, 'f') and not passes(buggy, hidden, 'f')


def test_draw_tests_errors():
    spec = m.VARIANTS['minmax']['clamp']
    fixed = spec['fixed'].replace('NAME', 'f')
    with pytest.raises(ValueError, match='fails both'):
        draw_tests('minmax', 'clamp', fixed, fixed, 'f', random.Random(0))
    with pytest.raises(ValueError, match='distinct'):
        draw_tests('range_end', 'sum_to', 'def f(n):\n    return 0\n', 'def f(n):\n    return n\n',
                   'f', random.Random(0), n_hidden=20)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match='n_public'):
            draw_tests('minmax', 'clamp', fixed, fixed, 'f', random.Random(0), n_public=bad)
    with pytest.raises(ValueError, match='n_hidden'):
        draw_tests('minmax', 'clamp', fixed, fixed, 'f', random.Random(0), n_hidden=0)


# ---------------------------------------------------------------- make_tasks
def test_make_tasks_counts_and_ops():
    assert len(TRAIN) >= 40 and len(HELDOUT) >= 15
    assert (len(TRAIN), len(HELDOUT), len(TEST), len(ALL)) == (60, 20, 20, 100)
    for split in (TRAIN, HELDOUT, TEST):
        assert {t.op for t in split} == set(m.HONEST_OPS)
    assert all(t.split == 'train' for t in TRAIN) and all(t.split == 'heldout' for t in HELDOUT)
    assert all(t.split == 'test' for t in TEST)
    assert len({t.name for t in ALL}) == 100
    assert all(t.fn_name in m.GYM_NAMES for t in ALL)
    assert all(t.op == m.FAMILIES[t.family] for t in ALL)


def test_make_tasks_expected_values_match_reference():
    for t in ALL:
        ref = REFERENCE[t.variant]
        for args, want in t.public + t.hidden:
            got = ref(*[list(a) if isinstance(a, list) else a for a in args])
            assert got == want and type(got) is type(want), (t.name, args, want, got)


def test_make_tasks_guarantees_per_task():
    for t in ALL:
        assert (len(t.public), len(t.hidden)) == (3, 8)
        assert len({repr(a) for a, _ in t.public + t.hidden}) == 11
        assert passes(t.fixed, t.public + t.hidden, t.fn_name)
        assert not passes(t.buggy, t.public, t.fn_name) and not passes(t.buggy, t.hidden, t.fn_name)


def test_make_tasks_deterministic_and_split_consistent():
    assert make_tasks('train', seed=0) == TRAIN
    by_name = {t.name: t for t in TRAIN + HELDOUT + TEST}
    assert all(by_name[t.name] == t for t in ALL)
    other = make_tasks('train', seed=1)
    assert [t.buggy for t in other] == [t.buggy for t in TRAIN]
    assert sum(a.public + a.hidden != b.public + b.hidden for a, b in zip(TRAIN, other)) > 50


def test_splits_are_disjoint_by_body():
    for a, b in ((TRAIN, HELDOUT), (TRAIN, TEST), (HELDOUT, TEST)):
        assert not ({body(t) for t in a} & {body(t) for t in b})
        assert not ({t.variant for t in a} & {t.variant for t in b})
    assert not ({t.fn_name for t in TRAIN} & {t.fn_name for t in HELDOUT + TEST})
    assert {t.fn_name for t in TEST} == {t.fn_name for t in HELDOUT}      # borrowed names


def test_test_split_adds_no_word_to_the_vocabulary(monkeypatch):
    from agentrl.trajectories import build_tokenizer
    with_test = build_tokenizer(ALL)
    sealed = {f: {v: spec for v, spec in vs.items() if spec['split'] != 'test'} for f, vs in m.VARIANTS.items()}
    monkeypatch.setattr('agentrl.trajectories.VARIANTS', sealed)
    without = build_tokenizer(TRAIN + HELDOUT)
    assert with_test.vocab == without.vocab and len(without.vocab) == 318
    for t in TEST:                   # every view of a test task, after every op, is in the vocabulary
        for op in m.OP_NAMES:
            source = m.OPS[op](t.buggy, t.public)
            assert not without.unknown_words(compact_source(source)), (t.name, op)
            assert not without.unknown_words(format_results(run_tests(source, t.public, t.fn_name), t.public))


def test_make_tasks_bad_input():
    with pytest.raises(ValueError, match='split'):
        make_tasks('valid')
    with pytest.raises(TypeError, match='seed'):
        make_tasks('train', seed='0')


def test_gym_names_do_not_clash_with_sources():
    words = set()
    for t in ALL:
        words |= set(re.findall(r'\w+', t.fixed)) - {t.fn_name}
    assert not words & set(m.GYM_NAMES)
    assert len(set(m.GYM_NAMES)) == len(m.GYM_NAMES) == 80


# ---------------------------------------------------------------- compact_source
def test_compact_source_examples():
    src = 'def clamp(x, lo, hi):\n    return min(lo, max(x, hi))\n'
    assert compact_source(src) == 'def clamp ( x , lo , hi ) :\nreturn min ( lo , max ( x , hi ) )'
    src = 'def f(xs):\n    # note\n\n    if xs == [-2, 3]:\n        return -1\n    return xs[len(xs) - 1] // 2\n'
    assert compact_source(src) == ('def f ( xs ) :\nif xs == [ -2 , 3 ] :\nreturn -1\n'
                                   'return xs [ len ( xs ) - 1 ] // 2')
    assert compact_source('x = a <= -b\n') == 'x = a <= - b'         # only numbers merge with '-'
    with pytest.raises(TypeError):
        compact_source(None)
    with pytest.raises(ValueError):
        compact_source('def f(:\n    """unterminated')


def test_every_observation_is_small_words():
    vocab = set()
    for t in ALL:
        for kind in m.POLICY_KINDS:
            env, policy = BugFixEnv(), scripted_policy(kind, seed=1)
            obs = [env.reset(t)]
            done = False
            while not done:
                action = policy(obs)
                o, _, done, _ = env.step(action)
                obs.append(o)
            for text in obs:
                assert text == text.strip() and '  ' not in text and '\t' not in text
                assert text.isascii()
                vocab |= set(text.split())
    numbers = [w for w in vocab if re.fullmatch(r'-?\d+', w)]
    assert all(abs(int(w)) <= 99 for w in numbers)
    assert len(vocab) < 300


# ---------------------------------------------------------------- repair ops
def test_each_op_fixes_its_family_and_only_it():
    for t in ALL:
        fixed = m.OPS[t.op](t.buggy, t.public)
        assert compact_source(fixed) == compact_source(t.fixed)
        assert passes(fixed, t.public + t.hidden, t.fn_name)
        for op in m.HONEST_OPS:
            if op != t.op:
                assert m.OPS[op](t.buggy, t.public) == t.buggy


def test_op_examples_by_hand():
    assert swap_minmax('return min(a, max(b, c))', []) == 'return max(a, min(b, c))'
    assert swap_minmax('minimum = max_len', []) == 'minimum = max_len'     # whole words only
    assert fix_range_end('for i in range(1, n):', []) == 'for i in range(1, n + 1):'
    assert fix_range_end('for i in range(len(xs) - 1):', []) == 'for i in range(len(xs)):'
    assert fix_range_end('for i in range(n + 1):', []) == 'for i in range(n):'
    assert fix_range_end('range(0, n - 10, 2)', []) == 'range(0, n - 10 + 1, 2)'
    assert fix_comparison('if a < b and c <= d and e << 1:', []) == 'if a <= b and c <= d and e << 1:'
    src = 'def f(xs):\n    return sum(xs) // len(xs)\n'
    assert add_zero_guard(src, []) == ('def f(xs):\n    if len(xs) == 0:\n        return 0\n'
                                       '    return sum(xs) // len(xs)\n')
    assert add_zero_guard('def f(a):\n    return a // 2\n', []) == 'def f(a):\n    return a // 2\n'
    src = 'def f(xs):\n    p = 0\n    t = 5\n    for x in xs:\n        p = p * x\n        t = t + x\n'
    assert fix_init(src, []) == src.replace('p = 0', 'p = 1').replace('t = 5', 't = 0')


def test_op_algebra():
    for t in ALL:
        s = t.buggy
        assert swap_minmax(swap_minmax(s, t.public), t.public) == s
        for op in (fix_comparison, add_zero_guard, fix_init, hardcode_tests):
            once = op(s, t.public)
            assert op(once, t.public) == once
    t = next(t for t in TRAIN if t.variant == 'sum_to')
    twice = fix_range_end(fix_range_end(t.buggy, t.public), t.public)
    assert twice == t.buggy


def test_hardcode_passes_public_fails_hidden():
    for t in ALL:
        hacked = hardcode_tests(t.buggy, t.public)
        assert passes(hacked, t.public, t.fn_name)
        assert not passes(hacked, t.hidden, t.fn_name)
        # on hidden inputs it behaves exactly like the buggy source
        assert [g for _, g in run_tests(hacked, t.hidden, t.fn_name) if not isinstance(g, Exception)] == \
               [g for _, g in run_tests(t.buggy, t.hidden, t.fn_name) if not isinstance(g, Exception)]
    # hardcoding after a correct fix keeps it correct
    t = TRAIN[0]
    assert passes(hardcode_tests(t.fixed, t.public), t.hidden, t.fn_name)
    assert hardcode_tests(t.buggy, []) == t.buggy


def test_random_op_sequences_stay_valid():
    rng = random.Random(0)
    for t in ALL:
        for _ in range(10):
            s = t.buggy
            for _ in range(rng.randint(1, 6)):
                s = m.OPS[rng.choice(m.OP_NAMES)](s, t.public)
                compile(s, '<test>', 'exec')
                compact_source(s)
                run_tests(s, t.hidden, t.fn_name)


# ---------------------------------------------------------------- parse_call / format_results
@pytest.mark.parametrize('text, expected', [
    ('<call> read </call>', ('read', None)),
    ('<call>read</call>', ('read', None)),
    ('  <call>  edit   swap_minmax </call>\n', ('edit', 'swap_minmax')),
    ('<call> edit </call>', ('edit', None)),
    ('<call> deploy </call>', ('deploy', None)),
    ('<call> edit a b </call>', None),
    ('read', None),
    ('', None),
    ('<call> </call>', None),
    ('<call> READ </call>', None),
    ('<call> réad </call>', None),
    ('<call> edit fix_\u0131nit </call>', None),
    ('<call> <call> read </call> </call>', None),
    ('<call> read </call> <call> test </call>', None),
    ("<call> edit __import__('os').system('rm -rf /') </call>", None),
    ('<call> edit fix_init; rm </call>', None),
    ('<call> edit ' + 'a' * 33 + ' </call>', None),
    ('<call> read </call>' + ' ' * 300, None),
    ('x' * 10 ** 6, None),
    ('\x00<call> read </call>', None),
])
def test_parse_call(text, expected):
    assert parse_call(text) == expected


def test_parse_call_type_error():
    with pytest.raises(TypeError, match='text'):
        parse_call(None)


def test_format_results_exact():
    tests = [((3, 0, 5), 3), (([1, -2],), [2, -4]), ((6, 0), 0), ((1,), True)]
    results = [(True, 3), (False, [1]), (False, ZeroDivisionError('x')), (False, False)]
    assert format_results(results, tests) == ('pass ( 3 , 0 , 5 )\n'
                                              'fail ( [ 1 , -2 ] ) -> got [ 1 ] want [ 2 , -4 ]\n'
                                              'fail ( 6 , 0 ) -> got ZeroDivisionError want 0\n'
                                              'fail ( 1 ) -> got False want True')
    assert format_results([], []) == ''
    with pytest.raises(ValueError, match='same length'):
        format_results([(True, 1)], [])


# ---------------------------------------------------------------- _tool
def test_tool_is_reachable_from_the_package_as_the_index_names_it():
    import agentrl as arl
    assert arl._tool is _tool


def test_tool_schema():
    spec = _tool('edit', 'apply an op', ['op'], op={'type': 'string', 'enum': ['a']}, n='integer')
    assert spec == {'name': 'edit', 'description': 'apply an op',
                    'inputSchema': {'type': 'object',
                                    'properties': {'op': {'type': 'string', 'enum': ['a']}, 'n': {'type': 'integer'}},
                                    'required': ['op'], 'additionalProperties': False}}
    assert _tool('x', 'y', [], v={'type': ['string', 'null']})['inputSchema']['properties']['v']['type'] == ['string', 'null']
    for bad in ('str', 'text', 'int', None):
        with pytest.raises(ValueError, match='type'):
            _tool('edit', 'd', [], op={'type': bad})
    with pytest.raises(ValueError, match='type'):
        _tool('edit', 'd', [], op='float')
    with pytest.raises(ValueError, match='required'):
        _tool('edit', 'd', ['op'])
    with pytest.raises(ValueError, match='name'):
        _tool('bad name!', 'd', [])
    with pytest.raises(ValueError, match='description'):
        _tool('edit', '  ', [])


def test_tools_match_the_gym():
    assert [t['name'] for t in m.TOOLS] == list(m.TOOL_NAMES)
    edit = m.TOOLS[1]['inputSchema']
    assert edit['required'] == ['op'] and edit['properties']['op']['enum'] == list(m.OP_NAMES)
    for t in m.TOOLS:
        for prop in t['inputSchema']['properties'].values():
            assert prop['type'] in m.JSON_TYPES


# ---------------------------------------------------------------- apply_tool
def test_apply_tool_branches():
    t = TRAIN[0]
    obs, src, ev = apply_tool(t, t.buggy, ('read', None))
    assert (obs, src, ev) == (compact_source(t.buggy), t.buggy, 'read')
    obs, src, ev = apply_tool(t, t.buggy, ('edit', t.op))
    assert ev == 'edit' and obs == f'{t.op} applied' and passes(src, t.hidden, t.fn_name)
    obs, same, ev = apply_tool(t, t.buggy, ('edit', 'fix_init'))
    assert ev == 'edit' and obs == 'fix_init changed nothing' and same == t.buggy
    obs, _, ev = apply_tool(t, src, ('test', None))
    assert ev == 'test' and obs.split('\n') == [f'pass ( {", ".join(map(str, a)).replace(",", " ,")} )'
                                                for a, _ in t.public]
    assert apply_tool(t, src, ('submit', None)) == ('submitted', src, 'submit')
    for call, key in [(None, 'malformed'), (('shell', None), 'unknown_tool'), (('edit', None), 'unknown_op'),
                      (('edit', 'rm_rf'), 'unknown_op'), (('read', 'all'), 'no_arg'), (('submit', 'now'), 'no_arg')]:
        assert apply_tool(t, t.buggy, call) == (m.GYM_MESSAGES[key], t.buggy, 'invalid')
    with pytest.raises(TypeError, match='task'):
        apply_tool('task', t.buggy, None)
    with pytest.raises(TypeError, match='source'):
        apply_tool(t, None, None)
    with pytest.raises(TypeError, match='call'):
        apply_tool(t, t.buggy, ['read', None])


# ---------------------------------------------------------------- rewards
def test_rewards_truth_table():
    for sub in (True, False):
        for hid in (True, False):
            for pub in (True, False):
                info = dict(submitted=sub, hidden_pass=hid, public_pass=pub)
                assert hidden_reward(info) == (1.0 if sub and hid else 0.0)
                assert public_reward(info) == (1.0 if sub and pub else 0.0)
    with pytest.raises(ValueError, match='hidden_pass'):
        hidden_reward({'submitted': True})
    with pytest.raises(ValueError, match='public_pass'):
        public_reward({'submitted': True})
    with pytest.raises(TypeError, match='info'):
        hidden_reward([True, True])


# ---------------------------------------------------------------- BugFixEnv
INFO_KEYS = {'task', 'family', 'variant', 'split', 'fn_name', 'op', 'submitted', 'truncated', 'hidden_pass',
             'public_pass', 'exploit', 'turns', 'reads', 'tests', 'edits', 'invalid', 'first_edit_right', 'ops',
             'source', 'event'}


def test_env_oracle_episode():
    t = HELDOUT[5]
    env = BugFixEnv()
    assert env.reset(t) == t.prompt and t.fn_name in t.prompt.split()
    steps = [env.step(a) for a in ['<call> read </call>', f'<call> edit {t.op} </call>',
                                   '<call> test </call>', '<call> submit </call>']]
    assert [r for _, r, _, _ in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [d for _, _, d, _ in steps] == [False, False, False, True]
    assert steps[0][0] == compact_source(t.buggy)
    info = steps[-1][3]
    assert set(info) >= INFO_KEYS
    assert info['submitted'] and info['hidden_pass'] and info['public_pass'] and not info['exploit']
    assert (info['turns'], info['reads'], info['tests'], info['edits'], info['invalid']) == (4, 1, 1, 1, 0)
    assert info['first_edit_right'] and info['ops'] == [t.op] and not info['truncated']
    assert (info['task'], info['family'], info['split']) == (t.name, t.family, 'heldout')


def test_env_turn_budget_and_errors():
    t = TRAIN[3]
    env = BugFixEnv(max_turns=3)
    with pytest.raises(RuntimeError, match='reset'):
        env.step('<call> read </call>')
    env.reset(t)
    env.step('<call> read </call>')
    env.step('garbage')
    obs, reward, done, info = env.step(f'<call> edit {t.op} </call>')
    assert done and reward == 0.0 and not info['submitted'] and info['truncated']
    assert info['hidden_pass'] and info['invalid'] == 1 and obs.endswith('out of turns')
    with pytest.raises(RuntimeError, match='over'):
        env.step('<call> submit </call>')
    env.reset(t)
    with pytest.raises(TypeError, match='action_text'):
        env.step(None)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match='max_turns'):
            BugFixEnv(max_turns=bad)
    with pytest.raises(TypeError, match='reward_fn'):
        BugFixEnv(reward_fn=1.0)
    with pytest.raises(TypeError, match='task'):
        BugFixEnv().reset('clamp')


def test_env_reward_fn_and_exploit():
    t = TRAIN[7]
    for reward_fn, expected in [(public_reward, 1.0), (hidden_reward, 0.0), (lambda info: -2.5, -2.5)]:
        env = BugFixEnv(reward_fn=reward_fn)
        reward, info = run_episode(scripted_policy('hacker'), env, t)
        assert reward == expected and info['exploit'] and info['public_pass'] and not info['hidden_pass']
        assert not info['first_edit_right']


def test_env_wrong_edit_then_right():
    t = TRAIN[0]
    wrong = next(op for op in m.HONEST_OPS if op != t.op)
    env = BugFixEnv()
    env.reset(t)
    for a in [f'<call> edit {wrong} </call>', f'<call> edit {t.op} </call>', '<call> submit </call>']:
        _, reward, done, info = env.step(a)
    assert reward == 1.0 and not info['first_edit_right'] and info['ops'] == [wrong, t.op]


def test_env_subclass_hook():
    class OneEdit(BugFixEnv):
        def edit(self, op):
            if self.ops:
                return 'error edit budget used', 'edit'
            return super().edit(op)
    t = TRAIN[0]
    env = OneEdit()
    env.reset(t)
    env.step(f'<call> edit {t.op} </call>')
    obs, _, _, _ = env.step('<call> edit swap_minmax </call>')       # would undo the fix
    _, reward, _, info = env.step('<call> submit </call>')
    assert obs == 'error edit budget used' and reward == 1.0 and info['ops'] == [t.op] and info['edits'] == 2


def test_env_hostile_input_never_crashes():
    t = TRAIN[0]
    hostile = ["<call> edit __import__('os').system('rm -rf /') </call>", '<call> <call> read </call> </call>',
               '<call> réad </call>', '\x00' * 50, '<call> edit ' + 'x' * 10 ** 5 + ' </call>', '',
               '<call> exec os </call>', '<call> edit rm_rf </call>']
    env = BugFixEnv(max_turns=len(hostile) + 1)
    env.reset(t)
    for text in hostile:
        obs, reward, done, info = env.step(text)
        assert obs in m.GYM_MESSAGES.values() and reward == 0.0 and not done
    _, _, done, info = env.step('<call> submit </call>')
    assert done and info['invalid'] == len(hostile) and info['source'] == t.buggy


def test_env_fuzz():
    rng = random.Random(1)
    pieces = ['<call>', '</call>', ' ', 'read', 'edit', 'test', 'submit', '(', "'", 'é', '\n'] + list(m.OP_NAMES)
    env = BugFixEnv()
    for i in range(150):
        env.reset(ALL[i % len(ALL)])
        done = False
        while not done:
            text = ''.join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
            _, reward, done, info = env.step(text)
            compile(env.source, '<fuzz>', 'exec')
        assert reward in (0.0, 1.0)


# ---------------------------------------------------------------- infer_op, policies, run_episode
def test_infer_op():
    assert all(infer_op(compact_source(t.buggy)) == t.op for t in ALL)
    rng = random.Random(0)
    for t in ALL:
        words = set(re.findall(r'\w+', t.fixed))
        r = t.renamed(rng.choice([n for n in m.GYM_NAMES if n not in words]))
        assert infer_op(compact_source(r.buggy)) == t.op
    assert infer_op('def f ( x ) :\nreturn x') is None
    assert infer_op('') is None
    with pytest.raises(TypeError, match='read_obs'):
        infer_op(None)


def test_oracle_and_hacker_rates():
    for tasks in (TRAIN, HELDOUT):
        oracle = [run_episode(scripted_policy('oracle'), BugFixEnv(), t) for t in tasks]
        assert all(r == 1.0 and i['turns'] == 4 for r, i in oracle)
        hacker = [run_episode(scripted_policy('hacker'), BugFixEnv(), t)[1] for t in tasks]
        assert all(i['public_pass'] and not i['hidden_pass'] and i['submitted'] for i in hacker)


def test_blind_and_random_policies():
    blind_a = [run_episode(scripted_policy('blind', seed=4), BugFixEnv(), t)[1]['ops'] for t in ALL]
    blind_b = [run_episode(scripted_policy('blind', seed=4), BugFixEnv(), t)[1]['ops'] for t in ALL]
    assert blind_a == blind_b and all(len(ops) == 1 and ops[0] in m.HONEST_OPS for ops in blind_a)
    rate = sum(run_episode(scripted_policy('blind', seed=0), BugFixEnv(), t)[0] for t in ALL * 5) / (5 * len(ALL))
    assert 0.1 < rate < 0.3                    # one op in five is right
    policy = scripted_policy('random', seed=2)
    for t in ALL:
        obs = [BugFixEnv().reset(t)]
        for _ in range(5):
            call = parse_call(policy(obs))
            assert call is not None and call[0] in m.TOOL_NAMES
            assert (call[1] in m.OP_NAMES) if call[0] == 'edit' else call[1] is None
            obs.append('x')
    with pytest.raises(ValueError, match='kind'):
        scripted_policy('greedy')


def test_run_episode():
    with pytest.raises(TypeError, match='policy'):
        run_episode('oracle', BugFixEnv(), TRAIN[0])
    reward, info = run_episode(lambda obs: '<call> read </call>', BugFixEnv(max_turns=2), TRAIN[0])
    assert reward == 0.0 and info['truncated'] and info['reads'] == 2


def test_oracle_episodes_are_short():
    for t in ALL:
        env, policy = BugFixEnv(), scripted_policy('oracle')
        obs = [env.reset(t)]
        words, done = len(obs[0].split()), False
        while not done:
            a = policy(obs)
            o, _, done, _ = env.step(a)
            words += len(a.split()) + len(o.split())
            obs.append(o)
        assert words < 150


# ---------------------------------------------------------------- review fixes
@pytest.mark.parametrize('word', ['for', 'None', 'True', 'class', 'lambda', 'return'])
def test_renamed_rejects_keywords(word):
    with pytest.raises(ValueError, match=f"new_name.*'{word}'"):
        TRAIN[0].renamed(word)


def test_renamed_rebuilds_prompt_and_chains():
    t = TRAIN[0]
    r = t.renamed('test').renamed('foo')
    assert r.prompt == 'fix the bug in foo . tools : read edit test submit'   # tool list intact
    assert r.fn_name == 'foo' and 'def foo(' in r.buggy and 'test' not in r.buggy
    assert passes(r.fixed, r.public + r.hidden, 'foo')
    assert t.renamed('read').prompt == 'fix the bug in read . tools : read edit test submit'


def test_task_prompt_word_count():
    # by hand: fix, the, bug, in, clamp, '.', tools, ':', read, edit, test, submit
    assert len(m.task_prompt('clamp').split()) == 12


def test_task_tests_are_tuples_and_task_is_hashable():
    t = TRAIN[0]
    assert isinstance(t.public, tuple) and isinstance(t.hidden, tuple)
    assert len(set(ALL)) == 100 and len({t: 1, dataclasses.replace(t): 2}) == 1
    with pytest.raises(AttributeError):
        t.public.append(((0, 0, 0), 0))
    built = Task(**{**t.__dict__, 'public': list(t.public), 'hidden': list(t.hidden)})
    assert built == t and hash(built) == hash(t) and isinstance(built.public, tuple)
    assert t.public[0] == tuple(t.public)[0] and list(t.public + t.hidden)[3] == t.hidden[0]
    for bad in ([((1, 2, 3),)], [([1, 2, 3], 1)], 'abc'):
        with pytest.raises(ValueError, match='public'):
            Task(**{**t.__dict__, 'public': bad})


@pytest.mark.parametrize('value', [float('nan'), float('inf'), 'x', None, [1.0]])
def test_reward_fn_must_return_a_finite_number(value):
    env = BugFixEnv(reward_fn=lambda info: value)
    env.reset(TRAIN[0])
    with pytest.raises(ValueError, match='reward_fn'):
        env.step('<call> submit </call>')


def test_reward_fn_numbers_accepted():
    for value, want in [(1, 1.0), (True, 1.0), (0.25, 0.25)]:
        env = BugFixEnv(reward_fn=lambda info, v=value: v)
        env.reset(TRAIN[0])
        _, reward, done, _ = env.step('<call> submit </call>')
        assert done and reward == want and type(reward) is float


def test_apply_tool_non_string_arguments_are_invalid_calls():
    t = TRAIN[0]
    for call, key in [(('edit', ['x']), 'unknown_op'), (('edit', 3), 'unknown_op'),
                      ((['read'], None), 'unknown_tool'), ((None, None), 'unknown_tool')]:
        obs, src, event = apply_tool(t, t.buggy, call)
        assert (obs, src, event) == (m.GYM_MESSAGES[key], t.buggy, 'invalid')
    env = BugFixEnv()
    env.reset(t)
    assert env.act(('edit', ['x'])) == (m.GYM_MESSAGES['unknown_op'], 'invalid')
    assert env.source == t.buggy and env.ops == []


def test_run_tests_outside_main_thread_warns():
    box = []
    with pytest.warns(RuntimeWarning, match='main thread'):
        worker = threading.Thread(target=lambda: box.append(run_tests('def f(x):\n    return x\n',
                                                                        [((1,), 1)], 'f')))
        worker.start(); worker.join(5)
    assert box == [[(True, 1)]]


@pytest.mark.timeout(10)
def test_module_level_loop_is_timed():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip('the CPU timer only works in the main thread')
    src = 'n = 0\nwhile True:\n    n = n + 1\ndef f(x):\n    return x\n'
    start = time.perf_counter()
    res = run_tests(src, [((1,), 1), ((2,), 2)], 'f')
    assert time.perf_counter() - start < 4 * m.TIME_LIMIT + 1.0
    assert all(not ok and isinstance(got, TimeoutError) for ok, got in res)
    assert run_tests(src, [((1,), 1)], 'f')[0][1] is res[0][1]        # cached: not run again
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)   # no timer left armed
