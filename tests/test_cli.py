"""The command line: generate and chat on the tiny model, and one-line configuration errors."""
import subprocess
import sys


def _run(args, stdin=None):
    return subprocess.run([sys.executable, "-m", "tokenmill", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_generate(tiny_llama):
    out = _run(["generate", "Hello world", "--model", str(tiny_llama), "--max-tokens", "4",
                "--kv-cache-memory-gb", "0.01"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Hello world")


def test_chat_reads_turns_until_empty_line(tiny_llama):
    out = _run(["chat", "--model", str(tiny_llama), "--max-tokens", "3", "--kv-cache-memory-gb", "0.01"],
               stdin="hi there\nand again\n\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("assistant> ") == 2


def test_bad_model_path_is_one_line():
    out = _run(["generate", "x", "--model", "/no/such/model"])
    assert out.returncode == 2
    assert out.stderr.strip().startswith("tokenmill: error: model path does not exist")
    assert "Traceback" not in out.stderr
