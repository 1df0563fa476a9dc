/* Compare page: the side by side of one item opens as a slide-over with its own URL (pushed
 * when it opens and on each step); j and k step through the compare rows (the panel's
 * previous and next links carry the table's filter and sort); closing it goes back past
 * those steps to the compare page. Without script every link is a page of its own. */
(function () {
  "use strict";

  var SIDE_PATH = /\/compare\/item\/(\?.*)?$/;  // a path, with or without its query
  var sideSteps = 0;

  document.addEventListener("htmx:afterSettle", function () {
    var panel = document.querySelector("#side-host dialog.floating[open]");
    if (panel && !panel.hasAttribute("data-modal")) {
      // Reopen as a modal: a backdrop, Escape closes it, focus moves into it.
      panel.close();
      panel.setAttribute("data-modal", "true");
      panel.showModal();
    }
  });
  document.addEventListener("htmx:pushedIntoHistory", function (event) {
    sideSteps = SIDE_PATH.test(event.detail.path) ? sideSteps + 1 : 0;
  });
  document.addEventListener("htmx:historyRestore", function () {
    if (!SIDE_PATH.test(location.pathname)) sideSteps = 0;
  });
  document.addEventListener("close", function (event) {
    var dialog = event.target;
    if (dialog.id === "side" && dialog.isConnected && !dialog.open && sideSteps > 0 &&
        SIDE_PATH.test(location.pathname)) {
      var steps = sideSteps;
      sideSteps = 0;
      history.go(-steps);
    }
  }, true);

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var target = event.target;
    if (target.closest && target.closest("input, select, textarea, [contenteditable]")) return;
    if (event.key !== "j" && event.key !== "k") return;
    var link = document.querySelector("#side a[data-step=" + (event.key === "j" ? "next" : "prev") + "]");
    // No side by side open yet: j opens the first compared item's.
    if (!link && event.key === "j" && !document.querySelector("dialog#side")) {
      link = document.querySelector("#pairs tr.pair-row a.side-link");
    }
    if (link) {
      event.preventDefault();
      link.click();
    }
  });
})();
