"""The node's verified cache: blobs fetched once per node and checked before use, the cache seen
whole and bounded, versions prefetched, and the shards a push need not write again."""
