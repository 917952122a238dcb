# Agent RL: build the book, test the library, refresh notebooks.
# `make book` and `make test` work on a fresh machine: they create .venv first.
SHELL := /bin/bash
PY      := .venv/bin/python
BIN     := .venv/bin
NBS     := $(sort $(wildcard nbs/*.ipynb))
NB      ?= $(NBS)
THREADS := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
MATHJAX := _mathjax/mathjax/tex-mml-chtml.js

.PHONY: book test warm lib execute lab bench clean clean-cache site libpage mathjax venv

venv: .venv/.installed
.venv/.installed: requirements.txt settings.ini setup.py
	python3 -m venv .venv
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0          # CPU wheel first; see toolchain notes
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

lib: venv  ## regenerate agentrl/ from the notebooks
	$(BIN)/nbdev_export

libpage: venv  ## regenerate library.md (the agentrl library page)
	$(PY) scripts/library_page.py > library.md

mathjax: $(MATHJAX)
$(MATHJAX):  ## offline MathJax 4 and its font from the npm registry (never committed)
	rm -rf build/npm _mathjax && mkdir -p build/npm _mathjax/fonts
	npm install --silent --no-audit --no-fund --prefix build/npm mathjax@4.1.3 @mathjax/mathjax-newcm-font@4.1.3 >/dev/null
	cp -r build/npm/node_modules/mathjax _mathjax/mathjax
	mkdir -p _mathjax/fonts/mathjax-newcm-font
	cp -r build/npm/node_modules/@mathjax/mathjax-newcm-font/chtml build/npm/node_modules/@mathjax/mathjax-newcm-font/chtml.js _mathjax/fonts/mathjax-newcm-font/

site: venv lib libpage mathjax
	$(BIN)/jupyter-book build . -W -n --keep-going -q

book: site  ## one command: environment, library, site; prints the page to open
	@echo "Open: file://$(CURDIR)/_build/html/index.html"

test: venv mathjax  ## every test: unit, export drift, notebook regression, site
	$(PY) scripts/warm_cache.py --workers 2
	$(THREADS) $(BIN)/pytest -n 2 --dist load -q

warm: venv  ## train every cached run that is missing, on 2 cores (half on switched CPU kernels)
	$(PY) scripts/warm_cache.py --workers 2

execute: venv  ## re-run notebooks in place (NB=path to choose), clean, export
	@for nb in $(NB); do echo "executing $$nb"; \
	  $(THREADS) $(BIN)/papermill -k python3 --cwd nbs $$nb $$nb --no-progress-bar || exit 1; \
	  $(BIN)/nbdev_clean --fname $$nb; \
	done
	$(PY) scripts/tag_hidden.py $(NB)
	$(BIN)/nbdev_export

LAB_ARGS ?=
lab: venv  ## Jupyter Lab on nbs/; pass flags with LAB_ARGS="--no-browser --allow-root"
	$(BIN)/jupyter lab nbs $(LAB_ARGS)

bench: venv  ## 3 timed executions per notebook -> bench/results.json
	$(THREADS) $(PY) scripts/bench.py --repeats 3 --out bench/results.json

clean:
	rm -rf _build build _mathjax

AGENTRL_CACHE ?= $(HOME)/.cache/agentrl
clean-cache:  ## delete the trained weights that make_base_agent / make_rl_base cached on disk
	rm -rf "$(AGENTRL_CACHE)"
