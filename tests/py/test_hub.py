"""setup --full / --stream from a Hugging Face hub (issue 16 items 1-2), against
a local hub emulator (tests/tools/hub_emulator.py: revision and tree APIs,
resolve with a 302 to a second storage host, ranges, fault injection): the
files land byte-identical in the huggingface_hub cache layout, which the
huggingface_hub package accepts without downloading anything (and the
reverse); every fault class recovers or fails with a clear message; kill -9
then resume completes with nothing half-marked; stream mode gives the full
install's logits."""
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from hub_emulator import COMMIT, HubEmulator  # noqa: E402

REPO = "tiny-org/tiny-moe"
SRC = "qwen3-moe-bf16"


def read_st(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h, b[8 + n:]


def write_st(path, tensors):
    """tensors: name -> (dtype, shape, bytes), written in name order."""
    hdr, off, blobs = {}, 0, []
    for k in sorted(tensors):
        dt, shape, data = tensors[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    j = json.dumps(hdr).encode()
    j += b" " * (-len(j) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(j)) + j + b"".join(blobs))


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory):
    """The tiny MoE split into two shards with an index, as hub repos ship."""
    d = tmp_path_factory.mktemp("repo")
    h, data = read_st(MODELS / SRC / "model.safetensors")
    t = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
    names = sorted(t)
    half = [n for n in names if ".layers.1." in n or "lm_head" in n or n.startswith("model.norm")]
    first = {k: t[k] for k in names if k not in half}
    second = {k: t[k] for k in half}
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    wm = {}
    for fn, ts in shards.items():
        write_st(d / fn, ts)
        wm.update({k: fn for k in ts})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    for f in ("config.json", "generation_config.json"):
        (d / f).write_bytes((MODELS / SRC / f).read_bytes())
    (d / "README.md").write_text("a tiny test repo\n")
    (d / "original").mkdir()
    (d / "original" / "params.json").write_text('{"dim": 64}\n')  # a file in a subfolder: links one level deeper
    return d


@pytest.fixture
def hub(repo_dir):
    emu = HubEmulator(REPO, repo_dir).start()
    yield emu
    emu.stop()


def env_for(emu, cache, **extra):
    e = {**os.environ, "HF_ENDPOINT": emu.endpoint, "HF_HUB_CACHE": str(cache), "DELTAFIN_HUB_CHUNK": "64K",
         "DELTAFIN_HUB_BACKOFF_MS": "20", "DELTAFIN_HUB_STALL_S": "2", "HF_HUB_DISABLE_TELEMETRY": "1",
         "HF_HUB_DISABLE_XET": "1"}
    e.pop("HF_TOKEN", None)
    e.pop("HF_HUB_OFFLINE", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def setup(dfbin, emu, cache, *args, ref=REPO, mode="--full", check=True, **extra):
    p = subprocess.run([dfbin, "setup", mode, ref, *args], capture_output=True, text=True, timeout=300,
                       env=env_for(emu, cache, **extra))
    if check and p.returncode != 0:
        raise AssertionError(f"setup {mode} {ref}: exit {p.returncode}: {p.stderr}")
    return p


def snapshot_matches(cache, repo_dir):
    rd = Path(cache) / ("models--" + REPO.replace("/", "--"))
    snap = rd / "snapshots" / COMMIT
    for f in repo_dir.rglob("*"):
        if f.is_dir():
            continue
        rel = f.relative_to(repo_dir)
        link = snap / rel
        assert link.is_symlink(), f"{link} is not a link into blobs/"
        tgt = os.readlink(link)
        assert tgt.startswith("../" * len(rel.parts) + "../blobs/"), tgt
        assert link.read_bytes() == f.read_bytes(), rel
    assert (rd / "refs" / "main").read_text() == COMMIT
    assert not list((rd / "blobs").glob("*.incomplete*")), "partial files left behind"
    return rd


def test_full_download_is_byte_identical_in_hub_layout(dfbin, hub, repo_dir, tmp_path):
    p = setup(dfbin, hub, tmp_path / "hub", "--connections", "4")
    rd = snapshot_matches(tmp_path / "hub", repo_dir)
    # blobs are named by etag: the LFS sha256 for the shards, the git blob id for the rest
    shard = repo_dir / "model-00001-of-00002.safetensors"
    assert (rd / "blobs" / hashlib.sha256(shard.read_bytes()).hexdigest()).exists()
    # the big files went through the storage host, in ranges, without the token
    assert hub.count("storage", "GET") > 4
    assert not hub.leaked_auth
    assert "complete" in p.stdout
    # a second run downloads nothing
    n, ns = hub.count(contains="/resolve/"), hub.count("storage")
    p = setup(dfbin, hub, tmp_path / "hub")
    assert hub.count(contains="/resolve/") == n and hub.count("storage") == ns
    assert "0 files downloaded" in p.stdout


def test_token_goes_to_the_hub_only(dfbin, repo_dir, tmp_path):
    emu = HubEmulator(REPO, repo_dir, token="hf_secret").start()
    try:
        p = setup(dfbin, emu, tmp_path / "hub", check=False)
        assert p.returncode != 0 and "HTTP 401" in p.stderr and "HF_TOKEN" in p.stderr, p.stderr
        setup(dfbin, emu, tmp_path / "hub", HF_TOKEN="hf_secret")
        snapshot_matches(tmp_path / "hub", repo_dir)
        assert not emu.leaked_auth, "the Authorization header was sent to the storage host"
        # the token file under HF_HOME works too
        home = tmp_path / "home"
        home.mkdir()
        (home / "token").write_text("hf_secret\n")
        setup(dfbin, emu, tmp_path / "hub2", HF_HOME=home)
    finally:
        emu.stop()


def test_huggingface_hub_accepts_our_cache(dfbin, hub, repo_dir, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    setup(dfbin, hub, cache)
    before_resolve, before_storage = hub.count(contains="/resolve/"), hub.count("storage")
    code = ("import sys, huggingface_hub as h; print(h.snapshot_download(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3]))")
    p = subprocess.run([sys.executable, "-c", code, REPO, str(cache), hub.endpoint], capture_output=True, text=True,
                       timeout=120, env=env_for(hub, cache))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith(COMMIT)
    assert hub.count(contains="/resolve/") == before_resolve, "huggingface_hub re-checked files deltafin downloaded"
    assert hub.count("storage") == before_storage, "huggingface_hub downloaded again"
    assert hf.scan_cache_dir(cache).repos, "scan_cache_dir sees no repo"
    info = hf.scan_cache_dir(cache)
    assert not info.warnings, info.warnings


def test_we_reuse_a_cache_written_by_huggingface_hub(dfbin, hub, repo_dir, tmp_path):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    code = ("import sys, huggingface_hub as h; h.snapshot_download(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3])")
    p = subprocess.run([sys.executable, "-c", code, REPO, str(cache), hub.endpoint], capture_output=True, text=True,
                       timeout=120, env=env_for(hub, cache))
    assert p.returncode == 0, p.stderr
    n_resolve, n_storage = hub.count(contains="/resolve/"), hub.count("storage")
    out = setup(dfbin, hub, cache)
    assert "0 files downloaded" in out.stdout, out.stdout
    assert hub.count(contains="/resolve/") == n_resolve and hub.count("storage") == n_storage
    # and the model opens by its repo id
    r = subprocess.run([dfbin, "eval", "--model", REPO, "--ids", "1,2,3", "--dump-logits", str(tmp_path / "a.f32")],
                       capture_output=True, text=True, timeout=120, env=env_for(hub, cache))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("fault", ["drop", "short", "wronglen", "overlong", "badrange", "429", "503", "stall"])
def test_each_fault_class_recovers(dfbin, hub, repo_dir, tmp_path, fault):
    hub.faults = [fault, fault]
    p = setup(dfbin, hub, tmp_path / "hub", "--connections", "2")
    snapshot_matches(tmp_path / "hub", repo_dir)
    assert "retrying" in p.stderr, p.stderr
    assert hub.faults == []


def test_expired_storage_url_is_resolved_again(dfbin, hub, repo_dir, tmp_path):
    setup(dfbin, hub, tmp_path / "warm")  # the HEADs of a clean run
    heads = hub.count("hub", "HEAD")
    hub.faults = ["expired"]
    p = setup(dfbin, hub, tmp_path / "hub")
    snapshot_matches(tmp_path / "hub", repo_dir)
    assert "resolved it again" in p.stderr, p.stderr
    assert hub.count("hub", "HEAD") == 2 * heads + 1


def test_persistent_faults_fail_with_a_clear_message(dfbin, hub, repo_dir, tmp_path):
    hub.faults = ["503"] * 100
    p = setup(dfbin, hub, tmp_path / "hub", check=False, DELTAFIN_HUB_RETRIES=3)
    assert p.returncode != 0
    assert "gave up after 3 attempts" in p.stderr and "HTTP 503" in p.stderr and ".safetensors" in p.stderr, p.stderr
    rd = Path(tmp_path / "hub") / ("models--" + REPO.replace("/", "--"))
    assert not (rd / "refs" / "main").exists(), "refs written for an incomplete download"
    # nothing under a blob name is partial: each blob that exists has its hash as its name
    for b in (rd / "blobs").iterdir():
        if ".incomplete" not in b.name and len(b.name) == 64:
            assert hashlib.sha256(b.read_bytes()).hexdigest() == b.name


def test_corrupt_bytes_are_never_marked_complete(dfbin, hub, repo_dir, tmp_path):
    hub.faults = ["corrupt"]
    p = setup(dfbin, hub, tmp_path / "hub", check=False)
    assert p.returncode != 0 and "sha256" in p.stderr and "expected" in p.stderr, p.stderr
    rd = Path(tmp_path / "hub") / ("models--" + REPO.replace("/", "--"))
    assert not (rd / "refs" / "main").exists()
    setup(dfbin, hub, tmp_path / "hub")  # the next run starts that file over and completes
    snapshot_matches(tmp_path / "hub", repo_dir)


def test_api_faults_and_errors(dfbin, hub, repo_dir, tmp_path):
    hub.api_faults = ["429", "503", "drop"]
    setup(dfbin, hub, tmp_path / "hub")
    snapshot_matches(tmp_path / "hub", repo_dir)
    p = setup(dfbin, hub, tmp_path / "hub2", ref="tiny-org/tiny-moe@nope", check=False)
    assert p.returncode != 0 and "HTTP 404" in p.stderr and "revision" in p.stderr, p.stderr
    p = setup(dfbin, hub, tmp_path / "hub2", ref="../etc", check=False)
    assert p.returncode == 2 and "repo id" in p.stderr, p.stderr


def test_offline_uses_the_cache_or_names_what_is_missing(dfbin, hub, repo_dir, tmp_path):
    p = setup(dfbin, hub, tmp_path / "hub", check=False, HF_HUB_OFFLINE=1)
    assert p.returncode != 0 and "HF_HUB_OFFLINE=1" in p.stderr and "refs/main" in p.stderr, p.stderr
    assert hub.count() == 0
    setup(dfbin, hub, tmp_path / "hub")
    n = hub.count()
    p = setup(dfbin, hub, tmp_path / "hub", HF_HUB_OFFLINE=1)
    assert "cached copy" in p.stdout and hub.count() == n
    # a snapshot missing a shard the index lists is named
    snap = tmp_path / "hub" / ("models--" + REPO.replace("/", "--")) / "snapshots" / COMMIT
    (snap / "model-00002-of-00002.safetensors").unlink()
    p = setup(dfbin, hub, tmp_path / "hub", check=False, HF_HUB_OFFLINE=1)
    assert p.returncode == 2 and "model-00002-of-00002.safetensors: missing from the cached snapshot" in p.stderr, p.stderr


def _ranges_logged(done_log):
    try:
        return len(done_log.read_text().splitlines())
    except FileNotFoundError:  # that shard finished (its log removed) between the glob and the read: seen under ASan
        return 0


def test_kill_during_download_then_resume(dfbin, hub, repo_dir, tmp_path):
    cache = tmp_path / "hub"
    hub.throttle = 200_000  # bytes/s per connection: the download takes a few seconds
    proc = subprocess.Popen([dfbin, "setup", "--full", REPO, "--connections", "2"], env=env_for(hub, cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rd = cache / ("models--" + REPO.replace("/", "--"))
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until some ranges of a shard are done
        logs = list((rd / "blobs").glob("*.incomplete.done")) if (rd / "blobs").exists() else []
        if logs and any(_ranges_logged(x) >= 2 for x in logs):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert logs, "the download never got under way"
    assert not (rd / "refs" / "main").exists()
    snap = rd / "snapshots" / COMMIT
    for link in snap.rglob("*") if snap.exists() else []:
        if link.is_symlink():
            assert link.read_bytes() == (repo_dir / link.relative_to(snap)).read_bytes(), "a half-written file was linked"
    got_before = sum(1 for s, m, *_ in hub.log if s == "storage" and m == "GET")
    hub.throttle = 0
    p = setup(dfbin, hub, cache)
    assert "resuming" in p.stderr, p.stderr
    snapshot_matches(cache, repo_dir)
    assert got_before > 0


def test_two_setups_at_once_share_the_download(dfbin, hub, repo_dir, tmp_path):
    cache = tmp_path / "hub"
    hub.throttle = 400_000
    env = env_for(hub, cache)
    procs = [subprocess.Popen([dfbin, "setup", "--full", REPO, "--connections", "2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    snapshot_matches(cache, repo_dir)
    assert any("another process is downloading it" in e for _, e in outs), outs


def eval_logits(dfbin, model, env, path, *extra):
    r = subprocess.run([dfbin, "eval", "--model", str(model), "--ids", "1,2,3,4,5,6,7,8", "--dump-logits", str(path), *extra],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return Path(path).read_bytes(), r.stderr


def run_stats(dfbin, model, env, *extra):
    r = subprocess.run([dfbin, "run", "--model", str(model), "--ids", "1,2,3,4,5,6,7,8", "--max-new", "8", "--ignore-eos",
                        "--print-ids", "--stats", *extra], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def stat_line(stderr):
    line = [x for x in stderr.splitlines() if "network (hub stream)" in x]
    assert line, stderr
    return line[0]


@pytest.fixture
def full_ref(dfbin, hub, tmp_path):
    cache = tmp_path / "full"
    setup(dfbin, hub, cache)
    env = env_for(hub, cache)
    lg, _ = eval_logits(dfbin, REPO, env, tmp_path / "full.f32")
    ids, _ = run_stats(dfbin, REPO, env)
    return lg, ids


def test_stream_equals_full_and_fetches_experts_on_first_use(dfbin, hub, repo_dir, tmp_path, full_ref):
    cache = tmp_path / "stream"
    n0 = hub.count("storage")
    p = setup(dfbin, hub, cache, mode="--stream")
    rd = cache / ("models--" + REPO.replace("/", "--"))
    sdir = rd / "deltafin-stream" / COMMIT
    assert (sdir / "stream.json").exists() and "stream setup complete" in p.stdout
    # up front: headers and resident tensors only, no routed expert byte
    total = sum(f.stat().st_size for f in repo_dir.glob("*.safetensors"))
    setup_bytes = int(p.stdout.split(" MB over the network")[0].rsplit(" ", 1)[1].replace(".", "")) * 100_000
    assert setup_bytes < total * 0.8, (setup_bytes, total)
    for sh in repo_dir.glob("*.safetensors"):
        h, _ = read_st(sh)
        n = struct.unpack("<Q", sh.read_bytes()[:8])[0]
        local = (sdir / sh.name).read_bytes()
        remote = sh.read_bytes()
        assert len(local) == len(remote)
        for k, v in h.items():
            a, b = v["data_offsets"][0] + 8 + n, v["data_offsets"][1] + 8 + n
            if ".experts." in k:
                assert local[a:b] == bytes(b - a), f"{k} fetched up front"
            else:
                assert local[a:b] == remote[a:b], f"{k} missing after stream setup"
    # huggingface_hub's view stays sane: no partial file under blobs/, the snapshot holds the small files only
    assert not [b for b in (rd / "blobs").iterdir() if ".incomplete" in b.name]
    assert not list((rd / "snapshots" / COMMIT).glob("*.safetensors"))
    assert (rd / "snapshots" / COMMIT / "config.json").exists()
    assert not (rd / "snapshots" / COMMIT / "original").exists(), "stream mode fetched a subfolder"
    try:
        import huggingface_hub as hf
        assert not hf.scan_cache_dir(cache).warnings
    except ImportError:
        pass
    # the same logits and greedy ids as the full install; experts came over the network on first use
    env = env_for(hub, cache)
    lg, _ = eval_logits(dfbin, REPO, env, tmp_path / "s.f32")
    assert lg == full_ref[0]
    assert hub.count("storage") > n0
    ids, err = run_stats(dfbin, REPO, env)
    assert ids == full_ref[1]
    stat_line(err)
    # a second process finds every expert it needs on disk: nothing more from the network for the same prompt
    n1 = hub.count("storage")
    ids2, err2 = run_stats(dfbin, REPO, env)
    assert ids2 == full_ref[1] and hub.count("storage") == n1
    assert " 0 experts fetched" in stat_line(err2), stat_line(err2)


def test_stream_disk_budget_evicts_and_keeps_the_bits(dfbin, hub, repo_dir, tmp_path, full_ref):
    cache = tmp_path / "stream"
    setup(dfbin, hub, cache, "--disk", "40K", mode="--stream")
    env = env_for(hub, cache)
    lg, _ = eval_logits(dfbin, REPO, env, tmp_path / "s.f32")
    assert lg == full_ref[0]
    ids, err = run_stats(dfbin, REPO, env)
    assert ids == full_ref[1]
    line = stat_line(err)
    evicted = int(line.split(" evicted")[0].rsplit(" ", 1)[1])
    assert evicted > 0, line
    disk_mb = float(line.split("expert cache on disk ")[1].split(" MB")[0])
    assert disk_mb <= 0.08, line  # within the budget (or one layer's experts when that is larger)


def test_stream_fetch_faults_recover_and_offline_names_the_missing_file(dfbin, hub, repo_dir, tmp_path, full_ref):
    cache = tmp_path / "stream"
    setup(dfbin, hub, cache, mode="--stream")
    env = env_for(hub, cache)
    r = subprocess.run([dfbin, "eval", "--model", REPO, "--ids", "1,2", "--dump-logits", os.devnull],
                       capture_output=True, text=True, timeout=120, env={**env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode != 0 and "HF_HUB_OFFLINE=1" in r.stderr and ".safetensors" in r.stderr, r.stderr
    hub.faults = ["drop", "503", "short", "429"]
    lg, err = eval_logits(dfbin, REPO, env, tmp_path / "s.f32")
    assert lg == full_ref[0]
    assert "retrying" in err and hub.faults == []


def test_stream_prefetch_hot_fetches_up_front(dfbin, hub, repo_dir, tmp_path, full_ref):
    cache = tmp_path / "stream"
    p = setup(dfbin, hub, cache, "--prefetch-hot", mode="--stream")
    assert "prefetch-hot" in p.stdout, p.stdout
    fetched = int(p.stdout.split("tokens fetched ")[1].split(" experts")[0])
    assert fetched > 0, p.stdout
    env = env_for(hub, cache)
    lg, _ = eval_logits(dfbin, REPO, env, tmp_path / "s.f32")
    assert lg == full_ref[0]
    p = setup(dfbin, hub, cache, "--prefetch-hot", mode="--full", check=False)
    assert p.returncode == 2 and "--prefetch-hot goes with --stream" in p.stderr


def test_stream_setup_killed_then_resumed(dfbin, hub, repo_dir, tmp_path, full_ref):
    cache = tmp_path / "stream"
    hub.throttle = 100_000
    env = env_for(hub, cache, DELTAFIN_HUB_CHUNK="4K")
    proc = subprocess.Popen([dfbin, "setup", "--stream", REPO, "--connections", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sdir = cache / ("models--" + REPO.replace("/", "--")) / "deltafin-stream" / COMMIT
    deadline = time.time() + 60
    logs = []
    while time.time() < deadline:
        logs = list(sdir.glob("*.resident.done")) if sdir.exists() else []
        if logs and any(len(x.read_text().splitlines()) >= 3 for x in logs):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert logs, "the stream setup never got under way"
    assert not (sdir / "stream.json").exists(), "marked complete before it was"
    r = subprocess.run([dfbin, "eval", "--model", REPO, "--ids", "1", "--dump-logits", os.devnull], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode != 0, "an incomplete stream setup opened"
    hub.throttle = 0
    n0 = hub.count("storage")
    setup(dfbin, hub, cache, mode="--stream", DELTAFIN_HUB_CHUNK="4K")
    assert (sdir / "stream.json").exists() and not list(sdir.glob("*.resident.done"))
    resumed_requests = hub.count("storage") - n0
    lg, _ = eval_logits(dfbin, REPO, env, tmp_path / "s.f32")
    assert lg == full_ref[0]
    n1 = hub.count("storage")
    setup(dfbin, hub, tmp_path / "fresh", mode="--stream", DELTAFIN_HUB_CHUNK="4K")
    fresh_requests = hub.count("storage") - n1
    assert 0 < resumed_requests < fresh_requests, (resumed_requests, fresh_requests)


@pytest.mark.parametrize("name", ["deepseek-v3-fp8", "kimi-k2-int4", "kimi-k3-mxfp4"])
def test_stream_equals_full_other_families(dfbin, name, tmp_path):
    """FP8 block scales, INT4 groups, MXFP4 and K3's language_model. prefix: the scale sidecars are expert
    parts fetched on first use, the shared experts and dense layers resident."""
    d = tmp_path / "repo"
    d.mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        (d / f).write_bytes((MODELS / name / f).read_bytes())
    emu = HubEmulator("fam/" + name, d).start()
    try:
        ids = json.loads((MODELS / name / "golden.json").read_text())["ids"]
        out = {}
        for mode in ("--full", "--stream"):
            cache = tmp_path / mode.strip("-")
            p = subprocess.run([dfbin, "setup", mode, "fam/" + name], capture_output=True, text=True, timeout=300,
                               env=env_for(emu, cache))
            assert p.returncode == 0, p.stderr
            r = subprocess.run([dfbin, "eval", "--model", "fam/" + name, "--ids", ",".join(map(str, ids)), "--dump-logits",
                                str(tmp_path / (mode.strip("-") + ".f32"))], capture_output=True, text=True, timeout=300,
                               env=env_for(emu, cache))
            assert r.returncode == 0, r.stderr
            out[mode] = (tmp_path / (mode.strip("-") + ".f32")).read_bytes()
        assert out["--stream"] == out["--full"]
    finally:
        emu.stop()


@pytest.mark.parametrize("edit", [
    {"commit": "../../etc"},
    {"repo": "../x"},
    {"disk_budget": -2},
    {"shards": [{"name": "../../outside.safetensors"}]},
    {"shards": [{"name": "config.json"}]},
    {"shards": [{}]},
], ids=["commit", "repo", "budget", "shard-path", "shard-ext", "shard-none"])
def test_stream_json_is_checked_where_it_is_read(dfbin, hub, tmp_path, edit):
    """stream.json is read back on every open: a value that is not what setup writes
    (a path in a shard name, a commit that is not 40 hex, a negative budget) is refused
    with the file and field named, never used to build a path or a URL."""
    cache = tmp_path / "stream"
    setup(dfbin, hub, cache, mode="--stream")
    sj = cache / ("models--" + REPO.replace("/", "--")) / "deltafin-stream" / COMMIT / "stream.json"
    d = json.loads(sj.read_text())
    d.update(edit)
    sj.write_text(json.dumps(d))
    r = subprocess.run([dfbin, "run", "--model", REPO, "--ids", "1,2,3", "--max-new", "1"], capture_output=True, text=True,
                       timeout=120, env=env_for(hub, cache))
    assert r.returncode != 0 and "stream.json" in r.stderr, r.stderr
    assert "expected" in r.stderr, r.stderr
