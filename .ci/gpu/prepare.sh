#!/usr/bin/env bash
# Prepare a GPU check (not CI: CI has no GPU). Run here, in the repository root, before handing the tree to a GPU
# machine that has Python 3.12 and a CUDA torch but no registry access: downloads py3.12 wheels of what tdcollect
# needs beyond torch into .whl/, and copies the pinned TorchRL tests into .dev/ (both ignored by git; carry them).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || printf "/.whl/\n/.dev/\n" >> .git/info/exclude
mkdir -p .whl .dev
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for package in torchrl==0.14.1 tensordict==0.14.3 gymnasium farama-notifications orjson pyvers hoptorch \
               importlib_metadata zipp; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$package"
done
rm -rf .dev/torchrl-tests && cp -r ../shared/torchrl-tests .dev/ && rm -rf .dev/torchrl-tests/sota-implementations
