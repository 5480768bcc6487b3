// FleetYield mission control: a read-only view that polls the controller's JSON API.
//
// Input: GET /v1/fleet (every node and GPU), /v1/status, /v1/events, /v1/proposals, /v1/ledger?by=day.
// Output: the DOM of index.html. Every string from the API reaches the page through textContent or an
// attribute set with setAttribute; nothing is ever parsed as HTML. The floor is one <canvas> with one
// pointer listener (hit-testing by arithmetic), so 1,000 nodes x 8 GPUs stay one element.
// ?poll=MS sets the poll interval (default 5000, at least 500).
"use strict";

(function () {
  const TIERS = ["green", "yellow", "red", "quarantined", "canary", "probation", "retired", "unknown"];
  const TIER_COLOR = {
    green: "#2f9e44", yellow: "#e0b000", red: "#e03131", quarantined: "#862e9c",
    canary: "#1c7ed6", probation: "#15aabf", retired: "#495057", unknown: "#adb5bd",
  };
  // Severity for "needs attention" ordering: worst first.
  const SEVERITY = { quarantined: 0, red: 1, retired: 2, canary: 3, probation: 4, yellow: 5, unknown: 6, green: 7 };
  const STAGES = ["sense", "risk", "profile", "price", "route", "settle", "gate", "learn"];
  // Event kinds (the store's log rows) -> the loop stage that wrote them. Prefixes end with "_".
  const KIND_STAGE = [
    ["agent_", "sense"], ["alert", "sense"], ["history_reset", "sense"], ["slurm_unreadable", "sense"],
    ["intake_failed", "sense"],
    ["fatal_", "risk"], ["drain", "risk"], ["hold", "risk"],
    ["envelope", "profile"], ["lemon", "profile"],
    ["tier_change", "price"],
    ["update", "route"], ["applied", "route"], ["dry_run", "route"], ["apply_failed", "route"], ["resume", "route"],
    ["job_outcome", "settle"], ["canary_result", "settle"], ["ledger", "settle"],
    ["proposed", "gate"], ["proposal_", "gate"], ["approval_", "gate"], ["gate_", "gate"], ["rejected", "gate"],
    ["superseded", "gate"], ["head_resealed", "gate"],
    ["lifecycle", "learn"], ["calibration", "learn"], ["learn", "learn"],
  ];
  const LADDER = ["quarantined", "remediating", "canary", "probation", "needs_human", "retired"];
  const ATTENTION_MAX = 200;
  const EVENTS_SHOWN = 60;
  const CHIPS_PER_RUNG = 60;

  const params = new URLSearchParams(window.location.search);
  const pollMs = Math.max(500, Number(params.get("poll")) || 5000);

  const $ = (id) => document.getElementById(id);
  const state = { fleet: null, layout: null, lastTick: null, stageCounts: {}, renders: 0, lastRenderMs: null,
    lastFetchMs: null, errors: 0, polls: 0 };
  // For tests and the curious: the last render's timings and a cell locator (no state is writable here).
  window.fleetyield = { state, cellOf: (node) => cellOf(node), pollMs };

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function fmtRisk(r) { return (r === null || r === undefined) ? "unknown" : Number(r).toFixed(4); }
  function fmtTime(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "-"; }
  function tierOf(t) { return TIERS.includes(t) ? t : "unknown"; }
  function stageOf(kind) {
    for (const [prefix, stage] of KIND_STAGE) {
      if (prefix.endsWith("_") ? kind.startsWith(prefix) : kind === prefix || kind.startsWith(prefix + "_")) return stage;
    }
    return "other";
  }

  async function getJSON(path) {
    const resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
    return resp.json();
  }

  // ---------------------------------------------------------------- the floor (one canvas)

  // GPU fill: grey unknown, dark red bad or fatal, else green -> yellow -> red on log10(risk), anchored at
  // the risk model's default thresholds (core.risk: yellow 0.05, red 0.5); below 0.005 (about the 7-day base
  // rate of one GPU) is plain green, so a healthy fleet looks green, not olive.
  const RAMP = [[0.005, [47, 158, 68]], [0.05, [224, 176, 0]], [0.5, [224, 49, 49]]];
  function gpuColor(g) {
    if (g.xids && g.xids.length) return "#7d0d0d";
    if (g.health === "bad") return "#a61e1e";
    if (g.risk === null || g.risk === undefined || g.health === "unknown") return "#dee2e6";
    let c = RAMP[RAMP.length - 1][1];
    if (g.risk <= RAMP[0][0]) c = RAMP[0][1];
    for (let i = 1; i < RAMP.length; i++) {
      const [p0, c0] = RAMP[i - 1], [p1, c1] = RAMP[i];
      if (g.risk > p0 && g.risk <= p1) {
        const u = (Math.log10(g.risk) - Math.log10(p0)) / (Math.log10(p1) - Math.log10(p0));
        c = c0.map((v, k) => Math.round(v + (c1[k] - v) * u));
      }
    }
    return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")";
  }

  function computeLayout(nodes, width) {
    const maxGpus = nodes.reduce((m, n) => Math.max(m, n.gpus.length), 0) || 1;
    const cols = Math.min(8, Math.max(1, Math.ceil(maxGpus / 2)));
    const rows = Math.ceil(maxGpus / cols);
    // Bigger cells for small fleets; 6 px GPUs keep 1,000 8-GPU nodes within a screen or two.
    const g = nodes.length <= 64 ? 14 : nodes.length <= 256 ? 10 : nodes.length <= 600 ? 8 : 6;
    const gap = 1, pad = g >= 10 ? 3 : 2, margin = g >= 10 ? 5 : 3;
    const cw = 2 * pad + cols * g + (cols - 1) * gap, ch = 2 * pad + rows * g + (rows - 1) * gap;
    const perRow = Math.max(1, Math.floor((width + margin) / (cw + margin)));
    const index = new Map();
    nodes.forEach((n, i) => index.set(n.node, i));
    return { cols, rows, g, gap, pad, margin, cw, ch, perRow, index, height: Math.ceil(nodes.length / perRow) * (ch + margin) };
  }

  function cellOf(node) {
    const L = state.layout;
    if (!L || !L.index.has(node)) return null;
    const i = L.index.get(node);
    return { x: (i % L.perRow) * (L.cw + L.margin), y: Math.floor(i / L.perRow) * (L.ch + L.margin), w: L.cw, h: L.ch };
  }

  function renderFloor(fleet) {
    const t0 = performance.now();
    const canvas = $("floor");
    const width = Math.max(300, canvas.parentElement.clientWidth - 2);
    const nodes = fleet.nodes;
    const L = computeLayout(nodes, width);
    state.layout = L;
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = width + "px";
    canvas.style.height = Math.max(20, L.height) + "px";
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(Math.max(20, L.height) * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, L.height);
    for (let i = 0; i < nodes.length; i++) {
      const n = nodes[i];
      const x = (i % L.perRow) * (L.cw + L.margin), y = Math.floor(i / L.perRow) * (L.ch + L.margin);
      ctx.fillStyle = TIER_COLOR[tierOf(n.tier)];
      ctx.fillRect(x, y, L.cw, L.ch);
      if (!n.gpus.length) {
        ctx.fillStyle = "#f1f3f5";
        ctx.fillRect(x + L.pad, y + L.pad, L.cw - 2 * L.pad, L.ch - 2 * L.pad);
      }
      for (let k = 0; k < n.gpus.length; k++) {
        const gx = x + L.pad + (k % L.cols) * (L.g + L.gap), gy = y + L.pad + Math.floor(k / L.cols) * (L.g + L.gap);
        ctx.fillStyle = gpuColor(n.gpus[k]);
        ctx.fillRect(gx, gy, L.g, L.g);
      }
    }
    state.lastRenderMs = performance.now() - t0;
    state.renders += 1;
    canvas.dataset.nodes = String(nodes.length);
    canvas.dataset.renderMs = state.lastRenderMs.toFixed(2);
  }

  function hit(evt) {
    const L = state.layout, fleet = state.fleet;
    if (!L || !fleet) return null;
    const rect = $("floor").getBoundingClientRect();
    const x = evt.clientX - rect.left, y = evt.clientY - rect.top;
    const col = Math.floor(x / (L.cw + L.margin)), row = Math.floor(y / (L.ch + L.margin));
    if (col < 0 || col >= L.perRow || x - col * (L.cw + L.margin) > L.cw || y - row * (L.ch + L.margin) > L.ch) return null;
    const n = fleet.nodes[row * L.perRow + col];
    if (!n) return null;
    const lx = x - col * (L.cw + L.margin) - L.pad, ly = y - row * (L.ch + L.margin) - L.pad;
    const k = Math.floor(ly / (L.g + L.gap)) * L.cols + Math.floor(lx / (L.g + L.gap));
    return { node: n, gpu: (lx >= 0 && ly >= 0 && k < n.gpus.length) ? n.gpus[k] : null, x, y };
  }

  function tipText(h) {
    const n = h.node;
    const lines = [n.node + ": " + tierOf(n.tier) + (n.stage && n.stage !== "in_service" ? " (" + n.stage + ")" : ""),
      "risk " + fmtRisk(n.risk) + ", health " + (n.health || "?") + ", slurm " + (n.slurm_state || "?")];
    if (n.reason) lines.push("reason: " + n.reason);
    if (n.scrape_error) lines.push("scrape: " + n.scrape_error);
    if (h.gpu) {
      lines.push("GPU " + h.gpu.index + ": " + h.gpu.health + ", risk " + fmtRisk(h.gpu.risk) +
        (h.gpu.xids.length ? ", XID " + h.gpu.xids.join(",") : ""));
    }
    return lines.join("\n");
  }

  function onMove(evt) {
    const tip = $("tip");
    const h = hit(evt);
    if (!h) { tip.hidden = true; return; }
    tip.textContent = tipText(h);
    tip.hidden = false;
    tip.style.left = Math.min(h.x + 14, $("floor").clientWidth - 200) + "px";
    tip.style.top = (h.y + 14) + "px";
  }

  async function onClick(evt) {
    const h = hit(evt);
    if (!h) return;
    const box = $("detail");
    $("detail-title").textContent = h.node.node;
    $("detail-text").textContent = "loading…";
    box.hidden = false;
    try {
      const doc = await getJSON("/v1/nodes/" + encodeURIComponent(h.node.node) + "/explain");
      $("detail-text").textContent = doc.text;
    } catch (e) {
      $("detail-text").textContent = String(e.message || e);
    }
  }

  function renderLegend(fleet) {
    const tiers = (fleet.summary && fleet.summary.tiers) || {};
    const legend = $("tiers");
    clear(legend);
    for (const t of TIERS) {
      const item = el("span", { "data-tier": t });
      const sw = el("span", { class: "sw" });
      sw.style.background = TIER_COLOR[t];
      item.appendChild(sw);
      item.appendChild(document.createTextNode(t + " " + (tiers[t] || 0)));
      legend.appendChild(item);
    }
    $("floor-count").textContent = fleet.nodes.length + " nodes, " +
      fleet.nodes.reduce((s, n) => s + n.gpus.length, 0) + " GPUs";
  }

  function renderAttention(fleet) {
    const rows = fleet.nodes.filter((n) => tierOf(n.tier) !== "green" || (n.stage && n.stage !== "in_service"));
    rows.sort((a, b) => (SEVERITY[tierOf(a.tier)] - SEVERITY[tierOf(b.tier)]) || ((b.risk || 0) - (a.risk || 0)));
    const body = $("attention").tBodies[0];
    clear(body);
    for (const n of rows.slice(0, ATTENTION_MAX)) {
      const tr = el("tr", { "data-node": n.node, "data-tier": tierOf(n.tier) });
      tr.appendChild(el("td", { class: "nowrap" }, n.node));
      tr.appendChild(el("td", { class: "nowrap tier t-" + tierOf(n.tier) }, tierOf(n.tier)));
      tr.appendChild(el("td", { class: "nowrap" }, n.stage || "in_service"));
      tr.appendChild(el("td", { class: "nowrap" }, fmtRisk(n.risk)));
      tr.appendChild(el("td", { class: "nowrap" }, n.slurm_state || "-"));
      tr.appendChild(el("td", null, n.reason || ""));
      body.appendChild(tr);
    }
    $("attention-count").textContent = rows.length > ATTENTION_MAX
      ? rows.length + " (first " + ATTENTION_MAX + ")" : String(rows.length);
  }

  function renderLadder(fleet) {
    const box = $("ladder");
    clear(box);
    const by = {};
    for (const n of fleet.nodes) (by[n.stage || "in_service"] = by[n.stage || "in_service"] || []).push(n.node);
    const inService = (by.in_service || []).length;
    for (const stage of [...LADDER, "in_service"]) {
      const names = by[stage] || [];
      const rung = el("div", { class: "rung", "data-stage": stage });
      rung.appendChild(el("h3", null, stage.replace("_", " ") + " " + (stage === "in_service" ? inService : names.length)));
      if (stage !== "in_service") {
        for (const name of names.slice(0, CHIPS_PER_RUNG)) rung.appendChild(el("span", { class: "chip" }, name));
        if (names.length > CHIPS_PER_RUNG) rung.appendChild(el("span", { class: "empty" }, "+" + (names.length - CHIPS_PER_RUNG) + " more"));
        if (!names.length) rung.appendChild(el("span", { class: "empty" }, "none"));
      }
      box.appendChild(rung);
    }
  }

  // ---------------------------------------------------------------- the loop

  function renderLoop(events) {
    const counts = {};
    for (const e of events) { const s = stageOf(e.kind || ""); counts[s] = (counts[s] || 0) + 1; }
    const box = $("loop");
    clear(box);
    for (const s of STAGES) {
      const hot = (counts[s] || 0) > (state.stageCounts[s] || 0) && state.polls > 1;
      const d = el("div", { class: "stage" + (hot ? " hot" : ""), "data-stage": s, title: "events from " + s + " in the last " + events.length });
      d.appendChild(el("b", null, counts[s] || 0));
      d.appendChild(document.createTextNode(s));
      box.appendChild(d);
    }
    state.stageCounts = counts;
    const body = $("events").tBodies[0];
    clear(body);
    for (const e of events.slice(0, EVENTS_SHOWN)) {
      const tr = el("tr", { "data-kind": e.kind || "" });
      tr.appendChild(el("td", { class: "nowrap" }, fmtTime(e.time).slice(11)));
      tr.appendChild(el("td", { class: "nowrap" }, stageOf(e.kind || "")));
      tr.appendChild(el("td", { class: "nowrap" }, e.kind));
      tr.appendChild(el("td", null, e.node || ""));
      tr.appendChild(el("td", null, e.message || ""));
      body.appendChild(tr);
    }
  }

  // ---------------------------------------------------------------- approvals (read-only)

  function copyButton(text) {
    const b = el("button", { type: "button" }, "copy");
    b.addEventListener("click", async () => {
      try { await navigator.clipboard.writeText(text); b.textContent = "copied"; }
      catch (_) { b.textContent = "select the text"; }
    });
    return b;
  }

  function renderProposals(doc) {
    const box = $("proposals");
    clear(box);
    const pending = (doc && doc.pending) || [];
    $("proposals-count").textContent = String(pending.length);
    if (!doc) { box.appendChild(el("p", { class: "empty" }, "the gate is not available")); return; }
    if (!pending.length) { box.appendChild(el("p", { class: "empty" }, "no open proposals")); return; }
    const now = Date.now() / 1000;
    for (const p of pending) {
      const d = el("div", { class: "proposal", "data-proposal": p.id });
      d.appendChild(el("h3", null, p.id + " drain " + p.node + " (risk " + fmtRisk(p.risk) + ")"));
      d.appendChild(el("div", null, "GPUs " + ((p.gpus && p.gpus.length) ? p.gpus.join(",") : "all") +
        "; affected jobs " + ((p.affected_jobs && p.affected_jobs.length) ? p.affected_jobs.join(",") : "none") +
        "; expires in " + Math.max(0, (p.expires_at - now) / 3600).toFixed(1) + " h"));
      for (const action of ["approve", "deny"]) {
        const cmd = "fleetyield " + action + " " + p.id + " --key ADMIN.key";
        const row = el("div", { class: "cmd" });
        row.appendChild(el("code", null, cmd));
        row.appendChild(copyButton(cmd));
        d.appendChild(row);
      }
      d.appendChild(el("pre", null, p.evidence || ""));
      box.appendChild(d);
    }
  }

  // ---------------------------------------------------------------- the ledger (SVG bars + net line)

  function renderLedger(doc) {
    const box = $("ledger");
    clear(box);
    const days = (doc && doc.groups) || [];
    if (!days.length) { box.appendChild(el("p", { class: "empty" }, "no settled jobs yet")); $("ledger-total").textContent = ""; return; }
    const total = days.reduce((a, d) => ({ u: a.u + d.useful_gpu_h, w: a.w + d.wasted_gpu_h, j: a.j + d.jobs, f: a.f + d.failures }),
      { u: 0, w: 0, j: 0, f: 0 });
    $("ledger-total").textContent = "useful " + total.u.toFixed(1) + " GPU-h, wasted " + total.w.toFixed(1) +
      " GPU-h, net " + (total.u - total.w).toFixed(1) + " GPU-h over " + Math.round(total.j) + " jobs (" + Math.round(total.f) + " failed)";
    const shown = days.slice(-60);
    const W = Math.max(320, box.clientWidth || 800), H = 160, padL = 44, padB = 18, padT = 6;
    const max = Math.max(1e-9, ...shown.map((d) => Math.max(d.useful_gpu_h + d.wasted_gpu_h, d.net_goodput_gpu_h)));
    const bw = (W - padL - 4) / shown.length;
    const y = (v) => padT + (H - padT - padB) * (1 - Math.max(0, v) / max);
    const chart = svg("svg", { class: "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
    chart.appendChild(svg("title", null, "GPU-hours per day: useful (green), wasted (red), net goodput (blue line)"));
    chart.appendChild(svg("line", { class: "axis", x1: padL, y1: H - padB, x2: W, y2: H - padB }));
    chart.appendChild(svg("text", { x: 2, y: padT + 8 }, max.toFixed(1)));
    chart.appendChild(svg("text", { x: 2, y: H - padB }, "0 GPU-h"));
    const pts = [];
    shown.forEach((d, i) => {
      const x = padL + i * bw;
      const hu = (H - padT - padB) * d.useful_gpu_h / max, hw = (H - padT - padB) * d.wasted_gpu_h / max;
      const r1 = svg("rect", { class: "useful", x: x + 1, y: H - padB - hu, width: Math.max(1, bw - 2), height: hu });
      r1.appendChild(svg("title", null, d.group + ": useful " + d.useful_gpu_h.toFixed(2) + " GPU-h, " + d.jobs + " jobs"));
      const r2 = svg("rect", { class: "wasted", x: x + 1, y: H - padB - hu - hw, width: Math.max(1, bw - 2), height: hw });
      r2.appendChild(svg("title", null, d.group + ": wasted " + d.wasted_gpu_h.toFixed(2) + " GPU-h, " + d.failures + " failures"));
      chart.appendChild(r1); chart.appendChild(r2);
      pts.push((x + bw / 2).toFixed(1) + "," + y(d.net_goodput_gpu_h).toFixed(1));
      if (i === 0 || i === shown.length - 1 || (shown.length <= 14)) {
        chart.appendChild(svg("text", { x: x + 1, y: H - 4 }, d.group.slice(5)));
      }
    });
    chart.appendChild(svg("polyline", { class: "net", points: pts.join(" ") }));
    box.appendChild(chart);
  }

  // ---------------------------------------------------------------- status + the poll loop

  function renderStatus(status, fleet) {
    $("tick").textContent = fleet.tick === null ? "none yet" : String(fleet.tick);
    $("age").textContent = fleet.time ? Math.max(0, Date.now() / 1000 - fleet.time).toFixed(0) + " s" : "-";
    const mode = $("mode");
    mode.textContent = fleet.dry_run ? "dry-run" : (fleet.dry_run === false ? "live" : "-");
    mode.className = "badge" + (fleet.dry_run ? " dry" : "");
    const live = (status && status.live) || {};
    const slurm = $("slurm");
    slurm.textContent = live.slurm_ok === false ? "slurm unreachable" : (live.slurm_ok ? "slurm ok" : "slurm ?");
    slurm.className = "badge" + (live.slurm_ok === false ? " bad" : (live.slurm_ok ? " ok" : ""));
    const inbox = (status && status.inbox) || {};
    $("inbox").textContent = (inbox.pending || 0) + " pending";
    $("holds").textContent = String((fleet.summary && fleet.summary.holds) || 0);
  }

  async function optional(path) {
    try { return await getJSON(path); } catch (_) { return null; }
  }

  async function poll() {
    const t0 = performance.now();
    try {
      const [fleet, status, events] = await Promise.all([getJSON("/v1/fleet"), getJSON("/v1/status"), getJSON("/v1/events?limit=200")]);
      const [proposals, ledger] = await Promise.all([optional("/v1/proposals"), optional("/v1/ledger?by=day")]);
      state.polls += 1;
      state.lastFetchMs = performance.now() - t0;
      state.fleet = fleet;
      renderStatus(status, fleet);
      if (fleet.tick !== state.lastTick || state.renders === 0) {
        renderFloor(fleet);
        renderLegend(fleet);
        renderAttention(fleet);
        renderLadder(fleet);
        state.lastTick = fleet.tick;
      }
      renderLoop(events);
      renderProposals(proposals);
      renderLedger(ledger);
      const conn = $("conn");
      conn.textContent = "updated " + new Date().toLocaleTimeString() + " (" + state.lastFetchMs.toFixed(0) + " ms)";
      conn.className = "conn";
      document.body.dataset.tick = String(fleet.tick);
    } catch (e) {
      state.errors += 1;
      const conn = $("conn");
      conn.textContent = "controller unreachable: " + (e.message || e) + " (retrying)";
      conn.className = "conn err";
    }
    window.setTimeout(poll, pollMs);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const canvas = $("floor");
    canvas.addEventListener("mousemove", onMove);
    canvas.addEventListener("mouseleave", () => { $("tip").hidden = true; });
    canvas.addEventListener("click", onClick);
    window.addEventListener("resize", () => { if (state.fleet) renderFloor(state.fleet); });
    poll();
  });
})();
