"""Moved to ops/views.py (pure JAX over layouts, used by the lowerings too); kept for old imports."""
from ..ops.views import *  # noqa: F401,F403
from ..ops.views import apply_bits, bitcast, dynamic_plan, plan, read, write  # noqa: F401
