"""test_doctor.py - `deltafin doctor` (docs/CLI.md): read-only, offline health report.

A tiny MoE store made by `setup --from tests/data/models/qwen3-moe-bf16 --out S --pack` is healthy (exit 0);
a byte flipped inside one expert is found by --deep, named by layer and expert (exit 1); a truncated pack and a
truncated spine are found by the quick checks; an unreadable file is reported; --json is one object; doctor
changes nothing on disk. Where the corruption lies is taken from the manifest, not from doctor's output.
"""
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from conftest import MODELS

SRC = MODELS / "qwen3-moe-bf16"


def doctor(dfbin, *args, home):
    return subprocess.run([dfbin, "doctor", "--home", str(home), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def pristine(dfbin, tmp_path_factory):
    d = tmp_path_factory.mktemp("doc") / "store"
    subprocess.run([dfbin, "setup", "--from", str(SRC), "--out", str(d), "--pack"], check=True, capture_output=True, timeout=300)
    return d


@pytest.fixture
def store(pristine, tmp_path):
    d = tmp_path / "store"
    shutil.copytree(pristine, d)
    return d


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


def tree_digest(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            st = os.stat(p)
            out[os.path.relpath(p, d)] = (st.st_size, st.st_mtime_ns, hashlib.sha256(open(p, "rb").read()).hexdigest())
    return out


def test_healthy_store_exit_0_and_read_only(dfbin, store, home):
    before = tree_digest(store)
    for extra in ([], ["--deep"]):
        p = doctor(dfbin, "--model", str(store), *extra, home=home)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "healthy: 0 problem(s)" in p.stdout
    assert tree_digest(store) == before  # nothing written, not even a timestamp
    assert list(home.iterdir()) == []


def test_json_is_one_object(dfbin, store, home):
    p = doctor(dfbin, "--model", str(store), "--deep", "--json", home=home)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["healthy"] is True and j["problems"] == 0 and j["deep"] is True
    assert j["build"]["version"] and "commit" in j["build"] and isinstance(j["build"]["cuda"], bool)
    assert isinstance(j["cpu"]["features"], list) and j["cpu"]["kernels"] in ("scalar", "avx2", "avx512")
    assert "cpu" in j["backends"]
    [m] = j["models"]
    assert m["kind"] == "store" and m["healthy"] is True and m["ram_need_bytes"] > 0
    assert all(c["status"] in ("ok", "warn") for c in j["checks"])


def first_expert_part(store, layer_pick=-1):
    man = json.loads((store / "manifest.json").read_text())
    x = man["experts"][layer_pick]
    part = x["parts"][1]
    return man, x, part, store / man["files"][part["file"]]


def test_flipped_byte_in_one_expert_found_by_deep(dfbin, store, home):
    man, x, part, path = first_expert_part(store)
    b = bytearray(path.read_bytes())
    b[part["offset"] + part["length"] // 2] ^= 0x40
    path.write_bytes(bytes(b))
    p = doctor(dfbin, "--model", str(store), "--deep", "--json", home=home)
    assert p.returncode == 1, p.stdout
    j = json.loads(p.stdout)
    assert j["healthy"] is False and j["problems"] >= 1
    fails = [c for c in j["checks"] if c["status"] == "fail"]
    want = f"layer {x['layer']} expert {x['expert']}:"
    assert any(want in c["message"] and "checksum mismatch" in c["message"] for c in fails), fails
    # only that expert is named
    assert sum("checksum mismatch" in c["message"] for c in fails) == 1, fails
    assert all(c["fix"] and "deltafin setup --from" in c["fix"] for c in fails)
    # the human form says the same, exit 1
    p = doctor(dfbin, "--model", str(store), "--deep", home=home)
    assert p.returncode == 1 and want in p.stdout and "FAIL" in p.stdout and "fix: deltafin setup" in p.stdout


def test_truncated_pack_found_by_quick(dfbin, store, home):
    man, x, part, path = first_expert_part(store)
    size = path.stat().st_size
    os.truncate(path, size - 4096)
    p = doctor(dfbin, "--model", str(store), home=home)
    assert p.returncode == 1, p.stdout
    assert str(path) in p.stdout and "truncated" in p.stdout, p.stdout


def test_truncated_spine_found_by_quick(dfbin, store, home):
    sp = store / "spine.safetensors"
    os.truncate(sp, sp.stat().st_size - 100)
    p = doctor(dfbin, "--model", str(store), "--json", home=home)
    assert p.returncode == 1
    j = json.loads(p.stdout)
    assert any("spine.safetensors" in c["message"] and "spine.size" in c["message"] for c in j["checks"] if c["status"] == "fail")


def test_unreadable_file(dfbin, store, home):
    man = json.loads((store / "manifest.json").read_text())
    path = store / man["files"][0]
    if os.geteuid() == 0:
        # root reads any mode: put a directory where the pack should be (open succeeds, read fails)
        path.unlink()
        path.mkdir()
    else:
        path.chmod(0)
    p = doctor(dfbin, "--model", str(store), home=home)
    assert p.returncode == 1, p.stdout
    assert str(path) in p.stdout and ("directory" in p.stdout or "Permission denied" in p.stdout), p.stdout


def test_home_not_writable_and_missing_model(dfbin, tmp_path):
    f = tmp_path / "home-is-a-file"
    f.write_text("x")
    p = doctor(dfbin, "--model", str(tmp_path / "nope"), "--json", home=f)
    assert p.returncode == 1
    j = json.loads(p.stdout)
    fails = [c for c in j["checks"] if c["status"] == "fail"]
    assert any(c["area"] == "home" and "not a directory" in c["message"] for c in fails)
    assert any("nope" in c["message"] for c in fails)


def test_installed_gguf_size_checked(dfbin, tmp_path):
    # an installed catalog model cut short: the quick check compares its size with the catalog's
    h = tmp_path / "home"
    d = h / "models" / "smollm2-135m-instruct"
    d.mkdir(parents=True)
    (d / "model.gguf").write_bytes(b"GGUF" + b"\0" * 1000)
    p = doctor(dfbin, "--json", home=h)
    assert p.returncode == 1
    j = json.loads(p.stdout)
    assert any("truncated or replaced" in c["message"] and "--force" in (c["fix"] or "") for c in j["checks"])


def test_usage(dfbin, tmp_path):
    p = subprocess.run([dfbin, "doctor", "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([dfbin, "doctor", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--deep" in p.stdout


@pytest.mark.parametrize("edit", ["huge_lengths", "wrong_types", "not_json", "incomplete"])
def test_hostile_manifest_reported_not_crashing(dfbin, store, home, edit):
    mp = store / "manifest.json"
    man = json.loads(mp.read_text())
    if edit == "huge_lengths":
        man["experts"][0]["parts"][0]["length"] = 2**62
        man["experts"][1]["parts"][0]["offset"] = 2**63 - 1
        man["experts"][2]["parts"][0]["file"] = 99
        man["config"]["num_experts_per_tok"] = 2**62
        man["spine"]["size"] = -5
        text = json.dumps(man)
    elif edit == "wrong_types":
        man["experts"][0] = "x"
        man["experts"][1]["parts"] = {"a": 1}
        man["files"][0] = 7
        man["spine"]["tensors"] = [1, 2]
        text = json.dumps(man)
    elif edit == "not_json":
        text = mp.read_text()[:200]
    else:
        man["complete"] = False
        text = json.dumps(man)
    mp.write_text(text)
    for extra in ([], ["--deep"]):
        p = doctor(dfbin, "--model", str(store), "--json", *extra, home=home)
        assert p.returncode == 1, p.stdout + p.stderr
        j = json.loads(p.stdout)
        assert j["problems"] >= 1 and all(c["fix"] for c in j["checks"] if c["status"] == "fail")
        assert "AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr


# ---- a Hugging Face hub snapshot (issue 16: "doctor finds ... a truncated blob") ----

def _hub_cache(root, src):
    """A hub cache as huggingface_hub lays it out: blobs named by their etag (LFS files:
    the sha256 of the bytes; others: git's blob SHA-1), the snapshot's files relative
    links to them, refs/main holding the commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    blobs = {}
    for f in sorted(os.listdir(src)):
        if not (f.endswith(".json") or f.endswith(".safetensors")) or f.startswith("golden"):
            continue
        data = (src / f).read_bytes()
        if f.endswith(".safetensors"):
            name = hashlib.sha256(data).hexdigest()
        else:
            name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / name).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", name), snap / f)
        blobs[f] = repo / "blobs" / name
    return blobs


def test_hub_snapshot_healthy_then_truncated_and_corrupt_blobs(dfbin, tmp_path):
    hub = tmp_path / "hub"
    blobs = _hub_cache(hub, MODELS / "qwen3-f16")
    env = dict(os.environ, HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")

    def doc(*a):
        return subprocess.run([dfbin, "doctor", "--home", str(tmp_path / "home"), *a], capture_output=True, text=True,
                              timeout=300, env=env)

    p = doc("--model", "org/tiny", "--deep")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "every blob's hash equals its name" in p.stdout
    # with no --model, the hub cache is scanned too
    p = doc("--json")
    assert p.returncode == 0, p.stdout
    assert any("models--org--tiny" in m["path"] for m in json.loads(p.stdout)["models"])

    st = next(v for k, v in blobs.items() if k.endswith(".safetensors"))
    data = st.read_bytes()
    # a flipped byte in the weights: quick checks pass, --deep names the blob
    st.write_bytes(data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:])
    assert doc("--model", "org/tiny").returncode == 0
    p = doc("--model", "org/tiny", "--deep")
    assert p.returncode == 1 and st.name in p.stdout and "corrupt" in p.stdout, p.stdout
    # a truncated blob: the quick checks find it
    st.write_bytes(data[: len(data) // 2])
    p = doc("--model", "org/tiny")
    assert p.returncode == 1, p.stdout
    # a config.json blob (git SHA-1 name) changed: --deep
    cfg = blobs["config.json"]
    cfg.write_bytes(cfg.read_bytes().replace(b"{", b"{ ", 1))
    st.write_bytes(data)
    p = doc("--model", "org/tiny", "--deep")
    assert p.returncode == 1 and cfg.name in p.stdout and "git blob sha1" in p.stdout, p.stdout
    # a missing blob: a dangling link
    cfg.unlink()
    p = doc("--model", "org/tiny")
    assert p.returncode == 1 and "dangling" in p.stdout, p.stdout
