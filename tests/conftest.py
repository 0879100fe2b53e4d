"""Test-wide settings: CPU-only JAX with a project-local compilation cache."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("AKO_JAX_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache",
                                                     "jax"))
