"""Golden logits for tests/py/test_mxfp4.py: transformers' float32 forward of the dequantized MXFP4 test model.

tools/mxfp4_ckpt.build() turns the deepseek-v3-bf16 test model into an MXFP4 checkpoint (routed experts
mxfp4-pack-quantized) and its BF16 twin, whose experts hold the decoded MXFP4 values (exact in BF16). This script
loads the twin with transformers (DeepseekV3ForCausalLM, float32, eager attention), runs the test's ids in one
forward pass and writes

    tests/data/mxfp4/golden_logits.f32   float32 [len(ids), vocab]
    tests/data/mxfp4/golden.json         ids, versions, the sha256 of the MXFP4 model.safetensors it belongs to

Needs torch + transformers (not in the CI image): python3 tools/make_mxfp4_golden.py
"""
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import mxfp4_ckpt  # noqa: E402

BASE = REPO / "tests" / "data" / "models" / "deepseek-v3-bf16"
OUT = REPO / "tests" / "data" / "mxfp4"
IDS = json.loads((BASE / "golden.json").read_text())["ids"]


def main():
    with tempfile.TemporaryDirectory(prefix="mxfp4_golden_") as tmp:
        mx, twin, codes = mxfp4_ckpt.build(BASE, tmp)
        assert codes == set(range(16))
        sha = hashlib.sha256((mx / "model.safetensors").read_bytes()).hexdigest()
        cfg = json.loads((twin / "config.json").read_text())
        cfg["torch_dtype"] = "float32"
        (twin / "config.json").write_text(json.dumps(cfg))
        model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
            twin, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not info.get("missing_keys") and not info.get("mismatched_keys"), info
        unexpected = [k for k in info.get("unexpected_keys") or [] if not k.startswith("model.layers.3.")]
        assert not unexpected, unexpected  # only the MTP layer (3) is unused
        # the routed experts transformers holds are the decoded MXFP4 values
        sd = model.state_dict()
        t = mxfp4_ckpt.read_st(mx / "model.safetensors")
        for e in range(cfg["n_routed_experts"]):
            p = f"model.layers.1.mlp.experts.{e}.down_proj"
            dec = mxfp4_ckpt.numpy_decode(np.frombuffer(t[p + ".weight_packed"][2], np.uint8).reshape(t[p + ".weight_packed"][1]),
                                          np.frombuffer(t[p + ".weight_scale"][2], np.uint8).reshape(t[p + ".weight_scale"][1]))
            assert np.array_equal(sd["model.layers.1.mlp.experts.down_proj"][e].numpy(), dec), p
        model.eval()
        with torch.no_grad():
            logits = model(torch.tensor([IDS])).logits[0].float().numpy()
    top = np.sort(logits, axis=1)
    gap = float(((top[:, -1] - top[:, -2]) / np.maximum(1.0, np.abs(top[:, -1]))).min())
    OUT.mkdir(parents=True, exist_ok=True)
    logits.astype("<f4").tofile(OUT / "golden_logits.f32")
    golden = {
        "ids": IDS,
        "logits": "golden_logits.f32",
        "vocab_size": int(logits.shape[1]),
        "mxfp4_safetensors_sha256": sha,
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, attn_implementation=eager",
        "min_logit_gap_rel": gap,
        "notes": "DeepseekV3ForCausalLM on the BF16 twin of the MXFP4 test model (tools/mxfp4_ckpt.py build): its routed "
                 "experts hold the values decoded from weight_packed/weight_scale, upcast to float32 by transformers.",
    }
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {OUT}: {logits.shape}, min relative top-2 gap {gap:.3g}, sha256 {sha[:16]}...")


if __name__ == "__main__":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    main()
