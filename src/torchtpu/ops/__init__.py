"""The lowering table (see table.py); importing this package registers every lowering."""
from . import elementwise, reductions, linalg  # noqa: F401
from . import activations, normalization, embedding, losses, convolution, pooling, attention, grid_sample  # noqa: F401
from . import indexing, shape, random, factories, misc, special, fft  # noqa: F401
from .table import LOWERINGS, lowering  # noqa: F401
