"""test_upgrade.py - `deltafin upgrade` (docs/CLI.md) on a throwaway source checkout.

The sources of this tree (Makefile, include/, src/) are committed into a fresh repository, pushed to a local bare
"remote", cloned, and the clone is built with a recorded profile (OPT=-O0: quick to build, and checkable). Then
the clone's own binary is asked to upgrade itself:
  - up to date: nothing to do (exit 0);
  - a dirty tree and a diverged branch are refused (exit 1), the binary untouched;
  - a fast-forward rebuilds with the same profile (the new binary reports the new commit and -O0), swaps it in and
    keeps the previous one as deltafin.prev (byte-identical to the old binary);
  - a commit that does not compile leaves the binary as it was and the checkout back at its commit;
  - no upstream, and an unreachable remote: clear refusals.
Builds take a few minutes on a loaded machine.
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_NOSYSTEM": "1"}
# the suite may run under `make test` / `make asan`: nothing of the outer make (MAKEFLAGS carries its command-line
# variables, O comes from run_all.sh) may reach the clone's build
for k in ("DELTAFIN_BIN", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "O", "OPT", "SAN", "CUDA", "CC", "CFLAGS", "LDFLAGS",
          "LDLIBS", "PROFILE_O"):
    ENV.pop(k, None)


def sh(*args, cwd=None, check=True, timeout=900, env=None):
    p = subprocess.run(list(map(str, args)), cwd=cwd, capture_output=True, text=True, env={**ENV, **(env or {})},
                       timeout=timeout)
    if check and p.returncode:
        raise AssertionError(f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def sha(p):
    return hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()


def commit_all(d, msg):
    sh("git", "add", "-A", cwd=d)
    sh("git", "commit", "-q", "-m", msg, cwd=d)
    return sh("git", "rev-parse", "HEAD", cwd=d).stdout.strip()


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    if not shutil.which("git") or not shutil.which("make"):
        pytest.skip("needs git and make")
    t = tmp_path_factory.mktemp("upgrade")
    dev = t / "dev"
    dev.mkdir()
    for f in ("Makefile", ".gitignore"):
        shutil.copy(REPO / f, dev / f)
    for d in ("include", "src"):
        shutil.copytree(REPO / d, dev / d)
    sh("git", "init", "-q", "-b", "main", cwd=dev)
    a = commit_all(dev, "A")
    bare = t / "remote.git"
    sh("git", "clone", "-q", "--bare", dev, bare)
    sh("git", "remote", "add", "origin", bare, cwd=dev)
    sh("git", "fetch", "-q", "origin", cwd=dev)
    sh("git", "branch", "-q", "--set-upstream-to", "origin/main", cwd=dev)
    clone = t / "clone"
    sh("git", "clone", "-q", bare, clone)
    sh("make", "-C", clone, "-j2", "OPT=-O0", "build/deltafin", timeout=1800)
    return {"dev": dev, "clone": clone, "bin": clone / "build" / "deltafin", "A": a}


def upgrade(r, *extra, env=None):
    return sh(r["bin"], "upgrade", *extra, check=False, timeout=1800, env=env)


def test_upgrade_flow(repos):
    r = repos
    dev, clone, binp = r["dev"], r["clone"], r["bin"]
    j = json.loads(sh(binp, "doctor", "--json", "--home", clone / "nohome", check=False).stdout)
    assert j["build"]["commit"] == r["A"] and j["build"]["opt"] == "-O0" and j["build"]["source"] == str(clone)
    assert j["build"]["dirty"] is False

    # up to date: nothing to do
    p = upgrade(r)
    assert p.returncode == 0 and "already up to date" in p.stdout, p.stdout + p.stderr
    old = sha(binp)

    # dirty: refused
    main_c = clone / "src" / "main.c"
    main_c.write_text(main_c.read_text() + "\n/* local edit */\n")
    p = upgrade(r)
    assert p.returncode == 1 and "uncommitted changes" in p.stderr, p.stderr
    assert sha(binp) == old
    sh("git", "checkout", "--", "src/main.c", cwd=clone)

    # diverged: a local commit and a new upstream commit
    (clone / "LOCAL.txt").write_text("local\n")
    commit_all(clone, "local")
    (dev / "UPSTREAM.txt").write_text("upstream\n")
    commit_all(dev, "upstream 1")
    sh("git", "push", "-q", "origin", "main", cwd=dev)
    p = upgrade(r)
    assert p.returncode == 1 and "diverged" in p.stderr and "fast-forward" in p.stderr, p.stderr
    assert sha(binp) == old
    sh("git", "reset", "-q", "--hard", r["A"], cwd=clone)

    # dry run: says what it would do, changes nothing
    p = upgrade(r, "--dry-run")
    assert p.returncode == 0 and "would fast-forward" in p.stdout and "OPT=-O0" in p.stdout, p.stdout + p.stderr
    assert sh("git", "rev-parse", "HEAD", cwd=clone).stdout.strip() == r["A"]

    # fast-forward: a visible change in the new binary
    m = dev / "src" / "main.c"
    m.write_text(m.read_text().replace("run large mixture-of-experts models exactly", "UPGRADED-MARKER run large"))
    b = commit_all(dev, "B")
    sh("git", "push", "-q", "origin", "main", cwd=dev)
    # build flags of the caller's environment (or an outer make's) do not leak into the recorded profile
    p = upgrade(r, env={"CFLAGS": "-fno-such-flag-deltafin", "MAKEFLAGS": "-- OPT=-fno-such-flag-deltafin"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "upgraded" in p.stdout
    assert "UPGRADED-MARKER" in sh(binp, "--help").stdout
    assert sha(str(binp) + ".prev") == old  # the previous binary kept as is
    j = json.loads(sh(binp, "doctor", "--json", "--home", clone / "nohome", check=False).stdout)
    assert j["build"]["commit"] == b and j["build"]["opt"] == "-O0" and j["build"]["output_dir"] == "build"
    assert sh("git", "rev-parse", "HEAD", cwd=clone).stdout.strip() == b
    new = sha(binp)

    # a commit that does not compile: the binary stays, the checkout goes back
    (dev / "src" / "cli" / "zz_broken.c").write_text("#error this commit does not compile\n")
    commit_all(dev, "C broken")
    sh("git", "push", "-q", "origin", "main", cwd=dev)
    p = upgrade(r)
    assert p.returncode == 1 and "build" in p.stderr and "failed" in p.stderr and "unchanged" in p.stderr, p.stderr
    assert sha(binp) == new
    assert sh("git", "rev-parse", "HEAD", cwd=clone).stdout.strip() == b
    assert "UPGRADED-MARKER" in sh(binp, "--help").stdout


def test_no_upstream_refused(repos):
    r = repos
    clone = r["clone"]
    sh("git", "checkout", "-q", "-b", "lonely", cwd=clone)
    try:
        p = upgrade(r)
        assert p.returncode == 1 and "no upstream" in p.stderr, p.stderr
    finally:
        sh("git", "checkout", "-q", "main", cwd=clone)


def test_remote_unreachable_refused(repos):
    """Offline (the remote is gone): a clear refusal from the fetch, nothing changed."""
    r = repos
    bare = r["clone"].parent / "remote.git"
    away = r["clone"].parent / "remote-away.git"
    before = sha(r["bin"])
    bare.rename(away)
    try:
        p = upgrade(r)
        assert p.returncode == 1 and "git fetch origin failed" in p.stderr and "offline" in p.stderr, p.stderr
        assert sha(r["bin"]) == before
    finally:
        away.rename(bare)


def test_usage(dfbin):
    p = subprocess.run([dfbin, "upgrade", "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([dfbin, "upgrade", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--dry-run" in p.stdout
