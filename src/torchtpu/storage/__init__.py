from .records import RECORDS, StorageRecord, new_tensor, record_of, set_buffer, stats, live_buffers, contiguous_strides  # noqa: F401
