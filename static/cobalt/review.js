/* Review mode's keys (templates/cobalt/review.html; loaded by that page only):
 *   p pass · f fail · s skip · n the note field · j/k next/previous item · Escape leaves a field.
 * A key presses the button or follows the link that carries it (data-key), so each has a
 * plain-HTML twin that works without script. Keys are ignored while typing in a field, with a
 * modifier held, on auto-repeat, and while the panel is being saved or loaded (one press is
 * one label). A refused save (400, 404, 409) still swaps in the panel: it says why and keeps
 * what was typed. */
(function () {
  "use strict";

  var PANEL = "review-panel";

  function busy(panel) {
    return panel.classList.contains("htmx-request") || panel.querySelector(".htmx-request") !== null;
  }

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var target = event.target;
    if (target.closest && target.closest("input, select, textarea, [contenteditable]")) {
      if (event.key === "Escape") {
        event.preventDefault();
        target.blur();
      }
      return;
    }
    var panel = document.getElementById(PANEL);
    if (!panel || event.repeat) return;
    if (event.key === "n") {
      var note = panel.querySelector("#review-note");
      if (note) {
        event.preventDefault();  // or the "n" would be typed into it
        note.focus();
      }
      return;
    }
    if (["p", "f", "s", "j", "k"].indexOf(event.key) === -1) return;
    var control = panel.querySelector('[data-key="' + event.key + '"]');
    if (!control) return;
    event.preventDefault();
    if (busy(panel)) return;
    // A click, not requestSubmit(): htmx sends the value of the button it saw clicked.
    control.click();
  });

  // htmx swaps only 2xx answers by default; a refused save answers 4xx with the panel that
  // explains it.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var status = event.detail.xhr.status;
    var target = event.detail.target;
    if (target && target.id === PANEL && (status === 400 || status === 404 || status === 409)) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
