"""The committed library is exactly what nbdev_export makes of the committed notebooks."""
import filecmp
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_library_matches_notebooks(tmp_path):
    for name in ('settings.ini', 'nbs'):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / 'agentrl').mkdir()
    shutil.copy(ROOT / 'agentrl' / '__init__.py', tmp_path / 'agentrl' / '__init__.py')
    exporter = pathlib.Path(sys.executable).parent / 'nbdev_export'
    subprocess.run([str(exporter)], cwd=tmp_path, check=True, capture_output=True)
    made = sorted(p.name for p in (tmp_path / 'agentrl').glob('*.py'))
    committed = sorted(p.name for p in (ROOT / 'agentrl').glob('*.py'))
    assert made == committed, f'modules differ: export makes {made}, repo has {committed}'
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / 'agentrl', ROOT / 'agentrl', made, shallow=False)
    assert not mismatch and not errors, (
        f'agentrl/ is out of sync with nbs/ in {mismatch + errors}: run `make lib` and commit')


def test_every_module_is_star_imported():
    """agentrl/__init__.py exposes every chapter module, so `arl.<name>` reaches each definition."""
    init = (ROOT / 'agentrl' / '__init__.py').read_text()
    modules = [p.stem for p in (ROOT / 'agentrl').glob('*.py') if not p.stem.startswith('_')]
    for mod in modules:
        assert f'from .{mod} import *' in init, f'agentrl/__init__.py does not import {mod}'
    import agentrl
    for mod in modules:
        module = __import__(f'agentrl.{mod}', fromlist=['__all__'])
        for name in module.__all__:
            assert hasattr(agentrl, name), f'arl.{name} is missing'


def test_exported_docstrings_point_to_their_section():
    import re
    for path in (ROOT / 'agentrl').glob('*.py'):
        if path.stem.startswith('_'):
            continue
        module = __import__(f'agentrl.{path.stem}', fromlist=['__all__'])
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj):
                continue
            doc = obj.__doc__ or ''
            assert re.search(r'Defined in Section [0-9A-Z]+\.\d+\.', doc), (
                f'{path.stem}.{name}: docstring must end with "Defined in Section N.k."')
