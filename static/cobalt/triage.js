/* Triage keys on a run's page and an item's: "?" opens the keyboard help as a dialog (without
 * script it is a section the "Shortcuts" link jumps to), "/" focuses the search, "n" opens the
 * next failure in the item panel, and the skip link moves focus onto the first failure.
 * j/k and the item panel itself are cobalt.js's. */
(function () {
  "use strict";

  var sheet = null;  // the <dialog> the help section is moved into while it is open

  function openHelp() {
    var help = document.getElementById("keyboard-help");
    if (!help) return;
    if (!sheet) {
      sheet = document.createElement("dialog");
      sheet.className = "help-sheet";
      sheet.setAttribute("aria-labelledby", "keyboard-help-title");
      var close = document.createElement("form");
      close.method = "dialog";
      close.innerHTML = '<button type="submit" class="close" aria-label="Close">×</button>';
      sheet.appendChild(close);
      sheet.addEventListener("close", function () {
        var home = document.getElementById("keyboard-help-home");
        if (home) home.replaceWith(sheet.querySelector("#keyboard-help"));
      });
      document.body.appendChild(sheet);
    }
    if (sheet.open) return;
    var home = document.createElement("div");  // where the section goes back on close
    home.id = "keyboard-help-home";
    help.replaceWith(home);
    sheet.appendChild(help);
    sheet.showModal();
  }

  function typing(target) {
    return target.closest && target.closest("input, select, textarea, [contenteditable]");
  }

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || typing(event.target)) return;
    if (event.key === "?") {
      event.preventDefault();
      openHelp();
    } else if (event.key === "/") {
      var search = document.querySelector("#item-filters input[name=q]");
      if (search && !document.querySelector("dialog[open]")) {
        event.preventDefault();
        search.focus();
        search.select();
      }
    } else if (event.key === "n") {
      var link = document.querySelector("#item-panel a[data-step=next-failure]");
      if (link) {
        event.preventDefault();
        link.click();
      }
    }
  });

  document.addEventListener("click", function (event) {
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    var help = event.target.closest && event.target.closest("a.help-link");
    if (help) {
      event.preventDefault();
      openHelp();
      return;
    }
    // The skip link: focus lands on the first failure itself, so Enter opens it.
    var skip = event.target.closest && event.target.closest("a.skip-link");
    var target = skip && document.getElementById(skip.hash.slice(1));
    if (target) {
      event.preventDefault();
      target.focus();
      target.scrollIntoView({ block: "center" });
    }
  });
})();
