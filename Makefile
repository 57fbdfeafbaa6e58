# Three commands do everything:
#   make demo             the quick study: the whole pipeline (nine variants, evaluation, comparison,
#                         MLflow experiment cifar10-amp-demo) on a tiny subset, in demo/; minutes on a CPU
#   make demo DATA=<path or URL>  the same from another data source (offline mirror)
#   make run              create .venv if needed, install, run the full study (dvc repro); without
#                         CUDA it first says how long that takes here (ampbench estimate)
#   make run DATA=<path or URL>   the same pipeline from another data source (offline mirror)
#   make test             create .venv if needed, install, make lint (pre-commit's checks, mypy),
#                         pytest: everything, what CI runs
#   make test-fast        ruff check, ruff format --check, then the unit tests only (pytest -m
#                         "not slow"): under a minute on 2 cores; the end-to-end tests (stages as
#                         subprocesses, the pipeline, dvc, mlflow server, browser) are marked slow
#   make explain [DATA=<path or URL>]  why AMP pays or not on this machine: its speed-up rung by rung from the
#                         tutorial's conditions to the defaults, and over batch sizes
#                         (ampbench explain: reports/explain.{json,md,png}; data/prepared first)
#   make plots [DIR=demo]  `dvc plots show` that works offline (fetches vega once from npm)
#   make tutorial DATA=<path or URL>  the tutorial's conditions (DataLoader, batch 128, eager, single
#                         GPU; experiment cifar10-amp-tutorial) in tutorial/, then docs/FINDINGS.md
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# A local DATA path is made absolute: DVC may run stages in a temporary copy of the repo (a
# quoted ~/... stays: the download stage expands it). Not by
# $(abspath): make splits its argument at spaces, so `DATA="/my data/c.tar.gz"` gave two paths.
DATA_URL = $(if $(or $(findstring ://,$(DATA)),$(filter /% ~%,$(firstword $(DATA)))),$(DATA),$(CURDIR)/$(DATA))
# $(call q,TEXT): TEXT as one shell word, whatever spaces or quotes it holds.
q = '$(subst ','\'',$(1))'

.PHONY: install run demo tutorial plots findings explain test test-fast lint clean clean-demo clean-tutorial

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

# dvc runs through ampbench.dvc_run (src/ampbench/dvc_run.py), which also starts the command's warm
# server (src/ampbench/warm/: stages fork from it instead of importing torch and MLflow again;
# AMPBENCH_WARM=0 runs them plain): the same command without DVC's
# "No file hash info found" warnings (dvc exp run's check-out of outputs not made yet) and with
# a stop (Ctrl-C, SIGTERM, SIGHUP: a closed terminal) told as one line: the train stage says what
# it saved, where, and the command below that resumes. The recipe traps the signal so that it can
# finish; make, which got it too, then exits by it (129, 130, 143) without a line of its own. A SIGTERM to make alone (`kill`
# of its pid, `timeout make run`) reaches only the recipe's shell, which cannot pass it on while it
# waits for a command in the foreground: so the command runs in the background (stdin kept as fd
# 3; AMPBENCH_MAKE_JOB tells it that Ctrl-C is still its own) and the shell passes SIGTERM on.
RESUME = make $@$(if $(DATA), DATA=$(call q,$(DATA)))
STOPPABLE = trap 'signalled=1' INT HUP QUIT USR1 USR2 ALRM; trap 'signalled=1; kill -TERM $$job 2>/dev/null' TERM; \
	export AMPBENCH_RESUME_COMMAND=$(call q,$(RESUME)) AMPBENCH_MAKE_JOB=1; exec 3<&0; \
	$(abspath $(PY)) -m ampbench.dvc_run $(1) <&3 3<&- & job=$$!; wait $$job; status=$$?; \
	while kill -0 $$job 2>/dev/null; do wait $$job; status=$$?; done; \
	if [ -n "$$signalled" ] && [ $$status -eq 129 -o $$status -eq 130 -o $$status -eq 143 ]; then exit 0; fi; \
	exit $$status

# First what the pipeline command would refuse (a faulty params.yaml, a DATA naming no file, a
# pipeline already running in this project: src/ampbench/dvc_guard.py), at once and once; then the estimate, which never
# holds the study up, but a setting it refuses (exit 2: a model too large for this machine) stops
# here. A Ctrl-C during the estimate: its one line names `make run` to start again; the trap keeps
# make's own "*** [run] Interrupt" away (make then ends by the signal, as after a stage's stop).
run: install
	@$(abspath $(PY)) -m ampbench.dvc_guard $(if $(DATA),$(call q,$(DATA_URL)))
	@trap 'exit 0' INT HUP; echo ampbench estimate; AMPBENCH_RESUME_COMMAND=$(call q,$(RESUME)) \
	ampbench estimate $(if $(DATA),--set $(call q,data.url=$(DATA_URL))) || [ $$? -ne 2 ]
ifdef DATA
	@echo dvc exp run -S $(call q,$(call q,data.url=$(DATA_URL)))
	@$(call STOPPABLE,exp run -S $(call q,data.url=$(DATA_URL)))
else
	@echo "dvc repro"
	@$(call STOPPABLE,repro)
endif

# demo/ runs the same dvc.yaml (an exact copy, kept in sync here and checked by the tests) with
# demo/params.yaml; demo/src links to src/ so the code deps resolve. Outputs stay in demo/.
# demo/ and tutorial/ are DVC subrepos (`dvc init --subdir`: their own .dvc/), so that the
# study's `dvc metrics show` / `plots show` / `exp show` at the root list none of their files
# and theirs none of the study's. DVC_ROOT=the repo root keeps their MLflow runs in the repo's
# mlflow.db (tracking/store.py reads DVC_ROOT; DVC sets it to demo/ otherwise).
# `git status` stays clean after a demo: DATA reaches the stages through demo/params.yaml (data.url:
# DVC tracks it in demo/dvc.lock, so a new source re-runs download) for this run only, the file as
# committed put back after it, however it ends (a stop too). DVC will neither read nor write a
# git-ignored dvc.lock, so demo/dvc.lock is committed as an empty lock and marked skip-worktree:
# git leaves what DVC writes there (this machine's demo run) out of `git status` and `git diff`
# (`git update-index --no-skip-worktree demo/dvc.lock` shows it again). `dvc exp run` from demo/
# would also check out the study's outputs and stage demo/src in git.
# One OpenMP thread per process: on a busy 2-core machine two threads spin against each other
# (a step measured 13x slower); the demo's timings say nothing anyway.
demo: install
	@cmp -s dvc.yaml demo/dvc.yaml || { echo "demo/dvc.yaml: updated from dvc.yaml"; cp dvc.yaml demo/dvc.yaml; }
	@git update-index --skip-worktree demo/dvc.lock 2>/dev/null || true
	@echo "cd demo && dvc repro"
	@cd demo && export DVC_ROOT=$(CURDIR) OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} && \
	$(if $(DATA),kept=$$(mktemp) && cp params.yaml "$$kept" && \
	trap 'cat "$$kept" > params.yaml; rm -f "$$kept"' EXIT && trap 'signalled=1' INT TERM && \
	sed -i $(call q,s|^  url: .*|  url: $(DATA_URL)|) params.yaml && )$(call STOPPABLE,repro)

explain: install
	@test -f data/prepared/cifar10.pt || ampbench download $(if $(DATA),--set $(call q,data.url=$(DATA_URL)))
	ampbench explain

# tutorial/ follows demo/'s pattern (a dvc.yaml copy, src -> ../src, its own params.yaml): the
# study under the tutorial's conditions, to test its four claims. Then `make findings` writes
# docs/FINDINGS.md and docs/FINDINGS.zh.md from both studies' metrics (and reports/bench.json and
# reports/explain.json when they exist).
tutorial: install
	@cmp -s dvc.yaml tutorial/dvc.yaml || { echo "tutorial/dvc.yaml: updated from dvc.yaml"; cp dvc.yaml tutorial/dvc.yaml; }
ifdef DATA
	sed -i $(call q,s|^  url: .*|  url: $(DATA_URL)|) tutorial/params.yaml
endif
	@echo "cd tutorial && DVC_ROOT=$(CURDIR) dvc repro"
	@cd tutorial && export DVC_ROOT=$(CURDIR) && $(call STOPPABLE,repro)
	@echo "The comparison: tutorial/reports/comparison.md; in DVC: cd tutorial && dvc metrics show"

# `dvc plots show` writes a page that loads vega from a CDN: blank offline. `make plots` builds,
# once, a page with vega, vega-lite and vega-embed inline (scripts/offline_plots.py, from the npm
# registry, pinned and checksummed; ~0.8 MB, so built rather than committed), points DVC at it
# (plots.html_template in the git-ignored .dvc/config.local of the study, demo/ and tutorial/),
# then draws the study's plots, or demo's / tutorial's with DIR=demo / DIR=tutorial. From then on
# a plain `dvc plots show` works offline too.
PLOTS_PAGE = .dvc/tmp/offline-plots.html
$(PLOTS_PAGE): scripts/offline_plots.py | $(VENV)/.installed
	$(PY) scripts/offline_plots.py $@
	@for d in . demo tutorial; do [ ! -d $$d/.dvc ] || (cd $$d && dvc config --local plots.html_template $(abspath $@)); done

plots: install $(PLOTS_PAGE)
	cd $(or $(DIR),.) && dvc plots show

findings: install
	ampbench findings $(if $(wildcard reports/bench.json),--bench reports/bench.json) $(if $(wildcard reports/explain.json),--explain reports/explain.json)

# The commit checks on every tracked file (.pre-commit-config.yaml: ruff check, ruff format, large
# files, merge conflicts, codespell; their environments come from PyPI, cached in ~/.cache/pre-commit
# after the first run), then the type checker on the files [tool.mypy] in pyproject.toml lists.
lint: install
	pre-commit run --all-files --show-diff-on-failure
	mypy

# Two pytest workers (pytest-xdist): the suite is mostly stage subprocesses, one CPU each. Each
# test is scheduled alone, except the modules whose tests share a module fixture (a pipeline run,
# a study's store: tests/conftest.py GROUPED_MODULES), kept on one worker. Then the tests that
# time something (marked serial), alone.
PYTEST_WORKERS ?= 2
test: lint
	pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not serial"
	pytest -m serial

# The quick loop: ruff only (pre-commit's first run builds its environments, mypy's a cache: ~50 s
# in a fresh clone), then the unit tests.
test-fast: install
	ruff check .
	ruff format --check .
	pytest -m "not slow"

clean:
	rm -rf data/prepared data/raw models reports/metrics reports/plots reports/comparison.* reports/answer reports/views

# The demo's outputs, its DVC cache, run cache included, and its dvc.lock back to the committed
# empty lock, no longer skip-worktree (so git can check out commits that change or lack it).
# Without the run cache gone, `dvc repro` would restore the nine models instead of training them
# (DVC's run cache keys each stage by its command, deps and params, which a clean does not change).
clean-demo:
	rm -rf demo/data demo/models demo/checkpoints demo/reports demo/.dvc/cache
	printf "schema: '2.0'\nstages: {}\n" > demo/dvc.lock
	@git update-index --no-skip-worktree demo/dvc.lock 2>/dev/null || true
	@echo "Removed the demo's files; the next 'make demo' trains all nine variants again."
	@echo "MLflow keeps the demo's runs (experiment cifar10-amp-demo in mlflow.db): the next demo adds a new"
	@echo "study beside them. To start MLflow over too: rm -rf mlflow.db mlruns (every experiment's runs, the study's too)."

clean-tutorial:
	rm -rf tutorial/data tutorial/models tutorial/checkpoints tutorial/reports tutorial/dvc.lock
