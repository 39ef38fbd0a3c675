# AWQ against int4 round-to-nearest on the default model (float32), perplexity over 384 tokens of
# alice_ch1_2.txt, by calibration tokens: what tests/test_quant_checkpoints.py asserts (awq <= int4).
# Run: TOKENMILL_HUGE_PAGES=0 PYTHONPATH=. python THIS
import math, tempfile, time, sys
from pathlib import Path
from tokenmill import LLM
from tokenmill.quant.quantize import quantize_model
from tokenmill.data import read_text
from tokenmill.eval.kv_quality import chunked_scores
d = Path(tempfile.mkdtemp())
for method, cal in (("int4", 0), ("awq", 256), ("awq", 128), ("awq", 64)):
    t = time.time()
    out = quantize_model(None, d / f"{method}{cal}", method, group_size=64, calibration_tokens=cal or 256)
    q = time.time() - t
    llm = LLM(str(out), dtype="float32", kv_cache_memory_gb=0.1)
    ids = llm.get_tokenizer().encode(read_text("alice_ch1_2.txt"))[:384]
    logp, _ = chunked_scores(llm.llm_engine, ids)
    print(method, cal, "ppl", math.exp(-logp.mean().item()), "quantize s", round(q, 1), "total", round(time.time() - t, 1), flush=True)
