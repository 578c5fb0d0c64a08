"""torchtpu: "tpu" as a native PyTorch device, executed by XLA through JAX.

`import torch` loads this package through PyTorch's device-backend autoload; `import torchtpu`
does the same explicitly. Public API: `torch.tpu.*` (the device module) and the names below.
"""

from __future__ import annotations

__version__ = "0.1.0"

_loaded = [False]


def _load():
    if _loaded[0]:
        return
    _loaded[0] = True
    from . import ops  # noqa: F401  (fills the lowering table)
    from .device import registration
    from .eager import kernels

    registration.install()
    from .storage import legacy, storage_methods

    legacy.install_storage_constructor()  # without the C++ extension: no allocator for "tpu"
    storage_methods.install()  # storage methods that would read a tpu storage's bytes on the host
    from . import api

    api.install()  # torch.tpu, before anything asks PyTorch for the device module
    kernels.register_all()
    from .compile import install_hooks

    install_hooks()  # registers backend="tpu" with Dynamo when Dynamo is first imported
    from . import integrations

    integrations.install()  # patches (integrations/patches.py): storage moves, DataLoader pinning, accelerate
    from .distributed import register as register_distributed

    register_distributed()  # process-group backends "tpu_dist" and "tpu" for torch.distributed


def _autoload():
    """Entry point of the `torch.backends` group: called by `import torch`."""
    _load()


_load()

from .device.platform import platform  # noqa: E402
from .eager.kernels import set_cpu_fallback  # noqa: E402
from .eager.modes import eager_mode, get_eager_mode, set_eager_mode  # noqa: E402
from .metrics import metrics, reset_metrics  # noqa: E402

__all__ = [
    "eager_mode",
    "get_eager_mode",
    "metrics",
    "platform",
    "reset_metrics",
    "set_cpu_fallback",
    "set_eager_mode",
]
