"""I/O primitives: safetensors shards written and read, digests, files written safely, pages
mapped ahead, copies staged to a GPU, calls run side by side. Nothing here knows a model, a
catalog or a store."""
