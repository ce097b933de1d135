# The two commands of the README: `make up` (build the default students, serve them; a rerun serves at
# once, an interrupted build resumes) and `make test`. `make up-teacher`: the teacher zero-shot, no build.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install up up-teacher test test-fast lint protos images

install:
	@./scripts/install.sh

up: install
	$(VENV)/bin/slimserve up

up-teacher: install
	$(VENV)/bin/slimserve up --teacher-only

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

protos: install
	$(PY) -m slimserve.protos_gen

# CPU images (service, Triton) built with podman, then the smoke check: kube play of the cpu overlay, one Score.
images: install
	./scripts/images.sh
