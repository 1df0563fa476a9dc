/* Cobalt dashboard: draws Chart.js charts from json_script data, opens the item panel and the
 * compare page's side by side (each its own URL; j/k step through the rows), carries sorts in
 * the filter form, remembers the theme.
 * A <canvas data-chart="KIND" data-source="ID"> is drawn from the JSON in <script id="ID">;
 * canvases swapped in by htmx are drawn after they settle. No inline scripts anywhere. */
(function () {
  "use strict";

  var COLOURS = ["#1d4ed8", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];

  function colour(i, alpha) {
    var hex = COLOURS[i % COLOURS.length];
    if (alpha === undefined) return hex;
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  var scoreAxis = { min: 0, max: 1, ticks: { stepSize: 0.2 } };

  var builders = {
    histogram: function (d) {
      return {
        type: "bar",
        data: {
          labels: d.histogram.labels,
          datasets: d.histogram.series.map(function (s, i) {
            return { label: s.label, data: s.values, backgroundColor: colour(i, 0.7) };
          }),
        },
        options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "items" } } } },
      };
    },
    compare: function (d) {
      return {
        type: "bar",
        data: {
          labels: d.labels,
          datasets: [
            { label: d.labelA, data: d.a, backgroundColor: colour(0, 0.45) },
            { label: d.labelB, data: d.b, backgroundColor: colour(0, 0.9) },
          ],
        },
        options: { scales: { y: scoreAxis } },
      };
    },
    trends: function (d, canvas) {
      // The score lines, or (data-metric) the error rate, cost or latency lines beside them.
      var metric = canvas.dataset.metric;
      var axes = {
        errorRate: { min: 0, suggestedMax: 0.1, ticks: { callback: function (v) { return Math.round(v * 1000) / 10 + "%"; } } },
        cost: { beginAtZero: true, title: { display: true, text: "USD" } },
        latency: { beginAtZero: true, title: { display: true, text: "ms" } },
      };
      return {
        type: "line",
        data: {
          labels: d.labels,
          datasets: (metric ? d.metrics[metric] : d.series).map(function (s, i) {
            return {
              label: s.label, data: s.values, borderColor: colour(i), backgroundColor: colour(i),
              pointRadius: 4, pointHoverRadius: 7, spanGaps: false, tension: 0,
            };
          }),
        },
        options: {
          scales: { y: metric ? axes[metric] : scoreAxis, x: metric ? { ticks: { maxRotation: 0, autoSkipPadding: 16 } } : {} },
          interaction: { mode: "nearest", intersect: true },
          onClick: function (_event, elements) {
            if (elements.length) pickTrendPoint(d, elements[0].index);
          },
          onHover: function (event, elements) {
            event.native.target.style.cursor = elements.length ? "pointer" : "default";
          },
          plugins: {
            tooltip: { callbacks: { footer: function (items) { return items.length ? "run " + d.runs[items[0].dataIndex] : ""; } } },
          },
        },
      };
    },
    pareto: function (d) {
      // A sweep's variants: quality against cost; the Pareto-optimal ones drawn larger.
      return {
        type: "scatter",
        data: {
          datasets: [
            { label: "Pareto-optimal", data: d.front, backgroundColor: colour(2), borderColor: colour(2), pointRadius: 9, pointStyle: "rectRot", clip: false },
            { label: "dominated", data: d.others, backgroundColor: colour(0, 0.5), borderColor: colour(0), pointRadius: 6, clip: false },
          ],
        },
        options: {
          scales: {
            x: { title: { display: true, text: d.xLabel } },
            y: { min: 0, max: 1, ticks: { stepSize: 0.2 }, title: { display: true, text: "mean score" } },
          },
          layout: { padding: 12 },  // points at 0 and 1 are drawn whole (clip: false)
          plugins: {
            tooltip: { callbacks: { label: function (item) { var p = item.raw; return p.label + ": " + p.y.toFixed(3) + " @ " + p.x + " (p50 " + p.latency + " ms)"; } } },
          },
        },
      };
    },
  };

  // Trends: the first point picked (on any chart) is one run, the second another: their
  // compare page opens, the older run as A. The table below the charts does the same without
  // script.
  var trendPick = null;
  function pickTrendPoint(d, index) {
    var first = trendPick ? d.runs.indexOf(trendPick) : -1;
    if (first !== -1 && first !== index) {
      trendPick = null;
      var a = d.runs[Math.min(first, index)], b = d.runs[Math.max(first, index)];
      window.location.assign(d.compareUrl + "?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b));
      return;
    }
    trendPick = d.runs[index];
    var status = document.getElementById("trend-pick");
    if (!status) return;
    var open = document.createElement("a");
    open.href = d.urls[index];
    open.textContent = "open run " + trendPick;
    status.replaceChildren("Picked run " + trendPick + " (" + d.labels[index] + "): pick another point to compare them, or ", open, ".");
  }

  function draw(root) {
    if (!window.Chart) return;
    // Axis and legend text in the page's colours (light or dark).
    var style = getComputedStyle(document.documentElement);
    window.Chart.defaults.color = style.getPropertyValue("--muted").trim() || "#5b6472";
    window.Chart.defaults.borderColor = style.getPropertyValue("--line").trim() || "#e5e7eb";
    root.querySelectorAll("canvas[data-chart]:not([data-drawn])").forEach(function (canvas) {
      var source = document.getElementById(canvas.dataset.source);
      var build = builders[canvas.dataset.chart];
      if (!source || !build) return;
      var config = build(JSON.parse(source.textContent), canvas);
      config.options = Object.assign({ animation: false, responsive: true, maintainAspectRatio: false }, config.options);
      new window.Chart(canvas, config);
      canvas.setAttribute("data-drawn", "true");
    });
  }

  function destroy(root) {
    if (!window.Chart || !root || !root.querySelectorAll) return;
    root.querySelectorAll("canvas[data-drawn]").forEach(function (canvas) {
      var chart = window.Chart.getChart(canvas);
      if (chart) chart.destroy();
    });
  }

  // "Copy as JSON" buttons need script: shown only when it runs.
  function enableCopy(root) {
    root.querySelectorAll("[data-needs-js][hidden]").forEach(function (button) {
      button.hidden = false;
    });
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    var source = button && document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) return;
    var text = JSON.stringify(JSON.parse(source.textContent), null, 2);
    navigator.clipboard.writeText(text).then(function () { button.textContent = "Copied"; });
  });

  document.addEventListener("DOMContentLoaded", function () {
    draw(document);
    enableCopy(document);
    restorePicks(document);
  });
  document.addEventListener("htmx:beforeSwap", function (event) { destroy(event.detail.target); });
  document.addEventListener("htmx:afterSettle", function () {
    draw(document);
    enableCopy(document);
    restorePicks(document);
  });
  document.addEventListener("htmx:historyRestore", function () {
    document.querySelectorAll("canvas[data-drawn]").forEach(function (canvas) {
      canvas.removeAttribute("data-drawn");
    });
    draw(document);
  });
  // A sort header is a link (it works without script); with script it sets the sort in its
  // filter form and submits that form, so one form carries the filters and the sort. Its
  // requests queue (hx-sync "queue last"): a typed filter and a sort clicked at once end in
  // one table whose URL says both.
  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a[data-sort][data-form]");
    var form = link && document.getElementById(link.dataset.form);
    var field = form && form.querySelector("input[name=sort]");
    if (!field || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    field.value = link.dataset.sort;
    form.requestSubmit();
  });

  // Compare picks (A and B radios on the runs list) survive paging, sorting and filtering:
  // kept for the tab's session, re-checked after each swap, and sent with the compare form
  // even when the picked run's row is on another page.
  var PICKS = { a: "cobalt-compare-a", b: "cobalt-compare-b" };
  function picked(side) {
    try { return sessionStorage.getItem(PICKS[side]) || ""; } catch (e) { return ""; }
  }
  function restorePicks(root) {
    ["a", "b"].forEach(function (side) {
      var id = picked(side);
      var radio = id && root.querySelector("form.compare-runs input[name=" + side + "][value='" + CSS.escape(id) + "']");
      if (radio) radio.checked = true;
    });
    var shown = document.getElementById("compare-picks");
    if (shown) {
      shown.textContent = ["a", "b"].map(function (side) {
        return side.toUpperCase() + ": " + (picked(side) || "—");
      }).join(" · ");
      shown.hidden = false;
    }
  }
  document.addEventListener("change", function (event) {
    var radio = event.target;
    if (!radio.closest || !radio.closest("form.compare-runs") || !PICKS[radio.name]) return;
    try { sessionStorage.setItem(PICKS[radio.name], radio.value); } catch (e) { /* blocked */ }
    restorePicks(document);
  });
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("compare-runs")) return;
    ["a", "b"].forEach(function (side) {
      if (form.querySelector("input[name=" + side + "]:checked") || !picked(side)) return;
      var hidden = document.createElement("input");
      hidden.type = "hidden";
      hidden.name = side;
      hidden.value = picked(side);
      form.appendChild(hidden);
    });
  });

  // A slide-over panel (the run page's item panel, the compare page's side by side) has its
  // own URL, pushed when it opens and on each step with j/k; it opens as a modal; closing it
  // goes back past those steps to the page it opened over; j and k click its next and
  // previous links (`first`: j with no panel open clicks the first row's). Without script
  // each of those links is a page of its own.
  function slideOver(id, path, first) {
    var steps = 0;
    document.addEventListener("htmx:afterSettle", function () {
      var panel = document.querySelector("dialog#" + id + ".floating[open]");
      if (panel && !panel.hasAttribute("data-modal")) {
        // Reopen as a modal: a backdrop, Escape closes it, focus moves into it.
        panel.close();
        panel.setAttribute("data-modal", "true");
        panel.showModal();
      }
    });
    document.addEventListener("htmx:pushedIntoHistory", function (event) {
      steps = path.test(event.detail.path) ? steps + 1 : 0;
    });
    document.addEventListener("htmx:historyRestore", function () {
      if (!path.test(location.pathname)) steps = 0;
    });
    document.addEventListener("close", function (event) {
      var dialog = event.target;
      if (dialog.id === id && dialog.isConnected && !dialog.open && steps > 0 &&
          path.test(location.pathname)) {
        var back = steps;
        steps = 0;
        history.go(-back);
      }
    }, true);
    document.addEventListener("keydown", function (event) {
      if (event.altKey || event.ctrlKey || event.metaKey) return;
      var target = event.target;
      if (target.closest && target.closest("input, select, textarea, [contenteditable]")) return;
      var rel = event.key === "j" ? "next" : event.key === "k" ? "prev" : null;
      var link = rel && document.querySelector("#" + id + " a[data-step=" + rel + "]");
      if (!link && rel === "next" && first && !document.querySelector("dialog#" + id)) {
        link = document.querySelector(first);
      }
      if (link) {
        event.preventDefault();
        link.click();
      }
    });
  }
  slideOver("item-panel", /\/items\/\d+\/(\?|$)/);  // an item's address, with its list's query
  slideOver("side", /\/compare\/item\/(\?.*)?$/, "#pairs tr.pair-row a.side-link");

  // Dark mode follows the system unless the toggle chose one; the choice is remembered.
  var THEME_KEY = "cobalt-theme";
  function applyTheme(theme) {
    if (theme) document.documentElement.setAttribute("data-theme", theme);
    else document.documentElement.removeAttribute("data-theme");
  }
  try { applyTheme(localStorage.getItem(THEME_KEY)); } catch (e) { /* storage blocked */ }
  document.addEventListener("click", function (event) {
    var toggle = event.target.closest && event.target.closest("#theme-toggle");
    if (!toggle) return;
    var dark = document.documentElement.getAttribute("data-theme") === "dark" ||
      (!document.documentElement.hasAttribute("data-theme") && matchMedia("(prefers-color-scheme: dark)").matches);
    var theme = dark ? "light" : "dark";
    applyTheme(theme);
    try { localStorage.setItem(THEME_KEY, theme); } catch (e) { /* storage blocked */ }
  });

  document.addEventListener("click", function (event) {
    var dialog = event.target;
    if (dialog instanceof HTMLDialogElement && dialog.hasAttribute("data-modal")) {
      var box = dialog.getBoundingClientRect();
      var inside = event.clientX >= box.left && event.clientX <= box.right &&
        event.clientY >= box.top && event.clientY <= box.bottom;
      if (!inside) dialog.close();
    }
  });
})();
