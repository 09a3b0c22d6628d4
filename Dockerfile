# The full install (README.md, "Which install?") in a container: for macOS and Windows, where PyPI has no Triton
# wheels, and for anyone who wants the tested environment. The engine's Triton kernels run on CPU through
# Triton's interpreter (the Makefile sets TRITON_INTERPRET=1 when there is no nvidia-smi).
#
#   docker build -t paged-attention-lab .
#   docker run --rm paged-attention-lab                          # make test (the CMD)
#   docker run --rm -it -p 8888:8888 paged-attention-lab \
#       .venv/bin/jupyter lab notebooks/ --ip=0.0.0.0 --no-browser --allow-root
#
# tests/test_install.py checks that what this file copies and runs exists and that its torch pin is the Makefile's.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*

# Keep TORCH_SPEC equal to the Makefile's; TORCH_INDEX picks the build (the CPU one: no multi-gigabyte CUDA
# libraries); e.g. --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 for a CUDA host.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

WORKDIR /lab
COPY . /lab

# torch first, from TORCH_INDEX, into the venv that `make install` then completes (it finds torch satisfied).
RUN python -m venv .venv \
    && .venv/bin/pip install -q --no-cache-dir "$TORCH_SPEC" --index-url "$TORCH_INDEX" \
    && PIP_NO_CACHE_DIR=1 make install PYTHON=python3 TORCH_SPEC="$TORCH_SPEC"

CMD ["make", "test"]
