# The two commands of the README: `make up` (build the default model, serve it) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install up test test-fast lint protos images

install:
	@./scripts/install.sh

up: install
	$(VENV)/bin/slimserve up

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
