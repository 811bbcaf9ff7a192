# Two entry points (see README): `make book` and `make test`. Both create .venv on first use.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= cpu
DEVICE ?= cpu
TORCH_PIP_ARGS ?=
# RETRAIN=1: ignore the shipped checkpoints (checkpoints/$(PROFILE)/) and train everything from scratch.
RETRAIN ?=

.PHONY: book test venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Install torch first so nothing pulls an unpinned build. On the study's machines pip finds a
	# local CPU wheel; elsewhere pass TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
	# (or a CUDA index for a GPU machine).
	$(BIN)/pip install --quiet $(TORCH_PIP_ARGS) torch==2.13.0
	# esm declares torchvision/torchtext builds that fail to import beside CPU torch: no deps.
	$(BIN)/pip install --quiet --no-deps esm==3.2.1.post1
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python -c "import torch, esm, mimdm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

book: venv
	$(BIN)/mimdm book --profile $(PROFILE) --device $(DEVICE) $(if $(RETRAIN),--retrain)

test: venv
	$(BIN)/python -m pytest -q -m "" --durations=15

clean:
	rm -rf _build book/_build
