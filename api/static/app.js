// h3batch browser UI: plain JavaScript, no build step. Talks to the JSON API with the stored Bearer key.
"use strict";
const H3 = (() => {
  const KEY = "h3batch.apiKey";
  const TERMINAL = new Set(["completed", "failed", "cancelled"]);
  const $ = (id) => document.getElementById(id);

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = localStorage.getItem(KEY);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function say(text, isError) {
    const box = $("message");
    if (!box) return;
    box.textContent = text || "";
    box.classList.toggle("error", !!isError);
  }

  function askForKey(reason) {
    $("key-form").hidden = false;
    say(reason || "This server needs an API key: enter it above.", true);
  }

  // fetch() with the key; a 401 shows the key form. Returns the Response (throws on network errors).
  async function api(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = headers(opts.headers);
    const response = await fetch(path, opts);
    if (response.status === 401) askForKey("The API answered 401: enter a valid API key above.");
    return response;
  }

  // JSON with 63-bit seeds kept exact: JavaScript numbers lose digits past 2^53, so seeds become strings.
  async function json(response) {
    return JSON.parse((await response.text()).replace(/"seed":\s*(\d{16,})/g, '"seed":"$1"'));
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error) return body.error.code + ": " + body.error.message;
    } catch (e) { /* not JSON */ }
    return "HTTP " + response.status;
  }

  // A blob: URL for an authenticated download (videos, plots): <video src> cannot send headers.
  async function blobUrl(path) {
    const response = await api(path);
    if (!response.ok) throw new Error(await errorText(response));
    return URL.createObjectURL(await response.blob());
  }

  // Server-sent events over fetch streaming (headers allowed, unlike EventSource). Calls onEvent(name, data, id)
  // per event; reconnects with Last-Event-ID until a terminal event arrives.
  async function followEvents(jobId, onEvent) {
    let lastId = null;
    for (let attempt = 0; attempt < 50; attempt++) {
      const extra = lastId ? {"Last-Event-ID": lastId} : {};
      let response;
      try {
        response = await api("/jobs/" + encodeURIComponent(jobId) + "/events", {headers: extra});
      } catch (e) {
        await new Promise((r) => setTimeout(r, 1000));
        continue;
      }
      if (response.status === 503) { await new Promise((r) => setTimeout(r, 2000)); continue; }
      if (!response.ok) throw new Error(await errorText(response));
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let name = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;  // keep-alive comment
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "event") name = text;
            else if (field === "data") data += (data ? "\n" : "") + text;
            else if (field === "id") id = text;
          }
          if (id) lastId = id;
          if (!data) continue;
          onEvent(name, JSON.parse(data), id);
          if (TERMINAL.has(name)) return name;
        }
      }
    }
    throw new Error("the event stream kept dropping; reload the page");
  }

  function fmtSeconds(v) { return v == null ? "–" : Number(v).toFixed(2) + " s"; }

  function card(job) {
    const div = document.createElement("article");
    div.className = "clip";
    div.dataset.jobId = job.id;
    // The gallery shows thumbnails; a clip's MP4 is fetched (as a blob: it needs the key) only when it is played.
    const video = document.createElement("video");
    video.preload = "none";
    video.playsInline = true;
    video.title = "play";
    div.appendChild(video);
    const meta = job.metadata || {};
    const info = document.createElement("div");
    info.className = "clip-info";
    const prompt = document.createElement("p");
    prompt.className = "prompt";
    prompt.textContent = job.prompt;
    info.appendChild(prompt);
    const facts = document.createElement("p");
    facts.className = "muted";
    facts.textContent = job.width + "×" + job.height + " · " + job.seconds + " s · seed " + job.seed +
      " · " + fmtSeconds(job.inference_time_s) + (meta.gpu ? " · " + meta.gpu : "");
    info.appendChild(facts);
    const download = document.createElement("a");  // the MP4 needs the key: a blob URL once it is fetched
    download.className = "download";
    download.textContent = "download";
    download.download = job.id + ".mp4";
    download.hidden = true;
    const play = document.createElement("button");
    play.type = "button";
    play.className = "link play";
    play.textContent = "▶ play";
    info.append(play, download);
    div.appendChild(info);
    blobUrl("/v1/videos/" + encodeURIComponent(job.id) + "/content?variant=thumbnail")
      .then((url) => { video.poster = url; }).catch(() => { /* the play button still works */ });
    let loading = null;
    const load = () => {
      loading = loading || blobUrl(job.links.content).then((url) => {
        video.src = url;
        video.controls = true;
        download.href = url;
        download.hidden = false;
        play.hidden = true;
        return video.play().catch(() => { /* autoplay refused: the controls are there */ });
      }).catch((e) => { loading = null; facts.textContent += " · video unavailable (" + e.message + ")"; });
      return loading;
    };
    play.addEventListener("click", load);
    video.addEventListener("click", () => { if (!video.src) load(); });
    return div;
  }

  async function loadGallery() {
    const gallery = $("gallery");
    const response = await api("/jobs?status=completed&limit=12");
    if (response.status === 401) return;  // api() already asked for a key
    if (!response.ok) { say(await errorText(response), true); return; }
    const page = await json(response);
    gallery.replaceChildren(...page.data.map(card));
    if (!page.data.length) gallery.textContent = "No finished clips yet.";
  }

  async function submit(event) {
    event.preventDefault();
    const [width, height] = $("size").value.split("x").map(Number);
    const body = {prompt: $("prompt").value, seconds: Number($("seconds").value), width, height};
    // Sent as typed: Number() would round a 63-bit seed past 2^53 and render another clip (the API reads the text).
    if ($("seed").value.trim() !== "") body.seed = $("seed").value.trim();
    const frames = [["first_frame", $("first-frame")], ["last_frame", $("last-frame")]]
      .filter(([, input]) => input && input.files.length);
    let request = {method: "POST", body: JSON.stringify(body), headers: {"Content-Type": "application/json"}};
    if (frames.length) {  // keyframes: multipart with the files, task fl2va (api/job_inputs.py)
      const form = new FormData();
      for (const [name, value] of Object.entries(body)) form.append(name, String(value));
      form.append("task", "fl2va");
      for (const [name, input] of frames) form.append(name, input.files[0]);
      request = {method: "POST", body: form};
    }
    $("submit").disabled = true;
    say("");
    try {
      const response = await api("/jobs", request);
      if (!response.ok) { say(await errorText(response), true); return; }
      const job = await json(response);
      await watch(job);
    } catch (e) {
      say(e.message, true);
    } finally {
      $("submit").disabled = false;
    }
  }

  async function watch(job) {
    $("current").hidden = false;
    $("current-id").textContent = job.id;
    const video = $("current-video");
    video.hidden = true;
    const cancel = $("current-cancel"), download = $("current-download");
    download.hidden = true;
    cancel.hidden = false;
    cancel.disabled = false;
    cancel.onclick = async () => {  // queued: cancelled at once; running: stops at the next denoise step
      cancel.disabled = true;
      const response = await api("/jobs/" + encodeURIComponent(job.id) + "/cancel", {method: "POST"});
      if (!response.ok && response.status !== 409) say(await errorText(response), true);
    };
    let totalSteps = job.total_steps || 8;  // the worker sends the release's count with its first denoise step
    let stageText = "", etaText = "";
    const line = () => { $("current-stage").textContent = stageText + etaText; };
    const show = (status, stage, progress, step) => {
      $("current-status").textContent = status;
      $("current-status").className = "badge " + status;
      if (progress != null) $("progress").value = Math.round(progress * 100);
      stageText = status === "queued" ? queuedText :
        stage ? "stage " + stage + (step ? " · step " + step + "/" + totalSteps : "") : "";
      line();
    };
    // The event stream carries stages and steps; the place in line and the ETA (the server's estimate, eta_s)
    // come from a look at the job every 1.5 s until it finishes.
    const placeText = (j) => "queued" + (j.queue_position ? " · position " + j.queue_position + " in line" : "");
    const etaOf = (j) => (j.eta_s == null ? "" : " · about " + fmtEta(j.eta_s) + " left");
    let queuedText = placeText(job);
    etaText = etaOf(job);
    const lookAtJob = setInterval(async () => {
      const response = await api("/jobs/" + encodeURIComponent(job.id));
      if (!response.ok) return;
      const now = await json(response);
      if (TERMINAL.has(now.status)) { clearInterval(lookAtJob); return; }
      etaText = etaOf(now);
      if (now.status === "queued") {
        queuedText = placeText(now);
        if ($("current-status").textContent === "queued") stageText = queuedText;
      }
      line();
    }, 1500);
    show(job.status, job.stage, job.progress);
    let status = job.status;
    const final = await followEvents(job.id, (name, data) => {
      if (data.status) status = data.status;
      if (data.total_steps) totalSteps = data.total_steps;
      show(TERMINAL.has(name) ? name : status, data.stage, data.progress, data.step);
    });
    clearInterval(lookAtJob);
    etaText = "";
    const done = await json(await api("/jobs/" + job.id));
    cancel.hidden = true;
    show(done.status, null, done.progress);
    $("current-stage").textContent = done.width + "×" + done.height + " · " + done.seconds + " s · seed " + done.seed;
    if (final === "completed") {
      video.src = await blobUrl(done.links.content);
      video.hidden = false;
      download.href = video.src;
      download.download = done.id + ".mp4";
      download.hidden = false;
      say("Done in " + fmtSeconds(done.inference_time_s) + ".");
      loadGallery();
    } else {
      say("Job " + final + (done.error ? ": " + done.error.message : ""), true);
    }
  }

  function initKey() {
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      localStorage.setItem(KEY, $("api-key").value.trim());
      $("key-form").hidden = true;
      $("forget-key").hidden = false;
      say("Key saved in this browser.");
      if ($("gallery")) loadGallery();
      if ($("sweeps")) loadSweeps();
      if ($("batches")) loadBatches();
    });
    $("forget-key").hidden = !localStorage.getItem(KEY);
    $("forget-key").addEventListener("click", () => {
      localStorage.removeItem(KEY);
      $("forget-key").hidden = true;
      $("key-form").hidden = false;
    });
  }

  function initKeyframe(inputId, previewId) {
    // A file chosen or dropped on the label shows as a preview; the form then sends it (fl2va).
    const input = $(inputId), preview = $(previewId), drop = input.closest("label");
    const show = () => {
      if (preview.src) URL.revokeObjectURL(preview.src);
      const file = input.files[0];
      preview.hidden = !file;
      if (file) preview.src = URL.createObjectURL(file); else preview.removeAttribute("src");
    };
    input.addEventListener("change", show);
    drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
    drop.addEventListener("dragleave", () => drop.classList.remove("over"));
    drop.addEventListener("drop", (e) => {
      e.preventDefault();
      drop.classList.remove("over");
      if (e.dataTransfer.files.length) { input.files = e.dataTransfer.files; show(); }
    });
  }

  async function openJob(id) {
    // `/#job_…` (a batch item's link): follow that job here as if it had just been submitted.
    const response = await api("/jobs/" + encodeURIComponent(id));
    if (!response.ok) { if (response.status !== 401) say(await errorText(response), true); return; }
    await watch(await json(response));
  }

  function initGenerate() {
    initKey();
    initKeyframe("first-frame", "first-frame-preview");
    initKeyframe("last-frame", "last-frame-preview");
    $("submit-form").addEventListener("submit", submit);
    $("refresh").addEventListener("click", loadGallery);
    loadGallery();
    const opened = () => {
      if (location.hash.startsWith("#job_")) openJob(decodeURIComponent(location.hash.slice(1)));
    };
    window.addEventListener("hashchange", opened);
    opened();
  }

  async function loadSweeps() {
    const root = $("sweeps");
    const response = await api("/sweeps?limit=20");
    if (response.status === 401) return;
    if (!response.ok) { say(await errorText(response), true); return; }
    const body = await response.json();
    root.replaceChildren();
    if (!body.sweeps.length) { root.textContent = "No sweeps yet."; return; }
    for (const sweep of body.sweeps) {
      const box = document.createElement("article");
      box.className = "card sweep";
      const title = document.createElement("h3");
      title.textContent = sweep.id + " · " + (sweep.status || "");
      box.appendChild(title);
      const plots = (sweep.links && sweep.links.plots) || {};
      const grid = document.createElement("div");
      grid.className = "plots";
      for (const [name, href] of Object.entries(plots)) {
        const figure = document.createElement("figure");
        const img = document.createElement("img");
        img.alt = name;
        const caption = document.createElement("figcaption");
        caption.textContent = name;
        figure.append(img, caption);
        grid.appendChild(figure);
        blobUrl(href).then((url) => { img.src = url; }).catch(() => { caption.textContent += " (unavailable)"; });
      }
      if (!Object.keys(plots).length) grid.textContent = "No plots yet.";
      box.appendChild(grid);
      root.appendChild(box);
    }
  }

  function initSweeps() {
    initKey();
    $("refresh").addEventListener("click", loadSweeps);
    loadSweeps();
  }

  // --- batches: a JSONL upload, polled progress, per-item status, the archive link -------------------------------

  const BATCH_TERMINAL = new Set(["completed", "cancelled", "failed", "expired"]);
  let watchToken = 0;  // each watchBatch() call takes a new token; an older polling loop sees it and stops

  function fmtEta(s) {
    if (s == null || s < 0) return "?";
    s = Math.round(s);
    return s >= 60 ? Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s" : s + "s";
  }

  // "line 3: width: expected …" (the server's message often starts with the field already).
  function detailLine(d, prefix) {
    const field = d.field || "body", message = String(d.message);
    return (prefix || "") + "line " + d.line + ": " + (message.startsWith(field + ":") ? message : field + ": " + message);
  }

  function showBatchErrors(lines) {
    const list = $("batch-errors");
    list.replaceChildren(...lines.map((text) => { const li = document.createElement("li"); li.textContent = text;
                                                   return li; }));
    list.hidden = !lines.length;
  }

  async function submitBatch(event) {
    event.preventDefault();
    const file = $("batch-file").files[0];
    if (!file) { say("Choose a JSONL file first.", true); return; }
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("on_invalid", $("on-invalid").value);
    $("batch-submit").disabled = true;
    say("");
    showBatchErrors([]);
    try {
      const response = await api("/batches", {method: "POST", body: form});
      if (!response.ok) {
        let body = null;
        try { body = await response.clone().json(); } catch (e) { /* not JSON */ }
        const details = body && body.error && Array.isArray(body.error.details) ? body.error.details : [];
        showBatchErrors(details.map((d) => detailLine(d)));
        say(await errorText(response), true);
        return;
      }
      const batch = await json(response);
      showBatchErrors((batch.skipped || []).map((d) => detailLine(d, "skipped ")));
      history.replaceState(null, "", "#" + batch.id);  // a reload resumes; replaceState fires no hashchange
      watchBatch(batch);
      loadBatches();
    } catch (e) {
      say(e.message, true);
    } finally {
      $("batch-submit").disabled = false;
    }
  }

  function showBatch(batch) {
    $("batch").hidden = false;
    $("batch-id").textContent = batch.id;
    $("batch-status").textContent = batch.status;
    $("batch-status").className = "badge " + batch.status;
    $("batch-progress").value = Math.round((batch.progress || 0) * 100);
    const c = batch.counts || {};
    const done = (c.completed || 0) + (c.failed || 0) + (c.cancelled || 0);
    let text = done + "/" + (c.total || 0) + " done";
    if (c.in_progress) text += " · " + c.in_progress + " running";
    if (c.failed) text += " · " + c.failed + " failed";
    if (c.cancelled) text += " · " + c.cancelled + " cancelled";
    if (!BATCH_TERMINAL.has(batch.status)) text += " · eta " + fmtEta(batch.eta_s);
    $("batch-counts").textContent = text;
    $("batch-cancel").hidden = BATCH_TERMINAL.has(batch.status);
  }

  function showItems(results) {
    $("batch-items").replaceChildren(...results.map((r) => {
      const row = document.createElement("tr");
      row.id = "item-" + r.index;
      row.className = "item " + r.status;
      const detail = r.error ? (r.error.code + ": " + r.error.message) : (r.job_id || "");
      for (const text of [String(r.index), r.custom_id || "", r.status, detail]) {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.appendChild(cell);
      }
      if (r.job_id && !r.error) {  // the item's job opens on the generate page (progress, player, download)
        const link = document.createElement("a");
        link.href = "/#" + encodeURIComponent(r.job_id);
        link.className = "job-link";
        link.textContent = r.job_id;
        row.lastChild.replaceChildren(link);
      }
      return row;
    }));
  }

  async function loadResults(batch) {
    const response = await api(batch.results_url || "/batches/" + encodeURIComponent(batch.id) + "/results");
    if (!response.ok) return;
    const text = await response.text();
    showItems(text.split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l)));
  }

  // The archive link: a plain link when the server needs no key; with a key, the first click fetches the zip
  // with the Authorization header into a blob: URL (an <a href> cannot send headers) and then downloads that.
  function showArchive(batch) {
    const link = $("batch-archive");
    const href = batch.archive_url || "/batches/" + encodeURIComponent(batch.id) + "/archive";
    link.href = href;
    link.dataset.href = href;
    link.dataset.state = "";
    link.download = batch.id + ".zip";
    link.hidden = !(batch.counts && batch.counts.completed);
  }

  async function archiveClick(event) {
    const link = $("batch-archive");
    if (!localStorage.getItem(KEY) || link.dataset.state === "ready") return;  // native download
    event.preventDefault();
    if (link.dataset.state === "loading") return;
    link.dataset.state = "loading";
    link.textContent = "Preparing archive…";
    try {
      link.href = await blobUrl(link.dataset.href);
      link.dataset.state = "ready";
      link.textContent = "Download archive";
      link.click();
    } catch (e) {
      link.dataset.state = "";
      link.textContent = "Download archive";
      say("archive: " + e.message, true);
    }
  }

  async function watchBatch(batch) {
    const token = ++watchToken;
    $("batch-archive").hidden = true;
    $("batch-items").replaceChildren();
    let lastCounts = null;
    for (;;) {
      if (token !== watchToken) return;  // another batch was chosen
      showBatch(batch);
      const c = batch.counts || {};
      const counts = JSON.stringify(c);
      if (counts !== lastCounts || BATCH_TERMINAL.has(batch.status)) {  // item rows only change with the counts
        lastCounts = counts;
        await loadResults(batch);
      }
      if (BATCH_TERMINAL.has(batch.status)) {
        showArchive(batch);
        say("Batch " + batch.status + ": " + (c.completed || 0) + " of " + (c.total || 0) + " clips rendered.",
            batch.status !== "completed" || !!c.failed);
        loadBatches();
        return;
      }
      await new Promise((r) => setTimeout(r, 1000));
      const response = await api("/batches/" + encodeURIComponent(batch.id));
      if (!response.ok) { say(await errorText(response), true); return; }
      batch = await json(response);
    }
  }

  async function cancelBatch() {
    const id = $("batch-id").textContent;
    const response = await api("/batches/" + encodeURIComponent(id) + "/cancel", {method: "POST"});
    if (!response.ok) say(await errorText(response), true);
  }

  async function openBatch(id) {
    const response = await api("/batches/" + encodeURIComponent(id));
    if (response.status === 401) return;
    if (!response.ok) { say(await errorText(response), true); return; }
    watchBatch(await json(response));
  }

  async function loadBatches() {
    const root = $("batches");
    const response = await api("/batches?limit=10");
    if (response.status === 401) return;
    if (!response.ok) { say(await errorText(response), true); return; }
    const page = await json(response);
    const batches = page.data || page.batches || [];
    root.replaceChildren(...batches.map((b) => {
      const li = document.createElement("li");
      const link = document.createElement("a");
      link.href = "#" + b.id;
      link.textContent = b.id;
      const c = b.counts || {};
      li.append(link, " · " + b.status + " · " + (c.completed || 0) + "/" + (c.total || 0) + " completed");
      return li;
    }));
    if (!batches.length) root.textContent = "No batches yet.";
  }

  function initBatches() {
    initKey();
    $("batch-form").addEventListener("submit", submitBatch);
    $("batch-archive").addEventListener("click", archiveClick);
    $("batch-cancel").addEventListener("click", cancelBatch);
    $("refresh").addEventListener("click", loadBatches);
    window.addEventListener("hashchange", () => { if (location.hash.length > 1) openBatch(location.hash.slice(1)); });
    loadBatches();
    if (location.hash.length > 1) openBatch(location.hash.slice(1));  // a reload keeps following the batch
  }

  return {initGenerate, initSweeps, initBatches, followEvents, api};
})();
