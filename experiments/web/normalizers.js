// Normalizers: one row of scores -> attention weights, the same functions as attn/normalizers.py.
//
// Each takes z: an array of numbers already divided by the temperature; an entry that is null,
// undefined, NaN or -Infinity is masked. Returns a new array of the same length: masked entries
// exactly 0, the rest summing to 1; a row with no valid entry is all zeros. Computed in float64.
//
//   window.attnNormalizers.sparsemax([1.2, null, 0.3])  // -> [0.95, 0, 0.05]
(function (global) {
  "use strict";

  function valid(x) {
    return typeof x === "number" && !Number.isNaN(x) && x !== -Infinity;
  }

  // Valid entries shifted by their max (a shift changes none of the three normalizers), sorted
  // descending; null when the row has no valid entry.
  function prepare(z) {
    const idx = [];
    for (let i = 0; i < z.length; i++) if (valid(z[i])) idx.push(i);
    if (!idx.length) return null;
    let max = -Infinity;
    for (const i of idx) max = Math.max(max, z[i]);
    const shifted = z.map((x, i) => (valid(x) ? x - max : null));
    const sorted = idx.map((i) => shifted[i]).sort((a, b) => b - a);
    return { idx, shifted, sorted };
  }

  function zeros(n) {
    return new Array(n).fill(0);
  }

  function softmax(z) {
    const p = prepare(z);
    const out = zeros(z.length);
    if (!p) return out;
    let sum = 0;
    for (const i of p.idx) {
      out[i] = Math.exp(p.shifted[i]);
      sum += out[i];
    }
    for (const i of p.idx) out[i] /= sum;
    return out;
  }

  // Martins & Astudillo (2016), Algorithm 1: the support is the largest k with
  // 1 + k z_(k) > sum_{j<=k} z_(j); tau = (sum_{j<=k*} z_(j) - 1) / k*; p = [z - tau]_+.
  function sparsemax(z) {
    const p = prepare(z);
    const out = zeros(z.length);
    if (!p) return out;
    // k* counts the ranks meeting the condition (they form a prefix), as attn/normalizers.py does.
    const cums = [];
    let cum = 0, kStar = 0;
    p.sorted.forEach((zk, j) => {
      cum += zk;
      cums.push(cum);
      if (1 + (j + 1) * zk > cum) kStar += 1;
    });
    const tau = (cums[kStar - 1] - 1) / kStar;
    for (const i of p.idx) out[i] = Math.max(p.shifted[i] - tau, 0);
    return out;
  }

  // Peters, Niculae & Martins (2019), Algorithm 2 (exact sort-based 1.5-entmax) on z/2:
  // tau_k = mean_k - sqrt((1 - ss_k) / k), the support is the largest k with tau_k <= z_(k);
  // p = [z/2 - tau*]_+^2.
  function entmax15(z) {
    const p = prepare(z);
    const out = zeros(z.length);
    if (!p) return out;
    const half = p.sorted.map((x) => x / 2);
    const taus = [];
    let sum = 0, sumSq = 0, kStar = 0;
    half.forEach((zk, j) => {
      const k = j + 1;
      sum += zk;
      sumSq += zk * zk;
      const mean = sum / k;
      const ss = k * (sumSq / k - mean * mean);
      const tau = mean - Math.sqrt(Math.max((1 - ss) / k, 0));
      taus.push(tau);
      if (tau <= zk) kStar += 1;
    });
    if (!kStar) return out;  // cannot happen for a finite row (k = 1 always qualifies)
    const tauStar = taus[kStar - 1];
    for (const i of p.idx) {
      const d = Math.max(p.shifted[i] / 2 - tauStar, 0);
      out[i] = d * d;
    }
    return out;
  }

  global.attnNormalizers = { softmax, sparsemax, entmax15 };
})(typeof window !== "undefined" ? window : globalThis);
