"""Scale-out on PyTorch's distributed engine. Takes plain models, the world and its own settings; never
imports the training package. Import from the submodules (some load slow parts of torch.distributed):

    env            the torchrun process group: join it, rank 0, barriers, reductions
    wrapper        ParallelModel (what a training loop drives) and StepSettings
    data_parallel  one process, DDP and FSDP2
    pipeline*      pipeline stages on torch.distributed.pipelining, the layout, the cross-stage cache
    wrap           wrap_model: the one entry point that picks among them
    checkpoint     distributed (DCP) checkpoints; checkpointer: the Checkpointer that picks a format
"""
