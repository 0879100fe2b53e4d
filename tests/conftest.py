"""Test-wide settings: CPU-only JAX with a project-local compilation cache."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("AKO_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache",
                                                     "jax"))

# akosim's --compute measure cache: never the user's (every test process and its children)
if "AKO_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["AKO_CACHE_DIR"] = tempfile.mkdtemp(prefix="ako-test-cache-")
