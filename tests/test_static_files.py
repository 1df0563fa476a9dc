"""Static files collected on first use: hashed names and compressed copies, nothing lost."""

from __future__ import annotations

import json

from cobalt_project.static_files import MANIFEST, ensure_collected


def test_a_given_folder_is_collected_into_once_and_keeps_what_it_held(tmp_path):
    given = tmp_path / "static"
    given.mkdir()
    (given / "notes.txt").write_text("mine")
    ensure_collected(given)
    assert (given / "notes.txt").read_text() == "mine"  # never wiped
    paths = json.loads((given / MANIFEST).read_text())["paths"]
    hashed = paths["cobalt/vendor/chart.umd.min.js"]
    assert hashed != "cobalt/vendor/chart.umd.min.js" and (given / hashed).is_file()
    assert (given / f"{hashed}.gz").is_file()  # served when the browser accepts gzip
    assert not list(tmp_path.glob(".static.*"))  # no staging folder left behind
    stamp = (given / MANIFEST).stat().st_mtime_ns
    ensure_collected(given)  # already there: not collected again
    assert (given / MANIFEST).stat().st_mtime_ns == stamp
