// The run viewer (attn/inspection/viewer.py writes the page): pick an example, step through its output
// tokens, see the source shaded by that step's attention and the full heatmap; the focus slider
// re-applies the run's normalizer to the raw scores at another temperature.
//
// Data (the JSON in #inspect-data): run / compare: run summaries; examples[i]: id, source,
// reference, prediction, src_tokens [Ts], tgt_tokens [Tt], weights [L][H][Tt][Ts], scores (same
// shape, null where masked; null when the run stored none), image (null, or {pixels [H][W] 0-255,
// regions [Ts][top, left, height, width]}), sentence_bleu, exact_match, compare.
// Every shaded token and heatmap cell carries the weight it shows in `data-weight`.
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("inspect-data").textContent);
  const RUN = DATA.run;
  const OTHER = DATA.compare;
  const NORMALIZE = window.attnNormalizers[RUN.normalizer];  // undefined: the slider is off
  const T0 = RUN.temperature;
  const SLIDER_MIN = Math.min(0.02, T0), SLIDER_MAX = Math.max(20, T0);  // log scale
  const AVERAGE = "avg";

  // T: null shows the run's own temperature, i.e. the stored weights exactly.
  const state = { ex: 0, step: 0, layer: 0, head: 0, T: null };

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  const fmt = (x, digits) => (typeof x === "number" ? x.toFixed(digits) : "–");
  const yesNo = (b) => (b === true ? "yes" : b === false ? "no" : "–");
  const canRescale = () => RUN.has_scores && NORMALIZE !== undefined;

  function shade(node, w) {
    // Opacity proportional to the weight; light text on dark cells.
    node.style.backgroundColor = `rgba(33, 102, 172, ${Math.min(Math.max(w, 0), 1)})`;
    node.style.color = w > 0.55 ? "#fff" : "";
  }

  function example() {
    return DATA.examples[state.ex];
  }

  // [Tt][Ts] weights of one head at the current temperature.
  function headWeights(ex, layer, head) {
    if (state.T === null || !canRescale()) return ex.weights[layer][head];
    const T = state.T;
    return ex.scores[layer][head].map(
        (row) => NORMALIZE(row.map((e) => (e === null ? null : e / T))));
  }

  // [Tt][Ts] weights on display: one head, or the mean of the layer's heads.
  function shownWeights() {
    const ex = example();
    if (state.head !== AVERAGE) return headWeights(ex, state.layer, state.head);
    const heads = ex.weights[state.layer].map((_, h) => headWeights(ex, state.layer, h));
    return heads[0].map((row, t) =>
      row.map((_, s) => heads.reduce((acc, m) => acc + m[t][s], 0) / heads.length));
  }

  function entropy(p) {
    return -p.reduce((acc, x) => (x > 0 ? acc + x * Math.log(x) : acc), 0);
  }

  // ---- run-level header (once) ----

  function renderHeader() {
    $("title").textContent = `attention: ${RUN.name}`;
    const bits = [`split ${RUN.split ?? "?"}`, `decoder ${RUN.decoder}`];
    if (RUN.has_attention) {
      bits.push(`score ${RUN.score}`, `normalizer ${RUN.normalizer}`, `scope ${RUN.scope}`,
                `temperature ${T0}`);
    }
    $("run-info").textContent = bits.join(" · ");
    const table = $("run-metrics");
    const runs = OTHER ? [RUN, OTHER] : [RUN];
    const head = el("tr");
    for (const h of ["run", "decoder", "BLEU", "chrF", "exact match"]) {
      head.appendChild(el("th", {}, h));
    }
    table.appendChild(head);
    runs.forEach((r, i) => {
      const tr = el("tr", { "data-run": i === 0 ? "a" : "b" });
      tr.appendChild(el("td", { title: r.workdir }, r.name));
      tr.appendChild(el("td", {}, r.decoder));
      tr.appendChild(el("td", { class: "run-bleu" }, fmt(r.metrics.bleu, 2)));
      tr.appendChild(el("td", { class: "run-chrf" }, fmt(r.metrics.chrf, 2)));
      tr.appendChild(el("td", { class: "run-exact" }, fmt(r.metrics.exact_match, 3)));
      table.appendChild(tr);
    });
  }

  function renderControls() {
    const select = $("example");
    DATA.examples.forEach((ex, i) => {
      const text = ex.source.length > 70 ? ex.source.slice(0, 67) + "…" : ex.source;
      select.appendChild(el("option", { value: String(i) }, `#${ex.id}: ${text}`));
    });
    if (RUN.multi) {
      $("head-controls").hidden = false;
      const [L, H] = [DATA.examples[0].weights.length, DATA.examples[0].weights[0].length];
      const option = (v) => el("option", { value: String(v) }, `${v + 1}`);
      for (let l = 0; l < L; l++) $("layer").appendChild(option(l));
      for (let h = 0; h < H; h++) $("head").appendChild(option(h));
      $("head").appendChild(el("option", { value: AVERAGE }, "average"));
      // Open on what the run's heatmaps and AER read: the last layer's head average
      // (attn.models.transformer.ALIGNMENT_LAYER).
      state.layer = L - 1;
      state.head = AVERAGE;
      $("layer").value = String(L - 1);
      $("head").value = AVERAGE;
    }
    const slider = $("temperature");
    slider.min = String(Math.log10(SLIDER_MIN));
    slider.max = String(Math.log10(SLIDER_MAX));
    slider.value = String(Math.log10(T0));
    slider.disabled = !canRescale();
    $("temperature-reset").disabled = !canRescale();
    if (RUN.note) {
      $("note").hidden = false;
      $("note").textContent = RUN.note;
    }
    if (!RUN.has_attention) {
      $("focus").hidden = true;
      $("heatmap-section").hidden = true;
      $("step-row").hidden = true;
    }
  }

  // ---- the example ----

  function renderTokens(weights) {
    const ex = example();
    const row = weights[state.step] || [];
    const source = $("source");
    source.replaceChildren();
    ex.src_tokens.forEach((tok, j) => {
      const w = RUN.has_attention ? row[j] : 0;
      const span = el("span", { class: "tok src-tok", "data-index": String(j),
                                "data-weight": String(w), title: `${tok}: ${fmt(w, 4)}` }, tok);
      if (RUN.has_attention) shade(span, w);
      source.appendChild(span);
    });
    const output = $("output");
    output.replaceChildren();
    ex.tgt_tokens.forEach((tok, t) => {
      const current = RUN.has_attention && t === state.step;
      const span = el("span", { class: "tok tgt-tok" + (current ? " current" : ""),
                                "data-index": String(t), title: `step ${t + 1}` }, tok);
      span.addEventListener("click", () => setStep(t));
      output.appendChild(span);
    });
    if (!RUN.has_attention) {
      $("step-info").textContent = "";
      return;
    }
    let best = 0;
    row.forEach((w, j) => { if (w > row[best]) best = j; });
    $("step-info").textContent = `step ${state.step + 1}/${ex.tgt_tokens.length} `
        + `(“${ex.tgt_tokens[state.step]}”): max weight ${fmt(row[best], 3)} `
        + `on “${ex.src_tokens[best]}”, entropy ${fmt(entropy(row), 3)} nats`;
  }

  function renderHeatmap(weights) {
    const ex = example();
    const table = $("heatmap");
    table.replaceChildren();
    const head = el("tr");
    head.appendChild(el("th"));
    ex.src_tokens.forEach((tok) => head.appendChild(el("th", { class: "col-label" }, tok)));
    table.appendChild(head);
    weights.forEach((row, t) => {
      const tr = el("tr", { "data-row": String(t), class: t === state.step ? "current" : "" });
      const label = el("th", { class: "row-label-cell" }, ex.tgt_tokens[t]);
      label.addEventListener("click", () => setStep(t));
      tr.appendChild(label);
      row.forEach((w, s) => {
        const td = el("td", { class: "cell", "data-row": String(t), "data-col": String(s),
                              "data-weight": String(w),
                              title: `${ex.tgt_tokens[t]} → ${ex.src_tokens[s]}: ${fmt(w, 4)}` });
        shade(td, w);
        td.addEventListener("click", () => setStep(t));
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }

  // The image under the attention (runs on images only): each region is tinted by the current
  // step's weight on it; the canvas carries the weights it shows in `data-weights`.
  const IMAGE_SCALE = 6;
  function renderImage(weights) {
    const ex = example();
    $("image-section").hidden = !ex.image;
    if (!ex.image) return;
    const { pixels, regions } = ex.image;
    const canvas = $("image");
    const [H, W] = [pixels.length, pixels[0].length];
    canvas.width = W * IMAGE_SCALE;
    canvas.height = H * IMAGE_SCALE;
    const ctx = canvas.getContext("2d");
    for (let y = 0; y < H; y++) {
      for (let x = 0; x < W; x++) {
        const v = pixels[y][x];
        ctx.fillStyle = `rgb(${v}, ${v}, ${v})`;
        ctx.fillRect(x * IMAGE_SCALE, y * IMAGE_SCALE, IMAGE_SCALE, IMAGE_SCALE);
      }
    }
    const row = RUN.has_attention ? (weights[state.step] || []) : [];
    regions.forEach(([top, left, h, w], j) => {
      const a = Math.min(Math.max(row[j] || 0, 0), 1);
      const box = [left * IMAGE_SCALE, top * IMAGE_SCALE, w * IMAGE_SCALE, h * IMAGE_SCALE];
      ctx.fillStyle = `rgba(255, 140, 0, ${0.7 * a})`;
      ctx.fillRect(...box);
      ctx.strokeStyle = "rgba(120, 120, 120, 0.8)";
      ctx.strokeRect(...box);
    });
    canvas.dataset.weights = JSON.stringify(regions.map((_, j) => row[j] || 0));
  }

  function renderTexts() {
    const ex = example();
    const ref = $("reference");
    ref.replaceChildren();
    if (ex.reference === null || ex.reference === undefined) {
      ref.textContent = "(not stored in this run's attention.npz)";
    } else {
      ref.appendChild(el("span", { id: "reference-text" }, ex.reference));
      if (!OTHER) {
        ref.appendChild(el("span", { class: "scores" },
            ` sentence BLEU ${fmt(ex.sentence_bleu, 1)} · exact match ${yesNo(ex.exact_match)}`));
      }
    }
    if (!OTHER) return;
    $("compare").hidden = false;
    const table = $("compare-table");
    table.replaceChildren();
    const other = ex.compare || {};
    const rows = [
      ["", RUN.name, OTHER.name, "th"],
      ["output", ex.prediction, other.prediction ?? "(not among the other run's sampled examples)"],
      ["sentence BLEU", fmt(ex.sentence_bleu, 1), fmt(other.sentence_bleu, 1)],
      ["exact match", yesNo(ex.exact_match), yesNo(other.exact_match)],
      ["run BLEU", fmt(RUN.metrics.bleu, 2), fmt(OTHER.metrics.bleu, 2)],
      ["run exact match", fmt(RUN.metrics.exact_match, 3), fmt(OTHER.metrics.exact_match, 3)],
    ];
    rows.forEach(([label, a, b, cell], i) => {
      const tr = el("tr");
      tr.appendChild(el("th", {}, label));
      tr.appendChild(el(cell || "td", i === 1 ? { id: "output-a", class: "text" } : {}, a));
      tr.appendChild(el(cell || "td", i === 1 ? { id: "output-b", class: "text" } : {}, b));
      table.appendChild(tr);
    });
  }

  function renderTemperature() {
    const T = state.T === null ? T0 : state.T;
    const out = $("temperature-value");
    out.dataset.value = String(T);
    out.textContent = `T′ = ${T < 0.1 ? T.toPrecision(2) : T.toFixed(2)}`
        + (state.T === null ? " (the run's own)" : ` (own ${T0})`);
  }

  function render() {
    const weights = shownWeights();
    renderTokens(weights);
    renderImage(weights);
    if (RUN.has_attention) renderHeatmap(weights);
    renderTemperature();
  }

  // ---- events ----

  function setStep(t) {
    const n = example().tgt_tokens.length;
    state.step = Math.min(Math.max(t, 0), n - 1);
    render();
  }

  function setExample(i) {
    state.ex = i;
    state.step = 0;
    renderTexts();
    render();
  }

  function bind() {
    $("example").addEventListener("change", (e) => setExample(Number(e.target.value)));
    $("layer").addEventListener("change", (e) => {
      state.layer = Number(e.target.value);
      render();
    });
    $("head").addEventListener("change", (e) => {
      state.head = e.target.value === AVERAGE ? AVERAGE : Number(e.target.value);
      render();
    });
    $("temperature").addEventListener("input", (e) => {
      const v = Number(e.target.value);
      // Back at the run's own temperature the stored weights are shown, not a recomputation.
      state.T = Math.abs(v - Math.log10(T0)) < 1e-9 ? null : Math.pow(10, v);
      render();
    });
    $("temperature-reset").addEventListener("click", () => {
      $("temperature").value = String(Math.log10(T0));
      state.T = null;
      render();
    });
    $("prev").addEventListener("click", () => setStep(state.step - 1));
    $("next").addEventListener("click", () => setStep(state.step + 1));
    document.addEventListener("keydown", (e) => {
      const tag = e.target && e.target.tagName;
      if (tag === "SELECT" || tag === "INPUT" || !RUN.has_attention) return;
      if (e.key === "ArrowLeft") { setStep(state.step - 1); e.preventDefault(); }
      if (e.key === "ArrowRight") { setStep(state.step + 1); e.preventDefault(); }
    });
  }

  renderHeader();
  renderControls();
  bind();
  setExample(0);
})();
