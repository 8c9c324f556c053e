"""Accumulation dtype: float32 at least, whatever the input dtype (float64 stays float64)."""

import jax.numpy as jnp


def accum_dtype(*xs):
  """The dtype products and softmaxes accumulate in: float32, or float64 for float64 inputs."""
  return jnp.result_type(jnp.float32, *(jnp.asarray(x).dtype if x is not None else jnp.float32
                                        for x in xs))
