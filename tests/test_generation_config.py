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


# -- the engine, LLM and the server use the model's generation_config.json --------------------------
@pytest.fixture(scope="module")
def model_with_generation_config(tiny_llama, tiny_llm, tmp_path_factory):
    """The tiny Llama with a generation_config.json listing a second end id (a token its greedy
    output reaches at position 3) and sampling defaults."""
    import shutil

    from tokenmill import SamplingParams
    prompt = [5, 6, 7, 8, 9]
    ids = tiny_llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    folder = tmp_path_factory.mktemp("with_generation_config") / "m"
    shutil.copytree(tiny_llama, folder)
    eos = json.loads((folder / "config.json").read_text())["eos_token_id"]
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [eos, ids[k]], "top_k": 1, "temperature": 0.8, "max_new_tokens": 20}))
    return folder, prompt, ids, k


def test_llm_stops_at_every_end_id_and_takes_the_sampling_defaults(model_with_generation_config):
    from tokenmill import LLM, SamplingParams
    folder, prompt, ids, k = model_with_generation_config
    llm = LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.02)
    defaults = llm.get_default_sampling_params()
    assert (defaults.top_k, defaults.temperature, defaults.max_tokens) == (1, 0.8, 20)
    out = llm.generate([prompt], use_tqdm=False)[0].outputs[0]  # top_k 1: greedy
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (ids[:k + 1], "stop", ids[k])
    explicit = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0].outputs[0]
    assert explicit.token_ids == ids[:k + 1]
    unbounded = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)  # max_new_tokens caps it
    assert len(llm.generate([prompt], unbounded, use_tqdm=False)[0].outputs[0].token_ids) == 20


def test_server_requests_take_the_model_defaults_for_unset_fields():
    from types import SimpleNamespace

    from tokenmill.server.protocol import ChatCompletionRequest
    from tokenmill.server.serving import OpenAIServing
    engine = SimpleNamespace(generation_defaults={"temperature": 0.6, "top_k": 20, "max_tokens": 300})
    serving = OpenAIServing(engine, ["m"], tokenizer=None)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], top_p=0.5)
    params = serving._sampling_params(req, None, None, {})
    assert (params.temperature, params.top_k, params.top_p) == (0.6, 20, 0.5)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=0.0)
    assert serving._sampling_params(req, None, None, {}).temperature == 0.0
