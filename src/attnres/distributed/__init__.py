"""Scale-out on PyTorch's distributed engine: process groups, DDP/FSDP2 wrapping, distributed
checkpoints, and pipeline stages with the cross-stage cache. Import from the submodules."""
