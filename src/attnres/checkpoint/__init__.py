"""Training checkpoints: the on-disk format (layout, digests, atomic publication, verification) and
the one-process safetensors writer and reader. The distributed (DCP) writer and the Checkpointer
that picks a format live in `attnres.distributed`."""

from attnres.checkpoint.format import (DCP_FORMAT, FORMAT, Checkpoint, CheckpointError, checkpoint_dirs,
                                       checkpoint_path, latest_checkpoint, read_checkpoint)

__all__ = ["DCP_FORMAT", "FORMAT", "Checkpoint", "CheckpointError", "checkpoint_dirs", "checkpoint_path",
           "latest_checkpoint", "read_checkpoint"]
