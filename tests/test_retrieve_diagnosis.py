"""The counterfactual diagnosis of a retriever + reader: identity is the model, zero_top on a
stage changes the answers, the retrieval intervention acts inside the top-k scope (the entry
point's refusals of a bad diagnosis are with its other flags' in tests/test_retrieve.py)."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from attn.errors import ConfigError
from attn.inspection import interventions
from attn.apps.retrieve import data as pools
from attn.apps.retrieve import sweep as retrieve
from attn.apps.retrieve import diagnosis as retrieve_diagnosis
from attn.apps.retrieve import model as retriever

SMALL = pools.PoolStoryConfig(max_sentences=6)


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
  """(workdir, report) of a tiny trained run diagnosed from its workdir."""
  workdir = str(tmp_path_factory.mktemp("retrieve"))
  cfg = retrieve.RetrieveConfig(stories=SMALL, distractors=(4,), modes=("retrieve",), dim=16,
                                steps=200, train_size=400, test_size=150, num_samples=1)
  retrieve.train_and_evaluate(cfg, workdir, verbose=False)
  return workdir, retrieve_diagnosis.diagnose_workdir(workdir, ("identity", "zero_top"))


def test_identity_reproduces_the_runs_accuracy_and_zero_top_changes_answers(diagnosed):
  workdir, report = diagnosed
  assert [s["stage"] for s in report["stages"]] == ["retrieval", "hop 1", "hop 2"]
  assert report["accuracy"] == report["reported_accuracy"] > 2 / len(SMALL.places)
  for stage in report["stages"]:
    assert stage["identity"] == {"accuracy": report["accuracy"], "changed": 0.0, "tv": 0.0}
    # the trained model reads its top-weighted story and sentences: taking them away matters
    assert stage["zero_top"]["changed"] > 0.2 and stage["zero_top"]["tv"] > 0.1, stage
  assert report["stages"][0]["top_on_gold"] > 0.9  # retrieval's top story is the gold one
  with open(os.path.join(workdir, retrieve_diagnosis.DIAGNOSIS_FILE)) as f:
    assert json.load(f) == report
  with open(os.path.join(workdir, retrieve_diagnosis.DIAGNOSIS_TABLE)) as f:
    assert "| hop 2 |" in f.read()


def test_the_retrieval_intervention_moves_p_z_inside_the_scope_only(diagnosed):
  model, test, _ = retrieve_diagnosis.load(diagnosed[0])
  p, m, q, _, _ = pools.batch_arrays(test, np.arange(8))
  key = jax.random.PRNGKey(0)
  real = retriever.apply(*nnx.split(model), p, m, q, key)
  graphdef, state = nnx.split(model)
  cf = jax.jit(lambda state: nnx.merge(graphdef, state)(  # eager nnx calls: seconds
      p, m, q, key=key, intervene=interventions.get("zero_top"), at=0))(state)
  w, w_cf = np.asarray(real.passage_weights), np.asarray(cf.passage_weights)
  second = np.argsort(-w, axis=1)[:, 1]  # k = 2: all the weight goes to the other story read
  np.testing.assert_allclose(w_cf, np.eye(w.shape[1])[second], atol=1e-6)
  np.testing.assert_allclose(cf.sentence_weights, real.sentence_weights, rtol=1e-5, atol=1e-7)


def test_unknown_interventions_are_one_config_error_listing_the_known_ones():
  known = ", ".join(interventions.INTERVENTIONS.names())
  with pytest.raises(ConfigError, match=f"unknown intervention 'nope'; known: {known}$"):
    retrieve_diagnosis.RetrieveDiagnosis(interventions=("zero_top", "nope"))
