"""Progress of a run in a Jupyter notebook: one line that updates in place.

The report itself renders through `ExperimentReport._repr_html_` when the cell returns it.
"""

from __future__ import annotations

import time
from typing import Any

UPDATE_EVERY = 0.25  # seconds between two updates of the line (the last one always shows)


class NotebookProgress:
    """The engine's reporter in a notebook: `name: 12/40 items · 1 error`, updated in place."""

    def __init__(self) -> None:
        from IPython.display import display

        self._display = display
        self._handle: Any = None
        self._name = ""
        self._errors = 0
        self._shown_at = 0.0

    def run_started(self, run: Any, experiment: Any) -> None:
        self._name = run.name
        self._handle = self._display(self._line(0, run.total_items), display_id=True)

    def item_finished(self, outcome: Any, done: int, total: int) -> None:
        self._errors += outcome.status != "ok"
        now = time.monotonic()
        if done == total or now - self._shown_at >= UPDATE_EVERY:
            self._shown_at = now
            self._handle.update(self._line(done, total))

    def run_finished(self, run: Any) -> None:
        from cobalt.report import item_counts

        status = (run.summary or {}).get("itemStatus", {})
        text = (
            f"{self._name}: {run.total_items}/{run.total_items} items · {run.status} · "
            f"{item_counts(status)} · run {run.id}"
        )
        if self._handle is not None:
            self._handle.update(_Text(text))

    def _line(self, done: int, total: int) -> Any:
        errors = f" · {self._errors} error{'s' * (self._errors != 1)}" if self._errors else ""
        return _Text(f"{self._name}: {done}/{total} items{errors}")


class _Text:
    """Plain text for `display()`: shown as is, never as a repr in quotes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
