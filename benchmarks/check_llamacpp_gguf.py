"""Convert tiny random-weight MoE / MLA models with llama.cpp's own converter and check that
tokenmill loads the GGUFs as the models they came from.

For each family (Mixtral, Qwen2-MoE, DeepSeek-V2, DeepSeek-V3, DeepSeek-V3 with YaRN and a
scoring_func key) it builds the tiny HF model of tests/tiny_models.py, runs llama.cpp's
convert_hf_to_gguf.py on it (a llama.cpp source tree given by --llama-cpp; nothing is downloaded),
loads the .gguf with tokenmill (float path, quantization="none") and compares with transformers on
the HF model: max |logit difference| and 32 greedy tokens. With --outtype q8_0 the GGUF's blocks
are Q8_0 and both tokenmill paths (none, gguf) are compared (max |diff| / logit range, argmax
agreement). The tests use a test-side writer of the same layout (tests/llamacpp_gguf.py); this
checks that layout against llama.cpp itself.

The only change to llama.cpp's converter: its check that it knows the tokenizer's pre-tokenizer
(the tiny byte-level BPE tokenizer is not one of its hashes) is bypassed ("default"), and Mixtral's
vocabulary is written as gpt2 BPE (llama.cpp tries sentencepiece first).

    python benchmarks/check_llamacpp_gguf.py --llama-cpp /path/to/llama.cpp [--outtype q8_0]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {"mixtral": ("mixtral", {}), "qwen2_moe": ("qwen2_moe", {}), "deepseek_v2": ("deepseek_v2", {}),
            "deepseek_v3": ("deepseek_v3", {}),
            "deepseek_v3_yarn": ("deepseek_v3", {"scoring_func": "sigmoid", "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}})}
_DRIVER = """
import sys
sys.path[:0] = [{src!r}, {src!r} + "/gguf-py"]
import conversion.base, conversion.llama
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
conversion.llama.LlamaModel.set_vocab = lambda self: self._set_vocab_gpt2()
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
convert_hf_to_gguf.main()
"""


def convert(llama_cpp: Path, folder: Path, out: Path, outtype: str) -> None:
    driver = folder.parent / "driver.py"
    driver.write_text(_DRIVER.format(src=str(llama_cpp)))
    subprocess.run([sys.executable, str(driver), str(folder), "--outfile", str(out), "--outtype", outtype],
                   check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (convert_hf_to_gguf.py)")
    ap.add_argument("--outtype", default="f32", choices=["f32", "q8_0"])
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import torch
    import transformers
    from test_models_breadth import TOKENS, _hf_greedy, _prompts
    from tiny_models import make_tiny_model

    from tokenmill import LLM, SamplingParams

    work = Path(tempfile.mkdtemp(prefix="llamacpp-gguf-"))
    os.environ["TOKENMILL_CACHE"] = str(work / "cache")
    for name, (arch, overrides) in FAMILIES.items():
        folder = make_tiny_model(work / name, arch, seed=11, **overrides)
        path = work / f"{name}-{args.outtype}.gguf"
        convert(args.llama_cpp, folder, path, args.outtype)
        ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            expected = ref(torch.tensor([TOKENS])).logits[0]
        span = (expected.max() - expected.min()).item()
        for quantization in ("none",) if args.outtype == "f32" else ("none", "gguf"):
            llm = LLM(str(path), dtype="float32", quantization=quantization, block_size=4, num_kv_blocks=64)
            got = llm.llm_engine.runner.full_logits(TOKENS)
            line = (f"{name:17s} {args.outtype} quantization={quantization}: max|diff| {(got - expected).abs().max():.2e}"
                    f" ({(got - expected).abs().max() / span:.4f} of the logit range), argmax agreement "
                    f"{(got.argmax(-1) == expected.argmax(-1)).float().mean():.3f}")
            if args.outtype == "f32":
                prompts = _prompts()[:3]
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                    SamplingParams(max_tokens=32, temperature=0, ignore_eos=True), use_tqdm=False)
                same = [o.outputs[0].token_ids for o in outs] == [_hf_greedy(ref, p, 32) for p in prompts]
                line += f", 32 greedy tokens x {len(prompts)} prompts identical: {same}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
