# The two commands of the README: `make demo` and `make test`. Each creates (once) and reuses
# the virtual environment .venv in the checkout; nothing is installed outside it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ftsup-installed
# PyPI's supervisord, for the test that installs our wheel beside it (offline at test time).
SUPERVISORD_WHEEL := $(VENV)/wheels/.supervisor-4.3.0

.PHONY: demo test unit lint proto clean-venv etcd-server chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip >/dev/null
	# torch first and pinned: an open range would pull the CUDA build and its GBs of packages.
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	GRPC_VERBOSITY=ERROR $(BIN)/ftsup demo --verify

# The integration tests start a real 3-member etcd cluster from Debian's etcd-server package.
# Idempotent: installs only when `etcd` is not on PATH (CI runs as root).
etcd-server:
	@if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then \
		if [ "$$(id -u)" != "0" ]; then \
			echo "error: etcd is not installed and this is not root; run as root:" >&2; \
			echo "  apt-get update && apt-get install -y etcd-server etcd-client" >&2; \
			exit 1; \
		fi; \
		echo "installing etcd-server and etcd-client (apt)"; \
		apt-get update && apt-get install -y etcd-server etcd-client; \
	fi

$(SUPERVISORD_WHEEL): $(STAMP)
	$(BIN)/python -m pip download -q --no-deps -d $(VENV)/wheels 'supervisor==4.3.0'
	touch $(SUPERVISORD_WHEEL)

# The status page's tests drive Debian's headless Chromium over its DevTools pipe (no driver
# download). Idempotent like etcd-server.
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" != "0" ]; then \
			echo "error: chromium is not installed and this is not root; run as root:" >&2; \
			echo "  apt-get update && apt-get install -y chromium" >&2; \
			exit 1; \
		fi; \
		echo "installing chromium (apt)"; \
		apt-get update && apt-get install -y chromium; \
	fi

test: $(STAMP) $(SUPERVISORD_WHEEL) etcd-server chromium lint
	GRPC_VERBOSITY=ERROR $(BIN)/python -m pytest -q -ra

# ruff over the tree; mypy over the installed layout (strict on supervisor/, agent/, trainer/ cores).
lint: $(STAMP)
	$(BIN)/ruff check .
	PYTHON=$(BIN)/python ./scripts/typecheck.sh

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

clean-venv:
	rm -rf $(VENV)
