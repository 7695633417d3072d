"""The Files and Batch APIs, run by the platform itself (docs/batch.md): uploaded files, batches, and the
runner that answers each batch line once, at low priority, through the same routes as any request."""
