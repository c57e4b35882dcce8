"""Bad inputs to the Llama decoder (issue 51) are one `UsageError` line naming the problem and the fix.

A missing or malformed config.json, a key missing or of the wrong type, an unsupported architecture,
lengths past the context or the cache, an absurd batch, a weights folder without or with unfitting
safetensors: each is caught before anything is built or run, as every deepgap input is.
"""

import json

import pytest
import torch

from deepgap.core.errors import UsageError
from deepgap.measure.llm_steps import make_step
from deepgap.measure.llm_timing import measure_decode
from deepgap.measure.models.llama_config import MAX_LLM_BATCH, SHAPES, check_run, shape_of
from deepgap.measure.models.llama_net import build_llama


def _one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert "\n" not in msg and "; " in msg, msg  # problem; fix
    for w in words:
        assert w in msg, msg


def _config(tmp_path, **changes):
    d = {**SHAPES["llama-tiny"].hf_dict(), **changes}
    d = {k: v for k, v in d.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(d))
    return str(tmp_path)


def test_missing_and_malformed_config_json(tmp_path):
    with pytest.raises(UsageError) as e:
        shape_of(str(tmp_path / "nope" / "config.json"))
    _one_line(e, "does not exist")
    with pytest.raises(UsageError) as e:
        shape_of(str(tmp_path))  # a folder without config.json
    _one_line(e, "does not exist")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError) as e:
        shape_of(str(tmp_path))
    _one_line(e, "not valid JSON")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(UsageError) as e:
        shape_of(str(tmp_path))
    _one_line(e, "holds a list")
    with pytest.raises(UsageError) as e:
        shape_of("llama-9000")
    _one_line(e, "unknown Llama shape", "llama-tiny")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"hidden_size": None}, ("hidden_size is missing",)),
        ({"num_hidden_layers": "two"}, ("num_hidden_layers is 'two'",)),
        ({"vocab_size": -5}, ("vocab_size is -5",)),
        ({"intermediate_size": 12.5}, ("intermediate_size is 12.5",)),
        ({"num_key_value_heads": 3}, ("not a multiple of 3 KV heads",)),
        ({"model_type": "mistral"}, ("'mistral' model",)),
        ({"attention_bias": True}, ("attention_bias",)),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, ("RoPE type 'yarn'",)),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, ("llama3 RoPE scaling lacks",)),
    ],
)
def test_config_keys_that_are_missing_wrong_or_unsupported(tmp_path, changes, words):
    with pytest.raises(UsageError) as e:
        build_llama(_config(tmp_path, **changes))
    _one_line(e, "config.json", *words)


def test_pre_transformers5_spelling_is_read(tmp_path):
    """Meta's files carry top-level rope_theta and ``rope_scaling``; they read as the same shape."""
    tiny = SHAPES["llama-tiny"]
    s = tiny.rope_scaling
    old = {
        "rope_parameters": None,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position,
        },
    }
    assert shape_of(_config(tmp_path, **old)) == tiny


def test_lengths_past_the_context_or_cache_and_absurd_batches():
    shape = SHAPES["llama-tiny"]
    for batch, length, words in [
        (0, 8, ("batch 0",)),
        (MAX_LLM_BATCH + 1, 8, ("out of range",)),
        (1, shape.max_positions + 1, ("context of 512",)),
    ]:
        with pytest.raises(UsageError) as e:
            check_run(shape, batch, length)
        _one_line(e, *words)
    with pytest.raises(UsageError) as e:
        check_run(SHAPES["llama-3.1-8b"], 60_000, 131_072)  # 60k × 128k tokens of KV: petabytes
    _one_line(e, "TiB")
    model = build_llama("llama-tiny")
    with pytest.raises(UsageError) as e:
        measure_decode(model, 1, 500, 100, clock=None)
    _one_line(e, "input + output length 600")
    with pytest.raises(UsageError) as e:
        measure_decode(model, 1, 4, 0, clock=None)
    _one_line(e, "output length 0")


def test_cache_misuse_is_one_line():
    model = build_llama("llama-tiny")
    ids = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(UsageError) as e:
        model.prefill(ids)
    _one_line(e, "not set up")
    model.setup_cache(3, 8)
    with pytest.raises(UsageError) as e:
        model.prefill(ids)
    _one_line(e, "batch of 2")
    model.setup_cache(2, 8)
    with pytest.raises(UsageError) as e:
        model.decode_step(ids[:, :1], 8)
    _one_line(e, "position 8 is past")
    with pytest.raises(UsageError) as e:
        model.decode_step(ids[:, :2], 5)
    _one_line(e, "one token per sequence")
    with pytest.raises(UsageError) as e:
        model(torch.zeros(2, 4))
    _one_line(e, "token ids")
    with pytest.raises(UsageError) as e:
        make_step(model, "turbo")
    _one_line(e, "unknown decode step")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError) as e:
            make_step(model, "cuda-graph")
        _one_line(e, "CUDA device")


def test_weights_folder_without_or_with_unfitting_safetensors(tmp_path):
    from safetensors.torch import save_file

    folder = _config(tmp_path)
    with pytest.raises(UsageError) as e:
        build_llama(folder, weights=True)
    _one_line(e, "no .safetensors file")
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(UsageError) as e:
        build_llama(folder, weights=True)
    _one_line(e, "cannot be read as safetensors")
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UsageError) as e:
        build_llama(folder, weights=True)
    _one_line(e, "no tensor 'model.norm.weight'")
    with pytest.raises(UsageError) as e:
        build_llama("llama-tiny", weights=True)
    _one_line(e, "checkpoint folder")


def test_weights_of_another_shape_name_the_tensor(tmp_path):
    from safetensors.torch import save_file

    from deepgap.measure.models.llama_weights import to_hf

    tiny = build_llama("llama-tiny")
    state = {k: v.contiguous() for k, v in to_hf(tiny.state_dict(), tiny.shape).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UsageError) as e:
        build_llama(_config(tmp_path, intermediate_size=96), weights=True)
    _one_line(e, "gate_up_proj", "(256, 64)", "(192, 64)")
    assert build_llama(_config(tmp_path), weights=True).state_dict().keys() == tiny.state_dict().keys()


def _bad_config(tmp_path, case: str) -> str:
    """A model path for ``deepgap run --models`` that is wrong in the way ``case`` names."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    if case == "missing":
        return str(cfg / "config.json")
    if case == "folder without config.json":
        return str(cfg)
    if case == "malformed":
        (cfg / "config.json").write_text('{"hidden_size": 64,')
        return str(cfg / "config.json")
    if case == "key missing":
        return _config(cfg, vocab_size=None)
    if case == "system path":
        return "/proc/self/status"
    return _config(cfg)  # a good one (lengths or batch are the bad input)


@pytest.mark.parametrize(
    ("case", "extra", "says"),
    [
        ("missing", [], "does not exist"),
        ("folder without config.json", [], "does not exist"),
        ("malformed", [], "is not valid JSON"),
        ("key missing", [], "vocab_size is missing"),
        ("system path", [], "is a system path"),
        ("good", ["--input-lens", "500", "--output-lens", "20"], "context of 512"),
        ("good", ["--batch-sizes", "1000000"], "out of range"),
    ],
)
def test_a_local_config_in_a_decode_sweep(tmp_path, capsys, case, extra, says):
    """``run --workload decode --models PATH``: one line naming problem and fix, exit 2, no store."""
    from deepgap.cli import main

    model = _bad_config(tmp_path, case)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["run", "--workload", "decode", "--models", model, "--device", "cpu", "--quiet", *extra]
    assert main([*argv, "--store", str(out / "s.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "; " in err and len(err.splitlines()) == 1, err
    assert list(out.iterdir()) == []


def test_a_good_local_config_plans_like_a_named_shape(tmp_path):
    from deepgap.drive.config import SweepSpec, validate
    from deepgap.drive.plan import expand
    from deepgap.measure.models import resolve_model

    path = _config(tmp_path)
    spec = SweepSpec(models=(path,), precisions=("fp32",), device="cpu", workload="decode", batch_sizes=(2,))
    (c,) = expand(validate(spec.replace(input_lens=(8,), output_lens=(4,))), "cpu")
    assert (c.model, c.input_len, c.output_len, c.batch_size) == (path, 8, 4, 2)
    entry = resolve_model(path)
    assert entry.is_text and entry.max_seq_len == SHAPES["llama-tiny"].max_positions
