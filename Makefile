# The two commands of the README: `make demo` and `make test`. Each creates (once) and reuses
# the virtual environment .venv in the checkout; nothing is installed outside it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ftsup-installed

.PHONY: demo test unit proto clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip >/dev/null
	# torch first and pinned: an open range would pull the CUDA build and its GBs of packages.
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	GRPC_VERBOSITY=ERROR $(BIN)/ftsup demo --verify

test: $(STAMP)
	GRPC_VERBOSITY=ERROR $(BIN)/python -m pytest -q -ra

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

clean-venv:
	rm -rf $(VENV)
