.PHONY: run test image image-test test-clients test-families-vllm lint bench bench-gpu bench-soak screenshots llama-server

## Install everything and start the service on the embedded defaults.
run:
	bash scripts/run.sh

## Install everything and run ruff, mypy and the whole pytest suite.
test:
	bash scripts/test.sh

## The images (deploy/image.sh, docs/deploy.md): localhost/modelhost:<version> and its -vllm variant,
## and an OCI archive of the default one in build/. Installs podman and mmdebstrap if missing.
image:
	bash deploy/image.sh default vllm

## The images built, then run with podman (tests/test_image.py): the image alone (a key, embeddings and
## chat through the openai SDK, SIGTERM's drain, a restart keeping the data), the compose stack (data in
## PostgreSQL and the bucket), the chart's Deployment under `podman kube play`, chat on the -vllm image;
## everything it made is removed. Run before resolving and whenever deploy/ changes (docs/deploy.md has
## its time).
image-test:
	MODELHOST_SETUP_VLLM=0 bash scripts/setup.sh dev
	bash deploy/image.sh default vllm
	MODELHOST_TEST_IMAGE=1 HF_HUB_OFFLINE=1 .venv/bin/pytest -p no:cacheprovider -m image tests/test_image.py

## Every model family's trained tiny model that vLLM can run, on vLLM (tests/test_families.py; the
## whole suite runs two of them): about 5 minutes on the 2-core machine.
test-families-vllm:
	bash scripts/setup.sh dev
	MODELHOST_TEST_VLLM_FAMILIES=all HF_HUB_OFFLINE=1 .venv/bin/pytest -p no:cacheprovider tests/test_families.py -k vllm

## Real client applications against a live modelhost, each from its own environment: Open WebUI 0.12.4
## (.venv-openwebui, about 2.4 GB, made once by scripts/setup-openwebui.sh) lists the models and chats
## (tests/test_client_openwebui.py, 75 s on the 2-core machine, 70 of them Open WebUI's
## start). `make test` skips it unless that environment exists; run this before resolving a client issue.
test-clients:
	bash scripts/setup.sh dev
	bash scripts/setup-openwebui.sh
	HF_HUB_OFFLINE=1 .venv/bin/pytest -p no:cacheprovider -m clients tests/test_client_openwebui.py

## llama.cpp's server compiled for this CPU into .venv-llama-server (once, ~10 min on 2 cores); llamacpp
## replicas started afterwards run it (docs/engines-llamacpp.md, "The build").
llama-server:
	bash scripts/build-llama-server.sh

lint:
	.venv/bin/ruff check src tests bench && .venv/bin/ruff format --check src tests bench && .venv/bin/mypy && .venv/bin/lint-imports

## Benchmarks (writes docs/benchmarks.md, and a record of each run in docs/benchmarks.jsonl), then each
## benchmark's ratios against its previous run on this kind of machine (changes beyond 10 % flagged, a
## warning only). Installs wrk from Debian's packages if missing.
bench:
	bash scripts/setup.sh dev
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.embeddings
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.user_view
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.gateway --traced
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.supervisor
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.generation
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.backends
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.tenancy
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.capacity
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.adapters
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.path_costs
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.batch
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.parsing
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.quantized
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.gguf
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.routing
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.tiers
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.fair_generation
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.migration
	.venv/bin/python -m bench.compare

## Text generation on a GPU machine (a 0.95 B model; needs CUDA): writes its section of docs/benchmarks.md.
bench-gpu:
	bash scripts/setup.sh dev
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.generation --gpu

## Soak: 10 minutes each of streamed chat and of embeddings at 4 clients, the RSS of every server process
## sampled (growth over the second half, target < 5 %): writes its section of docs/benchmarks.md.
bench-soak:
	bash scripts/setup.sh dev
	HF_HUB_OFFLINE=1 .venv/bin/python -m bench.soak

## The console's screenshots in docs/console/ (shown in the README), taken by its browser tests, and the
## picture of a chat request's trace in docs/traces/ (docs/operations.md), drawn by the traces test.
screenshots:
	bash scripts/setup.sh dev
	MODELHOST_CONSOLE_SCREENSHOTS=docs/console HF_HUB_OFFLINE=1 .venv/bin/pytest -p no:cacheprovider tests/test_console.py tests/test_console_sso.py
	MODELHOST_TEST_TRACE_PICTURE=docs/traces/chat.svg HF_HUB_OFFLINE=1 .venv/bin/pytest -p no:cacheprovider \
		tests/test_traces.py -k streamed_chat
