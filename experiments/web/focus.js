// The reading-focus page: asks /api/read for the attention over the story's sentences and
// highlights each sentence by its weight (background alpha = weight, and data-weight holds the
// exact number the server sent). No libraries, no network beyond this page's own server.
"use strict";

const $ = (id) => document.getElementById(id);
let info = null;       // /api/info: normalizers, samples, temperature range
let sample = null;     // the sample story shown, while its text is unedited
let requested = 0;     // id of the latest query sent; older answers are dropped
let timer = null;

function temperature() {
  // Slider value v in [-2, 2] is the focus strength: T = 10^-v (right = sharper).
  return Math.pow(10, -parseFloat($("focus").value));
}

function normalizer() {
  const checked = document.querySelector("#normalizers input:checked");
  return checked ? checked.value : "";
}

function showTemperature() {
  const t = temperature();
  $("temperature-label").textContent = "(temperature T = " + (t < 1 ? t.toPrecision(2) : t.toFixed(t < 10 ? 2 : 1)) + ")";
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function clearOutput() {
  $("sentences").replaceChildren();
  $("stages").replaceChildren();
  $("sentences-title").hidden = true;
  $("answer").textContent = "";
  $("answer-prob").textContent = "";
  $("expected").textContent = "";
  $("top-answers").replaceChildren();
  $("unknown").hidden = true;
}

function storyText(s) {
  // A sample may carry its own text (a pool of stories separated by blank lines).
  return s.text !== undefined ? s.text : s.sentences.join("\n");
}

function pickSample(i) {
  sample = info.samples[i] || null;
  if (sample) {
    $("story").value = storyText(sample);
    $("question").value = sample.question;
  }
  read();
}

function weightedItem(text, w, score, gold) {
  // One highlighted line: background alpha and bar = weight w; score (optional) on hover.
  const li = document.createElement("li");
  li.className = "sentence" + (gold ? " gold" : "");
  li.dataset.weight = String(w);
  if (score !== undefined) li.dataset.score = String(score);
  li.style.backgroundColor = "rgba(255, 166, 0, " + Math.min(1, Math.max(0, w)) + ")";
  li.title = "weight " + w.toFixed(4) +
      (score !== undefined ? ", raw score " + score.toFixed(3) : "") +
      (gold ? " (gold evidence)" : "");
  return li;
}

function renderStages(data, unedited) {
  // Earlier stages of a multi-stage reader (e.g. retrieval over passages, then reading): each a
  // titled list highlighted like the sentences. Absent for a one-stage reader.
  const box = $("stages");
  box.replaceChildren();
  (data.stages || []).forEach((stage) => {
    const title = document.createElement("h3");
    title.className = "stage-title";
    title.textContent = stage.title;
    const list = document.createElement("ol");
    list.className = "stage";
    list.dataset.stage = stage.name;
    const gold = unedited && sample.gold ? sample.gold[stage.name] : undefined;
    stage.items.forEach((item, i) => {
      list.appendChild(fillItem(weightedItem(item.text, item.weight, item.score, i === gold),
                                i, item.text, item.weight));
    });
    box.append(title, list);
  });
  $("sentences-title").hidden = !data.sentences_title;
  $("sentences-title").textContent = data.sentences_title || "";
}

function fillItem(li, i, text, w) {
  // The line's number, text, weight bar and weight.
  const n = document.createElement("span");
  n.className = "n";
  n.textContent = String(i + 1);
  const t = document.createElement("span");
  t.className = "text";
  t.textContent = text;
  const bar = document.createElement("span");
  bar.className = "bar";
  const level = document.createElement("span");
  level.style.width = (100 * w).toFixed(1) + "%";
  bar.appendChild(level);
  const wl = document.createElement("span");
  wl.className = "w";
  wl.textContent = w.toFixed(3);
  li.append(n, t, bar, wl);
  return li;
}

function render(data) {
  const unedited = sample && $("story").value === storyText(sample) &&
      $("question").value.trim() === sample.question;
  renderStages(data, unedited);
  const list = $("sentences");
  list.replaceChildren();
  data.sentences.forEach((text, i) => {
    const w = data.weights[i];
    const li = weightedItem(text, w, data.scores ? data.scores[i] : undefined,
                            unedited && i === sample.support);
    list.appendChild(fillItem(li, i, text, w));
  });
  $("answer").textContent = data.answer;
  $("answer-prob").textContent = "(p = " + data.answer_prob.toFixed(3) + ")";
  $("answer-prob").dataset.prob = String(data.answer_prob);
  const expected = $("expected");
  if (unedited) {
    const ok = sample.answer === data.answer;
    expected.textContent = (ok ? "correct" : "expected " + sample.answer) + " (sample story)";
    expected.className = ok ? "ok" : "wrong";
  } else {
    expected.textContent = "";
  }
  const top = $("top-answers");
  top.replaceChildren(...data.top_answers.map((a) => {
    const li = document.createElement("li");
    li.textContent = a.answer + " " + a.prob.toFixed(3);
    return li;
  }));
  const unknown = $("unknown");
  unknown.hidden = data.unknown_words.length === 0;
  unknown.textContent = data.unknown_words.length ?
      "Unknown words (read as <unk>, they add nothing): " + data.unknown_words.join(", ") : "";
}

function hasQuestion() {
  // The words the server reads (stories.tokenize): a question without any is never sent.
  return /[a-z0-9]/i.test($("question").value);
}

function showQuestionState() {
  $("read").disabled = !hasQuestion();
}

async function read() {
  clearTimeout(timer);
  showQuestionState();
  const id = ++requested;
  if (!hasQuestion()) {  // asked to read (Enter, a control) with no question: say so, send nothing
    clearOutput();
    showError("The question is empty: type one, e.g. \"Where is Mary?\"");
    document.body.dataset.state = "error";
    document.body.dataset.reads = String(id);
    return;
  }
  document.body.dataset.state = "loading";
  const params = new URLSearchParams({
    story: $("story").value, question: $("question").value,
    temperature: String(temperature()), normalizer: normalizer(),
  });
  let data = null;
  let failure = "";
  try {
    const resp = await fetch("/api/read?" + params.toString());
    data = await resp.json();
    if (!resp.ok) failure = data.error || ("HTTP " + resp.status);
  } catch (err) {
    failure = "The server did not answer: " + err;
  }
  if (id !== requested) return;  // a newer query is on its way
  if (failure) {
    clearOutput();
    showError(failure);
  } else {
    showError("");
    render(data);
  }
  document.body.dataset.state = failure ? "error" : "ready";
  document.body.dataset.reads = String(id);
}

function later() {
  // While typing: read once the typing pauses, and only when there is a question to send (a
  // question being retyped is briefly empty; that is no request and no error).
  clearTimeout(timer);
  showQuestionState();
  if (hasQuestion()) timer = setTimeout(() => { if (hasQuestion()) read(); }, 250);
}

async function init() {
  try {
    info = await (await fetch("/api/info")).json();
  } catch (err) {
    showError("Could not load the model's description: " + err);
    return;
  }
  if (info.title) {  // another reader on this page (e.g. retrieval, then read)
    document.title = info.title;
    document.querySelector("h1").textContent = info.title;
    document.querySelector(".sub").firstChild.textContent = info.description + " ";
  }
  $("model-info").textContent = "Score: " + info.score + "; stories of up to " +
      info.max_sentences + " sentences; answers: " + info.answers.join(", ") + ".";
  const box = $("normalizers");
  info.normalizers.forEach((name, i) => {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.type = "radio";
    input.name = "normalizer";
    input.value = name;
    input.checked = i === 0;
    input.addEventListener("change", read);
    label.append(input, " " + name);
    box.appendChild(label);
  });
  const select = $("sample");
  info.samples.forEach((s, i) => {
    const opt = document.createElement("option");
    opt.value = String(i);
    opt.textContent = "Test story " + (i + 1) + ": " + s.question + " (" + s.sentences.length +
        " sentences)";
    select.appendChild(opt);
  });
  const custom = document.createElement("option");
  custom.value = "";
  custom.textContent = "Your own story (edit the text)";
  select.appendChild(custom);
  select.addEventListener("change", () => {
    if (select.value === "") {
      sample = null;
      read();
    } else {
      pickSample(parseInt(select.value, 10));
    }
  });
  $("story").addEventListener("input", later);
  $("question").addEventListener("input", later);
  $("question").addEventListener("keydown", (e) => { if (e.key === "Enter") read(); });
  $("read").addEventListener("click", read);
  $("focus").addEventListener("input", () => { showTemperature(); read(); });
  showTemperature();
  if (info.samples.length) {
    pickSample(0);
  } else {
    select.value = "";
    $("story").value = "Mary went to the kitchen.\nJohn journeyed to the garden.";
    $("question").value = "Where is Mary?";
    read();
  }
}

init();
