"""`tokenmill quantize MODEL --method int8|int4|awq [--format awq|compressed-tensors] --out DIR`:
write a weight-only checkpoint that tokenmill (the method is picked from config.json), vLLM and
transformers read: 4 bits in AutoAWQ's GEMM layout (quant/awq_gptq.py, the default for int4 and
awq), or either width in compressed-tensors' layout (quant/compressed_tensors.py, vLLM's native
format; the only one for int8).

- int8: symmetric round to nearest, one scale per output channel (compressed-tensors only).
- int4: round to nearest per group of `--group-size` inputs with an integer zero point.
- awq: activation-aware scaling first (Lin et al., AWQ): calibration text (the shipped
  tokenmill/data/passages.json, not the perplexity text) runs through the float model; for each
  set of linears sharing an input (q/k/v after the attention norm, gate/up after the MLP norm,
  down after up) the per-input-channel scale s = mean|x|^alpha (alpha on a grid of 21 points in
  [0, 1]) that minimises the calibration output error of the quantized weights W·s is chosen, the
  weights are multiplied by s before quantization, and s is divided out of what produced the input
  (the norm's weight, or up's rows). o_proj is left unscaled when K/V heads are shared (GQA).
"""
from __future__ import annotations

import argparse

METHODS = ("int8", "int4", "awq")
FORMATS = ("awq", "compressed-tensors")


def run(args: argparse.Namespace) -> int:
    from tokenmill.quant.quantize import quantize_model  # torch: only when the command runs
    print(quantize_model(args.model, args.out, args.method, args.group_size, args.calibration_tokens, args.fmt))
    return 0


def add_quantize_parser(sub) -> None:
    from tokenmill.engine.arg_utils import add_model_args
    p = sub.add_parser("quantize", help="write a weight-only checkpoint (int8 / int4 / AWQ) in AutoAWQ's or "
                       "compressed-tensors' layout",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--method", choices=METHODS, default="awq", help="(default: %(default)s)")
    p.add_argument("--group-size", type=int, choices=(32, 64, 128), default=128,
                   help="inputs per scale; in_features must divide by it (default: %(default)s)")
    p.add_argument("--calibration-tokens", type=int, default=512, help="awq: tokens of calibration text "
                   "(default: %(default)s)")
    p.add_argument("--format", choices=FORMATS, default=None, dest="fmt",
                   help="checkpoint layout (default: compressed-tensors for int8, awq otherwise)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=run)
