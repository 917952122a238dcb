"""Packaging for `agentrl`, driven by nbdev's settings.ini (nbdev 2 layout)."""
from configparser import ConfigParser

import setuptools
from packaging.version import Version

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']
assert Version(cfg['version'])  # a valid PEP 440 version

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    author=cfg['author'],
    author_email=cfg['author_email'],
    license='Apache-2.0',
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    python_requires='>=' + cfg['min_python'],
    install_requires=cfg.get('requirements', '').split(),
    extras_require={'dev': cfg.get('dev_requirements', '').split()},
    zip_safe=False,
)
