.PHONY: run test lint bench

## Install everything and start the service on the embedded defaults.
run:
	bash scripts/run.sh

## Install everything and run ruff, mypy and the whole pytest suite.
test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check src tests bench && .venv/bin/ruff format --check src tests bench && .venv/bin/mypy
