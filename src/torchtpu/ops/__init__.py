"""The lowering table (see table.py); importing this package registers every lowering."""

from . import (  # noqa: F401
    activations,
    attention,
    convolution,
    elementwise,
    embedding,
    factories,
    fft,
    grid_sample,
    indexing,
    linalg,
    linalg_decompositions,
    losses,
    misc,
    normalization,
    pooling,
    random,
    reductions,
    shape,
    special,
)
from .table import LOWERINGS, lowering  # noqa: F401
