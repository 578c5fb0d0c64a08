"""The lowering table (see table.py); importing this package registers every lowering."""
from . import elementwise, reductions, linalg, nn, indexing, shape, random, factories, misc, special, fft  # noqa: F401
from .table import LOWERINGS, lowering  # noqa: F401
