"""Searching for outputs: greedy and beam search as jax.lax loops over a pure one-step decoder
function, shared by every architecture.

Axis names: B batch, K beams, T = max_len (output positions), Ts source length, V vocabulary
(the width of step_fn's log_probs: V_ext = V + Ts for a pointer-generator's extended vocabulary).

The model side is one pure function (closing over the parameters):

    step_fn(state, y_prev) -> (state, log_probs, weights)            or
    step_fn(state, y_prev) -> (state, log_probs, weights, extras)

- `state`: any pytree whose leaves have a leading batch axis B (beam search tiles it to B*K and
  reorders it by beam parent at every step, so every per-hypothesis quantity must live here);
- `y_prev`: [B] int32, the previous token (BOS at the first step). It can be any id the search
  emitted, i.e. any column of log_probs: with an extended vocabulary (See et al. 2017) ids >= the
  decoder's embedding size are source copies, and step_fn must map them to UNK before embedding
  them. The searches never look at ids beyond comparing them (EOS, n-gram blocking);
- `log_probs`: [B, V] float32, log-softmax of the next-token distribution (must be <= 0: the
  early-exit bound of beam search relies on scores never increasing along a hypothesis). V is read
  from its shape and must not change between steps;
- `weights`: [B, Ts] float32, the attention of that step (zeros for models without attention);
- `extras` (optional): dict name -> [B] float32, per-step quantities to record along each
  hypothesis (e.g. {"p_gen": ...}, the pointer-generator's generation probability).

A step_fn whose state has room for a fixed number of steps (the Transformer's key/value cache)
carries `step_fn.check_room(init_state, max_len)`, which both searches call before they start:
a search longer than the room is refused there, on static shapes, and the step needs no
run-time check.

Both searches return a `DecodeOutput`: tokens [B, T] int32 without BOS, EOS included, PAD after
it; lengths [B] int32 counting EOS; weights [B, T, Ts] float32, row t being the attention of the
step that produced token t (zeros after EOS); scores [B] float32, the sum of the token
log-probabilities (EOS included); extras: dict name -> [B, T] float32 laid out like the weights,
or None when step_fn returns no extras. A hypothesis that never emits EOS stops at T tokens.

Constraints for summarization (both searches; all off by default, and then the searches run
exactly the program they ran without them): `min_len` (no EOS before min_len tokens, EOS counted)
and `block_repeat_ngram` (no token that would repeat an n-gram of the hypothesis' own generated
tokens, Paulus et al. 2018). Beam search also takes the GNMT coverage penalty (`coverage_penalty`,
`source_lengths`) into the ranking of finished hypotheses.

Neither function jits itself: call them inside your own `jax.jit` with the parameters passed as
arguments, so step_fn closes over traced arrays rather than baking them in as constants (arrays
closed over by a jitted function become compile-time constants, and folding large ones is slow).
Static (Python scalars): B, T, K, the special ids, length_penalty, min_len, block_repeat_ngram,
coverage_penalty and early_exit; source_lengths is an ordinary (traced) array.

    @functools.partial(jax.jit, static_argnames=("max_len", "beam_size"))
    def translate(params, src, src_len, *, max_len, beam_size):
      model = nnx.merge(graphdef, params)
      memory = model.decoder.memory(model.encoder(src, src_len))       # leaves [B, ...]
      B = src.shape[0]
      init = {"memory": memory, "dec": model.decoder.initial_state_from_memory(memory),
              "t": jnp.zeros([B], jnp.int32)}                           # t per row: leading B

      def step_fn(s, y_prev):
        dec, logits, att = model.decoder.step(s["memory"], s["dec"], y_prev, s["t"][0])
        return ({**s, "dec": dec, "t": s["t"] + 1},
                jax.nn.log_softmax(logits.astype(jnp.float32)), att.weights)

      return decoding.beam_search(step_fn, init, B, max_len, beam_size=beam_size)

Beam search reorders every state leaf by parent at each step, except a leaf that step_fn hands
back as the very object it got (`new["memory"] is state["memory"]`): the K beams of an example
hold the same copy of it from the start, so its reordering is the identity and is skipped. A
model that passes its encoder memory through the state untouched therefore pays nothing for it.
`keep_weights=False` (both searches) records no attention history: weights come back [B, T, 0],
the tokens and scores are the same, and beam search no longer copies a [B, K, T, Ts] history at
every step.

`shrink_to=n` (both searches; greedy then runs as beam search with one beam and no length
penalty, which gives the same outputs) lets examples that are done leave the batch: once at most
half of them are still searching, the loop carries on over half the rows, down to n rows. The
outputs are the same; a batch of mixed output lengths costs less per pass, and each halving is
one more loop body to compile (worth it when a split is decoded more than once or is long).

Loops: both use `lax.while_loop`, not `lax.scan` over T. Decoding needs no gradient (the one thing
scan would add), and the while loop stops as soon as the whole batch is done: greedy when every
row has emitted EOS, beam search when every example is done by its stop rule (by default, when
no live hypothesis can beat the worst finished one). With T set generously (e.g. 2 x source
length + 10) most batches finish well before T.
Outputs are written into preallocated [.., T, ..] buffers, so all shapes stay static.

Modules: step.py (the step_fn contract's checks, DecodeOutput, NBest), greedy.py, beam.py,
constraints.py (min_len, n-gram blocking), penalties.py (GNMT length and coverage penalties),
settings.py (`Search`, the search settings a run decodes its test split with).
"""

from attn.decoding.beam import beam_search
from attn.decoding.greedy import greedy_decode
from attn.decoding.penalties import COVERAGE_FLOOR, gnmt_coverage_penalty, gnmt_length_penalty
from attn.decoding.settings import Search
from attn.decoding.step import DecodeOutput, NBest, StepFn, tile_beams

__all__ = ["COVERAGE_FLOOR", "DecodeOutput", "NBest", "Search", "StepFn", "beam_search",
           "gnmt_coverage_penalty", "gnmt_length_penalty", "greedy_decode", "tile_beams"]
