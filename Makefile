# Two commands do everything:
#   make run              create .venv if needed, install, run the DVC pipeline (dvc repro)
#   make run DATA=<path or URL>   the same pipeline from another data source (offline mirror)
#   make test             create .venv if needed, install, ruff check, ruff format --check, pytest
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# A local DATA path is made absolute: DVC may run stages in a temporary copy of the repo.
DATA_URL = $(if $(findstring ://,$(DATA)),$(DATA),$(abspath $(DATA)))

.PHONY: install run test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -r requirements.txt
	touch $@

run: install
ifdef DATA
	dvc exp run -S 'data.url=$(DATA_URL)'
else
	dvc repro
endif

lint: install
	ruff check .
	ruff format --check .

test: lint
	pytest

clean:
	rm -rf data/prepared data/raw models reports/metrics reports/plots reports/comparison.*
