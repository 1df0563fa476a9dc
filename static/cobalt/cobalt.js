/* Cobalt dashboard: draws Chart.js charts from json_script data and opens the item panel.
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
    bars: function (d) {
      return {
        type: "bar",
        data: {
          labels: d.bars.labels,
          datasets: [{
            label: "average score",
            data: d.bars.values,
            backgroundColor: d.bars.labels.map(function (_, i) { return colour(i, 0.75); }),
          }],
        },
        options: { indexAxis: "y", scales: { x: scoreAxis }, plugins: { legend: { display: false } } },
      };
    },
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
    trends: function (d) {
      return {
        type: "line",
        data: {
          labels: d.labels,
          datasets: d.series.map(function (s, i) {
            return {
              label: s.label, data: s.values, borderColor: colour(i), backgroundColor: colour(i),
              pointRadius: 4, pointHoverRadius: 7, spanGaps: true, tension: 0.2,
            };
          }),
        },
        options: {
          scales: { y: scoreAxis },
          interaction: { mode: "nearest", intersect: true },
          onClick: function (_event, elements) {
            if (elements.length && d.urls) window.location.assign(d.urls[elements[0].index]);
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
  };

  function draw(root) {
    if (!window.Chart) return;
    root.querySelectorAll("canvas[data-chart]:not([data-drawn])").forEach(function (canvas) {
      var source = document.getElementById(canvas.dataset.source);
      var build = builders[canvas.dataset.chart];
      if (!source || !build) return;
      var config = build(JSON.parse(source.textContent));
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

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:beforeSwap", function (event) { destroy(event.detail.target); });
  document.addEventListener("htmx:afterSettle", function () {
    draw(document);
    var panel = document.querySelector("#panel dialog.floating[open]");
    if (panel && !panel.hasAttribute("data-modal")) {
      // Reopen as a modal: a backdrop, Escape closes it, focus moves into it.
      panel.close();
      panel.setAttribute("data-modal", "true");
      panel.showModal();
    }
  });
  document.addEventListener("htmx:historyRestore", function () {
    document.querySelectorAll("canvas[data-drawn]").forEach(function (canvas) {
      canvas.removeAttribute("data-drawn");
    });
    draw(document);
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
