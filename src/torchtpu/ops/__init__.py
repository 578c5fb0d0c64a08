"""The lowering table (see table.py); importing this package registers every lowering, and
decompose.py as resolve's last resort for ops without one."""

from . import (  # noqa: F401
    activations,
    attention,
    bucketize,
    comparisons,
    convolution,
    decompose,  # registers itself in resolve.DECOMPOSERS
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
    rnn,
    shape,
    special,
    special_polynomials,
)
from .table import LOWERINGS, lowering  # noqa: F401
