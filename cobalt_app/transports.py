"""The HTTP clients whose transports Cobalt wraps (`http_intercept`), each once per process."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from typing import Any

import wrapt

from cobalt_app import (
    item_threads,
    transport_aiohttp,
    transport_httpx,
    transport_stdlib,
    transport_urllib3,
)

# module -> its wrapper; requests sends through urllib3, LiteLLM through aiohttp, and
# urllib.request through http.client
LIBRARIES: dict[str, Callable[[Any], None]] = {
    "httpx": transport_httpx.wrap,
    "httpx2": transport_httpx.wrap,
    "aiohttp": transport_aiohttp.wrap,
    "urllib3": transport_urllib3.wrap,
    "http.client": transport_stdlib.wrap,  # urllib.request
}
_lock = threading.RLock()  # the import hook wraps too, maybe inside `install`
_hooked: set[str] = set()


def install(*, lazily: bool = False) -> None:
    """Wrap the transports of the HTTP clients installed: for record/replay, stubs and the
    trace's HTTP steps, and in every run to refuse the calls of a timed-out item
    (`runaway`). `lazily`: a library not imported yet is wrapped when it is (importing them
    all costs a run that uses none a good part of a second)."""
    item_threads.install()  # a request from a thread the agent started is still its item's
    with _lock:
        for name in LIBRARIES:
            if lazily and name not in sys.modules:
                if name not in _hooked and importlib.util.find_spec(name) is not None:
                    _hooked.add(name)
                    wrapt.register_post_import_hook(_wrap_module, name)
                continue
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            _wrap_module(module)


def _wrap_module(module: Any) -> None:
    with _lock:
        LIBRARIES[module.__name__](module)
