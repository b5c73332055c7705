"use strict";
// The run page's time slider. Every state it shows was computed in Python by the
// projections (fetched from the JSON API, or embedded by the offline report):
// this script only draws them, always as text (never as HTML).
(function () {
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const slider = document.getElementById("slider");
  const label = document.getElementById("slider-label");
  const problem = document.getElementById("slider-error");
  const overlay = document.getElementById("overlay");
  const cache = new Map();
  let wanted = null;
  let busy = false;

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function json(value) {
    return value === null || value === undefined ? "" : JSON.stringify(value);
  }

  function fill(id, rows) {
    const body = document.querySelector("#" + id + " tbody");
    const fragment = document.createDocumentFragment();
    rows.forEach(function (row) { fragment.appendChild(row); });
    body.replaceChildren(fragment);
  }

  function pairs(id, entries) {
    const list = document.getElementById(id);
    const fragment = document.createDocumentFragment();
    entries.forEach(function (entry) {
      const dt = document.createElement("dt");
      dt.textContent = entry[0];
      const dd = document.createElement("dd");
      dd.textContent = entry[1];
      fragment.appendChild(dt);
      fragment.appendChild(dd);
    });
    list.replaceChildren(fragment);
  }

  // A frame's row never changes: the frame pushed by event v sits at the same depth
  // in every stack that holds it. Rows are made once and reused as the slider moves,
  // known by version and stage (`frame_key`: an outcome that took a hub's implicit
  // route pushed two frames, the hub's and its own).
  const frameRows = new Map();

  function frameRow(frame) {
    const key = frame.version + ":" + frame.stage;
    let row = frameRows.get(key);
    if (row) return row;
    row = document.createElement("tr");
    row.className = frame.failed ? "failed" : "completed";
    row.dataset.version = frame.version;
    cell(row, frame.n, "num");
    cell(row, frame.version, "num");
    cell(row, frame.state);
    cell(row, frame.stage);
    cell(row, frame.outcome);
    cell(row, frame.attempt, "num");
    cell(row, frame.took, "num");
    cell(row, frame.failed ? frame.error_type + ": " + frame.error : json(frame.result), "text");
    frameRows.set(key, row);
    return row;
  }

  // Only the rows that changed are moved: a step pushes or pops one frame, and
  // putting back all of them would lay the whole table out again at every move.
  function keep(body, rows) {
    const wanted = new Set(rows);
    Array.from(body.children).forEach(function (row) {
      if (!wanted.has(row)) row.remove();
    });
    let next = body.firstElementChild;
    rows.forEach(function (row) {
      if (row === next) next = row.nextElementSibling;
      else body.insertBefore(row, next);
    });
  }

  function drawStack(stack) {
    document.getElementById("stack-depth").textContent = "depth " + stack.depth;
    const hidden = document.getElementById("stack-hidden");
    hidden.hidden = stack.hidden === 0;
    hidden.textContent = stack.hidden + " older frames not listed";
    const rows = stack.frames.map(frameRow);
    keep(document.querySelector("#stack tbody"), rows);
    // Only the newest rows are laid out and painted at a move (a jump replaces them all,
    // a hundred rows cost tens of milliseconds); the older ones show once scrolled to.
    rows.forEach(function (row, index) {
      const far = index < rows.length - ROWS_IN_VIEW;
      if (row.hidden !== far) row.hidden = far;
    });
    // The top of the stack in view, once laid out for the next frame (reading the
    // panel's height now would lay the whole page out a second time).
    // A scroll event still pending from before this drawing must not show every row.
    newestScrollPending = true;
    requestAnimationFrame(function () {
      stackPanel.scrollTop = stackPanel.scrollHeight;
      newestScrollPending = false;
    });
  }

  // Rows drawn at a move: the panel shows about a dozen.
  const ROWS_IN_VIEW = 24;
  const stackPanel = document.getElementById("stack-panel");
  let newestScrollPending = false;  // a drawing's scroll to its newest rows is still to come

  function showOlderRows() {
    if (newestScrollPending || stackPanel.scrollTop > 40) return;
    const far = document.querySelectorAll("#stack tbody tr[hidden]");
    if (far.length === 0) return;
    const before = stackPanel.scrollHeight;
    far.forEach(function (row) { row.hidden = false; });
    stackPanel.scrollTop += stackPanel.scrollHeight - before;  // the same rows stay in view
  }

  function drawResults(results) {
    fill("results", results.map(function (entry) {
      const row = document.createElement("tr");
      if (entry.last_failed) row.className = "failed";
      cell(row, entry.stage);
      cell(row, entry.attempts, "num");
      cell(row, entry.last_outcome);
      cell(row, entry.last_took, "num");
      cell(row, json(entry.latest), "text");
      return row;
    }));
  }

  function drawCounters(view) {
    const retries = view.retries;
    const entries = [["total attempts", retries.total_attempts]];
    Object.keys(retries.retry_counts).sort().forEach(function (stage) {
      entries.push(["retries of " + stage, retries.retry_counts[stage]]);
    });
    if (retries.open_stage) entries.push(["open attempt", retries.open_stage]);
    pairs("retries", entries);
    const progress = view.progress;
    pairs("progress", Object.keys(progress).sort().map(function (key) {
      return [key.replace(/_/g, " "), progress[key] === null ? "-" : String(progress[key])];
    }));
  }

  function highlight(state) {
    document.querySelectorAll("svg.pipeline g.node").forEach(function (node) {
      node.classList.toggle("current", node.dataset.node === String(data.states.indexOf(state)));
    });
  }

  // The report holds its pages of events in <template>s and shows one at a time.
  const perPage = data.per_page;
  const firstPage = Math.ceil(data.window.first / perPage);
  const lastPage = Math.ceil(data.window.last / perPage);
  let eventPage = 1;

  function showEvents(number) {
    const page = document.getElementById("events-page-" + number);
    if (!page || number === eventPage) return;
    eventPage = number;
    document.getElementById("events").replaceChildren(page.content.cloneNode(true));
    bindEvents();
    const last = Math.min(number * perPage, data.last_version);
    document.getElementById("events-range").textContent =
      "events " + ((number - 1) * perPage + 1) + "–" + last + " of " + data.last_version;
  }

  function bindEvents() {
    document.querySelectorAll(".events li").forEach(function (item) {
      item.addEventListener("dblclick", function () {
        slider.value = item.dataset.version;
        show(Number(item.dataset.version));
      });
    });
  }

  // The timeline draws a window of the run's events around the slider: its bars and
  // markers, sorted by version, are marked "later" past the slider's version. Each
  // drawing keeps its index and the version it is faded to, so a window shown again is
  // not indexed again, and a move changes only the elements between two versions.
  const indexes = new WeakMap();
  let drawn = null;  // the index of the drawing shown

  function indexTimeline() {
    const drawing = document.getElementById("gantt");
    drawn = indexes.get(drawing);
    if (drawn) return;
    const pairs = Array.from(drawing.querySelectorAll("[data-version]"), function (element) {
      return [Number(element.dataset.version), element];
    });
    pairs.sort(function (a, b) { return a[0] - b[0]; });
    drawn = {
      versions: pairs.map(function (pair) { return pair[0]; }),
      elements: pairs.map(function (pair) { return pair[1]; }),
      fadedTo: Infinity,  // as drawn by the viewer: nothing faded
    };
    indexes.set(drawing, drawn);
  }

  function fade(version) {
    const low = Math.min(version, drawn.fadedTo);
    const high = Math.max(version, drawn.fadedTo);
    const versions = drawn.versions;
    for (let index = firstAbove(low); index < versions.length; index++) {
      if (versions[index] > high) break;
      drawn.elements[index].classList.toggle("later", versions[index] > version);
    }
    drawn.fadedTo = version;
  }

  function firstAbove(version) {
    const versions = drawn.versions;
    let low = 0;
    let high = versions.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (versions[middle] > version) high = middle; else low = middle + 1;
    }
    return low;
  }

  function inWindow(version) {
    return version >= data.window.first && version <= data.window.last;
  }

  // A window's SVG, drawn by the viewer with every text of the run escaped, is parsed
  // by the HTML parser of an inert <template> (nothing in it runs or loads), as the page
  // itself parses the first window: three to four times faster than DOMParser's XML
  // parser on a window's 65 KB, and it reads what an XML parser refuses (a stage name
  // with a control character).
  function parsedDrawing(svg) {
    const holder = document.createElement("template");
    holder.innerHTML = svg;
    return holder.content.firstElementChild;
  }

  // A bar's or a marker's text is its aria-label; its tooltip, a <title>, is made when
  // the pointer first comes over it (a window would otherwise parse and style hundreds).
  const SVG_NS = "http://www.w3.org/2000/svg";

  function tooltip(event) {
    const shape = event.target.closest("#gantt [data-version][aria-label]");
    if (!shape || shape.querySelector("title")) return;
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = shape.getAttribute("aria-label");
    shape.appendChild(title);
  }

  // Windows drawn lately, newest last, each with its drawing (a move back reuses it).
  const windows = [];

  async function windowAt(version) {
    if (inWindow(version) || data.embedded) return;
    let shown = windows.find(function (known) {
      return version >= known.answer.first && version <= known.answer.last;
    });
    if (!shown) {
      const response = await fetch(data.api + "/timeline?at=" + version,
        {headers: {Accept: "application/json"}});
      if (!response.ok) throw new Error("the viewer answered " + response.status);
      const answer = await response.json();
      shown = {answer: answer, drawing: parsedDrawing(answer.svg)};
      delete answer.svg;
    } else {
      windows.splice(windows.indexOf(shown), 1);
    }
    windows.push(shown);
    if (windows.length > 20) windows.shift();
    document.getElementById("gantt").replaceWith(shown.drawing);
    data.window = shown.answer;
    document.getElementById("window-span").textContent =
      shown.answer.first + "–" + shown.answer.last;
    overlay.setAttribute("viewBox", shown.drawing.getAttribute("viewBox"));
    indexTimeline();
  }

  function mark(version, requested) {
    if (data.embedded && document.getElementById("event-pager")) {
      showEvents(Math.ceil(version / perPage));
    }
    const previous = document.querySelector(".events li.at");
    if (previous) previous.classList.remove("at");
    const item = document.getElementById("ev-" + version);
    if (item) item.classList.add("at");
    const jump = document.getElementById("events-jump");
    jump.hidden = item !== null || Boolean(data.embedded);
    if (!jump.hidden) {  // the live page lists one page of events: offer the one with this event
      const page = Math.ceil(version / perPage);
      jump.href = "?page=" + page + "&at=" + version + "#ev-" + version;
      jump.textContent = "event " + version + " in the list";
    }
    const cursor = document.getElementById("cursor");
    const note = document.getElementById("timeline-note");
    const shown = inWindow(version);
    cursor.style.display = shown ? "" : "none";
    note.hidden = shown;
    if (shown) {
      const x = data.window.cursor[version - data.window.first];
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
    } else {
      note.textContent = "This report's timeline draws events " + data.window.first + "–" +
        data.window.last + "; event " + requested + " is before them.";
    }
    fade(version);
  }

  // What a move left as it was is not drawn again: a step changes a stage's results
  // or a counter, seldom the state; each part remembers what it drew last.
  const drawnParts = new Map();

  function changed(part, value) {
    const text = JSON.stringify(value);
    if (drawnParts.get(part) === text) return false;
    drawnParts.set(part, text);
    return true;
  }

  function setText(id, text) {
    const element = document.getElementById(id);
    if (element.textContent !== text) element.textContent = text;
  }

  function draw(view, requested) {
    const summary = view.summary || {};
    setText("current-state", view.stack.current || "");
    setText("current-status", summary.status || "");
    drawStack(view.stack);
    if (changed("results", view.results)) drawResults(view.results);
    if (changed("counters", [view.retries, view.progress])) drawCounters(view);
    if (changed("state", view.stack.current)) highlight(view.stack.current);
    mark(view.version, requested);
    let text = "after event " + view.version + " of " + view.last_version + ": " + view.kind;
    if (view.version !== requested) text += " (nearest embedded version to " + requested + ")";
    label.textContent = text;
    problem.hidden = true;
    if (document.body.dataset.ready) remember(requested);  // moved, not opened
    document.body.dataset.shownVersion = String(requested);
  }

  // The address says where the slider is, so a view can be shared: ?at=N on the
  // live page (which opens there), #at=N in the report (a file:// page keeps its query).
  // It is written once the slider rests, ADDRESS_DELAY ms after the last move drawn:
  // the browser's own process records every history.replaceState (at each step it
  // cost more CPU than drawing the step), and it throttles a page that calls it
  // hundreds of times in a few seconds, as a dragged slider would.
  const ADDRESS_DELAY = 300;
  let addressTimer = null;

  // A page left before the slider rests writes it as it goes: back (or forward) to it,
  // the page opens where its slider was. A reload, though, asks for the address the
  // page had before it was left: so the version moved to is also noted in the tab's
  // sessionStorage (only as the page is left, nothing at each move), and a reload of
  // that same address opens there. A page that loses the focus (to the address bar,
  // to be copied and shared) or is hidden writes its address at once.
  let addressDue = null;
  const RELOAD_NOTE = "stagetrail.reload";
  const RELOAD_NOTE_SIZE = 20000;  // characters: a longer note is none this page wrote

  function remember(version) {
    clearTimeout(addressTimer);
    addressDue = version;
    addressTimer = setTimeout(writeDueAddress, ADDRESS_DELAY);
  }

  function writeDueAddress() {
    clearTimeout(addressTimer);
    addressTimer = null;
    if (addressDue === null) return;
    const version = addressDue;
    addressDue = null;
    writeAddress(version);
  }

  function moving() {
    return Boolean(document.body.dataset.ready) && (addressDue !== null || busy);
  }

  function leave() {
    // A page left at rest drops any older note: one left by this very page before it was
    // kept for back and forward (the bfcache) and shown again would else serve its reload.
    const note = moving() ? {address: location.href, version: Number(slider.value)} : null;
    try {
      if (note) sessionStorage.setItem(RELOAD_NOTE, JSON.stringify(note));
      else sessionStorage.removeItem(RELOAD_NOTE);
    } catch (error) {  // storage refused (a private window's quota): the address still is
    }
    if (note) addressDue = note.version;
    writeDueAddress();
  }

  function settle() {
    if (moving()) addressDue = Number(slider.value);
    writeDueAddress();
  }

  function reloadedAt() {
    // The version a reload of this very address was left at, once: any other load forgets it.
    let note = null;
    try {
      const noted = sessionStorage.getItem(RELOAD_NOTE);
      sessionStorage.removeItem(RELOAD_NOTE);  // before it is read: a bad note goes too
      if (noted === null || noted.length > RELOAD_NOTE_SIZE) return null;
      note = JSON.parse(noted);
    } catch (error) {
      return null;
    }
    const navigation = performance.getEntriesByType("navigation")[0];
    if (!note || !navigation || navigation.type !== "reload") return null;
    if (note.address !== location.href || !Number.isInteger(note.version)) return null;
    return note.version;
  }

  function writeAddress(version) {
    if (data.embedded) {
      if (location.hash !== "#at=" + version) history.replaceState(null, "", "#at=" + version);
      return;
    }
    const query = new URLSearchParams(location.search);
    if (query.get("at") === String(version)) return;
    query.set("at", String(version));
    history.replaceState(null, "", "?" + query.toString() + location.hash);
  }

  function startVersion() {
    const hash = /^#at=([0-9]+)$/.exec(location.hash);
    const reloaded = reloadedAt();
    let wanted = data.embedded && hash ? Number(hash[1]) : data.start;
    if (reloaded !== null) wanted = reloaded;
    const version = Math.min(Math.max(wanted, 1), data.last_version);
    if (reloaded !== null) writeAddress(version);
    return version;
  }

  function expand(compact) {
    // The report stores each distinct value once: put the view back together.
    const embedded = data.embedded;
    const listed = embedded.values[compact.stack.frames];
    const frames = listed.map(function (key, index) {
      return Object.assign({n: compact.stack.depth - listed.length + index + 1},
        embedded.frames[key]);
    });
    return {
      version: compact.version,
      kind: compact.kind,
      last_version: data.last_version,
      summary: embedded.values[compact.summary],
      stack: Object.assign({}, compact.stack, {frames: frames}),
      results: compact.results.map(function (row) { return embedded.values[row]; }),
      retries: embedded.values[compact.retries],
      progress: embedded.values[compact.progress],
    };
  }

  function embeddedView(version) {
    const versions = data.embedded.versions;
    let low = 0;
    let high = versions.length - 1;
    while (low < high) {  // the newest embedded version at or before `version`
      const middle = Math.ceil((low + high) / 2);
      if (versions[middle] <= version) low = middle; else high = middle - 1;
    }
    return expand(data.embedded.states[low]);
  }

  async function stateAt(version) {
    if (data.embedded) return embeddedView(version);
    const timeline = windowAt(version);  // the timeline around it, fetched alongside
    let view = cache.get(version);
    if (!view) {
      const response = await fetch(data.api + "/state?at=" + version,
        {headers: {Accept: "application/json"}});
      if (!response.ok) throw new Error("the viewer answered " + response.status);
      view = await response.json();
      if (cache.size >= 500) cache.delete(cache.keys().next().value);  // the oldest asked
      cache.set(version, view);
    }
    await timeline;
    return view;
  }

  async function show(version) {
    wanted = version;
    if (busy) return;
    busy = true;
    try {
      while (wanted !== null) {  // a newer move replaces any not yet drawn
        const next = wanted;
        wanted = null;
        const view = await stateAt(next);
        if (wanted === null) draw(view, next);
      }
    } catch (error) {
      problem.textContent = String(error.message || error);
      problem.hidden = false;
    } finally {
      busy = false;
    }
  }

  function step(delta) {
    const value = Math.min(Math.max(Number(slider.value) + delta, 1), data.last_version);
    slider.value = String(value);
    show(value);
  }

  slider.addEventListener("input", function () { show(Number(slider.value)); });
  stackPanel.addEventListener("scroll", showOlderRows, {passive: true});
  document.getElementById("gantt-box").addEventListener("pointerover", tooltip);
  window.addEventListener("pagehide", leave);
  window.addEventListener("blur", settle);
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "hidden") settle();
  });
  document.getElementById("prev").addEventListener("click", function () { step(-1); });
  document.getElementById("next").addEventListener("click", function () { step(1); });
  bindEvents();
  indexTimeline();
  if (document.getElementById("event-pager")) {
    eventPage = 0;
    showEvents(firstPage);
    document.getElementById("events-prev").addEventListener("click", function () {
      showEvents(Math.max(eventPage - 1, firstPage));
    });
    document.getElementById("events-next").addEventListener("click", function () {
      showEvents(Math.min(eventPage + 1, lastPage));
    });
  }
  // The live page asks for its first state once shown (a fold of a long run never
  // holds the page up); the report has it, or any other, embedded.
  const start = startVersion();
  slider.value = String(start);
  if (data.initial && start === data.initial.version) {
    draw(data.initial, start);
    document.body.dataset.ready = "1";
  } else if (data.embedded) {
    draw(embeddedView(start), start);
    document.body.dataset.ready = "1";
  } else {
    label.textContent = "reading the state after event " + start + "…";
    show(start).then(function () { document.body.dataset.ready = "1"; });
  }
})();
