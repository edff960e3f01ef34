"""What a version is made of: lineage captured at push into the signed manifest
(:mod:`.lineage`), an AI-BOM (:mod:`.bom`), a model card (:mod:`.card`) and the difference
between two versions (:mod:`.diff`). BOM, card and lineage graph are computed from manifests and
catalog links; diff compares shard digests before it reads a byte."""
