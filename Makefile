# Three commands do everything:
#   make demo             the quick study: the whole pipeline (nine variants, evaluation, comparison,
#                         MLflow experiment cifar10-amp-demo) on a tiny subset, in demo/; minutes on a CPU
#   make demo DATA=<path or URL>  the same from another data source (offline mirror)
#   make run              create .venv if needed, install, run the full study (dvc repro); without
#                         CUDA it first says how long that takes here (ampbench estimate)
#   make run DATA=<path or URL>   the same pipeline from another data source (offline mirror)
#   make test             create .venv if needed, install, ruff check, ruff format --check, pytest
#                         (everything; what CI runs)
#   make test-fast        the same lint, then the unit tests only (pytest -m "not slow"): under a
#                         minute on 2 cores; the end-to-end tests (stages as subprocesses, the
#                         pipeline, dvc, mlflow server, browser) are marked slow
#   make tutorial DATA=<path or URL>  the tutorial's conditions (DataLoader, batch 128, eager, single
#                         GPU; experiment cifar10-amp-tutorial) in tutorial/, then docs/FINDINGS.md
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# A local DATA path is made absolute: DVC may run stages in a temporary copy of the repo.
DATA_URL = $(if $(findstring ://,$(DATA)),$(DATA),$(abspath $(DATA)))

.PHONY: install run demo tutorial findings test test-fast lint clean clean-demo clean-tutorial

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

run: install
	-ampbench estimate
ifdef DATA
	dvc exp run -S 'data.url=$(DATA_URL)'
else
	dvc repro
endif

# demo/ runs the same dvc.yaml (an exact copy, kept in sync here and checked by the tests) with
# demo/params.yaml; demo/src links to src/ so the code deps resolve. Outputs stay in demo/.
# DATA is written into demo/params.yaml (data.url, tracked in demo/dvc.lock) and `dvc repro` runs:
# `dvc exp run` from demo/ would also check out the study's outputs and stage demo/src in git.
# One OpenMP thread per process: on a busy 2-core machine two threads spin against each other
# (a step measured 13x slower); the demo's timings say nothing anyway.
demo: install
	@cmp -s dvc.yaml demo/dvc.yaml || { echo "demo/dvc.yaml: updated from dvc.yaml"; cp dvc.yaml demo/dvc.yaml; }
ifdef DATA
	sed -i 's|^  url: .*|  url: $(DATA_URL)|' demo/params.yaml
endif
	cd demo && OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} dvc repro
	@cat demo/reports/comparison.md

# tutorial/ follows demo/'s pattern (a dvc.yaml copy, src -> ../src, its own params.yaml): the
# study under the tutorial's conditions, to test its four claims. Then `make findings` writes
# docs/FINDINGS.md from both studies' metrics (and reports/bench.json when it exists).
tutorial: install
	@cmp -s dvc.yaml tutorial/dvc.yaml || { echo "tutorial/dvc.yaml: updated from dvc.yaml"; cp dvc.yaml tutorial/dvc.yaml; }
ifdef DATA
	sed -i 's|^  url: .*|  url: $(DATA_URL)|' tutorial/params.yaml
endif
	cd tutorial && dvc repro
	@cat tutorial/reports/comparison.md

findings: install
	ampbench findings $(if $(wildcard reports/bench.json),--bench reports/bench.json)

lint: install
	ruff check .
	ruff format --check .

test: lint
	pytest

test-fast: lint
	pytest -m "not slow"

clean:
	rm -rf data/prepared data/raw models reports/metrics reports/plots reports/comparison.*

clean-demo:
	rm -rf demo/data demo/models demo/checkpoints demo/reports demo/dvc.lock

clean-tutorial:
	rm -rf tutorial/data tutorial/models tutorial/checkpoints tutorial/reports tutorial/dvc.lock
