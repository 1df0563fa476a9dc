"""Big blocks of memory given back to the system as soon as they are freed (glibc).

A run's finalisation builds arrays of 8 bytes an item (the summary's scores, the score table,
the failing verdicts' ranks: 8 MB each at a million items), one phase after another. glibc's
malloc serves a block above its mmap threshold (128 KB) with a mapping of its own, returned to
the system when freed, but it raises that threshold to the size of each such block freed: from
the first 8 MB array on, later arrays came from its heap, which it keeps. The RSS of a
1,000,000-item `cobalt run` then kept the highest of every phase and stacked the next one on it
(issue 41). A fixed threshold keeps big blocks mapped, and freed ones given back; the small
blocks of everything else are served as before.
"""

from __future__ import annotations

import ctypes
import functools

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's own default, before it moves it


@functools.cache
def given_back() -> bool:
    """Fix malloc's mmap threshold for this process (once); False where the C library has no
    `mallopt` (macOS) or ignores it (musl)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
