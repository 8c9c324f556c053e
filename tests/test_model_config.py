"""The model config: one section per architecture, records of what took effect, old flat files,
no JAX on construction, and the Architecture protocol both models implement."""

import dataclasses
import inspect
import json
import os

import jax
import pytest

from attn.errors import ConfigError
from attn.models import (Architecture, AttentionRole, ModelConfig, RNNConfig, TransformerConfig,
                         architecture, build_model, registries)
from attn.models.config import migrate_model_section, section_names
from attn.training import workdir as workdir_lib
from experiments.configs import translate as translate_config
from experiments.configs import use_arch

V = 11


def _rnn(**rnn):
  return ModelConfig(src_vocab=V, tgt_vocab=V, rnn=RNNConfig(**rnn))


def _transformer(**transformer):
  return ModelConfig(src_vocab=V, tgt_vocab=V, arch="transformer",
                     transformer=TransformerConfig(**{"d_model": 8, "num_heads": 2,
                                                      **transformer}))


# ---------------------------------------------------------------------------------- the sections

@pytest.mark.parametrize("make,message", [
    (lambda: ModelConfig(src_vocab=V, tgt_vocab=V, transformer=TransformerConfig(num_heads=8)),
     "model.transformer.num_heads=8 belongs to model.arch=transformer; model.arch=rnn reads "
     "model.rnn.* and the shared model.* fields"),
    (lambda: ModelConfig(src_vocab=V, tgt_vocab=V, transformer=TransformerConfig(
        cross=AttentionRole(normalizer="sparsemax"))),
     "model.transformer.cross.normalizer='sparsemax' belongs to model.arch=transformer; "
     "model.arch=rnn reads model.rnn.* and the shared model.* fields"),
    (lambda: ModelConfig(src_vocab=V, tgt_vocab=V, arch="transformer",
                         rnn=RNNConfig(cell="lstm")),
     "model.rnn.cell='lstm' belongs to model.arch=rnn; model.arch=transformer reads "
     "model.transformer.* and the shared model.* fields"),
])
def test_a_setting_of_the_section_the_architecture_does_not_read_is_refused(make, message):
  with pytest.raises(ConfigError) as e:
    make()
  assert str(e.value).startswith(message + ". A preset (or a --config override) set it"), e.value
  assert "experiments.configs.use_arch(config, " in str(e.value)


def test_sections_are_named_after_the_registered_architectures():
  assert sorted(section_names()) == registries.ARCHS.canonical_names() == ["rnn", "transformer"]
  for name in section_names():
    default = ModelConfig.__dataclass_fields__[name].default
    assert type(default) is registries.ARCHS.get(name).settings
    assert ModelConfig(src_vocab=V, tgt_vocab=V, arch=name).settings == default


def test_the_record_holds_the_shared_fields_and_the_active_section_only():
  rec = _rnn(decoder="luong").record()
  assert rec["rnn"]["decoder"] == "luong" and "transformer" not in rec
  assert {"arch", "enc_layers", "dec_layers", "dropout", "fused", "max_src_len"} <= set(rec)
  rec = _transformer().record()
  assert rec["transformer"]["cross"]["scope"] == "global" and "rnn" not in rec


def test_replace_paths_reaches_into_sections():
  cfg = _transformer().replace_paths({"dropout": 0.5, "transformer.cross.scope": "topk"})
  assert cfg.dropout == 0.5 and cfg.transformer.cross.scope == "topk"
  assert cfg.transformer.enc_self.scope == "global"


def test_switching_architecture_on_a_preset_resets_the_other_section():
  c = translate_config.get_config("smoke")  # an RNN preset (model.rnn sizes set)
  c.model.arch = "transformer"
  with pytest.raises(ConfigError, match="model.rnn.emb_dim=16 belongs to model.arch=rnn.*"
                     "use a preset of that architecture .*use_arch"):
    ModelConfig.from_config(c.model, src_vocab=V, tgt_vocab=V)
  use_arch(c, "transformer", d_model=16)
  mc = ModelConfig.from_config(c.model, src_vocab=V, tgt_vocab=V)
  assert mc.arch == "transformer" and mc.transformer.d_model == 16 and mc.rnn == RNNConfig()


# --------------------------------------------------------------------------- old flat records

FLAT_RNN = dict(src_vocab=24, tgt_vocab=24, arch="rnn", emb_dim=16, enc_hidden=16, dec_hidden=16,
                enc_layers=1, dec_layers=1, bidirectional=True, cell="gru", dropout=0.0,
                decoder="bahdanau", score="additive", d_attn=16, d_model=256, num_heads=4,
                cross={"score": "scaled_dot"})


def test_a_flat_model_section_migrates_into_its_architectures_section():
  got = migrate_model_section(FLAT_RNN)
  assert got["rnn"] == dict(emb_dim=16, enc_hidden=16, dec_hidden=16, bidirectional=True,
                            cell="gru", decoder="bahdanau", score="additive", d_attn=16)
  assert "transformer" not in got and "d_model" not in got  # never took effect: dropped
  assert got["enc_layers"] == 1 and got["src_vocab"] == 24
  assert migrate_model_section(got) == got  # today's layout is left as it is
  flat_t = dict(arch="transformer", d_model=32, num_heads=2, emb_dim=64, decoder="luong")
  assert migrate_model_section(flat_t) == dict(arch="transformer",
                                               transformer=dict(d_model=32, num_heads=2))


def test_a_flat_field_given_to_the_config_names_its_new_place():
  with pytest.raises(ConfigError, match=r"^model.decoder is now model.rnn.decoder; model.num_heads "
                                        r"is now model.transformer.num_heads \(each"):
    ModelConfig.from_config({"decoder": "luong", "num_heads": 2}, src_vocab=V, tgt_vocab=V)


def test_a_workdir_with_a_flat_model_record_resumes_or_names_the_moved_field(tmp_path):
  os.makedirs(tmp_path / "checkpoints" / "4")
  (tmp_path / "model.json").write_text(json.dumps(FLAT_RNN))
  same = ModelConfig(src_vocab=24, tgt_vocab=24, dropout=0.0, rnn=RNNConfig(
      emb_dim=16, enc_hidden=16, dec_hidden=16, d_attn=16))
  assert workdir_lib.check_model(str(tmp_path), same) == {}
  other = same.replace_paths({"rnn.cell": "lstm"})
  with pytest.raises(workdir_lib.WorkdirError, match="model.rnn.cell='gru' there, 'lstm' here"):
    workdir_lib.check_model(str(tmp_path), other)
  # The coverage switch (SWITCH_ON_WHEN_RESUMING) is found by its path in the migrated record.
  (tmp_path / "model.json").write_text(json.dumps({**FLAT_RNN, "coverage": False}))
  switched = workdir_lib.check_model(str(tmp_path), same.replace_paths({"rnn.coverage": True}))
  assert switched == {"rnn.coverage": False}
  workdir_lib.record_model(str(tmp_path), same)
  assert json.loads((tmp_path / "model.json").read_text()) == same.record()


def test_a_moved_flag_names_its_new_place():
  from attn.launching import cli  # pylint: disable=import-outside-toplevel
  line = cli.describe_flag_error(AttributeError("'decoder'"), ["--config.model.decoder=luong"])
  assert line == ("--config.model.decoder: the config has no such field; it moved to "
                  "model.rnn.decoder")


# ------------------------------------------------------------------------- plain values, no JAX

def test_constructing_and_replacing_configs_runs_no_trace(monkeypatch):
  """Every dataclasses.replace (each step of match_param_count's bisection) builds a config:
  that must stay a plain value. The abstract evaluation runs in validate() alone."""
  def refuse(*args, **kw):
    raise AssertionError("a config ran jax.eval_shape")

  monkeypatch.setattr(jax, "eval_shape", refuse)
  cfg = _rnn(decoder="bahdanau", score="dot", dec_hidden=10, enc_hidden=6)  # a bad pairing
  cfg = cfg.replace(dropout=0.1).replace_paths({"rnn.dec_hidden": 11})
  dataclasses.replace(cfg, enc_layers=2)
  t = _transformer(cross=AttentionRole(scope="linear", score="general"))  # refused in validate
  t.replace_paths({"transformer.d_ff": 32})
  ModelConfig.from_config(translate_config.get_config("demo_transformer").model, src_vocab=V,
                          tgt_vocab=V)
  monkeypatch.undo()
  with pytest.raises(ConfigError) as e:
    cfg.validate()
  assert str(e.value).startswith("model.rnn.score='dot' does not fit decoder 'bahdanau' "
                                 "(queries of size 11, keys of size 12): ")
  with pytest.raises(ConfigError, match="model.transformer.cross: .*feature map"):
    t.validate()
  assert _rnn().validate() == _rnn()


# ---------------------------------------------------------------------------------- the protocol

def _params(fn):
  return list(inspect.signature(fn).parameters.values())


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_both_architectures_implement_the_protocol(arch):
  cls = registries.ARCHS.get(arch)
  for name in architecture.METHODS + architecture.CLASS_FACTS:
    want, got = _params(getattr(Architecture, name)), _params(getattr(cls, name))
    assert [p.name for p in got[:len(want)]] == [p.name for p in want], (arch, name)
    assert all(g.kind == w.kind for g, w in zip(got, want)), (arch, name)
    assert all(p.default is not inspect.Parameter.empty or p.kind == p.VAR_KEYWORD
               for p in got[len(want):]), (arch, name)  # extras are optional
  for name in architecture.CLASS_FACTS:  # facts read from the class, without a model
    assert isinstance(inspect.getattr_static(cls, name), staticmethod), (arch, name)
  assert dataclasses.is_dataclass(cls.settings)
  cfg = _rnn(emb_dim=4, enc_hidden=4, dec_hidden=4, d_attn=4) if arch == "rnn" else _transformer()
  model = build_model(cfg)
  assert isinstance(model, Architecture) and model.cfg is cfg
  assert model.encoder.embed.num_embeddings == V
  assert cls.describe(cfg).keys() == {"decoder", "score", "normalizer", "scope", "temperature"}


# ------------------------------------------------------------------- numbers and length limits

@pytest.mark.parametrize("make,message", [
    # Before: an RNN accepted these and failed (or divided by zero) inside the first step.
    (lambda: _rnn(scope="window", half_width=-1), "model.rnn.half_width must be positive, got -1"),
    (lambda: _rnn(half_width=0), "model.rnn.half_width must be positive, got 0"),
    (lambda: _rnn(temperature=0.0), "model.rnn.temperature must be > 0, got 0.0"),
    (lambda: _rnn(scope="topk", top_k=0), "model.rnn.top_k must be positive, got 0"),
    # The Transformer's roles: the same check, the same words.
    (lambda: _transformer(cross=AttentionRole(scope="window", half_width=-1)),
     "model.transformer.cross.half_width must be positive, got -1"),
    (lambda: _transformer(enc_self=AttentionRole(top_k=0)),
     "model.transformer.enc_self.top_k must be positive, got 0"),
])
def test_attention_numbers_are_checked_alike_in_every_architecture(make, message):
  with pytest.raises(ConfigError) as e:
    make()
  assert str(e.value) == message


@pytest.mark.parametrize("fused", [True, "auto", "cpu_blocked"])
def test_a_fused_setting_the_rnn_cannot_run_is_refused_naming_the_value_given(fused):
  """The refusal said model.fused=True whatever was given (a target's name, or auto)."""
  with pytest.raises(ConfigError) as e:
    ModelConfig(src_vocab=V, tgt_vocab=V, fused=fused, rnn=RNNConfig(decoder="bahdanau"))
  assert str(e.value).startswith(f"model.fused={fused!r}: decoder 'bahdanau' attends one step ")


def test_length_limits_name_the_field_that_bounds_each_side():
  assert _rnn().length_limits() == {}
  assert _rnn(score="location").length_limits() == {
      "source": ("model.max_src_len", 128, "model.rnn.score='location'")}
  assert _transformer().length_limits() == {}  # sinusoids exist at every position
  learned = _transformer(pos_encoding="learned", max_tgt_len=32).replace(max_src_len=40)
  why = "model.transformer.pos_encoding='learned'"
  assert learned.length_limits() == {"source": ("model.max_src_len", 40, why),
                                     "target": ("model.transformer.max_tgt_len", 32, why)}
  located = _transformer(dec_self=AttentionRole(score="location"))
  assert located.length_limits() == {"target": ("model.transformer.max_tgt_len", 128,
                                                 "model.transformer.dec_self.score='location'")}


def test_an_rnn_with_topk_attention_keeps_top_k_keys_per_step():
  # Before: model.rnn.scope=topk was offered but the RNN had no top_k to pass: a traceback
  # ("scope 'topk' needs top_k=") inside the first step.
  from model_configs import random_batch
  model = build_model(_rnn(scope="topk", top_k=2, emb_dim=4, enc_hidden=4, dec_hidden=4,
                           d_attn=4))
  _, att = model.attention(random_batch([6, 4], [3, 5], 6, 5, V, V))
  assert jax.numpy.isfinite(att.weights).all()
  assert int((att.weights > 0).sum(-1).max()) == 2


def test_the_captioner_and_packed_rows_refuse_a_fused_setting_naming_the_value_given():
  """The two other fused refusals said model.fused=True whatever was given (auto, a target)."""
  from attn import training  # pylint: disable=import-outside-toplevel
  from experiments.configs import caption as caption_config  # pylint: disable=import-outside-toplevel
  from experiments.configs import translate as translate_config  # pylint: disable=import-outside-toplevel
  config = caption_config.get_config("tiny")
  config.model.fused = "auto"  # on a decoder whose attention could run fused
  config.model.rnn.decoder, config.model.rnn.input_feeding = "luong", False
  with pytest.raises(ConfigError, match=r"^model\.fused='auto': the captioner's attention"):
    training.validate_config(config, "caption")
  config = translate_config.get_config("reverse_transformer")
  config.model.fused, config.data.pack = "cpu_blocked", True
  with pytest.raises(ConfigError, match=r"^data\.pack=True with model\.fused='cpu_blocked': "):
    training.validate_config(config, "translate")
