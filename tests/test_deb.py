"""The Debian package (``make package``, contrib/deb/build-deb.sh): built once per run, then its metadata
(``dpkg-deb -f``), its file list (``dpkg-deb -c``) and its contents, extracted into a scratch directory
(``dpkg-deb -x``): the venv at /opt/fleetyield runs there, and where a private mount namespace is allowed
(root, as CI runs) the extracted venv is bind-mounted at the real /opt/fleetyield and its console scripts
run through their own shebangs. Nothing is installed on the host.

Needs dpkg-deb and Debian's /usr/bin/python3 with venv, and reaches the package index for the
dependencies like ``make venv`` does (or a wheelhouse: PIP_FIND_LINKS/PIP_NO_INDEX)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "contrib/deb/build-deb.sh"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PREFIX = "/opt/fleetyield"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SHARE = "opt/fleetyield/share/fleetyield"
SHARED = {  # what an admin installs besides the venv: path in the package -> source in the repo
    f"{SHARE}/slurm/fleetyield-snippet.conf": "contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf",
    f"{SHARE}/slurm/fleetyield-spares.conf": "contrib/slurm-docker-cluster/slurm/fleetyield-spares.conf",
    f"{SHARE}/slurm/job_submit.lua": "prolog_epilog/job_submit.lua",
    f"{SHARE}/examples/fleetyield.example.toml": "contrib/fleetyield.example.toml",
    f"{SHARE}/prometheus/fleetyield-rules.yml": "contrib/prometheus/fleetyield-rules.yml",
    f"{SHARE}/alertmanager/alertmanager.yml": "contrib/alertmanager/alertmanager.yml",
    f"{SHARE}/grafana/fleetyield.json": "contrib/grafana/fleetyield.json",
    "opt/fleetyield/docs/admin-guide.md": "docs/admin-guide.md",
    "opt/fleetyield/docs/README.md": "README.md",
    "usr/lib/systemd/system/fleetyield-controller.service": "contrib/systemd/fleetyield-controller.service",
    "usr/lib/systemd/system/fleetyield-agent.service": "contrib/systemd/fleetyield-agent.service",
    "etc/default/fleetyield-agent": "contrib/systemd/fleetyield-agent.default",
    "etc/logrotate.d/fleetyield": "contrib/logrotate/fleetyield",
}  # fmt: skip


def _run(*cmd: str | Path, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not available (Debian: apt-get install dpkg)")
    if _run("/usr/bin/python3", "-c", "import ensurepip, venv").returncode != 0:
        pytest.skip("Debian's /usr/bin/python3 with venv is not available (apt-get install python3-venv)")
    out = tmp_path_factory.mktemp("dist")
    proc = _run(BUILD, out, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    arch = _run("dpkg", "--print-architecture").stdout.strip()
    assert path == out / f"fleetyield_{VERSION}_{arch}.deb" and path.is_file()
    return path


@pytest.fixture(scope="module")
def tree(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    proc = _run("dpkg-deb", "-x", deb, root)
    assert proc.returncode == 0, proc.stderr
    return root


def test_metadata(deb: Path) -> None:
    fields = {}
    for key in ("Package", "Version", "Architecture", "Depends", "Description"):
        fields[key] = _run("dpkg-deb", "-f", deb, key).stdout.strip()
    assert fields["Package"] == "fleetyield" and fields["Version"] == VERSION
    assert fields["Architecture"] == _run("dpkg", "--print-architecture").stdout.strip()
    pyver = _run("/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    assert f"python{pyver}" in [d.strip().split()[0] for d in fields["Depends"].split(",")]
    names = {tok for line in _run("dpkg-deb", "-I", deb).stdout.splitlines() for tok in line.split()}
    assert {"control", "conffiles", "postinst", "prerm", "postrm"} <= names, names


def test_file_list(deb: Path) -> None:
    listing = _run("dpkg-deb", "-c", deb).stdout.splitlines()
    paths = {line.split()[5].removeprefix("./").rstrip("/") for line in listing}
    for script in SCRIPTS:
        assert f"opt/fleetyield/bin/{script}" in paths, script
    assert set(SHARED) <= paths, set(SHARED) - paths
    assert {"usr/bin/fleetyield", "usr/bin/fleetyield-agent"} <= paths
    assert not [p for p in paths if "__pycache__" in p or p.endswith(".pyc")], "bytecode is built by postinst"
    owners = {line.split()[1] for line in listing}
    assert owners == {"root/root"}, owners


def test_shared_files_are_the_repos(tree: Path) -> None:
    for packaged, source in SHARED.items():
        assert (tree / packaged).read_bytes() == (ROOT / source).read_bytes(), packaged


def test_units_documentation_is_in_the_package(tree: Path) -> None:
    for unit in (tree / "usr/lib/systemd/system").glob("fleetyield-*.service"):
        lines = unit.read_text().splitlines()
        docs = [ln.split("=", 1)[1] for ln in lines if ln.startswith("Documentation=")]
        assert docs, unit.name
        for url in docs:
            assert url.startswith(f"file://{PREFIX}/docs/"), url
            assert (tree / url.removeprefix("file:///")).is_file(), url
        assert any(ln.startswith("LimitNOFILE=") for ln in lines), unit.name


def test_the_venv_names_only_its_real_prefix(tree: Path) -> None:
    venv = tree / PREFIX.lstrip("/")
    for script in SCRIPTS:
        shebang = (venv / "bin" / script).read_text().splitlines()[0]
        interpreter = shebang.removeprefix("#!")
        assert interpreter.startswith(f"{PREFIX}/bin/python"), (script, shebang)
        assert (tree / interpreter.lstrip("/")).exists(), (script, shebang)  # a link to /usr/bin/python3.X
    cfg = (venv / "pyvenv.cfg").read_text()
    assert f"{PREFIX}" in cfg and "fleetyield-deb." not in cfg, cfg
    target = os.readlink(venv / "bin/python3")
    assert target.startswith("/usr/bin/python3."), target  # the versioned interpreter, as Depends says
    stale = _run("grep", "-rlF", "fleetyield-deb.", tree)
    assert stale.returncode == 1 and not stale.stdout, f"files name the build directory: {stale.stdout}"


def test_the_extracted_venv_runs(tree: Path) -> None:
    python = tree / PREFIX.lstrip("/") / "bin/python"
    for script in SCRIPTS:
        proc = _run(python, python.parent / script, "--version")
        assert proc.returncode == 0 and proc.stdout.strip() == f"{script} {VERSION}", (script, proc)
    proc = _run(python, "-c", "import sushy, slurm_fleetyield, node_agent, prolog_epilog; print('ok')")
    assert proc.stdout.strip() == "ok", proc.stderr


def test_console_scripts_run_at_opt_fleetyield(tree: Path) -> None:
    """The shebangs themselves, at the real path: the extracted venv bind-mounted at /opt/fleetyield in a
    private mount namespace (the host's /opt is untouched)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace (CI runs as root)")
    venv = tree / PREFIX.lstrip("/")
    calls = " && ".join(f"{PREFIX}/bin/{s} --version" for s in SCRIPTS)
    script = f"mount -t tmpfs tmpfs /opt && mkdir {PREFIX} && mount --bind {venv} {PREFIX} && {calls}"
    proc = _run("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == [f"{s} {VERSION}" for s in SCRIPTS]


def test_maintainer_scripts_parse(deb: Path, tmp_path: Path) -> None:
    assert _run("dpkg-deb", "-e", deb, tmp_path / "DEBIAN").returncode == 0
    for script in ("postinst", "prerm", "postrm"):
        proc = _run("sh", "-n", tmp_path / "DEBIAN" / script)
        assert proc.returncode == 0, (script, proc.stderr)
    conffiles = (tmp_path / "DEBIAN/conffiles").read_text().split()
    assert conffiles == ["/etc/default/fleetyield-agent", "/etc/logrotate.d/fleetyield"]


def test_inputs_cover_every_repo_file_the_package_ships() -> None:
    """``build-deb.sh --inputs`` (what the docker cluster's up.sh stages for the image's package build)
    names every path of the tree the package is made from: a file missing there breaks only the image."""
    inputs = _run(BUILD, "--inputs").stdout.split()
    assert inputs and all((ROOT / p).exists() for p in inputs), inputs
    for source in SHARED.values():
        assert any(source == p or source.startswith(f"{p}/") for p in inputs), source
