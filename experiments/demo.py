r"""Demo of the primitives: learn to retrieve with every score x normalizer (`make demo`, ~40 s on
2 cores; docs/results.md). Its own workdir: `make run`'s sweep owns workdirs/demo.

Task (associative recall): Tk random keys; the query is a fixed random linear map A of one key plus
noise; the target is that key's position. Parameter-free scores (dot, scaled_dot) can only match q
against k directly and fail because of A; `general` can learn W ~ A^-T and `additive` a nonlinear
match; `location` ignores the keys and can only guess. Each variant trains its score parameters with
Adam and reports retrieval accuracy, weight entropy and sparsity, then one heatmap per variant.

    python -m experiments.demo --workdir=/tmp/attn_demo --steps=300
"""

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import attn
from attn.common.files import write_json
from attn.common.tables import markdown_table
from attn.config.configurable import option
from attn.errors import ConfigError
from attn.common import plots
from attn.launching import cli


@dataclasses.dataclass(frozen=True)
class Settings:
  """The demo's flags, one for one."""
  workdir: str = option("workdirs/primitives_demo", "Where the table and heatmap go.")
  steps: int = option(300, "Adam steps per variant.")
  num_keys: int = option(12, "Keys per example (Tk).")
  dim: int = option(16, "Query/key size.")
  noise: float = option(0.3, "Query noise standard deviation.")
  scores: tuple[str, ...] = option(tuple(attn.canonical_names("score")), "Scores to compare.")
  normalizers: tuple[str, ...] = option(tuple(attn.canonical_names("normalizer")),
                                        "Normalizers to compare.")
  seed: int = option(0, "Random seed.")

  def __post_init__(self):
    unknown = [s for s in self.scores if s not in attn.names("score")]
    unknown += [n for n in self.normalizers if n not in attn.names("normalizer")]
    if unknown:
      raise ConfigError(f"unknown variants {unknown}; known scores {attn.names('score')}, "
                        f"normalizers {attn.names('normalizer')}")


def make_batch(key, A, batch, num_keys, noise):
  """keys [B, Tk, d], queries [B, 1, d] = A k_target + noise, targets [B]."""
  kk, kt, kn = jax.random.split(key, 3)
  keys = jax.random.normal(kk, (batch, num_keys, A.shape[0]))
  target = jax.random.randint(kt, (batch,), 0, num_keys)
  picked = jnp.take_along_axis(keys, target[:, None, None], axis=1)  # [B, 1, d]
  queries = picked @ A.T + noise * jax.random.normal(kn, picked.shape)
  return queries, keys, target


def train_variant(score, normalizer, *, steps, num_keys, dim, noise, seed):
  """Trains one variant's score parameters; returns metrics and one example's weights [Tk]."""
  key = jax.random.PRNGKey(seed)
  A = jax.random.normal(jax.random.fold_in(key, 1), (dim, dim)) / np.sqrt(dim)
  params = attn.init_score(score, jax.random.fold_in(key, 2), dim, dim, d_attn=2 * dim,
                           max_len=num_keys)
  values = jnp.eye(num_keys)  # value j is one-hot(j): the context is the retrieved distribution

  def loss_fn(params, q, k, target):
    ctx, _ = attn.attend(params, q, k, jnp.broadcast_to(values, k.shape[:1] + values.shape),
                         score=score, normalizer=normalizer)
    p = ctx[:, 0, :]  # [B, Tk]
    # Squared error to the one-hot target works for sparse normalizers too (log 0 would not).
    return jnp.mean(jnp.sum((p - jax.nn.one_hot(target, num_keys)) ** 2, -1))

  tx = optax.adam(1e-2)
  opt_state = tx.init(params) if params is not None else None

  @jax.jit
  def step(params, opt_state, key):
    q, k, t = make_batch(key, A, 128, num_keys, noise)
    loss, grads = jax.value_and_grad(loss_fn)(params, q, k, t)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  if params is not None:
    for i in range(steps):
      params, opt_state, _ = step(params, opt_state, jax.random.fold_in(key, 100 + i))
  q, k, t = make_batch(jax.random.fold_in(key, 7), A, 1000, num_keys, noise)
  _, w = attn.attend(params, q, k, k, score=score, normalizer=normalizer)  # w [B, 1, Tk]
  w = np.asarray(w[:, 0])
  ent = -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0), -1)
  return {
      "score": score, "normalizer": normalizer,
      "accuracy": float(np.mean(w.argmax(-1) == np.asarray(t))),
      "mean_entropy": float(ent.mean()),
      "zero_weight_fraction": float(np.mean(w == 0)),
  }, w[:8]


def run_demo(workdir, *, scores, normalizers, steps, num_keys, dim, noise, seed):
  os.makedirs(workdir, exist_ok=True)
  rows, heat = [], {}
  t0 = time.time()
  for s in scores:
    for n in normalizers:
      row, w = train_variant(s, n, steps=steps, num_keys=num_keys, dim=dim, noise=noise, seed=seed)
      rows.append(row)
      heat[(s, n)] = w
      print(f"[{time.time() - t0:6.1f}s] {s:>10} / {n:<9} accuracy {row['accuracy']:.3f}  "
            f"entropy {row['mean_entropy']:.2f}  zeros {row['zero_weight_fraction']:.2f}", flush=True)
  write_json(os.path.join(workdir, "results.json"), rows)
  print("\n" + markdown_table(
      ["score", "normalizer", "accuracy", "entropy", "zero weights"],
      [[r["score"], r["normalizer"], f"{r['accuracy']:.3f}", f"{r['mean_entropy']:.2f}",
        f"{r['zero_weight_fraction']:.2f}"] for r in rows]))
  _plot(heat, scores, normalizers, os.path.join(workdir, "attention.png"))
  print(f"\nwrote {workdir}/results.json and {workdir}/attention.png (chance accuracy "
        f"{1 / num_keys:.3f})")
  return rows


def _plot(heat, scores, normalizers, path):
  plt = plots.pyplot()
  fig, axes = plt.subplots(len(scores), len(normalizers), squeeze=False,
                           figsize=(2.6 * len(normalizers), 1.6 * len(scores)))
  for i, s in enumerate(scores):
    for j, n in enumerate(normalizers):
      ax = axes[i][j]
      ax.imshow(heat[(s, n)], vmin=0, vmax=1, cmap="viridis", aspect="auto")
      ax.set_xticks([]), ax.set_yticks([])
      ax.set_title(f"{s} / {n}", fontsize=8)
  fig.suptitle("attention weights: 8 queries (rows) over keys (columns)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  del argv
  s = cli.settings_from_flags(Settings)
  run_demo(s.workdir, scores=s.scores, normalizers=s.normalizers, steps=s.steps,
           num_keys=s.num_keys, dim=s.dim, noise=s.noise, seed=s.seed)


if __name__ == "__main__":
  cli.define_settings_flags(Settings)
  cli.run(main)
