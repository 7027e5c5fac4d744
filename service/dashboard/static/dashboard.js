/* Driftline dashboard: charts (uPlot) and live updates (server-sent events).
 *
 * The pages are complete without this file (server-rendered tables). With it:
 * - #accuracy-chart / #hit-chart draw /dashboard/data/accuracy: heartbeat RMSE and
 *   hit-rate@10 of the serving and never-retrained models, drift alerts as dots, swaps
 *   as labelled dashed lines, retraining jobs shaded, the alert threshold as a band;
 * - #loss-chart draws a job's loss per epoch from /jobs/{id};
 * - #versions-chart draws holdout RMSE across versions from /models;
 * - /dashboard/events (SSE) appends heartbeats and alerts as they happen, keeping the
 *   chart's zoom; after repeated stream errors it polls the JSON every 5 s instead.
 * Each chart element gets data-points="N" (its x values), which the browser tests read.
 */
(function () {
  "use strict";

  const POLL_MS = 5000;
  const charts = {};
  window.driftlineCharts = charts;

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error(url + ": " + r.status); } return r.json(); });
  }

  function width(el) { return Math.max(320, el.clientWidth - 2); }

  function setLiveState(state) {
    const badge = document.getElementById("live-status");
    if (badge) { badge.dataset.state = state; badge.textContent = "live: " + state; }
  }

  /* ---------- accuracy chart ---------- */

  const accuracy = { data: null, plot: null, hitPlot: null, zoomed: false };
  /* What the accuracy chart marks (alerts, swaps, job spans, threshold), as drawn. */
  charts.marks = function () { return accuracy.data; };

  /* uPlot's columns: events seen, then the serving and never-retrained models' figure. */
  function columnsOf(series, key) {
    const beats = series.heartbeats;
    return [
      beats.map(function (b) { return b.events_seen; }),
      beats.map(function (b) { return b[key]; }),
      beats.map(function (b) { return b["static_" + key]; }),
    ];
  }
  function columns(series) { return columnsOf(series, "rmse"); }
  function hitColumns(series) { return columnsOf(series, "hit_rate"); }

  /* Markers, spans and the band drawn on the canvas after each redraw. */
  function overlay(u) {
    const series = accuracy.data;
    if (!series) { return; }
    const ctx = u.ctx;
    const top = u.bbox.top, height = u.bbox.height, left = u.bbox.left, right = left + u.bbox.width;
    ctx.save();
    const t = series.threshold;
    if (t) {
      const y1 = u.valToPos(t.alert_rmse, "y", true), y0 = u.valToPos(t.reference_rmse, "y", true);
      ctx.fillStyle = "rgba(230, 81, 0, 0.10)";
      ctx.fillRect(left, Math.min(y0, y1), right - left, Math.abs(y0 - y1));
    }
    series.jobs.forEach(function (j) {
      const x0 = u.valToPos(j.start_events, "x", true), x1 = u.valToPos(j.end_events, "x", true);
      if (x1 < left || x0 > right) { return; }
      ctx.fillStyle = "rgba(21, 101, 192, 0.10)";
      ctx.fillRect(Math.max(x0, left), top, Math.max(2, Math.min(x1, right) - Math.max(x0, left)), height);
    });
    ctx.strokeStyle = "#6a1b9a"; ctx.fillStyle = "#6a1b9a"; ctx.setLineDash([4, 4]);
    ctx.font = (11 * devicePixelRatio) + "px system-ui";
    series.swaps.forEach(function (s) {
      const x = u.valToPos(s.events_seen, "x", true);
      if (x < left || x > right) { return; }
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
      ctx.fillText(s.version || "", x + 3, top + 12 * devicePixelRatio);
    });
    ctx.setLineDash([]);
    ctx.fillStyle = "#c62828";
    series.alerts.forEach(function (a) {
      const x = u.valToPos(a.events_seen, "x", true), y = u.valToPos(a.after, "y", true);
      if (x < left || x > right) { return; }
      ctx.beginPath(); ctx.arc(x, Math.min(Math.max(y, top), top + height), 5 * devicePixelRatio, 0, 2 * Math.PI); ctx.fill();
    });
    ctx.restore();
  }

  function rememberZoom(u) {
    const xs = u.data[0];
    if (!xs.length) { return; }
    const min = u.scales.x.min, max = u.scales.x.max;
    accuracy.zoomed = min > xs[0] || max < xs[xs.length - 1];
  }

  // Both accuracy panels plot the serving model against the never-retrained one.
  function servingSeries() {
    return [
      { label: "events" },
      { label: "serving", stroke: "#1565c0", width: 2 },
      { label: "never retrained", stroke: "#8a939b", width: 1 },
    ];
  }

  function drawAccuracy(el, series) {
    accuracy.data = series;
    const opts = {
      title: "Prequential RMSE per heartbeat",
      width: width(el), height: 280,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false } },
      axes: [{ label: "labelled events seen" }, { label: "RMSE" }],
      series: servingSeries(),
      hooks: { draw: [overlay], setScale: [function (u, key) { if (key === "x") { rememberZoom(u); } }] },
    };
    accuracy.plot = new uPlot(opts, columns(series), el);
    const hitEl = document.getElementById("hit-chart");
    if (hitEl) {
      accuracy.hitPlot = new uPlot({
        title: "Hit-rate@10 per heartbeat",
        width: width(hitEl), height: 180,
        cursor: { sync: { key: "accuracy" } },
        scales: { x: { time: false } },
        axes: [{ label: "labelled events seen" }, { label: "hit-rate@10" }],
        series: servingSeries(),
      }, hitColumns(series), hitEl);
      hitEl.dataset.points = String(series.heartbeats.length);
    }
    charts.accuracy = accuracy.plot;
    charts.hitRate = accuracy.hitPlot;
    el.dataset.points = String(series.heartbeats.length);
  }

  /* Replace the chart's data; a zoomed chart keeps its x range. */
  function refreshAccuracy() {
    const el = document.getElementById("accuracy-chart");
    if (!el || !accuracy.plot) { return; }
    const keep = accuracy.zoomed;
    const x = accuracy.plot.scales.x;
    const range = { min: x.min, max: x.max };
    accuracy.plot.setData(columns(accuracy.data), !keep);
    if (keep) { accuracy.plot.setScale("x", range); }
    if (accuracy.hitPlot) {
      accuracy.hitPlot.setData(hitColumns(accuracy.data), !keep);
      if (keep) { accuracy.hitPlot.setScale("x", range); }
      document.getElementById("hit-chart").dataset.points = String(accuracy.data.heartbeats.length);
    }
    el.dataset.points = String(accuracy.data.heartbeats.length);
  }

  function addHeartbeat(beat) {
    if (!accuracy.data) { return; }
    const beats = accuracy.data.heartbeats;
    if (beats.length && beat.events_seen <= beats[beats.length - 1].events_seen) { return; }
    beats.push(beat);  // swaps arrive as their own events (the chart refetches its marks)
    refreshAccuracy();
    const seen = document.getElementById("events-seen");
    if (seen) { seen.textContent = String(beat.events_seen); }
  }

  function addAlert(alert) {
    if (accuracy.data && !accuracy.data.alerts.some(function (a) { return a.id === alert.id; })) {
      accuracy.data.alerts.push({ id: alert.id, events_seen: alert.events_seen, after: alert.after });
      refreshAccuracy();
    }
    const rows = document.getElementById("alerts-rows");
    if (!rows || rows.querySelector('[data-alert-id="' + alert.id + '"]')) { return; }
    const empty = rows.querySelector("tr.empty");
    if (empty) { empty.remove(); }
    const tr = document.createElement("tr");
    tr.dataset.alertId = String(alert.id);
    const cells = [null, new Date((alert.detected_at || Date.now() / 1000) * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC",
      alert.events_seen, fmt(alert.before), fmt(alert.after), alert.model_version || "", "", "no"];
    cells.forEach(function (value, i) {
      const td = document.createElement("td");
      if (i === 0) {
        const a = document.createElement("a");
        a.href = "/dashboard/alerts/" + alert.id; a.textContent = "#" + alert.id;
        td.appendChild(a);
      } else { td.textContent = String(value); }
      tr.appendChild(td);
    });
    rows.insertBefore(tr, rows.firstChild);
  }

  /* The serving card names the version a swap put in. */
  function showSwap(swap) {
    const card = document.getElementById("serving-version");
    if (card && swap.version) { card.textContent = swap.version; }
  }

  /* A job's status in the jobs table (a new job gets a row); its own page redraws the
   * loss curve from the job's JSON. */
  function showJob(job) {
    const rows = document.getElementById("jobs-rows");
    if (rows) {
      let row = rows.querySelector('[data-job-id="' + job.id + '"]');
      if (!row) {
        const empty = rows.querySelector("tr.empty");
        if (empty) { empty.remove(); }
        row = document.createElement("tr");
        row.dataset.jobId = String(job.id);
        const values = ["#" + job.id, "", job.trigger || "", job.status, "", "", "", "", "", ""];
        values.forEach(function (value, i) {
          const td = document.createElement("td");
          if (i === 0) {
            const a = document.createElement("a");
            a.href = "/dashboard/jobs/" + job.id; a.textContent = value;
            td.appendChild(a);
          } else { td.textContent = value; }
          row.appendChild(td);
        });
        rows.insertBefore(row, rows.firstChild);
      }
      const status = row.children[3];
      status.textContent = job.status; status.className = "status-" + job.status;
    }
    const loss = document.getElementById("loss-chart");
    if (loss && loss.dataset.source === "/jobs/" + job.id && charts.loss) {
      getJSON(loss.dataset.source).then(function (fresh) {
        charts.loss.setData([fresh.epochs.map(function (e) { return e.epoch; }), fresh.loss_curve]);
        loss.dataset.points = String(fresh.epochs.length);
        const status = document.getElementById("job-status");
        if (status) { status.textContent = fresh.status; status.className = "status-" + fresh.status; }
      });
    }
  }

  function fmt(v) { return typeof v === "number" ? v.toFixed(4) : (v == null ? "–" : String(v)); }

  function pollAccuracy() {
    getJSON("/dashboard/data/accuracy").then(function (series) {
      if (!accuracy.data) { return; }
      const known = accuracy.data.alerts.map(function (a) { return a.id; });
      accuracy.data = series;
      refreshAccuracy();
      series.alerts.forEach(function (a) { if (known.indexOf(a.id) < 0) { addAlert(a); } });
    }).catch(function () { /* the next poll tries again */ });
  }

  /* ---------- live events ---------- */

  function startLive() {
    if (!window.EventSource) { startPolling(); return; }
    let failures = 0;
    const after = document.body.dataset.lastEventId;
    const source = new EventSource("/dashboard/events" + (after ? "?last_event_id=" + encodeURIComponent(after) : ""));
    source.onopen = function () { failures = 0; setLiveState("live"); };
    source.onerror = function () {
      failures += 1;
      if (failures >= 3) { source.close(); startPolling(); }
    };
    source.addEventListener("heartbeat", function (e) { addHeartbeat(JSON.parse(e.data)); });
    source.addEventListener("alert", function (e) { addAlert(JSON.parse(e.data)); });
    source.addEventListener("swap", function (e) { showSwap(JSON.parse(e.data)); pollAccuracy(); });
    source.addEventListener("job", function (e) { showJob(JSON.parse(e.data)); pollAccuracy(); });
    source.addEventListener("reload", function () { pollAccuracy(); });
  }

  let polling = null;
  function startPolling() {
    if (polling) { return; }
    setLiveState("polling");
    polling = window.setInterval(pollAccuracy, POLL_MS);
  }

  /* ---------- job and versions charts ---------- */

  function drawLoss(el) {
    getJSON(el.dataset.source).then(function (job) {
      const epochs = job.epochs.map(function (e) { return e.epoch; });
      charts.loss = new uPlot({
        title: "Training loss per epoch",
        width: width(el), height: 240,
        scales: { x: { time: false } },
        axes: [{ label: "epoch" }, { label: "loss" }],
        series: [{ label: "epoch" }, { label: "loss", stroke: "#1565c0", width: 2, points: { show: true, size: 6 } }],
      }, [epochs, job.loss_curve], el);
      el.dataset.points = String(epochs.length);
    });
  }

  function drawVersions(el) {
    getJSON(el.dataset.source).then(function (registry) {
      const versions = registry.versions.slice().sort(function (a, b) { return a.created_at - b.created_at; });
      const xs = versions.map(function (_, i) { return i + 1; });
      charts.versions = new uPlot({
        title: "Holdout RMSE across versions (oldest first)",
        width: width(el), height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "version #", values: function (u, ticks) { return ticks.map(function (t) { const v = versions[t - 1]; return v ? v.version : ""; }); } }, { label: "holdout RMSE" }],
        series: [{ label: "version" }, { label: "holdout RMSE", stroke: "#2e7d32", width: 2, points: { show: true, size: 6 } }],
      }, [xs, versions.map(function (v) { return v.rmse; })], el);
      el.dataset.points = String(xs.length);
    });
  }

  function start() {
    const acc = document.getElementById("accuracy-chart");
    if (acc) {
      getJSON(acc.dataset.source).then(function (series) { drawAccuracy(acc, series); startLive(); })
        .catch(function () { startPolling(); });
    }
    const loss = document.getElementById("loss-chart");
    if (loss) { drawLoss(loss); }
    const versions = document.getElementById("versions-chart");
    if (versions) { drawVersions(versions); }
    // Tables, cards and a running job's loss follow the stream (not the sign-in page).
    if (!acc && document.body.dataset.page !== "sign-in") { startLive(); }
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
}());
