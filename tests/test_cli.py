"""The command line: generate on the tiny model, flags checked before any model loads, one-line
errors with a non-zero status, the model given as MODEL or --model, --version."""
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tokenmill
from tokenmill.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--kv-cache-memory-gb", "0.01", "--dtype", "float32", "--num-threads", "1"]


def _run(args, stdin=None):
    """`python -m tokenmill ARGS` importing this tree's tokenmill (not an installed copy)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tokenmill", *args], input=stdin, capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


def test_generate(tiny_llama):
    out = _run(["generate", "Hello world", "--model", str(tiny_llama), "--max-tokens", "4", *TINY_ARGS])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Hello world")
    assert "=====" not in out.stdout  # one output: no separator


def test_generate_reads_dash_from_stdin_and_separates_outputs(tiny_llama):
    out = _run(["generate", "-", "Paris is", "--model", str(tiny_llama), "--max-tokens", "3", "--n", "2",
                "--temperature", "0.8", "--sampling-seed", "3", *TINY_ARGS], stdin="Hello world\n")
    assert out.returncode == 0, out.stderr
    headers = [line for line in out.stdout.splitlines() if line.startswith("=====")]
    assert headers == ["===== prompt 1/2, sample 1/2 =====", "===== prompt 1/2, sample 2/2 =====",
                       "===== prompt 2/2, sample 1/2 =====", "===== prompt 2/2, sample 2/2 ====="]
    blocks = out.stdout.split("=====")
    assert blocks[2].strip().startswith("Hello world")  # the prompt read from stdin, newline dropped
    assert blocks[6].strip().startswith("Paris is")


def test_generate_failed_prompt_exits_non_zero(tiny_llama):
    out = _run(["generate", "hi", "one two three four five six seven eight nine ten " * 3, "--model",
                str(tiny_llama), "--max-tokens", "2", "--max-model-len", "16", *TINY_ARGS])
    assert out.returncode == 1
    assert out.stdout.startswith("===== prompt 1/2 =====\nhi")
    assert "tokenmill: error: prompt 2: This model's maximum context length is 16" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_model_path_is_one_line():
    out = _run(["generate", "x", "--model", "/no/such/model"])
    assert out.returncode == 2
    assert out.stderr.strip().startswith("tokenmill: error: model path does not exist")
    assert "Traceback" not in out.stderr


def test_version():
    out = _run(["--version"])
    assert out.returncode == 0
    assert out.stdout.strip() == f"tokenmill {tokenmill.__version__}"
    assert tokenmill.__version__ == importlib.metadata.version("tokenmill")


def test_quantize_writes_a_checkpoint_and_refuses_a_quantized_one(tiny_llama, tmp_path, capsys):
    out = tmp_path / "int4"
    assert main(["quantize", str(tiny_llama), "--method", "int4", "--group-size", "32", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq" and cfg["quantization_config"]["bits"] == 4
    assert main(["quantize", str(out), "--out", str(tmp_path / "again")]) == 2
    assert capsys.readouterr().err == f"tokenmill: error: {str(out)!r} is already quantized (awq)\n"


@pytest.mark.parametrize("argv, message", [
    (["generate", ""], "tokenmill: error: prompt 1 is empty"),
    (["generate", "x", "--max-tokens", "0"], "tokenmill: error: --max-tokens must be an integer >= 1, got 0"),
    (["generate", "x", "--top-p", "2"], "tokenmill: error: --top-p must be (0, 1], got 2.0"),
    (["generate", "x", "--sampling-seed", str(2**63)], "tokenmill: error: --sampling-seed must be"),
    (["generate", "x", "--min-tokens", "5", "--max-tokens", "2"], "tokenmill: error: --min-tokens must be <="),
    (["generate", "x", "--block-size", "3"], "tokenmill: error: --block-size must be a power of two"),
    (["chat", "--temperature", "-1"], "tokenmill: error: --temperature must be [0, 100], got -1.0"),
    (["chat", "--chat-template", "no-such-file"], "tokenmill: error: --chat-template: 'no-such-file'"),
])
def test_bad_flags_fail_before_the_model_loads(tmp_path, capsys, argv, message):
    # the model folder is empty: loading it would fail with another error, so the flag's error
    # proves the flags were checked first
    assert main([*argv, "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert err.count("\n") == 1


def test_empty_stdin_prompt_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(""))
    assert main(["generate", "-", "--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "tokenmill: error: prompt 1 from stdin is empty\n"


def test_bad_flag_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "x", "--temperature", "hot"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenmill generate: error: argument --temperature: invalid float value: 'hot'")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv, model", [
    (["serve", "m"], "m"), (["serve", "--model", "m"], "m"), (["serve"], None),
    (["chat", "m"], "m"), (["chat", "--model", "m"], "m"), (["chat", "m", "--model", "m"], "m"),
    (["generate", "p", "--model", "m"], "m"), (["generate", "p", "q"], None),
])
def test_model_is_given_as_MODEL_or_with_model_flag(argv, model):
    args = build_parser().parse_args(argv)
    assert args.model == model
    if argv[0] == "generate":
        assert args.prompts == [a for a in argv[1:] if a not in ("--model", "m")]  # positionals are prompts


def test_two_different_models_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["chat", "a", "--model", "b"])
    assert exc.value.code == 2
    assert "the model is given twice ('a' and 'b')" in capsys.readouterr().err


def test_chat_and_generate_take_every_sampling_flag():
    flags = ["--temperature", "0.5", "--top-p", "0.9", "--top-k", "5", "--min-p", "0.1",
             "--repetition-penalty", "1.2", "--presence-penalty", "0.5", "--frequency-penalty", "0.5",
             "--stop", "a", "--stop", "b", "--sampling-seed", "7", "--max-tokens", "9", "--min-tokens", "1",
             "--ignore-eos"]
    from tokenmill.cli_sampling import user_sampling_kwargs
    for cmd in (["generate", "x", "--n", "2", "--logprobs", "3"], ["chat"]):
        got = user_sampling_kwargs(build_parser().parse_args([*cmd, *flags]))
        assert got["stop"] == ["a", "b"] and got["seed"] == 7 and got["ignore_eos"] is True
        assert got["top_k"] == 5 and got["max_tokens"] == 9
    args = build_parser().parse_args(["generate", "x", "--seed", "5", "--sampling-seed", "7"])
    assert args.seed == 5 and user_sampling_kwargs(args) == {"seed": 7}  # engine seed and sampling seed apart
    assert user_sampling_kwargs(build_parser().parse_args(["generate", "x"])) == {}
