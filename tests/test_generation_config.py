"""Sampling defaults: generation_config.json (as vLLM), the command's fallback, the user's flags."""
import json

import pytest

from tokenmill.cli import build_parser
from tokenmill.cli_sampling import CHAT_DEFAULTS, GENERATE_DEFAULTS, resolve_sampling
from tokenmill.engine.generation_config import load_generation_config


def _folder(tmp_path, config):
    (tmp_path / "generation_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return tmp_path


def test_reads_the_sampling_keys_only(tmp_path):
    folder = _folder(tmp_path, {"temperature": 0.6, "top_p": 0.9, "top_k": 20.0, "max_new_tokens": 300,
                                "do_sample": True, "eos_token_id": 2, "min_p": None, "repetition_penalty": "x"})
    assert load_generation_config(folder) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 300}


def test_missing_or_broken_file_gives_nothing(tmp_path):
    assert load_generation_config(tmp_path) == {}
    assert load_generation_config(None) == {}
    assert load_generation_config(_folder(tmp_path, "{not json")) == {}
    assert load_generation_config(_folder(tmp_path, {"bos_token_id": 0, "eos_token_id": 1})) == {}


def _resolve(argv, defaults, folder):
    return resolve_sampling(build_parser().parse_args(argv), defaults, folder)


def test_without_model_values_the_command_defaults_apply(tmp_path):
    params, source = _resolve(["chat"], CHAT_DEFAULTS, tmp_path)
    assert (params.temperature, params.top_p, params.repetition_penalty, params.max_tokens) == (0.7, 0.9, 1.1, None)
    assert source == "tokenmill chat defaults"
    params, _ = _resolve(["generate", "x"], GENERATE_DEFAULTS, tmp_path)
    assert params.greedy and params.max_tokens == 128


def test_model_values_replace_the_fallback_and_flags_win(tmp_path):
    folder = _folder(tmp_path, {"temperature": 0.3, "top_k": 40})
    params, source = _resolve(["chat"], CHAT_DEFAULTS, folder)
    assert (params.temperature, params.top_k, params.top_p, params.repetition_penalty) == (0.3, 40, 1.0, 1.0)
    assert source == "the model's generation_config.json"
    params, _ = _resolve(["chat", "--temperature", "0.9", "--max-tokens", "50"], CHAT_DEFAULTS, folder)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.9, 40, 50)


def test_help_says_where_defaults_come_from(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["chat", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "generation_config.json" in text and "(default: model, else 0.7)" in text
    assert "(default: model, else the room left in the context)" in text
