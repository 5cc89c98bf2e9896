"""The format: what defines a store's bytes (metadata records, configs, array schema, manifest and digests,
shard objects, masks and values). Imports nothing from hskstore.io, hskstore.share or hskstore.method."""
