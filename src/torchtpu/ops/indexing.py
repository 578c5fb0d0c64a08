"""Lowerings: indexing."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering

