#!/usr/bin/env bash
# Build the FleetYield Debian package (what `make package` runs):
#   contrib/deb/build-deb.sh [OUTDIR]          (default: dist/; prints the .deb's path on stdout)
#   contrib/deb/build-deb.sh --inputs          (the tree's paths it reads, one a line: what the docker
#                                               cluster's up.sh stages for the image's package build)
# Environment: PYTHON (default /usr/bin/python3: the interpreter the target hosts run, Debian's own),
#   VERSION (default: pyproject's), PIP_FIND_LINKS / PIP_NO_INDEX (pip's own variables: build offline from
#   a wheelhouse, e.g. the docker cluster's contrib/slurm-docker-cluster/build/wheels/py3.11/deps, which also
#   holds the build backend), DEB_COMPRESS (dpkg-deb -Z: xz by default; the docker cluster's image build,
#   which installs the package at once, uses none).
#
# One package for every host: the venv at /opt/fleetyield with the console scripts (the agent, the hooks and
# RebootProgram on GPU nodes, the controller on its host) and the [controller] extra, so one artifact serves
# both roles; GPU nodes never import the Redfish client (tests/test_packaging.py checks the node modules).
#
# The venv. A venv is not relocatable: its console scripts' shebangs, bin/activate* and pyvenv.cfg hold the
# absolute path it was created at. It must not be created at the real /opt/fleetyield on the build host
# (that would overwrite an installation there and need root), and a chroot or container would need a whole
# Debian root. So, as dh-virtualenv does: create it inside the staging root at STAGE/opt/fleetyield with the
# target's interpreter (its bin/python links to /usr/bin/python3.X, an absolute path that is the same on
# the target), install the wheels with --no-compile, then rewrite every occurrence of the staging prefix
# in the text files that hold it (shebangs, activate scripts, pyvenv.cfg) to /opt/fleetyield, and fail if
# any file still names the staging directory. Bytecode is not shipped (its co_filename would name the
# staging path, and pip's RECORD does not list it): postinst compiles it in place, prerm removes it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Every path of the tree this script reads: the package's Python sources, then what step 3 installs.
SOURCES=(pyproject.toml README.md slurm_fleetyield node_agent prolog_epilog)
INPUTS=("${SOURCES[@]}" contrib/deb contrib/systemd contrib/logrotate contrib/fleetyield.example.toml
  contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf contrib/slurm-docker-cluster/slurm/fleetyield-spares.conf
  contrib/prometheus contrib/alertmanager contrib/grafana
  docs/admin-guide.md docs/results.md docs/simulator.md docs/devlog.md)
if [[ ${1:-} == --inputs ]]; then printf '%s\n' "${INPUTS[@]}"; exit 0; fi
ROOT=$PWD
OUT=${1:-$ROOT/dist}
PYTHON=${PYTHON:-/usr/bin/python3}
PREFIX=/opt/fleetyield
die() { echo "build-deb: $*" >&2; exit 1; }

command -v dpkg-deb >/dev/null || die "dpkg-deb not found (Debian: apt-get install dpkg)"
[[ -x $PYTHON ]] || die "PYTHON=$PYTHON is not an executable interpreter"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || die "$PYTHON has no venv module (apt-get install python3-venv)"
PYVER=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is Python $PYVER; FleetYield needs 3.11+"
VERSION=${VERSION:-$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}
[[ $VERSION =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || die "VERSION=$VERSION is not a Debian version"
ARCH=$(dpkg --print-architecture)  # the venv holds compiled wheels (cryptography, pydantic-core, psutil)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fleetyield-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/root
VENV=$STAGE$PREFIX
mkdir -p "$STAGE/DEBIAN" "$OUT"

# 1. The project wheel from a clean copy of the sources (a build/ directory in the tree can hold stale
#    modules), then the venv with it and its dependencies.
mkdir -p "$WORK/src" "$WORK/wheel"
tar -c --exclude=__pycache__ --exclude='*.pyc' "${SOURCES[@]}" | tar -x -C "$WORK/src"
"$PYTHON" -m venv "$VENV"
# bin/python3 -> the versioned interpreter (/usr/bin/python3.X), not /usr/bin/python3: the site-packages
# are python3.X's, and a host whose default python3 is another version still runs this venv.
ln -sfn "$(readlink -f "$PYTHON")" "$VENV/bin/python3"
"$VENV/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$WORK/wheel" "$WORK/src" >/dev/null
wheel=$(ls "$WORK"/wheel/fleetyield-*.whl)
"$VENV/bin/pip" install -q --disable-pip-version-check --no-compile --no-cache-dir "${wheel}[controller]"
find "$VENV" -name __pycache__ -type d -prune -exec rm -rf {} +
# pip records where the project wheel came from (a file: URL in the temporary directory): not a fact
# about the installation, and it would name the build directory.
for d in "$VENV"/lib/python*/site-packages/fleetyield-*.dist-info; do
  rm -f "$d/direct_url.json"
  sed -i '/direct_url.json/d' "$d/RECORD"
done

# 2. The staging prefix -> /opt/fleetyield in every text file that names it.
grep -rlIF -- "$VENV" "$VENV" | while IFS= read -r f; do
  sed -i "s|$VENV|$PREFIX|g" "$f"
done
if left=$(grep -rlF -- "$WORK" "$STAGE"); then
  die "files still name the staging directory: $left"
fi
for s in "$VENV"/bin/fleetyield*; do
  [[ $(head -1 "$s") == "#!$PREFIX/bin/python"* ]] || die "$s: shebang $(head -1 "$s")"
done

# 3. What an admin installs besides the venv: units, examples, Slurm, Prometheus, Alertmanager, Grafana, docs.
share=$VENV/share/fleetyield
install -D -m 0644 contrib/systemd/fleetyield-controller.service "$STAGE/usr/lib/systemd/system/fleetyield-controller.service"
install -D -m 0644 contrib/systemd/fleetyield-agent.service "$STAGE/usr/lib/systemd/system/fleetyield-agent.service"
install -D -m 0644 contrib/systemd/fleetyield-agent.default "$STAGE/etc/default/fleetyield-agent"
install -D -m 0644 contrib/logrotate/fleetyield "$STAGE/etc/logrotate.d/fleetyield"
install -D -m 0644 contrib/fleetyield.example.toml "$share/examples/fleetyield.example.toml"
install -D -m 0644 contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf "$share/slurm/fleetyield-snippet.conf"
install -D -m 0644 contrib/slurm-docker-cluster/slurm/fleetyield-spares.conf "$share/slurm/fleetyield-spares.conf"
install -D -m 0644 prolog_epilog/job_submit.lua "$share/slurm/job_submit.lua"
install -D -m 0644 contrib/prometheus/fleetyield-rules.yml "$share/prometheus/fleetyield-rules.yml"
install -D -m 0644 contrib/prometheus/prometheus.yml "$share/prometheus/prometheus.yml"
install -D -m 0644 contrib/alertmanager/alertmanager.yml "$share/alertmanager/alertmanager.yml"
install -D -m 0644 contrib/grafana/fleetyield.json "$share/grafana/fleetyield.json"
docs=$VENV/docs
install -D -m 0644 README.md "$docs/README.md"
for d in admin-guide.md results.md simulator.md devlog.md; do install -D -m 0644 "docs/$d" "$docs/$d"; done
install -D -m 0644 contrib/systemd/README.md "$docs/systemd.md"
install -D -m 0644 contrib/prometheus/README.md "$docs/prometheus.md"
mkdir -p "$STAGE/usr/bin" "$STAGE/usr/share/doc/fleetyield"
for exe in fleetyield fleetyield-agent; do ln -s "$PREFIX/bin/$exe" "$STAGE/usr/bin/$exe"; done
cat >"$STAGE/usr/share/doc/fleetyield/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: fleetyield
Comment: The venv under $PREFIX bundles third-party Python packages; each one's licence is in its
 $PREFIX/lib/python$PYVER/site-packages/*.dist-info directory.

Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
EOF

# 4. Metadata and maintainer scripts.
size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat >"$STAGE/DEBIAN/control" <<EOF
Package: fleetyield
Version: $VERSION
Architecture: $ARCH
Maintainer: FleetYield <fleetyield@localhost>
Depends: python$PYVER, adduser
Recommends: logrotate
Suggests: slurm-client, prometheus, prometheus-alertmanager
Section: admin
Priority: optional
Installed-Size: $size
Homepage: https://github.com/fleetyield/fleetyield
Description: reliability layer for Slurm GPU clusters (agent, controller, hooks)
 FleetYield runs beside an unmodified Slurm: an agent on every GPU node exports
 dcgm-exporter-compatible metrics and pushes fatal events; the controller ranks
 GPU risk and steers Slurm through node features, weights, drains and requeues;
 the Prolog/Epilog hooks and job_submit.lua gate and route jobs. Installs a
 Python venv under $PREFIX; units are installed, not enabled.
EOF
printf '%s\n' /etc/default/fleetyield-agent /etc/logrotate.d/fleetyield >"$STAGE/DEBIAN/conffiles"
cat >"$STAGE/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
  # The controller's unit runs as this user (contrib/systemd/README.md); GPU nodes do not need it.
  if ! getent passwd fleetyield >/dev/null; then
    adduser --system --group --home /var/lib/fleetyield --no-create-home --quiet fleetyield
  fi
  $PREFIX/bin/python -m compileall -q -j 0 $PREFIX/lib >/dev/null || true
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
exit 0
EOF
cat >"$STAGE/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
# Bytecode written by postinst is not in the package's file list: remove it with the package.
find $PREFIX -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
exit 0
EOF
cat >"$STAGE/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
exit 0
EOF
chmod 0755 "$STAGE/DEBIAN/postinst" "$STAGE/DEBIAN/prerm" "$STAGE/DEBIAN/postrm"

deb=$OUT/fleetyield_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$STAGE" "$deb" >/dev/null
echo "$deb"
