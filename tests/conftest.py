import os

# Two virtual XLA:CPU devices, so tpu:1 is testable on any machine (read when torch loads the backend).
os.environ.setdefault("TORCHTPU_NUM_DEVICES", "2")
