from .records import RECORDS, StorageRecord, contiguous_strides, live_buffers, new_tensor, record_of, set_buffer, stats  # noqa: F401
