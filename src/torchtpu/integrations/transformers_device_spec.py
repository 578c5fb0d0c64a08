"""Device spec for running the Hugging Face Transformers test suite on "tpu".

    TRANSFORMERS_TEST_BACKEND=torchtpu TRANSFORMERS_TEST_DEVICE=tpu \
    TRANSFORMERS_TEST_DEVICE_SPEC=tpu_spec.py python -m pytest tests/models/llama

Transformers imports the spec by its file name (the path with ".py" stripped, so it must be a
plain file name reachable from the working directory): link or copy this file into the
transformers checkout, e.g. `python -m torchtpu.integrations.transformers_device_spec tpu_spec.py`.
"""

import torch

DEVICE_NAME = "tpu"

MANUAL_SEED_FN = torch.tpu.manual_seed
EMPTY_CACHE_FN = torch.tpu.empty_cache
DEVICE_COUNT_FN = torch.tpu.device_count
# Read by newer transformers releases (and harmless for older ones).
RESET_MAX_MEMORY_ALLOCATED_FN = torch.tpu.reset_max_memory_allocated
RESET_PEAK_MEMORY_STATS_FN = torch.tpu.reset_peak_memory_stats
MAX_MEMORY_ALLOCATED_FN = torch.tpu.max_memory_allocated
MEMORY_ALLOCATED_FN = torch.tpu.memory_allocated
SYNCHRONIZE_FN = torch.tpu.synchronize
TORCH_ACCELERATOR_MODULE = torch.tpu


if __name__ == "__main__":
    import os
    import shutil
    import sys

    target = sys.argv[1] if len(sys.argv) > 1 else "tpu_spec.py"
    shutil.copyfile(os.path.abspath(__file__), target)
    print(f"wrote {target}; use TRANSFORMERS_TEST_DEVICE_SPEC={os.path.basename(target)}")
